"""Fragmentation F of a node, FGD and BestFit scores, worked by hand from the definitions
in docs/placement.md#benchmark-metrics and docs/placement.md#calibration."""

import pytest

from gpushare.placement.bestfit import BestFitPolicy
from gpushare.placement.fgd import FgdPolicy
from gpushare.placement.fit import Placement, evaluate, to_allocation
from gpushare.placement.fragmentation import Fragmentation, devices, free_milli, models
from gpushare.placement.lookahead import LookaheadFgdPolicy
from gpushare.placement.workload import TaskShape, Workload
from gpushare.request import ContainerRequest, ContainerRole, PodRequest
from gpushare.state import NodeState
from tests.builders import T0
from tests.core.test_host_resources import cpu_only, milli_node, sharing, whole

# p=0.5: 500 milli of one GPU, 1 CPU; p=0.3: one whole GPU, 2 CPUs; p=0.2: CPU only.
WORKLOAD = Workload(
    (
        (TaskShape(gpus=1, mem=500, core=500, cpu_milli=1000), 0.5),
        (TaskShape(gpus=1, exclusive=True, cpu_milli=2000), 0.3),
        (TaskShape(gpus=0, cpu_milli=1000), 0.2),
    )
)


def loaded(cpu: int) -> NodeState:
    """Three GPUs with 1000, 300 and 600 milli free, and `cpu` milli-CPU left."""
    state = milli_node(gpus=3, cpu=cpu + 2000)
    for key, req in (("a", sharing(700, cpu=1000)), ("b", sharing(400, cpu=1000))):
        result = evaluate(state.view(), req, BestFitPolicy())
        assert isinstance(result, Placement)
        state.add(key, to_allocation(req, result.assignment, state.inventory, T0))
    # BestFit put both on GPU 0 if they fit: move the picture to the one we want.
    assert sorted(free_milli(g.mem_free, g.core_free, 1000, 1000) for g in state.view().gpus) == [
        300,
        600,
        1000,
    ]
    return state


def test_fragmentation_counts_what_each_task_cannot_use():
    # G = 1900. Sharing task fits: the 300 GPU is its fragment. Whole-GPU task lacks CPU
    # at 1500: all 1900. CPU-only: all 1900. F = .5*300 + .3*1900 + .2*1900 = 1100.
    frag = Fragmentation(WORKLOAD)
    assert frag.of_view(loaded(cpu=1500).view()) == pytest.approx(1100)
    # With 2500 CPU the whole-GPU task fits on the free GPU: its fragment is 300+600.
    assert frag.of_view(loaded(cpu=2500).view()) == pytest.approx(
        0.5 * 300 + 0.3 * 900 + 0.2 * 1900
    )


def test_expected_next_is_f_after_the_next_pod_lands_where_it_leaves_f_lowest():
    frag = Fragmentation(WORKLOAD)
    # GPUs free 1000, 300, 600; 2500 CPU; F = .5*300 + .3*900 + .2*1900 = 800.
    # Next 500-slice (1 CPU): on the 1000 GPU F = .5*300 + .3*1400 + .2*1400 = 850, on
    # the 600 GPU 900: 850. Next whole GPU (2 CPUs): 500 CPU left, F = 900. CPU-only: 800.
    assert frag.expected_next(*parts(loaded(cpu=2500))) == pytest.approx(
        0.5 * 850 + 0.3 * 900 + 0.2 * 800
    )
    # With 1500 CPU (same GPUs, asked of the same memo): the slice leaves 500 CPU, too
    # little for anything (F = 1400); the whole-GPU pod does not fit: F stays 1100.
    assert frag.expected_next(*parts(loaded(cpu=1500))) == pytest.approx(
        0.5 * 1400 + 0.3 * 1100 + 0.2 * 1100
    )


def parts(state: NodeState):
    view = state.view()
    return models(view), view.cpu_free, devices(view)


def test_a_full_node_has_no_fragmentation_and_a_wrong_model_is_all_fragment():
    frag = Fragmentation(WORKLOAD)
    full = milli_node(gpus=1)
    placed = evaluate(full.view(), whole(1), FgdPolicy(WORKLOAD))
    assert isinstance(placed, Placement)
    full.add("x", to_allocation(whole(1), placed.assignment, full.inventory, T0))
    assert frag.of_view(full.view()) == 0
    picky = Workload(((TaskShape(gpus=1, mem=100, core=100, gpu_spec=frozenset({"A100"})), 1.0),))
    assert Fragmentation(picky).of_view(milli_node(gpus=2, model="T4").view()) == 2000


def test_a_task_pinned_elsewhere_counts_all_of_the_nodes_free_gpu_for_both_policies():
    # Half the workload is pinned to A100, half takes any model: on a T4 node with 2 free
    # GPUs, F counts all 2000 free as fragment for the pinned half (1000), and the other
    # half fits (0). On its own model the pinned task fits too: nothing.
    mixed = Workload(
        (
            (TaskShape(gpus=1, mem=100, core=100, gpu_spec=frozenset({"A100"})), 0.5),
            (TaskShape(gpus=1, mem=100, core=100), 0.5),
        )
    )
    t4 = milli_node(gpus=2, model="T4").view()
    assert Fragmentation(mixed).of_view(t4) == 1000
    assert Fragmentation(mixed).of_view(milli_node(gpus=2, model="A100").view()) == 0
    # Issue 40: fgd-lookahead counts them as FGD does (it left them out before).
    assert FgdPolicy(mixed).fragmentation.of_view(t4) == 1000
    assert LookaheadFgdPolicy(mixed).fragmentation.of_view(t4) == 1000


@pytest.mark.parametrize("policy", [FgdPolicy, LookaheadFgdPolicy])
def test_an_unpinned_pod_leaves_the_model_most_pods_are_pinned_to(policy):
    """Where most of the workload may only run on T4 (as in the published gpuspec lists),
    an unpinned slice goes to another model's node: the T4s stay for the pods that have
    no other place (issue 40: taking them cost 61% more unallocated GPU than FGD)."""
    pinned = Workload(
        (
            (TaskShape(gpus=1, mem=500, core=500, gpu_spec=frozenset({"T4"})), 0.7),
            (TaskShape(gpus=1, mem=500, core=500), 0.3),
        )
    )
    judge = policy(pinned)
    slice_ = PodRequest((ContainerRequest("main", ContainerRole.APP, 0, 1, 500, core=500),))
    t4 = evaluate(milli_node(gpus=2, model="T4").view(), slice_, judge)
    g2 = evaluate(milli_node(gpus=2, model="G2").view(), slice_, judge)
    assert isinstance(t4, Placement) and isinstance(g2, Placement)
    assert g2.score > t4.score


def test_fgd_tries_every_gpu_for_a_slice_and_keeps_the_best_score():
    # Before (CPU 2500): F = 800. A 200-milli pod using 500 CPU leaves 2000 CPU; on the
    # 300 GPU: F = .5*100 + .3*700 + .2*1700 = 600, dF = -200, floor(100*sigmoid(.2)) = 54.
    # On the free GPU: no whole GPU left, F = 1000 (score 45); on the 600 GPU: F = 900 (47).
    state = loaded(cpu=2500)
    result = evaluate(state.view(), sharing(200, cpu=500), FgdPolicy(WORKLOAD))
    assert isinstance(result, Placement)
    chosen = result.assignment.gpus[0][0]
    assert state.view().gpus[chosen].mem_free == 300
    assert result.score == 54


def test_fgd_breaks_ties_between_gpus_by_lowest_index():
    state = milli_node(gpus=4)
    result = evaluate(state.view(), sharing(200), FgdPolicy(WORKLOAD))
    assert isinstance(result, Placement) and result.assignment.gpus == ((0,),)


def test_fgd_gives_whole_gpu_pods_free_gpus_and_scores_the_change():
    state = loaded(cpu=2500)
    result = evaluate(state.view(), whole(1, cpu=500), FgdPolicy(WORKLOAD))
    assert isinstance(result, Placement)
    assert state.view().gpus[result.assignment.gpus[0][0]].whole
    # After: GPUs 300 and 600, CPU 2000, G = 900: .5*300 + .3*900 + .2*900 = 600; dF = -200.
    assert result.score == 54


def test_fgd_scores_cpu_only_pods_by_the_cpu_they_take():
    # CPU 2500 -> 1000 cuts the whole-GPU task (needs 2000): its f goes 900 -> 1900.
    state = loaded(cpu=2500)
    result = evaluate(state.view(), cpu_only(1500), FgdPolicy(WORKLOAD))
    assert isinstance(result, Placement) and result.assignment.gpus == ()
    assert result.score == 42  # floor(100 * sigmoid(-0.3))


def test_fgd_judges_the_node_before_a_pod_by_the_cpu_it_has_now():
    # 1500 CPU: the whole-GPU task (2000) does not fit before, F = 1100 (as above). A
    # CPU-only pod of 500 leaves 1000: still F = .5*300 + .3*1900 + .2*1900 = 1100. No
    # growth: 50. Judging "before" without the CPU (F = 800) would make it 42.
    result = evaluate(loaded(cpu=1500).view(), cpu_only(500), FgdPolicy(WORKLOAD))
    assert isinstance(result, Placement) and result.score == 50


def test_fgd_judges_a_slice_by_the_cpu_left_before_and_after_it():
    # 1500 CPU before (F = 1100); the slice takes 1000, leaving 500: no task of the
    # workload fits any more, F = G = 1600 wherever it lands: growth 500, score 37.
    # Without the CPU before: growth 800 (31); without it after: F = 500 (64).
    result = evaluate(loaded(cpu=1500).view(), sharing(300, cpu=1000), FgdPolicy(WORKLOAD))
    assert isinstance(result, Placement) and result.score == 37


@pytest.mark.parametrize(("pod", "score"), [(sharing(300), 57), (whole(1), 73)])
def test_fgd_counts_all_of_a_node_of_the_wrong_model_as_fragment_before_and_after(pod, score):
    # The workload runs on A100s only: on these T4s every free milli-GPU is a fragment,
    # so a pod's growth is minus what it takes: -300 (57) or -1000 (73).
    picky = Workload(((TaskShape(gpus=1, mem=100, core=100, gpu_spec=frozenset({"A100"})), 1.0),))
    result = evaluate(milli_node(gpus=2).view(), pod, FgdPolicy(picky))
    assert isinstance(result, Placement) and result.score == score


def test_bestfit_takes_the_fullest_gpu_and_scores_cpu_and_gpu_left():
    state = milli_node(gpus=3, cpu=64_000 + 2000)
    for key, req in (("a", sharing(700, cpu=1000)), ("b", sharing(400, cpu=1000))):
        result = evaluate(state.view(), req, BestFitPolicy())
        assert isinstance(result, Placement)
        state.add(key, to_allocation(req, result.assignment, state.inventory, T0))
    result = evaluate(state.view(), sharing(200, cpu=4000), BestFitPolicy())
    assert isinstance(result, Placement)
    assert state.view().gpus[result.assignment.gpus[0][0]].mem_free == 300
    # floor(100 * (1 - (64000-4000)/128000/2 - (1900-200)/8000/2)) = floor(65.94) = 65
    assert result.score == 65


def test_bestfit_leaves_the_cpu_of_a_pod_that_asks_none_on_the_node():
    # floor(100 * (1 - 2561/128000/2 - 0/8000/2)) = floor(98.9996): a milli-CPU counted
    # for the pod would make it 99.
    state = milli_node(gpus=1, cpu=2561)
    result = evaluate(state.view(), sharing(1000, cpu=0), BestFitPolicy())
    assert isinstance(result, Placement) and result.score == 98


def test_bestfit_scores_a_node_larger_than_the_papers_scales_zero_not_below():
    # 19.9 GPUs left: 1 - 19900/8000/2 < 0. Still a place the pod fits, at the bottom.
    result = evaluate(milli_node(gpus=20).view(), sharing(100), BestFitPolicy())
    assert isinstance(result, Placement) and result.score == 0


def test_bestfit_counts_what_a_slice_leaves_by_the_scarcer_of_memory_and_compute():
    # 200 milli of memory and 600 of compute: the GPU keeps 800 and 400, so 400 milli-GPU.
    # floor(100 * (1 - 16000/128000/2 - 400/8000/2)) = floor(91.25)
    slice_ = ContainerRequest("main", ContainerRole.APP, 0, gpus=1, mem=200, core=600)
    result = evaluate(milli_node(gpus=1).view(), PodRequest((slice_,)), BestFitPolicy())
    assert isinstance(result, Placement) and result.score == 91


def test_fgd_counts_the_gpu_its_slice_fills_with_pods_as_a_fragment():
    # One pod per GPU: the 300-milli slice leaves GPU 0 with 700 free that no other pod
    # may use. F goes 0 -> 700: floor(100 * sigmoid(-0.7)) = 33.
    workload = Workload(((TaskShape(gpus=1, mem=300, core=300), 1.0),))
    state = milli_node(gpus=2, max_pods_per_gpu=1)
    result = evaluate(state.view(), sharing(300, cpu=0), FgdPolicy(workload))
    assert isinstance(result, Placement) and result.score == 33


def test_the_typical_workload_keeps_the_popular_shapes_covering_95_percent():
    a, b, c, d = (TaskShape(gpus=1, mem=m, core=m) for m in (100, 200, 300, 400))
    kept = Workload.typical({a: 50, b: 30, c: 15, d: 5})
    assert [s for s, _ in kept.tasks] == [a, b, c]
    assert [p for _, p in kept.tasks] == pytest.approx([50 / 95, 30 / 95, 15 / 95])
    assert len(Workload.typical({a: 50, b: 30, c: 14, d: 6}).tasks) == 4


def test_expected_next_counts_each_task_that_fits_by_its_own_cpu():
    # 300 milli with 2 CPUs (.5) and 300 milli asking no CPU (.5); GPUs with 600 and 1000
    # free (G = 1600), 1 CPU left. F = .5 * 1600 (the first does not fit). The first
    # cannot come next (F stays); the second lands anywhere: G = 1300, F = .5 * 1300.
    with_cpu = TaskShape(gpus=1, mem=300, core=300, cpu_milli=2000)
    workload = Workload(((with_cpu, 0.5), (TaskShape(gpus=1, mem=300, core=300), 0.5)))
    frag = Fragmentation(workload)
    state = milli_node(gpus=2, cpu=3000)
    result = evaluate(state.view(), sharing(400, cpu=2000), BestFitPolicy())
    assert isinstance(result, Placement)
    state.add("a", to_allocation(sharing(400, cpu=2000), result.assignment, state.inventory, T0))
    models_, _, gpus = parts(state)
    assert frag.expected_next(models_, 1000, gpus) == pytest.approx(0.5 * 800 + 0.5 * 650)
    # With exactly 2 CPUs left the first fits (F = 0) and leaves none: F = .5 * 1300 then.
    assert frag.expected_next(models_, 2000, gpus) == pytest.approx(0.5 * 650)


def test_every_pod_without_gpus_finds_all_free_gpu_a_fragment():
    # Two CPU-only shapes (.3 and .2) and a slice that fits: F = (.3 + .2) * 2000.
    workload = Workload(
        (
            (TaskShape(gpus=1, mem=300, core=300), 0.5),
            (TaskShape(gpus=0, cpu_milli=1000), 0.3),
            (TaskShape(gpus=0, cpu_milli=2000), 0.2),
        )
    )
    assert Fragmentation(workload).of_view(milli_node(gpus=2).view()) == pytest.approx(1000)


def test_expected_next_a_whole_gpu_pod_takes_only_the_gpus_it_asks_for():
    # GPU 0 has 600 free, GPUs 1-3 are whole. Pods of one whole GPU (.7) and of two (.3):
    # F = .7 * 600 + .3 * 600. After a one-GPU pod two whole GPUs are left: F = 600; after
    # a two-GPU pod one: the two-GPU pod no longer fits, F = .7 * 600 + .3 * 1600 = 900.
    workload = Workload(
        (
            (TaskShape(gpus=1, exclusive=True), 0.7),
            (TaskShape(gpus=2, exclusive=True), 0.3),
        )
    )
    state = milli_node(gpus=4)
    result = evaluate(state.view(), sharing(400), BestFitPolicy())
    assert isinstance(result, Placement)
    state.add("a", to_allocation(sharing(400), result.assignment, state.inventory, T0))
    frag = Fragmentation(workload)
    assert frag.of_view(state.view()) == pytest.approx(600)
    assert frag.expected_next(*parts(state)) == pytest.approx(0.7 * 600 + 0.3 * 900)


def test_each_answer_is_worked_out_once_and_served_from_the_memo_after(monkeypatch):
    """A scheduler asks F, stranding and the look-ahead of the same GPUs again and again;
    the second asking of each must cost a look-up, not the work."""
    frag = Fragmentation(WORKLOAD)
    work: list[str] = []
    compute, afters = frag._compute, frag._afters
    monkeypatch.setattr(frag, "_compute", lambda *a: work.append("F") or compute(*a))
    monkeypatch.setattr(frag, "_afters", lambda *a: work.append("next") or afters(*a))
    copies = type(frag._strand_groups[0]).copies
    monkeypatch.setattr(
        type(frag._strand_groups[0]), "copies", lambda g, d: work.append("copies") or copies(g, d)
    )
    state = parts(loaded(cpu=2500))
    first = (frag.of(*state), frag.stranded(*state[1:]), frag.expected_next(*state))
    done = len(work)
    assert {"F", "next", "copies"} <= set(work)
    frag._copies.clear()  # what stranding is made of: only a stranding not kept needs it
    again = (frag.of(*state), frag.stranded(*state[1:]), frag.expected_next(*state))
    assert again == first and len(work) == done  # nothing worked out again
    # Another CPU amount with the same GPUs: the stranding is new, the copies are not.
    frag.stranded(state[1] - 1000, state[2])
    frag.stranded(state[1] - 500, state[2])
    assert work[done:] == ["copies"] * len(frag._strand_groups)  # once per group, once
