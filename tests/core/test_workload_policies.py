"""The fragmentation-aware policies on Kubernetes nodes (GiB, CPU not tracked), through
the same evaluate() the extender calls, and learning the workload online."""

from functools import partial

import pytest

from gpushare.errors import Refusal, Rule
from gpushare.placement import workload
from gpushare.placement.bestfit import BestFitPolicy
from gpushare.placement.fgd import FgdPolicy, fgd_score
from gpushare.placement.fit import Placement, evaluate, to_allocation
from gpushare.placement.fragmentation import Fragmentation, devices, devices_after, models
from gpushare.placement.lookahead import (
    WHOLE_NODE_SHARE,
    WIDE_SHARE,
    LookaheadFgdPolicy,
    single_gpu_share,
    weights,
)
from gpushare.placement.policies import (
    OUR_POLICY,
    POLICIES,
    BinpackPolicy,
    SpreadPolicy,
)
from gpushare.placement.workload import (
    PRIOR,
    SHAPES_LIMIT,
    LearnedWorkload,
    TaskShape,
    Workload,
)
from gpushare.request import PodRequest
from gpushare.state import NodeState
from tests.builders import T0, container, node_state, request
from tests.core.test_host_resources import milli_node, sharing, whole
from tests.core.test_preemption import put

# Learned on Kubernetes: shapes in GiB, no CPU.
HALF_GPUS = Workload(((TaskShape(gpus=1, mem=8), 0.7), (TaskShape(gpus=1, exclusive=True), 0.3)))


def place(state: NodeState, req, policy, key: str) -> Placement:
    result = evaluate(state.view(), req, policy)
    assert isinstance(result, Placement), result
    state.add(key, to_allocation(req, result.assignment, state.inventory, T0))
    return result


def test_our_policy_is_registered_and_selectable_by_name():
    assert OUR_POLICY == "fgd-lookahead"
    assert isinstance(POLICIES[OUR_POLICY](), LookaheadFgdPolicy)
    assert {"binpack", "spread", "bestfit", "fgd", "fgd-lookahead"} <= set(POLICIES)


def test_gib_amounts_are_judged_as_fractions_of_the_gpu():
    state = node_state("2x16GiB")
    place(state, request(mem=10), FgdPolicy(HALF_GPUS), "a")
    # GPU 0 has 6 of 16 GiB free = 375 milli-GPU; an 8 GiB pod cannot use it, a whole-GPU
    # pod cannot either (not free of pods); GPU 1 (1000) fits both.
    frag = Fragmentation(HALF_GPUS)
    assert frag.of_view(state.view()) == pytest.approx(0.7 * 375 + 0.3 * 375)


@pytest.mark.parametrize("policy", [FgdPolicy(HALF_GPUS), LookaheadFgdPolicy(HALF_GPUS)])
def test_a_slice_completes_a_half_used_gpu_rather_than_opening_one(policy):
    state = node_state("2x16GiB")
    place(state, request(mem=8), policy, "a")
    assert place(state, request(mem=8), policy, "b").assignment.gpus == ((0,),)
    assert state.used(0)[0] == 16 and state.used(1)[0] == 0


def test_a_slice_tries_every_gpu_past_two_empty_alike_ones():
    # GPUs 0 and 1 are empty (one judgement serves both); GPU 2 is half used: the slice
    # completes it.
    state = node_state("3x16GiB")
    put(state, "a", 2, mem=8)
    assert place(state, request(mem=8), FgdPolicy(HALF_GPUS), "b").assignment.gpus == ((2,),)


# Half of the GPUs requested go to 2-GPU jobs: fgd-lookahead takes its smaller weights.
WITH_TWO_GPU_JOBS = Workload(
    (
        (TaskShape(gpus=1, mem=8), 0.35),
        (TaskShape(gpus=1, exclusive=True), 0.15),
        (TaskShape(gpus=2, exclusive=True), 0.5),
    )
)


@pytest.mark.parametrize("name", ["fgd", "fgd-lookahead"])
@pytest.mark.parametrize("workload", [HALF_GPUS, WITH_TWO_GPU_JOBS])
def test_the_node_where_the_slice_fits_snugly_scores_higher(name, workload):
    # fgd-lookahead at both ends of its weights: 2 for HALF_GPUS, 0.5 with the 2-GPU jobs.
    policy = POLICIES[name]().with_workload(workload)  # type: ignore[attr-defined]
    snug, loose = snug_and_loose(policy)
    assert snug > loose


def test_a_node_without_pods_is_opened_as_with_the_smaller_weights():
    # At the larger weights (2 and 0.45 for HALF_GPUS) the half-used GPU a slice leaves on
    # an empty node counts the next slice's expected fill as progress: the empty node
    # would score 51, above 48.5 for completing a half-used GPU elsewhere (the snug case).
    policy = LookaheadFgdPolicy(HALF_GPUS)
    assert (policy.next_weight, policy.cpu_weight) == (2.0, 0.45)
    empty = node_state("2x16GiB")
    view = empty.view()
    result = evaluate(view, request(mem=8), policy)
    assert isinstance(result, Placement)
    gpu_models, before = models(view), devices(view)
    after = devices_after(view, result.assignment)

    def growth(waste) -> float:
        return waste(gpu_models, None, after) - waste(gpu_models, None, before)

    smaller = partial(policy.weighed, next_weight=0.5, cpu_weight=0.15)
    assert growth(policy.opening) == growth(smaller) == pytest.approx(97.5)
    assert result.score == fgd_score(growth(smaller)) == 47
    assert fgd_score(growth(policy.waste)) == 51
    # Once the node holds a pod, the workload's weights count.
    place(empty, request(mem=8), policy, "a")
    assert policy.judge(empty.view()) == policy.waste


def snug_and_loose(policy) -> tuple[float, float]:
    """Scores of an 8 GiB slice on a 2x16 GiB node with one such slice, and on an empty one."""
    half = node_state("2x16GiB", node="half")
    place(half, request(mem=8), policy, "a")
    empty = node_state("2x16GiB", node="empty")
    snug = evaluate(half.view(), request(mem=8), policy)
    loose = evaluate(empty.view(), request(mem=8), policy)
    assert isinstance(snug, Placement) and isinstance(loose, Placement)
    return snug.score, loose.score


def test_single_gpu_share_counts_a_sharing_pod_as_its_gpu_and_multi_gpu_pods_by_theirs():
    workload = Workload(
        (
            (TaskShape(gpus=1, mem=8), 0.4),
            (TaskShape(gpus=1, exclusive=True), 0.2),
            (TaskShape(gpus=4, exclusive=True), 0.1),
            (TaskShape(gpus=0, cpu_milli=1000), 0.3),  # CPU-only: takes no GPU
        )
    )
    assert single_gpu_share(workload) == pytest.approx(0.6 / (0.6 + 0.4))
    assert single_gpu_share(Workload(((TaskShape(gpus=0), 1.0),))) == 1.0


def one_and_eight_gpu_pods(share: float) -> Workload:
    """1-GPU and 8-GPU pods, the 1-GPU ones taking `share` of the GPUs:
    p1 / (p1 + 8 p8) = share."""
    p8 = (1 - share) / (8 * share + 1 - share)
    tasks = ((TaskShape(gpus=1, exclusive=True), 1 - p8), (TaskShape(gpus=8, exclusive=True), p8))
    return Workload(tuple((shape, p) for shape, p in tasks if p > 0))


@pytest.mark.parametrize(
    ("share", "expected"),
    [
        (1.0, (2.0, 0.45)),
        (0.75, (1.25, 0.30)),
        (0.5, (0.5, 0.15)),
        (0.3, (0.5, 0.15)),
        (WHOLE_NODE_SHARE, (0.5, 0.15)),
        (0.2, (0.4, 0.12)),
        (0.125, (0.25, 0.075)),
        (0.0, (0.0, 0.0)),
    ],
)
def test_the_weights_follow_the_share_of_the_gpus_on_single_gpu_pods(share, expected):
    # The larger weights where single-GPU pods take all the GPUs, the smaller from half
    # of them down to a quarter, then less still, to FGD's none where they take none.
    workload = one_and_eight_gpu_pods(share)
    assert single_gpu_share(workload) == pytest.approx(share)
    assert weights(workload) == pytest.approx(expected)


def test_where_multi_gpu_pods_dominate_a_node_is_opened_with_the_workloads_smaller_weights():
    policy = LookaheadFgdPolicy(one_and_eight_gpu_pods(0.125))
    assert (policy.next_weight, policy.cpu_weight) == pytest.approx((0.25, 0.075))
    state = node_state("2x16GiB")
    place(state, request(mem=8), policy, "a")  # what opening the node leaves it
    view = state.view()
    gpus, gpu_models = devices(view), models(view)
    workloads = policy.weighed(gpu_models, None, gpus, next_weight=0.25, cpu_weight=0.075)
    smaller = policy.weighed(gpu_models, None, gpus, next_weight=0.5, cpu_weight=0.15)
    assert policy.opening(gpu_models, None, gpus) == pytest.approx(workloads)
    assert workloads != pytest.approx(smaller)


def test_learned_online_the_weights_follow_the_learned_workload():
    policy = LookaheadFgdPolicy()
    # The prior: about three quarters of its GPUs on single-GPU pods.
    assert policy.next_weight == pytest.approx(weights(policy.workload)[0])
    assert 0.5 < policy.next_weight < 2.0
    for _ in range(400):
        policy.observe(request(mem=4))
    assert (policy.next_weight, policy.cpu_weight) == (2.0, 0.45)
    epoch = policy.epoch
    for _ in range(3000):
        policy.observe(request(count=8))
    assert policy.epoch > epoch
    # Nearly all the GPUs now go to 8-GPU pods: the weights fall to nearly FGD's none.
    assert single_gpu_share(policy.workload) < 0.05
    assert (policy.next_weight, policy.cpu_weight) == pytest.approx(weights(policy.workload))
    assert policy.next_weight < 0.1 and policy.cpu_weight < 0.03


def test_our_policy_leaves_the_hole_the_next_popular_pod_fills_exactly():
    # Pods of 5 and 11 GiB, equally common, on 16 GiB GPUs; GPU 0 holds 3 GiB (13 free),
    # GPU 1 is empty. For an 11 GiB pod FGD takes GPU 0 (F lowest now), leaving 2 GiB
    # nobody uses; looking one pod ahead, ours takes GPU 1 and leaves 5 GiB there, just
    # what the popular 5 GiB pod needs (and GPU 0 keeps room for two of them).
    workload = Workload(((TaskShape(gpus=1, mem=5), 0.5), (TaskShape(gpus=1, mem=11), 0.5)))
    chosen = {}
    for policy in (FgdPolicy(workload), LookaheadFgdPolicy(workload)):
        state = node_state("2x16GiB")
        place(state, request(mem=3), policy, "small")
        assert state.used(0)[0] == 3
        chosen[policy.name] = place(state, request(mem=11), policy, "next").assignment.gpus
    assert chosen == {"fgd": ((0,),), "fgd-lookahead": ((1,),)}


def test_expected_next_on_kubernetes_nodes_with_the_priors_fractions():
    # The prior's shapes are fractions of a GPU: 500 milli of a 16 GiB GPU is 8 GiB.
    half = Workload(((TaskShape(gpus=1, mem=500, fraction=True), 1.0),))
    frag = Fragmentation(half)
    state = node_state("1x16GiB")
    place(state, request(mem=4), FgdPolicy(half), "a")
    view = state.view()
    # 12 GiB free (750): a half fits, leaving 4 GiB (250) that no half can use.
    assert frag.of_view(view) == 0
    assert frag.expected_next(models(view), None, devices(view)) == pytest.approx(250)


def test_expected_next_after_a_slice_the_gpu_takes_no_whole_gpu_pod_and_has_less_memory():
    # An empty 16 GiB GPU; pods of half a GPU (.4), a whole GPU (.3) and 10 GiB (.3): all
    # fit, F = 0. After a half (8 GiB and 500 left) neither a whole-GPU pod nor a 10 GiB
    # one fits: F = .6 * 500. After a whole GPU nothing is left: 0. After 10 GiB (6 left,
    # 375 milli) nothing fits: F = 375. Expected: .4 * 300 + .3 * 0 + .3 * 375.
    half = TaskShape(gpus=1, mem=500, fraction=True)
    workload = Workload(
        ((half, 0.4), (TaskShape(gpus=1, exclusive=True), 0.3), (TaskShape(gpus=1, mem=10), 0.3))
    )
    view = node_state("1x16GiB").view()
    frag = Fragmentation(workload)
    assert frag.of_view(view) == 0
    assert frag.expected_next(models(view), None, devices(view)) == pytest.approx(232.5)


def test_expected_next_a_slice_leaving_under_a_gib_leaves_nothing_to_place_on():
    # 12 of 16 GiB free (750 milli). A 700-milli pod leaves 50 milli but 0.8 GiB: no pod
    # can use it, the GPU counts as full (F = 0); a 50-milli pod leaves room for either.
    frag = Fragmentation(
        Workload(
            (
                (TaskShape(gpus=1, mem=700, fraction=True), 0.5),
                (TaskShape(gpus=1, mem=50, fraction=True), 0.5),
            )
        )
    )
    state = node_state("1x16GiB")
    place(state, request(mem=4), FgdPolicy(HALF_GPUS), "a")
    view = state.view()
    assert frag.of_view(view) == 0
    assert frag.expected_next(models(view), None, devices(view)) == 0


def test_expected_next_a_slice_takes_its_compute_share_too():
    # 15 GiB and 95% free: 937 milli. A pod of 4 GiB and 60% leaves 11 GiB and 35%:
    # min(937 * 11 // 15, 937 * 35 // 95) = 345 milli, and no room for another: F = 345.
    frag = Fragmentation(Workload(((TaskShape(gpus=1, mem=4, core=60), 1.0),)))
    state = node_state("1x16GiB", mode="core_mem")
    place(state, request(mem=1, core=5), FgdPolicy(HALF_GPUS), "a")
    view = state.view()
    assert frag.of_view(view) == 0
    assert frag.expected_next(models(view), None, devices(view)) == pytest.approx(345)


def test_our_policy_prefers_a_node_in_use_over_an_equally_good_empty_one():
    policy = LookaheadFgdPolicy(HALF_GPUS)
    busy = node_state("4x16GiB", node="busy")
    place(busy, request(count=1), policy, "whole")
    empty = node_state("4x16GiB", node="empty")
    req = request(count=1)
    on_busy, on_empty = (evaluate(s.view(), req, policy) for s in (busy, empty))
    assert isinstance(on_busy, Placement) and isinstance(on_empty, Placement)
    assert (on_busy.score, on_empty.score) == (50.5, 50.0)  # wins the tie, not a step
    # A pod on a GPU gone unhealthy does not make its node one in use.
    broken = node_state("4x16GiB", node="broken", unhealthy=(0,))
    put(broken, "stuck", 0, 4)
    on_broken = evaluate(broken.view(), req, policy)
    assert isinstance(on_broken, Placement) and on_broken.score == 50.0


def test_the_registered_policies_start_from_the_prior_and_learn():
    policy = LookaheadFgdPolicy()
    assert policy.learns and policy.workload == PRIOR.typical_part(policy.coverage, wide=WIDE_SHARE)
    epoch = policy.epoch
    for _ in range(400):
        policy.observe(request(mem=4))
    assert policy.epoch > epoch
    shapes = dict(policy.workload.tasks)
    assert shapes[TaskShape(gpus=1, mem=4)] > 0.5


def test_the_learned_workload_follows_a_change_and_forgets_the_old():
    learned = LearnedWorkload(half_life=200, check_every=50)
    small, large = TaskShape(gpus=1, mem=2), TaskShape(gpus=1, mem=12)
    changes = sum(learned.observe(small) for _ in range(1000))
    assert changes >= 1 and dict(learned.current.tasks)[small] > 0.9
    for _ in range(2000):
        learned.observe(large)
    # Adopted within the tolerance (5% total variation) of the decayed histogram.
    assert dict(learned.current.tasks).get(small, 0.0) < 0.06
    assert dict(learned.current.tasks)[large] > 0.9


def test_a_steady_workload_stops_changing_the_epoch():
    learned = LearnedWorkload(check_every=100, tolerance=0.05)
    shapes = [TaskShape(gpus=1, mem=m) for m in (2, 4, 8)]
    changes = [learned.observe(shapes[i % 3]) for i in range(6000)]
    assert sum(changes[:1000]) >= 1
    assert sum(changes[3000:]) == 0


def test_after_very_many_pods_each_pod_still_weighs_by_its_age():
    # half_life=1: each pod weighs twice the one before (the weights kept inside grow as
    # 2^n and are rescaled once past 1e12, at the 40th pod: that must not show). After 40
    # pods, pod 30 (`rare`) weighs 2^-10 of the last pod and all 40 weigh 2 - 2^-39. The
    # prior, 10 pods' worth before the first, is down to 10 * 2^-40 of a pod: forgotten.
    old, steady, rare, new = (TaskShape(gpus=1, mem=m) for m in (1, 2, 3, 4))
    learned = LearnedWorkload(
        Workload(((old, 1.0),)), prior_weight=10, half_life=1, check_every=1, tolerance=0
    )
    for n in range(1, 41):
        learned.observe(rare if n == 30 else steady)
    total = 2 - 2**-39
    shares = dict(learned.current.tasks)
    assert shares.keys() == {steady, rare}
    assert shares[rare] == pytest.approx(2**-10 / total)
    # The next pod weighs 2, as much as all the pods before it together.
    learned.observe(new)
    assert dict(learned.current.tasks)[new] == pytest.approx(2 / (total + 2))


def test_a_shape_down_to_a_millionth_of_a_pod_is_forgotten():
    # A prior of 2^40 millionths of a pod, halved by each of 40 pods (half_life=1): a
    # millionth of a pod when the 40th pod comes, and dropped then.
    old, steady = TaskShape(gpus=1, mem=1), TaskShape(gpus=1, mem=2)
    learned = LearnedWorkload(
        Workload(((old, 1.0),)), prior_weight=1e-6 * 2**40, half_life=1, check_every=1, tolerance=0
    )
    for _ in range(39):
        learned.observe(steady)
    assert old in dict(learned.current.tasks)
    learned.observe(steady)
    assert dict(learned.current.tasks) == {steady: 1.0}


def test_past_the_limit_of_shapes_the_lighter_half_is_forgotten(monkeypatch):
    monkeypatch.setattr(workload, "SHAPES_LIMIT", 4)
    prior, b, c, d, e = (TaskShape(gpus=1, mem=m) for m in (1, 2, 3, 4, 5))
    learned = LearnedWorkload(
        Workload(((prior, 1.0),)), prior_weight=10, half_life=1e12, check_every=1, tolerance=0
    )
    for shape in (b, b, b, c, c, d):
        learned.observe(shape)
    assert learned.shapes == 4
    # A fifth shape: the two heaviest stay (the prior's 10 pods and b's 3), then e counts.
    learned.observe(e)
    assert learned.shapes == 3
    shares = dict(learned.current.tasks)
    assert shares.keys() == {prior, b, e}
    assert shares[prior] == pytest.approx(10 / 14) and shares[e] == pytest.approx(1 / 14)
    # A shape counted already is counted again, whatever the count of shapes.
    learned.observe(b)
    assert learned.shapes == 3 and dict(learned.current.tasks)[b] == pytest.approx(4 / 15)


def test_a_stream_of_pods_of_new_shapes_is_bounded_and_the_steady_workload_stays():
    # Tenants choose their pods' CPU requests: one new shape a pod.
    learned = LearnedWorkload()
    steady = TaskShape(gpus=1, mem=4)
    for _ in range(2000):
        learned.observe(steady)
    for cpu in range(2 * SHAPES_LIMIT):
        learned.observe(TaskShape(gpus=1, mem=4, cpu_milli=1000 + cpu))
        assert learned.shapes <= SHAPES_LIMIT
    assert learned.shapes > SHAPES_LIMIT // 2
    assert dict(learned.current.tasks)[steady] > 0.1


def test_fixed_and_learning_copies_are_fresh_objects_of_the_same_class():
    registered = POLICIES["fgd-lookahead"]()
    fixed = registered.with_workload(HALF_GPUS)  # type: ignore[attr-defined]
    assert type(fixed) is type(registered) and fixed is not registered and not fixed.learns
    fixed.observe(request(mem=4))
    assert fixed.epoch == 0
    assert registered.learning().learns  # type: ignore[attr-defined]


def test_what_our_policy_learns_online_changes_where_it_places():
    def eleven_gib_goes_to(policy: LookaheadFgdPolicy):
        state = node_state("2x16GiB")
        place(state, request(mem=3), policy, "small")
        assert state.used(0)[0] == 3
        return place(state, request(mem=11), policy, "big").assignment.gpus

    policy = LookaheadFgdPolicy()
    # The prior expects many whole-GPU pods: keep GPU 1 free of pods.
    assert eleven_gib_goes_to(policy) == ((0,),)
    for i in range(300):  # the extender's filter observes every pod it is asked about
        policy.observe(request(mem=5 if i % 2 else 11))
    # Only 5 and 11 GiB pods come: leave GPU 1 with the 5 GiB the next one needs.
    assert eleven_gib_goes_to(policy) == ((1,),)


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize(
    "req",
    [request(mem=4), request(mem=6, core=30), request(count=1), request(count=2)],
    ids=["4GiB", "6GiB+30%", "1 GPU", "2 GPUs"],
)
def test_every_registered_policy_places_on_kubernetes_nodes(name, req):
    policy = POLICIES[name]()
    busy = node_state("4x16GiB", node="busy", mode="core_mem")
    place(busy, request(mem=10), policy, "a")
    place(busy, request(mem=6), policy, "b")
    nodes = [busy.view(), node_state("2x16GiB", node="small", mode="core_mem").view()]
    placements = [(evaluate(v, req, policy), v) for v in nodes]
    fitting = [(p, v) for p, v in placements if isinstance(p, Placement)]
    assert fitting, placements
    placement, view = max(fitting, key=lambda pv: pv[0].score)
    # The placement fits the node it would go to.
    added = {index: (mem, core) for index, mem, core in placement.assignment.added}
    for gpu in view.gpus:
        mem, core = added.get(gpu.index, (0, 0))
        assert mem <= gpu.mem_free and core <= gpu.core_free


def test_bestfit_on_kubernetes_nodes_scores_the_gpu_left_in_fractions_of_a_gpu():
    # 12 of 16 GiB and 16 of 16 left: 750 + 1000 milli-GPU; CPU not tracked.
    # floor(100 * (1 - 1750 / 8000 / 2)) = floor(89.06)
    result = evaluate(node_state("2x16GiB").view(), request(mem=4), BestFitPolicy())
    assert isinstance(result, Placement) and result.score == 89


def test_spread_takes_the_gpu_with_the_most_compute_left_among_equally_empty_ones():
    state = node_state("2x16GiB", mode="core_mem")
    place(state, request(mem=4, core=50), BinpackPolicy(), "a")
    place(state, request(mem=4, core=10), SpreadPolicy(), "b")
    assert (state.used(0)[:2], state.used(1)[:2]) == ((4, 50), (4, 10))
    result = place(state, request(mem=2, core=10), SpreadPolicy(), "c")
    assert result.assignment.gpus == ((1,),)
    # The score is the share of the node's memory left free: 22 of 32 GiB.
    assert result.score == pytest.approx(100 * 22 / 32)


def test_the_learned_workload_is_rederived_at_8_16_32_64_pods_then_every_check():
    learned = LearnedWorkload(check_every=100, tolerance=0)
    new = TaskShape(gpus=1, mem=3)
    changed = [n for n in range(1, 201) if learned.observe(new)]
    assert changed == [8, 16, 32, 64, 100, 200]


def test_distance_is_the_total_variation():
    a, b = TaskShape(gpus=1, mem=2), TaskShape(gpus=1, mem=4)
    assert Workload(((a, 1.0),)).distance(Workload(((b, 1.0),))) == 1.0
    assert Workload(((a, 0.5), (b, 0.5))).distance(Workload(((a, 1.0),))) == 0.5


def test_a_workload_of_no_weight_is_refused():
    with pytest.raises(ValueError, match="at least one shape with a positive weight"):
        Workload.typical({TaskShape(gpus=1, mem=2): 0.0})


def test_the_shape_of_a_pod_of_several_containers_is_its_largest_slice_on_its_widest():
    shared = request(containers=[container("a", mem=4, core=50), container("b", mem=8, core=30)])
    assert TaskShape.of(shared) == TaskShape(gpus=1, mem=8, core=50)
    whole = request(containers=[container("a", count=1), container("b", count=2)])
    assert TaskShape.of(whole) == TaskShape(gpus=2, exclusive=True)
    mixed = request(containers=[container("a", count=2), container("b", mem=4)])
    assert TaskShape.of(mixed) == TaskShape(gpus=2, mem=4)


def test_the_shape_of_a_pod_without_gpus_keeps_its_cpu_and_gpu_model():
    spec = frozenset({"T4"})
    cpu_only = PodRequest((), cpu_milli=1500, memory_mib=1024, gpu_spec=spec)
    assert TaskShape.of(cpu_only) == TaskShape(gpus=0, cpu_milli=1500, gpu_spec=spec)


def test_the_shape_of_a_gpu_pod_keeps_its_cpu_and_the_gpu_models_it_accepts():
    # A learned pod asking for V100s must not count as fitting on a node of T4s.
    picky = sharing(300, cpu=500, spec=frozenset({"V100M16"}))
    shape = TaskShape.of(picky)
    assert shape == TaskShape(gpus=1, mem=300, core=300, cpu_milli=500, gpu_spec=picky.gpu_spec)
    frag = Fragmentation(Workload(((shape, 1.0),)))
    t4s = milli_node(gpus=2, model="T4")
    assert frag.of_view(t4s.view()) == pytest.approx(2000)  # all of it: the pod cannot come


def test_a_fixed_workload_is_judged_by_its_shapes_covering_95_percent():
    common, rare = TaskShape(gpus=1, mem=4), TaskShape(gpus=1, mem=12)
    policy = FgdPolicy(Workload(((common, 0.96), (rare, 0.04))))
    assert policy.workload == Workload(((common, 1.0),))


def test_a_rare_shape_of_several_gpus_stays_once_it_asks_enough_gpus():
    common, rare_one = TaskShape(gpus=1, mem=4), TaskShape(gpus=1, mem=12)
    eight, two = TaskShape(gpus=8, exclusive=True), TaskShape(gpus=2, exclusive=True)
    mix = Workload(((common, 0.955), (rare_one, 0.0255), (eight, 0.0125), (two, 0.007)))
    assert mix.typical_part() == Workload(((common, 1.0),))
    # 8 x 0.0125 = 0.1 GPU per pod stays; 2 x 0.007 = 0.014 stays at 0.01, not at 0.02;
    # a single-GPU shape never does, however much it asks.
    kept = dict(mix.typical_part(wide=0.01).tasks)
    assert set(kept) == {common, eight, two}
    assert kept[eight] == pytest.approx(0.0125 / 0.9745) and sum(kept.values()) == pytest.approx(1)
    assert set(dict(mix.typical_part(wide=0.02).tasks)) == {common, eight}
    assert set(dict(mix.typical_part(wide=0.014).tasks)) == {common, eight, two}  # at it
    assert mix.typical_part(wide=0.2) == mix.typical_part()
    # The coverage still decides the rest.
    assert set(dict(mix.typical_part(0.97, wide=0.02).tasks)) == {common, rare_one, eight}


def test_our_policy_keeps_rare_wide_shapes_fgd_drops_them():
    common, eight = TaskShape(gpus=1, mem=4), TaskShape(gpus=8, exclusive=True)
    mix = Workload(((common, 0.99), (eight, 0.01)))
    assert dict(FgdPolicy(mix).workload.tasks) == {common: 1.0}
    assert set(dict(LookaheadFgdPolicy(mix).workload.tasks)) == {common, eight}
    assert policy_shapes(LookaheadFgdPolicy()) >= {8, 4}  # the prior's multi-GPU jobs too

    class Wider(LookaheadFgdPolicy):
        coverage = 0.995

    assert (
        len(Wider(Workload(((common, 0.98), (TaskShape(gpus=1, mem=8), 0.02)))).workload.tasks) == 2
    )


def policy_shapes(policy: LookaheadFgdPolicy) -> set[int]:
    return {shape.gpus for shape, _ in policy.workload.tasks}


def test_a_pod_stays_off_the_only_nodes_a_rare_8_gpu_shape_fits():
    # 8-GPU pods asking 120 cores fit only the 128-core nodes; 0.4% of the pods, below
    # the 95% coverage, yet 3% of the GPUs. A 1-GPU pod then takes a 96-core node.
    small, big = whole(1, cpu=8_000), whole(8, cpu=120_000)
    mix = Workload(
        (
            (TaskShape.of(small), 0.96),
            (TaskShape.of(whole(1, cpu=30_000)), 0.036),
            (TaskShape.of(big), 0.004),
        )
    )
    policy = LookaheadFgdPolicy(mix)
    scores = {}
    for cores in (128_000, 96_000):
        result = evaluate(milli_node(gpus=8, cpu=cores, memory=1 << 20).view(), small, policy)
        assert isinstance(result, Placement)
        scores[cores] = result.score
    assert scores[96_000] > scores[128_000]


def test_fgd_gives_a_pod_on_several_gpus_the_fullest_gpus_it_fits_on():
    state = node_state("3x16GiB")
    place(state, request(mem=8), BinpackPolicy(), "a")
    place(state, request(mem=10), SpreadPolicy(), "b")
    assert [state.used(i)[0] for i in range(3)] == [8, 10, 0]
    # 4 GiB on each of two GPUs: GPUs 1 (6 GiB free) and 0 (8 GiB), not the empty one.
    split = request(mem=8, labels={"aliyun.com/gpu-count": "2"})
    assert place(state, split, FgdPolicy(HALF_GPUS), "c").assignment.gpus == ((1, 0),)


def test_each_change_of_the_learned_workload_is_a_new_epoch():
    policy = FgdPolicy()
    epochs = [policy.epoch]
    for i in range(64):
        policy.observe(request(mem=2 if i < 32 else 12))
        if policy.epoch != epochs[-1]:
            epochs.append(policy.epoch)
    assert len(epochs) >= 3 and len(set(epochs)) == len(epochs)


def test_a_pod_on_several_gpus_that_does_not_fit_is_refused_by_the_fragmentation_policies():
    state = node_state("2x16GiB")
    place(state, request(mem=4), BinpackPolicy(), "a")
    for policy in (FgdPolicy(HALF_GPUS), LookaheadFgdPolicy(HALF_GPUS)):
        found = evaluate(state.view(), request(count=2), policy)
        assert isinstance(found, Refusal) and found.rule is Rule.NO_FREE_GPU


def test_a_gpu_at_its_pod_limit_is_all_fragment():
    # GPU 0 holds a 4 GiB pod (12 GiB free, 750 milli). With room for one more pod there
    # the 8 GiB pods can use it: only whole-GPU pods (.3) cannot, F = .3 * 750. At the
    # limit of one pod per GPU nobody can: F = 750.
    frag = Fragmentation(HALF_GPUS)
    for limit, expected in ((2, 0.3 * 750), (1, 750)):
        state = node_state("2x16GiB", max_pods_per_gpu=limit)
        place(state, request(mem=4), BinpackPolicy(), "a")
        assert frag.of_view(state.view()) == pytest.approx(expected)


def test_fgd_counts_a_gpu_still_open_after_the_pod_lands_as_usable():
    # Three pods per GPU; GPU 0 holds one (4 GiB). A 2 GiB pod there leaves 10 GiB and a
    # place for a third pod: F = .3 * 625, down from .3 * 750 (score 50); on GPU 1 it
    # would leave no whole GPU: F = .3 * (750 + 875) (score 43).
    state = node_state("2x16GiB", max_pods_per_gpu=3)
    place(state, request(mem=4), BinpackPolicy(), "a")
    result = place(state, request(mem=2), FgdPolicy(HALF_GPUS), "b")
    assert result.assignment.gpus == ((0,),) and result.score == 50


def test_binpack_scores_a_pod_that_fills_the_node_100():
    result = evaluate(node_state("1x16GiB").view(), request(mem=16), BinpackPolicy())
    assert isinstance(result, Placement) and result.score == 100.0


def test_a_gpu_whose_compute_is_all_taken_has_no_room_left_whatever_memory_it_has():
    # Room is the scarcer of memory and compute: an 8 GiB pod that took all of GPU 0's
    # compute leaves it no room, so with GPU 1 whole the node is judged as one without
    # pods (F alone), although GPU 0 still has 8 GiB free. Counting its memory as room
    # would add the look-ahead (2 x E = 125 here) to a node no next pod can share.
    policy = LookaheadFgdPolicy(
        Workload(((TaskShape(gpus=1, mem=12), 0.5), (TaskShape(gpus=1, mem=4), 0.5)))
    )
    state = node_state("2x16GiB", mode="core_mem")
    place(state, request(mem=8, core=100), policy, "a")
    view = state.view()
    gpus, gpu_models = devices(view), models(view)
    assert gpus[0][0] == 0 and gpus[0][1] == 8  # no free fraction, 8 GiB of memory
    frag = policy.fragmentation
    assert frag.expected_next(gpu_models, None, gpus) == pytest.approx(62.5)
    assert policy.waste(gpu_models, None, gpus) == frag.of(gpu_models, None, gpus) == 0.0
