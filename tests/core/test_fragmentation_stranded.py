"""The GPU a node's CPU strands (Fragmentation.stranded, the CPU term fgd-lookahead adds to
F): per task t of the workload, p_t times the milli-GPU of the copies of t the node's GPUs
could hold beyond the floor(CPU left / CPU of t) copies its CPU can run. Worked by hand."""

import pytest

from gpushare.labels import NodeMode
from gpushare.placement.fragmentation import Fragmentation, devices, models
from gpushare.placement.lookahead import LookaheadFgdPolicy
from gpushare.placement.workload import TaskShape, Workload
from gpushare.state import NodeState
from tests.builders import node_state, request
from tests.core.test_host_resources import milli_node, place, sharing


def one_task(shape: TaskShape) -> Fragmentation:
    return Fragmentation(Workload(((shape, 1.0),)))


def slice_of_400_on_gpu_0(gpus: int) -> NodeState:
    """A simulator node (GPUs of 1000 milli) whose GPU 0 holds a 400-milli pod."""
    state = milli_node(gpus=gpus)
    place(state, sharing(400), "a")
    assert state.used(0)[0] == 400
    return state


def test_gpus_the_cpu_left_cannot_feed_are_stranded():
    # A 300-milli task with 1 CPU: 2 copies fit on the 600 left of GPU 0, 3 on GPU 1, 5 in
    # all, each 300 milli. 2 CPUs run 2 of them: the other 3 copies, 900 milli, are stranded.
    frag = one_task(TaskShape(gpus=1, mem=300, core=300, cpu_milli=1000))
    gpus = devices(slice_of_400_on_gpu_0(gpus=2).view())
    assert frag.stranded(2000, gpus) == pytest.approx(900)
    # The same GPUs asked again with other CPU left: each copy the CPU can run is one less.
    assert frag.stranded(4999, gpus) == pytest.approx(300)
    assert frag.stranded(5000, gpus) == 0
    assert frag.stranded(2000, gpus) == pytest.approx(900)


def test_nodes_without_cpu_tracking_and_tasks_without_cpu_strand_nothing():
    task = TaskShape(gpus=1, mem=300, core=300, cpu_milli=1000)
    gpus = devices(slice_of_400_on_gpu_0(gpus=2).view())
    assert one_task(task).stranded(None, gpus) == 0  # a Kubernetes node: CPU is not ours
    # The prior's tasks name no CPU: the node's CPU never limits them.
    no_cpu = Fragmentation(Workload(((TaskShape(gpus=1, mem=300, core=300), 1.0),)))
    assert no_cpu.stranded(0, gpus) == 0


def test_whole_gpu_copies_take_their_gpu_and_multi_gpu_tasks_strand_nothing():
    # GPU 0 holds a pod; GPUs 1-3 are whole. A whole-GPU task (2 CPUs): 3 copies of 1000
    # milli; 1 CPU left runs none: .5 * 3 * 1000. A 2-GPU task's copies are whole blocks
    # of the node, which F already judges: stranding leaves it out (counting it broke up
    # the nodes multi-GPU pods need, docs/placement.md#workload-mixes).
    frag = Fragmentation(
        Workload(
            (
                (TaskShape(gpus=1, exclusive=True, cpu_milli=2000), 0.5),
                (TaskShape(gpus=2, exclusive=True, cpu_milli=4000), 0.25),
                (TaskShape(gpus=2, mem=700, core=700, cpu_milli=2000), 0.25),
            )
        )
    )
    state = slice_of_400_on_gpu_0(gpus=4)
    assert frag.stranded(1000, devices(state.view())) == pytest.approx(1500)
    # GPU 1 taken: 2 whole GPUs left.
    place(state, sharing(1000), "b")
    assert frag.stranded(1000, devices(state.view())) == pytest.approx(1000)
    # 2 CPUs run one copy.
    assert frag.stranded(2000, devices(state.view())) == pytest.approx(500)
    # With every GPU taken there is nothing left to strand.
    for key in ("c", "d"):
        place(state, sharing(1000), key)
    place(state, sharing(600), "e")
    assert frag.stranded(0, devices(state.view())) == 0


def test_on_gib_gpus_copies_are_counted_in_gib_and_percent_and_weighed_in_milli_gpu():
    # 16 GiB GPUs; GPU 0 holds 1 GiB and 50% compute: 15 GiB and 50% free, 500 milli (its
    # compute is scarcer). A task of 5 GiB and 20%: GPU 0 holds min(15//5, 50//20) = 2
    # copies of 5/15 of its 500 milli (166.7 each); GPU 1 holds min(16//5, 100//20) = 3 of
    # 5/16 of 1000 (312.5 each). 5 copies average 7625/30 milli; 2 CPUs run 2 of them.
    state = node_state("2x16GiB", mode=NodeMode.CORE_MEM)
    place(state, request(mem=1, core=50), "a")
    assert state.used(0)[:2] == (1, 50)
    frag = one_task(TaskShape(gpus=1, mem=5, core=20, cpu_milli=1000))
    assert frag.stranded(2000, devices(state.view())) == pytest.approx(3 * 7625 / 30)


def test_fraction_tasks_and_tasks_without_compute_share_fill_gib_gpus_by_memory():
    # GPU 0 holds 4 GiB: 12 GiB free (750 milli); GPU 1 is free. A task of 300 milli of any
    # GPU fits 750 // 300 + 1000 // 300 = 5 times, 300 each; a 4 GiB task without compute
    # share 12 // 4 + 16 // 4 = 7 times, 250 milli each. 1 CPU runs one of each:
    # stranded = .5 * 4 * 300 + .5 * 6 * 250.
    state = node_state("2x16GiB")
    place(state, request(mem=4), "a")
    assert state.used(0)[0] == 4
    frag = Fragmentation(
        Workload(
            (
                (TaskShape(gpus=1, mem=300, fraction=True, cpu_milli=1000), 0.5),
                (TaskShape(gpus=1, mem=4, cpu_milli=1000), 0.5),
            )
        )
    )
    assert frag.stranded(1000, devices(state.view())) == pytest.approx(
        0.5 * 4 * 300 + 0.5 * 6 * 250
    )


def test_fgd_lookahead_adds_the_stranded_gpu_and_the_next_pods_change_of_f():
    # One task: 300 milli of a T4 and 1 CPU. GPU 0 has 600 free, GPU 1 1000 (G = 1600).
    # A workload of single-GPU pods only takes the larger weights:
    # waste = F + .45 * stranded + 2 * (F after the next pod - F).
    task = TaskShape(gpus=1, mem=300, core=300, cpu_milli=1000, gpu_spec=frozenset({"T4"}))
    policy = LookaheadFgdPolicy(Workload(((task, 1.0),)))
    assert (policy.next_weight, policy.cpu_weight) == (2.0, 0.45)
    view = slice_of_400_on_gpu_0(gpus=2).view()
    t4, gpus = models(view), devices(view)
    # 2.5 CPUs: the task fits before and after the next pod (F = 0), 3 of 5 copies are
    # stranded (900).
    assert policy.waste(t4, 2500, gpus) == pytest.approx(0.45 * 900)
    # 1.5 CPUs: the task fits (F = 0), 4 of its 5 copies are stranded (1200), and the
    # next one leaves too little CPU for another: F = 1300 after it.
    assert policy.waste(t4, 1500, gpus) == pytest.approx(0.45 * 1200 + 2 * 1300)
    # 0.5 CPU: nothing fits (F = G = 1600) and stays so; all 5 copies are stranded.
    assert policy.waste(t4, 500, gpus) == pytest.approx(1600 + 0.45 * 1500)
    # A node without pods is judged by F and the stranded GPU alone: 5 of 6 copies.
    empty = milli_node(gpus=2).view()
    assert policy.waste(t4, 1500, devices(empty)) == pytest.approx(0.45 * 1500)


def test_fgd_lookahead_opens_a_node_with_the_smaller_weights_whatever_the_workload():
    # The workload of the test above takes 2 and 0.45; a node without pods is judged with
    # 0.5 and 0.15 (before and after its first pod), so opening one does not look cheap.
    task = TaskShape(gpus=1, mem=300, core=300, cpu_milli=1000, gpu_spec=frozenset({"T4"}))
    policy = LookaheadFgdPolicy(Workload(((task, 1.0),)))
    empty = milli_node(gpus=2).view()
    t4 = models(empty)
    assert policy.judge(empty) == policy.opening
    assert policy.opening(t4, 1500, devices(empty)) == pytest.approx(0.15 * 1500)
    # After the first pod, as in the test above: 4 of 5 copies stranded, F 1300 after the next.
    used = slice_of_400_on_gpu_0(gpus=2).view()
    assert policy.opening(t4, 1500, devices(used)) == pytest.approx(0.15 * 1200 + 0.5 * 1300)
    assert policy.judge(used) == policy.waste
