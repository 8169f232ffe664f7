"""What is allocated where: per node, per GPU, rebuilt from pod annotations alone.

`NodeState` keeps the running totals for one node and hands placement an
immutable `NodeView`; `ClusterState` is the set of them plus the pod index.
Neither is thread-safe: the extender serialises access around them.
"""

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import count

from gpushare import annotation
from gpushare.allocation import PodAllocation
from gpushare.errors import AnnotationError
from gpushare.inventory import NodeGpus, node_gpus
from gpushare.labels import NodeMode
from gpushare.objects import Node, Pod
from gpushare.request import JobType
from gpushare.resources import DEFAULT_MAX_PODS_PER_GPU


@dataclass(frozen=True, slots=True)
class GpuView:
    """One GPU as placement sees it."""

    index: int
    mem_total: int
    core_total: int
    mem_free: int
    core_free: int
    slots: int
    """How many more pods may share this GPU."""
    whole: bool
    """Healthy and holding no pod: may be given out exclusively."""
    usable: bool
    """Healthy and not held exclusively by a pod."""
    healthy: bool = True
    model: str = ""


@dataclass(frozen=True, slots=True)
class NodeView:
    """One node as placement sees it: immutable, cheap to share, hashable."""

    name: str
    mode: NodeMode | None
    gpus: tuple[GpuView, ...]
    job_types: frozenset[JobType] = frozenset()
    """Job types of the pods already sharing GPUs on this node."""
    unknown: tuple[str, ...] = ()
    """Pods whose allocation here is not known (a damaged record, or one the node's GPUs
    cannot hold): while there are any, the node takes no new GPU pod."""
    cpu_total: int | None = None
    """Host CPU in milli-cores where tracked (the simulator); None on Kubernetes nodes."""
    cpu_free: int | None = None
    memory_total: int | None = None
    """Host memory in MiB where tracked; None on Kubernetes nodes."""
    memory_free: int | None = None

    @property
    def mem_total(self) -> int:
        return sum(g.mem_total for g in self.gpus)

    @property
    def mem_free(self) -> int:
        return sum(g.mem_free for g in self.gpus if g.usable)


@dataclass(slots=True)
class _GpuLoad:
    mem: int = 0
    core: int = 0
    pods: set[str] = field(default_factory=set)
    exclusive_pod: str | None = None


_VERSIONS = count(1)
"""One sequence for every NodeState, so a version never repeats across objects and
caches keyed on (node, version) cannot confuse a rebuilt state with an old one."""


class NodeState:
    _view: NodeView | None
    """Made when first asked for after a change (`_changed` drops it)."""

    def __init__(self, inventory: NodeGpus) -> None:
        self._start(inventory)

    def _start(self, inventory: NodeGpus) -> None:
        self.inventory = inventory
        self.pods: dict[str, PodAllocation] = {}
        self._loads = {gpu.index: _GpuLoad() for gpu in inventory.gpus}
        self._gpus = {gpu.index: gpu for gpu in inventory.gpus}
        self.unknown: set[str] = set()
        """Pods held here whose allocation is not known (`_holds`): charged nowhere."""
        self._job_types: Counter[JobType] = Counter()
        self.cpu_used = 0
        self.memory_used = 0
        self._changed()

    @property
    def name(self) -> str:
        return self.inventory.node

    def add(self, pod_key: str, allocation: PodAllocation) -> None:
        if pod_key in self.pods:
            self.remove(pod_key)
        self.pods[pod_key] = allocation
        charges = allocation.charges()
        if allocation.unknown or not self._holds(charges):
            self.unknown.add(pod_key)
            self._changed()
            return
        exclusive = allocation.exclusive_gpus
        for index, (mem, core) in charges.items():
            load = self._loads[index]
            load.mem += mem
            load.core += core
            load.pods.add(pod_key)
            if index in exclusive:
                load.exclusive_pod = pod_key
        self._job_types[allocation.job_type] += 1
        self.cpu_used += allocation.cpu_milli or 0
        self.memory_used += allocation.memory_mib or 0
        self._changed()

    def remove(self, pod_key: str) -> PodAllocation | None:
        allocation = self.pods.pop(pod_key, None)
        if allocation is None:
            return None
        if pod_key in self.unknown:
            self.unknown.remove(pod_key)
            self._changed()
            return allocation
        for index, (mem, core) in allocation.charges().items():
            load = self._loads[index]
            load.mem -= mem
            load.core -= core
            load.pods.discard(pod_key)
            if load.exclusive_pod == pod_key:
                load.exclusive_pod = None
        self._job_types[allocation.job_type] -= 1
        if not self._job_types[allocation.job_type]:
            del self._job_types[allocation.job_type]
        self.cpu_used -= allocation.cpu_milli or 0
        self.memory_used -= allocation.memory_mib or 0
        self._changed()
        return allocation

    def _holds(self, charges: dict[int, tuple[int, int]]) -> bool:
        """Whether the node's GPUs can hold what an allocation charges them: a GPU
        index the node does not have, or more than a GPU has, means a record not to
        be trusted (or GPUs gone from under the pod), and the pod's load unknown."""
        for index, (mem, core) in charges.items():
            gpu = self._gpus.get(index)
            if gpu is None or mem > gpu.mem or core > gpu.core:
                return False
        return True

    def replace_inventory(self, inventory: NodeGpus) -> None:
        """New labels or GPUs for the node; what runs on it stays."""
        pods = self.pods
        self._start(inventory)
        for key, allocation in pods.items():
            self.add(key, allocation)

    def used(self, index: int) -> tuple[int, int, int]:
        """Memory, compute and number of pods on one GPU."""
        load = self._loads[index]
        return load.mem, load.core, len(load.pods)

    def pods_on(self, index: int) -> frozenset[str]:
        return frozenset(self._loads[index].pods)

    def view(self) -> NodeView:
        if self._view is None:
            self._view = self._make_view()
        return self._view

    def _changed(self) -> None:
        self.version = next(_VERSIONS)
        self._view = None

    def _make_view(self) -> NodeView:
        inventory = self.inventory
        gpus = []
        for gpu in inventory.gpus:
            load = self._loads[gpu.index]
            usable = gpu.healthy and load.exclusive_pod is None
            gpus.append(
                GpuView(
                    index=gpu.index,
                    mem_total=gpu.mem,
                    core_total=gpu.core,
                    mem_free=max(gpu.mem - load.mem, 0) if usable else 0,
                    core_free=max(gpu.core - load.core, 0) if usable else 0,
                    slots=max(inventory.max_pods_per_gpu - len(load.pods), 0) if usable else 0,
                    whole=usable and not load.pods,
                    usable=usable,
                    healthy=gpu.healthy,
                    model=gpu.model,
                )
            )
        shared = frozenset(t for t in self._job_types if t is not JobType.EXCLUSIVE)
        return NodeView(
            name=inventory.node,
            mode=inventory.mode,
            gpus=tuple(gpus),
            job_types=shared,
            unknown=tuple(sorted(self.unknown)),
            cpu_total=inventory.cpu_milli,
            cpu_free=_left(inventory.cpu_milli, self.cpu_used),
            memory_total=inventory.memory_mib,
            memory_free=_left(inventory.memory_mib, self.memory_used),
        )


def _left(capacity: int | None, used: int) -> int | None:
    return None if capacity is None else max(capacity - used, 0)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A comparable picture of a cluster's allocations: node → GPU → (mem, core, pods)."""

    gpus: dict[str, dict[int, tuple[int, int, frozenset[str]]]]
    pods: dict[str, PodAllocation]


class ClusterState:
    def __init__(self) -> None:
        self.nodes: dict[str, NodeState] = {}
        self.pod_nodes: dict[str, str] = {}
        self.unplaced: dict[str, PodAllocation] = {}
        """Allocations naming a node the state does not know (yet)."""

    def set_node(self, inventory: NodeGpus) -> NodeState:
        state = self.nodes.get(inventory.node)
        if state is None:
            state = self.nodes[inventory.node] = NodeState(inventory)
            for key, allocation in list(self.unplaced.items()):
                if allocation.node == inventory.node:
                    del self.unplaced[key]
                    self.add_pod(key, allocation)
        elif state.inventory != inventory:
            state.replace_inventory(inventory)
        return state

    def remove_node(self, name: str) -> None:
        state = self.nodes.pop(name, None)
        if state is None:
            return
        for key, allocation in state.pods.items():
            del self.pod_nodes[key]  # add_pod put it there
            self.unplaced[key] = allocation

    def add_pod(self, pod_key: str, allocation: PodAllocation) -> None:
        self.remove_pod(pod_key)
        state = self.nodes.get(allocation.node)
        if state is None:
            self.unplaced[pod_key] = allocation
            return
        state.add(pod_key, allocation)
        self.pod_nodes[pod_key] = allocation.node

    def remove_pod(self, pod_key: str) -> PodAllocation | None:
        self.unplaced.pop(pod_key, None)
        node = self.pod_nodes.pop(pod_key, None)
        if node is None:
            return None
        return self.nodes[node].remove(pod_key)  # remove_node drops its pods from pod_nodes

    def allocation(self, pod_key: str) -> PodAllocation | None:
        node = self.pod_nodes.get(pod_key)
        if node is not None:
            return self.nodes[node].pods.get(pod_key)
        return self.unplaced.get(pod_key)

    def snapshot(self) -> Snapshot:
        gpus = {
            name: {
                gpu.index: (*state.used(gpu.index)[:2], state.pods_on(gpu.index))
                for gpu in state.inventory.gpus
            }
            for name, state in self.nodes.items()
        }
        pods = {key: state.pods[key] for state in self.nodes.values() for key in state.pods}
        return Snapshot(gpus=gpus, pods=pods)

    @classmethod
    def rebuild(
        cls,
        nodes: Iterable[Node],
        pods: Iterable[Pod],
        max_pods_per_gpu: int = DEFAULT_MAX_PODS_PER_GPU,
    ) -> tuple["ClusterState", list[str]]:
        """The cluster's allocations from node objects and pod annotations alone.

        Returns the state and one line per object that could not be read, so the
        caller can log them; a pod whose record is damaged is charged as
        annotation.read says (never left out, never guessed at).
        """
        state = cls()
        problems: list[str] = []
        for node in nodes:
            try:
                state.set_node(node_gpus(node, max_pods_per_gpu))
            except AnnotationError as err:
                problems.append(f"node {node.name}: {err}")
        for pod in pods:
            if pod.is_finished:  # one being deleted still runs on its GPUs
                continue
            reading = annotation.read(pod)
            if reading.problem is not None:
                problems.append(f"pod {pod.key}: {reading.problem}")
            if reading.allocation is not None:
                state.add_pod(pod.key, reading.allocation)
        return state, problems
