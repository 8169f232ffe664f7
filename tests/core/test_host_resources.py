"""CPU, host memory and GPU model: tracked where the node says so (the simulator),
left to the kube-scheduler on Kubernetes nodes, in milli-GPU units as the trace asks."""

import pytest

from gpushare import annotation
from gpushare.errors import Refusal, Rule
from gpushare.inventory import Gpu, NodeGpus
from gpushare.labels import NodeMode
from gpushare.placement.fgd import FgdPolicy
from gpushare.placement.fit import Placement, evaluate, to_allocation
from gpushare.placement.policies import BinpackPolicy
from gpushare.placement.workload import TaskShape, Workload
from gpushare.request import ContainerRequest, ContainerRole, PodRequest
from gpushare.state import NodeState
from tests.builders import T0, node_state, request

BINPACK = BinpackPolicy()


def milli_node(
    gpus: int = 2,
    cpu: int = 16_000,
    memory: int = 65_536,
    model: str = "T4",
    max_pods_per_gpu: int = 1_000_000,
):
    """A node as the simulator builds it: GPUs of 1000 milli, CPU and memory tracked."""
    inventory = NodeGpus(
        node="sim",
        mode=NodeMode.CORE_MEM,
        gpus=tuple(Gpu(i, "", mem=1000, model=model, core=1000) for i in range(gpus)),
        max_pods_per_gpu=max_pods_per_gpu,
        cpu_milli=cpu,
        memory_mib=memory,
    )
    return NodeState(inventory)


def sharing(milli: int, cpu: int = 1000, memory: int = 1024, spec=None) -> PodRequest:
    container = ContainerRequest("main", ContainerRole.APP, 0, gpus=1, mem=milli, core=milli)
    return PodRequest((container,), cpu_milli=cpu, memory_mib=memory, gpu_spec=spec)


def whole(gpus: int, cpu: int = 1000, memory: int = 1024) -> PodRequest:
    container = ContainerRequest("main", ContainerRole.APP, 0, gpus=gpus, mem=0, exclusive=True)
    return PodRequest((container,), cpu_milli=cpu, memory_mib=memory)


def cpu_only(cpu: int, memory: int = 1024) -> PodRequest:
    return PodRequest((), cpu_milli=cpu, memory_mib=memory)


def place(state: NodeState, req: PodRequest, key: str) -> Placement:
    result = evaluate(state.view(), req, BINPACK)
    assert isinstance(result, Placement), result
    state.add(key, to_allocation(req, result.assignment, state.inventory, T0))
    return result


def test_milli_gpu_slices_share_one_gpu_up_to_1000():
    state = milli_node(gpus=1)
    place(state, sharing(460), "a")
    place(state, sharing(470), "b")
    assert state.used(0) == (930, 930, 2)
    result = evaluate(state.view(), sharing(80), BINPACK)
    assert isinstance(result, Refusal) and result.rule is Rule.INSUFFICIENT_MEMORY


def test_the_view_carries_cpu_and_memory_left():
    state = milli_node(cpu=16_000, memory=65_536)
    place(state, sharing(500, cpu=6_000, memory=4_096), "a")
    view = state.view()
    assert (view.cpu_total, view.cpu_free) == (16_000, 10_000)
    assert (view.memory_total, view.memory_free) == (65_536, 61_440)
    state.remove("a")
    assert state.view().cpu_free == 16_000


def test_a_pod_needing_more_cpu_than_is_left_is_refused():
    state = milli_node(cpu=16_000)
    place(state, whole(1, cpu=12_000), "a")
    found = evaluate(state.view(), whole(1, cpu=8_000), BINPACK)
    assert isinstance(found, Refusal) and found.rule is Rule.INSUFFICIENT_CPU
    assert found.rule.resolvable
    assert "8000 milli-CPU" in found.message and "4000 left" in found.message


def test_a_pod_needing_more_host_memory_than_is_left_is_refused():
    state = milli_node(memory=8_192)
    found = evaluate(state.view(), sharing(100, memory=10_000), BINPACK)
    assert isinstance(found, Refusal) and found.rule is Rule.INSUFFICIENT_HOST_MEMORY
    assert found.message == "the pod needs 10000 MiB of host memory; node sim has 8192 MiB left"


def test_a_pod_asking_for_another_gpu_model_is_refused_for_good():
    found = evaluate(
        milli_node(model="P100").view(), sharing(100, spec=frozenset({"V100M16"})), BINPACK
    )
    assert isinstance(found, Refusal) and found.rule is Rule.GPU_MODEL
    assert not found.rule.resolvable
    picky = sharing(100, spec=frozenset({"V100M16", "A100"}))
    found = evaluate(milli_node(model="P100").view(), picky, BINPACK)
    assert isinstance(found, Refusal)
    assert found.message == "the pod accepts GPU models A100, V100M16; node sim has P100"
    found = evaluate(milli_node(gpus=0).view(), picky, BINPACK)
    assert isinstance(found, Refusal)
    assert found.message == "the pod accepts GPU models A100, V100M16; node sim has none"
    ok = evaluate(
        milli_node(model="V100M16").view(), sharing(100, spec=frozenset({"V100M16", "T4"})), BINPACK
    )
    assert isinstance(ok, Placement)


@pytest.mark.parametrize("policy", [BINPACK, FgdPolicy(Workload(((TaskShape(gpus=0), 1.0),)))])
def test_on_a_node_of_mixed_models_a_slice_goes_only_to_a_model_it_accepts(policy):
    gpus = (
        Gpu(0, "", mem=1000, model="T4", core=1000),
        Gpu(1, "", mem=1000, model="A100", core=1000),
    )
    state = NodeState(NodeGpus("sim", NodeMode.CORE_MEM, gpus, max_pods_per_gpu=10))
    place(state, sharing(600), "t4-first")  # binpack would put the next slice with it
    picky = sharing(300, spec=frozenset({"A100"}))
    result = evaluate(state.view(), picky, policy)
    assert isinstance(result, Placement) and result.assignment.gpus == ((1,),)
    refused = evaluate(state.view(), sharing(300, spec=frozenset({"V100M16"})), policy)
    assert isinstance(refused, Refusal)
    assert refused.message == "the pod accepts GPU models V100M16; node sim has A100, T4"


def test_a_node_reporting_no_gpus_refuses_gpu_pods_saying_where_to_look():
    empty = milli_node(gpus=0).view()
    found = evaluate(empty, sharing(100), BINPACK)
    assert isinstance(found, Refusal) and found.rule is Rule.TOO_FEW_GPUS
    assert found.message == (
        "node sim reports no GPUs (is the gpushare device plugin running there?)"
    )
    assert isinstance(evaluate(empty, cpu_only(1000), BINPACK), Placement)


def test_a_cpu_only_pod_takes_cpu_and_no_gpu():
    state = milli_node(cpu=16_000)
    result = place(state, cpu_only(10_000), "cpu")
    assert result.assignment.gpus == ()
    assert state.view().cpu_free == 6_000
    assert all(g.whole for g in state.view().gpus)
    found = evaluate(state.view(), cpu_only(7_000), BINPACK)
    assert isinstance(found, Refusal) and found.rule is Rule.INSUFFICIENT_CPU


def test_whole_gpu_pods_need_free_gpus_all_on_one_node():
    state = milli_node(gpus=2)
    place(state, sharing(100), "slice")
    found = evaluate(state.view(), whole(2), BINPACK)
    assert isinstance(found, Refusal) and found.rule is Rule.NO_FREE_GPU
    assert place(state, whole(1), "one").assignment.gpus == ((1,),)


def test_kubernetes_nodes_and_requests_track_no_host_resources():
    state = node_state("2x16GiB")
    view = state.view()
    assert view.cpu_free is None and view.memory_free is None
    # A request that names CPU still fits: the node does not track it (kube-scheduler does).
    req = PodRequest(request(mem=4).containers, cpu_milli=10**9, memory_mib=10**9)
    assert isinstance(evaluate(view, req, BINPACK), Placement)


def test_the_shape_tells_requests_of_different_cpu_apart_but_not_kubernetes_ones():
    assert sharing(100, cpu=1000).shape != sharing(100, cpu=2000).shape
    assert request(mem=4).shape == request(name="other", mem=4).shape
    assert request(mem=4).shape == ((ContainerRole.APP, 1, 4, 0, False),)


def test_host_resources_stay_out_of_the_allocation_annotation():
    state = milli_node()
    req = sharing(300, cpu=4_000, memory=2_048)
    result = evaluate(state.view(), req, BINPACK)
    assert isinstance(result, Placement)
    allocation = to_allocation(req, result.assignment, state.inventory, T0)
    assert (allocation.cpu_milli, allocation.memory_mib) == (4_000, 2_048)
    encoded = annotation.encode(allocation)[annotation.ALLOCATION]
    assert "cpu" not in encoded.lower() and "memory_mib" not in encoded
