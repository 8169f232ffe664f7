"""One node's running totals: what placement sees after pods come and go."""

from dataclasses import replace

from gpushare.errors import Refusal, Rule
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


def test_a_gpu_the_node_stops_reporting_makes_the_pods_load_unknown():
    # Issue 39: a record naming a GPU the node does not have is not charged in part (the
    # GPU it really holds may be another): the node holds an unknown allocation.
    state = node_state("2x16GiB")
    split = request(mem=8, labels={"aliyun.com/gpu-count": "2"})
    result = evaluate(state.view(), split, BinpackPolicy())
    assert isinstance(result, Placement)
    state.add("default/split", to_allocation(split, result.assignment, state.inventory, T0))
    first_gone = replace(state.inventory, gpus=state.inventory.gpus[1:])
    state.replace_inventory(first_gone)
    assert state.used(1) == (0, 0, 0)
    assert state.view().unknown == ("default/split",)
    refusal = evaluate(state.view(), request(mem=1), BinpackPolicy())
    assert isinstance(refusal, Refusal) and refusal.rule is Rule.UNKNOWN_ALLOCATION
    assert "default/split" in refusal.message
    state.remove("default/split")
    assert state.used(1) == (0, 0, 0) and state.view().unknown == ()
    assert isinstance(evaluate(state.view(), request(mem=1), BinpackPolicy()), Placement)


def test_more_than_a_gpu_holds_makes_the_pods_load_unknown():
    state = node_state("1x16GiB")
    allocation = placed(state, 12)
    state.add("p", allocation)
    smaller = replace(state.inventory, gpus=(replace(state.inventory.gpus[0], mem=8),))
    state.replace_inventory(smaller)
    assert state.view().unknown == ("p",) and state.used(0) == (0, 0, 0)
    state.replace_inventory(replace(smaller, gpus=(replace(smaller.gpus[0], mem=12),)))
    assert state.view().unknown == () and state.used(0) == (12, 0, 1)
    assert state.remove("p") == allocation


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


def test_more_compute_than_a_gpu_has_makes_the_pods_load_unknown():
    state = node_state("1x16GiB", mode=NodeMode.CORE_MEM)
    req = request(mem=2, core=60)
    result = evaluate(state.view(), req, BinpackPolicy())
    assert isinstance(result, Placement)
    state.add("p", to_allocation(req, result.assignment, state.inventory, T0))
    gpu = state.inventory.gpus[0]
    state.replace_inventory(replace(state.inventory, gpus=(replace(gpu, core=55),)))
    assert state.view().unknown == ("p",)
    state.replace_inventory(replace(state.inventory, gpus=(replace(gpu, core=60),)))
    assert state.view().unknown == () and state.used(0) == (2, 60, 1)
