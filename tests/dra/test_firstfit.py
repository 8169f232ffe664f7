"""What the allocator gives an ACK request's claim on a node, as our allocation record:
the first eligible GPUs by index, which the extender charges between kube-scheduler's
bind and the driver's record. (The device choice itself: tests/simulator/test_dra.py.)"""

from gpushare.allocation import UNKNOWN_BIND_TIME
from gpushare.dra.firstfit import SHARES_PER_GPU, DeviceLeft, allocation_on, devices_left, first_fit
from gpushare.placement.fit import Assignment, to_allocation
from gpushare.request import ContainerRequest, ContainerRole, PodRequest
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


def _pod(*containers: tuple[int, int, int, bool], spec: frozenset[str] | None = None) -> PodRequest:
    """A pod of containers given as (GPUs, GiB, percent compute, whole GPUs)."""
    return PodRequest(
        containers=tuple(
            ContainerRequest(f"c{i}", ContainerRole.APP, i, gpus, mem, core, exclusive)
            for i, (gpus, mem, core, exclusive) in enumerate(containers)
        ),
        gpu_spec=spec,
    )


def _fresh(*models: str, memory: int = 16, cores: int = 100) -> list[DeviceLeft]:
    return [DeviceLeft(i, m, memory, cores, SHARES_PER_GPU, True) for i, m in enumerate(models)]


def test_the_slice_order_decides_which_device_comes_first():
    fit = first_fit(_fresh("T4", "T4"), _pod((1, 4, 0, False)), order=[1, 0])
    assert fit is not None and fit.gpus == ((1,),)


def test_devices_of_a_model_the_claim_does_not_accept_are_passed_over():
    fit = first_fit(_fresh("A10", "T4", "T4"), _pod((1, 4, 0, False), spec=frozenset({"T4"})))
    assert fit is not None and fit.gpus == ((1,),)


def test_a_slice_that_asks_exactly_what_is_left_fits():
    exact = [DeviceLeft(0, "T4", 6, 30, 1, False)]
    fit = first_fit(exact, _pod((1, 6, 30, False)))
    assert fit is not None and fit.gpus == ((0,),)


def test_later_requests_see_the_memory_and_compute_earlier_ones_took():
    by_memory = first_fit(_fresh("T4", "T4"), _pod((1, 10, 0, False), (1, 10, 0, False)))
    assert by_memory is not None and by_memory.gpus == ((0,), (1,))
    by_compute = first_fit(_fresh("T4", "T4"), _pod((1, 2, 60, False), (1, 2, 60, False)))
    assert by_compute is not None and by_compute.gpus == ((0,), (1,))
    both_fit = first_fit(_fresh("T4", "T4"), _pod((1, 8, 50, False), (1, 8, 50, False)))
    assert both_fit is not None and both_fit.gpus == ((0,), (0,))
    assert both_fit.added == ((0, 16, 100),)


def test_a_whole_gpu_taken_by_one_request_is_not_given_to_the_next():
    fit = first_fit(_fresh("T4", "T4"), _pod((1, 16, 0, True), (1, 16, 0, True)))
    assert fit is not None and fit.gpus == ((0,), (1,))
    assert fit.added == ((0, 16, 100), (1, 16, 100))
    # Nothing of a whole GPU is left for a slice of the same claim, not even 1 GiB.
    fit = first_fit(_fresh("T4", "T4"), _pod((1, 16, 0, True), (1, 1, 1, False)))
    assert fit is not None and fit.gpus == ((0,), (1,))


def test_what_the_claim_adds_to_each_device_it_touches():
    left = [DeviceLeft(0, "T4", 16, 100, 20, True), DeviceLeft(1, "T4", 12, 70, 19, False)]
    fit = first_fit(left, _pod((2, 4, 30, False)))
    assert fit is not None and fit.gpus == ((0, 1),)
    assert fit.added == ((0, 4, 30), (1, 4, 30))


def test_shares_left_count_the_pods_a_gpu_holds_down_to_none():
    state = node_state("2x32GiB")
    _holding(state, "first", gpu=0, mem=1)
    assert [d.shares for d in devices_left(state)] == [SHARES_PER_GPU - 1, SHARES_PER_GPU]
    for n in range(SHARES_PER_GPU - 1):
        _holding(state, f"p{n}", gpu=1, mem=1)
    _holding(state, "last", gpu=1, mem=1)
    assert [d.shares for d in devices_left(state)] == [SHARES_PER_GPU - 1, 0]
