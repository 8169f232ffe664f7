"""What the allocator gives an ACK request's claim on a node, as our allocation record:
the first eligible GPUs by index, which the extender charges between kube-scheduler's
bind and the driver's record. (The device choice itself: tests/simulator/test_dra.py.)"""

from gpushare.allocation import UNKNOWN_BIND_TIME
from gpushare.dra.firstfit import SHARES_PER_GPU, DeviceLeft, allocation_on, devices_left, first_fit
from gpushare.placement.fit import Assignment, to_allocation
from gpushare.state import NodeState
from tests.builders import container, node_state, request


def _holding(state: NodeState, key: str, gpu: int, mem: int) -> NodeState:
    """The node with a pod of `mem` GiB on GPU `gpu`."""
    assignment = Assignment(gpus=((gpu,),), added=((gpu, mem, 0),))
    state.add(key, to_allocation(request(mem=mem), assignment, state.inventory, UNKNOWN_BIND_TIME))
    return state


def test_the_first_gpu_with_room_by_index_not_the_best_fitting_one():
    state = _holding(node_state("3x16GiB"), "big", gpu=0, mem=14)
    _holding(state, "mid", gpu=2, mem=12)
    # GPU 2 has exactly 4 GiB left: every policy of ours would complete it.
    placed = allocation_on(state, request(mem=4), UNKNOWN_BIND_TIME)
    assert placed is not None
    assert placed.node == "n1" and placed.gpu_indices == (1,)
    (slice_,) = placed.containers[0].gpus
    assert (slice_.mem, slice_.gpu_mem) == (4, 16)


def test_a_claim_that_fits_no_gpu_gets_nothing():
    state = _holding(node_state("2x16GiB"), "a", gpu=0, mem=10)
    _holding(state, "b", gpu=1, mem=10)
    assert allocation_on(state, request(mem=8), UNKNOWN_BIND_TIME) is None


def test_whole_gpus_and_several_containers_take_distinct_untouched_gpus():
    state = _holding(node_state("4x16GiB"), "small", gpu=1, mem=1)
    placed = allocation_on(
        state,
        request(containers=[container("train", count=2), container("eval", 3)]),
        UNKNOWN_BIND_TIME,
    )
    assert placed is not None
    train, evaluate = placed.containers
    assert train.exclusive and [g.index for g in train.gpus] == [0, 2]
    assert [g.index for g in evaluate.gpus] == [1]  # a slice still fits beside "small"


def test_each_device_left_reports_its_model_and_an_unhealthy_one_no_share():
    state = node_state("2x16GiB:T4", unhealthy=(1,))
    left = devices_left(state)
    assert [(d.index, d.model) for d in left] == [(0, "T4"), (1, "T4")]
    assert [(d.memory, d.shares) for d in left] == [(16, SHARES_PER_GPU), (0, 0)]


def test_each_slice_of_a_claim_takes_one_share_of_its_device():
    two = request(containers=[container("a", 1), container("b", 1)])
    one_share_left = [
        DeviceLeft(0, "T4", 16, 100, 1, False),
        DeviceLeft(1, "T4", 16, 100, 20, True),
    ]
    fit = first_fit(one_share_left, two)
    assert fit is not None and fit.gpus == ((0,), (1,))
    two_shares_left = [
        DeviceLeft(0, "T4", 16, 100, 2, False),
        DeviceLeft(1, "T4", 16, 100, 20, True),
    ]
    fit = first_fit(two_shares_left, two)
    assert fit is not None and fit.gpus == ((0,), (0,))
