"""What the cache tells /inspect and /metrics about its nodes: copies, taken under
the cache's lock, that the caller reads at leisure without the lock."""

from collections.abc import Container, Mapping
from dataclasses import dataclass

from gpushare.state import NodeState


@dataclass(frozen=True, slots=True)
class PodOnGpu:
    key: str
    mem: int
    core: int
    assumed: bool
    """Reserved by a bind the watch has not shown yet."""


@dataclass(frozen=True, slots=True)
class GpuDetails:
    index: int
    uuid: str
    model: str
    healthy: bool
    mem: int
    core: int
    allocated_mem: int
    allocated_core: int
    pod_count: int
    pods: tuple[PodOnGpu, ...]
    """By key; empty when the pods were not asked for."""


@dataclass(frozen=True, slots=True)
class NodeDetails:
    name: str
    policy: str
    """The placement policy the node's label (or the default) names."""
    problem: str | None = None
    """Why the node's GPUs could not be read; it then has none."""
    mode: str | None = None
    mem: int = 0
    gpus: tuple[GpuDetails, ...] = ()
    unknown: tuple[str, ...] = ()
    """Pods the node holds whose allocation is not known: it takes no GPU pod meanwhile."""


@dataclass(frozen=True, slots=True)
class ClusterDetails:
    synced: bool
    nodes: tuple[NodeDetails, ...]
    """By name: every node with GPUs or a problem."""
    assumed: tuple[str, ...]
    pod_problems: Mapping[str, str]
    waiting: tuple[str, ...] = ()
    """Pods filter refused on every node, waiting for room (the requeue nudge's),
    least recently refused first."""


def node_details(
    name: str,
    state: NodeState | None,
    policy: str,
    problem: str | None,
    assumed: Container[str],
    with_pods: bool,
) -> NodeDetails:
    """A copy of what the node holds (call with the cache's lock held)."""
    if state is None:
        return NodeDetails(name, policy, problem)
    charges = (
        {key: allocation.charges() for key, allocation in state.pods.items()} if with_pods else {}
    )
    gpus = []
    for gpu in state.inventory.gpus:
        mem, core, count = state.used(gpu.index)
        pods = (
            tuple(
                PodOnGpu(key, *charges[key][gpu.index], assumed=key in assumed)
                for key in sorted(state.pods_on(gpu.index))
            )
            if with_pods
            else ()
        )
        gpus.append(
            GpuDetails(
                gpu.index,
                gpu.uuid,
                gpu.model,
                gpu.healthy,
                gpu.mem,
                gpu.core,
                mem,
                core,
                count,
                pods,
            )
        )
    mode = state.inventory.mode
    return NodeDetails(
        name,
        policy,
        None,
        mode.value if mode else None,
        state.inventory.total_mem,
        tuple(gpus),
        tuple(sorted(state.unknown)),
    )
