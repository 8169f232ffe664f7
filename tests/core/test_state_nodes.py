"""One node's running totals: what placement sees after pods come and go."""

from dataclasses import replace

from gpushare.inventory import Gpu, NodeGpus
from gpushare.labels import NodeMode
from gpushare.placement.fit import Placement, evaluate, to_allocation
from gpushare.placement.policies import BinpackPolicy
from gpushare.request import ContainerRequest, ContainerRole, PodRequest
from gpushare.state import NodeState
from tests.builders import T0, node_state, request


def placed(state, mem: int):
    req = request(mem=mem)
    result = evaluate(state.view(), req, BinpackPolicy())
    assert isinstance(result, Placement)
    return to_allocation(req, result.assignment, state.inventory, T0)


def test_a_pod_added_again_is_charged_once():
    state = node_state("1x16GiB")
    allocation = placed(state, 4)
    state.add("default/a", allocation)
    state.add("default/a", allocation)  # the same pod seen again
    assert state.used(0) == (4, 0, 1)
    assert state.view().gpus[0].mem_free == 12
    assert state.remove("default/a") == allocation
    assert state.used(0) == (0, 0, 0) and state.view().gpus[0].mem_free == 16
    assert state.remove("default/a") is None  # gone already: nothing to free


def test_a_gpu_the_node_stops_reporting_leaves_the_pods_charge_on_the_others():
    state = node_state("2x16GiB")
    split = request(mem=8, labels={"aliyun.com/gpu-count": "2"})
    result = evaluate(state.view(), split, BinpackPolicy())
    assert isinstance(result, Placement)
    state.add("default/split", to_allocation(split, result.assignment, state.inventory, T0))
    first_gone = replace(state.inventory, gpus=state.inventory.gpus[1:])
    state.replace_inventory(first_gone)
    assert state.used(1) == (4, 0, 1)
    assert [g.mem_free for g in state.view().gpus] == [12]
    state.remove("default/split")
    assert state.used(1) == (0, 0, 0)


def test_a_whole_gpu_given_to_a_pod_takes_no_shared_pod():
    state = node_state("1x16GiB")
    whole = request(count=1)
    result = evaluate(state.view(), whole, BinpackPolicy())
    assert isinstance(result, Placement)
    state.add("default/whole", to_allocation(whole, result.assignment, state.inventory, T0))
    gpu = state.view().gpus[0]
    assert (gpu.usable, gpu.whole, gpu.mem_free, gpu.slots) == (False, False, 0, 0)
    state.remove("default/whole")
    assert state.view().gpus[0].usable


def tracked_node() -> NodeState:
    """A node as the simulator builds it: host CPU and memory tracked."""
    gpus = tuple(Gpu(i, "", mem=1000, core=1000) for i in range(2))
    return NodeState(NodeGpus("sim", NodeMode.CORE_MEM, gpus, 1_000, 16_000, 65_536))


def host(cpu: int, memory: int) -> PodRequest:
    container = ContainerRequest("main", ContainerRole.APP, 0, gpus=1, mem=100, core=100)
    return PodRequest((container,), cpu_milli=cpu, memory_mib=memory)


def test_host_cpu_and_memory_left_count_every_pod_and_nothing_for_pods_asking_none():
    state = tracked_node()
    for key, req in (("a", host(1000, 1024)), ("b", host(500, 2048)), ("c", host(0, 0))):
        result = evaluate(state.view(), req, BinpackPolicy())
        assert isinstance(result, Placement)
        state.add(key, to_allocation(req, result.assignment, state.inventory, T0))
    view = state.view()
    assert (view.cpu_free, view.memory_free) == (14_500, 62_464)
    state.remove("b")
    assert (state.view().cpu_free, state.view().memory_free) == (15_000, 64_512)
    state.remove("c")
    assert (state.view().cpu_free, state.view().memory_free) == (15_000, 64_512)


def test_an_unhealthy_gpu_offers_nothing_to_placement():
    gpu, healthy = node_state("2x16GiB", unhealthy=(0,)).view().gpus
    assert (gpu.usable, gpu.whole, gpu.mem_free, gpu.core_free, gpu.slots) == (
        False,
        False,
        0,
        0,
        0,
    )
    assert (healthy.usable, healthy.whole, healthy.mem_free, healthy.slots) == (True, True, 16, 20)


def test_a_node_whose_host_is_taken_has_nothing_left():
    state = tracked_node()
    req = host(16_000, 65_536)
    result = evaluate(state.view(), req, BinpackPolicy())
    assert isinstance(result, Placement)
    state.add("all", to_allocation(req, result.assignment, state.inventory, T0))
    assert (state.view().cpu_free, state.view().memory_free) == (0, 0)
