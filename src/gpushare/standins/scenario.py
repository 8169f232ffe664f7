"""Workloads for the mock backend: pods placed on a mock node by the core, started as mock
containers with the environment the device plugin would give them.

The demo, the benchmark and the tests describe what runs on a node this way, so
every mock container's limits come from a real allocation through the real
environment contract.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from gpushare.environment import HIGH_PRIO, POD, SCHD_WEIGHT
from gpushare.inventory import NodeGpus, parse_layout
from gpushare.isolation.backends.mock import Demand, MemoryStep, MockContainer, mock_devices
from gpushare.isolation.backends.port import GpuDevice
from gpushare.labels import NodeMode
from gpushare.objects import Pod
from gpushare.placement.fit import Placement, evaluate, to_allocation
from gpushare.placement.policies import BinpackPolicy
from gpushare.request import parse_pod_request
from gpushare.resources import GPU_CORE, GPU_MEM
from gpushare.state import NodeState


@dataclass(frozen=True, slots=True)
class Workload:
    """One single-container pod and how it behaves on the GPU."""

    name: str
    mem: int
    """aliyun.com/gpu-mem (GiB)."""
    core: int = 0
    """aliyun.com/gpu-core.percentage; 0 for none."""
    weight: int = 1
    high_priority: bool = False
    demand: Demand = field(default_factory=Demand)
    intensity: float = 1.0
    memory: tuple[MemoryStep, ...] = ()
    namespace: str = "default"


@dataclass(frozen=True, slots=True)
class Node:
    devices: tuple[GpuDevice, ...]
    containers: tuple[MockContainer, ...]
    gpu_of: dict[str, int]
    """Pod name to the GPU index it was placed on."""

    def container(self, pod_name: str) -> MockContainer:
        for container in self.containers:
            if container.environ.get(POD, "").endswith(f"/{pod_name}"):
                return container
        raise KeyError(f"no pod {pod_name} in the scenario")


def place(
    workloads: Sequence[Workload],
    layout: str = "1x16GiB",
    node: str = "mock-node",
    mode: NodeMode = NodeMode.CORE_MEM,
) -> Node:
    """Place each workload in order with binpack (the fullest GPU first, so scenarios
    know where each lands), as the extender does on a binpack node, and start it."""
    gpus = parse_layout(layout, node)
    state = NodeState(NodeGpus(node, mode, gpus))
    containers = []
    gpu_of = {}
    for workload in workloads:
        pod = _pod(workload)
        request = parse_pod_request(pod)
        if request is None:
            raise ValueError(f"workload {workload.name} asks for no shared GPU")
        placed = evaluate(state.view(), request, BinpackPolicy())
        if not isinstance(placed, Placement):
            raise ValueError(f"workload {workload.name} does not fit: {placed}")
        allocation = to_allocation(request, placed.assignment, state.inventory, datetime.now(UTC))
        state.add(pod.key, allocation)
        containers.append(
            MockContainer.from_allocation(
                pod,
                allocation,
                allocation.containers[0],
                demand=workload.demand,
                intensity=workload.intensity,
                memory=workload.memory,
            )
        )
        gpu_of[workload.name] = allocation.gpu_indices[0]
    return Node(mock_devices(gpus), tuple(containers), gpu_of)


def _pod(workload: Workload) -> Pod:
    limits = {GPU_MEM: str(workload.mem)}
    if workload.core:
        limits[GPU_CORE] = str(workload.core)
    env = [
        {"name": SCHD_WEIGHT, "value": str(workload.weight)},
        {"name": HIGH_PRIO, "value": "1" if workload.high_priority else "0"},
    ]
    return Pod.model_validate(
        {
            "metadata": {
                "name": workload.name,
                "namespace": workload.namespace,
                "uid": f"uid-{workload.name}",
            },
            "spec": {
                "containers": [
                    {"name": "main", "resources": {"limits": limits}, "env": env},
                ]
            },
        }
    )
