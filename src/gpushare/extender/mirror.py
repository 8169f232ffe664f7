"""The extender's mirror of the cluster: the API's pods and nodes, as the watch shows
them, plus its own binds the watch has not shown yet ("assumed" pods, as
kube-scheduler calls them), and the placement state they make.

It is rebuilt from annotations alone after every listing, and it never holds the
only copy of anything: an assumed allocation is also on its way to the API inside
the Binding. It is not thread-safe: the scheduler cache (extender.cache) calls it
under its one lock. What changes here that others keep something of (the answer
tables of a node, the pods waiting for room, the damaged records to tell about)
goes to its listener, in the same critical section.
"""

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from gpushare import annotation
from gpushare.allocation import UNKNOWN_BIND_TIME, PodAllocation
from gpushare.cluster import EventType
from gpushare.dra.ackresources import ACK_RESOURCES, rewritten_request
from gpushare.dra.firstfit import allocation_on
from gpushare.errors import AnnotationError, PodRefused
from gpushare.extender.nodedetails import NodeDetails, node_details
from gpushare.extender.policychoice import PolicyChoice
from gpushare.inventory import adds_room, node_gpus
from gpushare.labels import NodeMode
from gpushare.objects import Node, Pod
from gpushare.request import PodRequest, requests_gpu
from gpushare.resources import MANAGED_RESOURCES, parse_quantity
from gpushare.state import ClusterState, NodeState

log = logging.getLogger(__name__)

_EXPIRY_EVERY_S = 5.0


@dataclass(frozen=True, slots=True)
class PodRecord:
    uid: str
    node: str | None
    allocation: PodAllocation | None
    priority: int = 0
    """spec.priority (nil counts as 0, as in kube-scheduler): who preemption may evict."""
    deleting: bool = False
    """Deletion asked for: preemption counts its GPUs as freed and never picks it."""
    claim_request: PodRequest | None = None
    """A DRA-mode pod bound but without its allocation record yet: the request its
    claim asks, which the mirror charges where the allocator put it (_charge)."""


@dataclass(frozen=True, slots=True)
class GpuShape:
    """The most a pod can get on the nodes of one mode."""

    largest_gpu: int
    """Memory of the largest GPU (GiB)."""
    most_gpus: int
    """GPUs of the node that has most."""

    def widened(self, other: "GpuShape") -> "GpuShape":
        return GpuShape(
            max(self.largest_gpu, other.largest_gpu), max(self.most_gpus, other.most_gpus)
        )


@dataclass(frozen=True, slots=True)
class _Assumed:
    uid: str
    allocation: PodAllocation
    since: float


def interesting(pod: Pod) -> bool:
    """Pods the extender keeps: those asking for our resources (themselves or through a
    claim the webhook gave them) or carrying an allocation."""
    annotations = pod.metadata.annotations
    return (
        requests_gpu(pod)
        or ACK_RESOURCES in annotations
        or any(key in annotations for key in annotation.ALL_KEYS)
    )


class MirrorListener(Protocol):
    """What the mirror tells as it changes."""

    def node_changed(self, name: str) -> None:
        """What placement reads of the node changed (its GPUs, labels or pods)."""

    def rebuilt(self) -> None:
        """Every node may have changed: a listing replaced the picture."""

    def room_appeared(self, names: Iterable[str]) -> None:
        """These nodes may hold a pod they could not before."""

    def record_damaged(self, key: str, uid: str, problem: str) -> None:
        """The pod's allocation record cannot be trusted (a new or changed problem)."""

    def record_gone(self, key: str) -> None:
        """The pod is gone, or its record reads sound again."""


class ClusterMirror:
    def __init__(
        self,
        choice: PolicyChoice,
        max_pods_per_gpu: int,
        assume_ttl_s: float,
        listener: MirrorListener,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._choice = choice
        self._max_pods_per_gpu = max_pods_per_gpu
        self._assume_ttl_s = assume_ttl_s
        self._listener = listener
        self._clock = clock
        self.state = ClusterState()
        """The placement state: every allocation, the watch's and assumed ones."""
        self._nodes: dict[str, Node] = {}
        self._node_policies: dict[str, str] = {}
        self._node_problems: dict[str, str] = {}
        self._policy_use: Counter[str] = Counter()
        self._gpu_shapes: dict[NodeMode, GpuShape] | None = None
        """gpu_shapes' answer, None until asked again after a node changed."""
        self._pods: dict[str, PodRecord] = {}
        self._pod_problems: dict[str, str] = {}
        self._assumed: dict[str, _Assumed] = {}
        self._next_expiry = 0.0
        self.nodes_synced = False
        self.pods_synced = False

    @property
    def synced(self) -> bool:
        return self.nodes_synced and self.pods_synced

    # ----- the watch

    def replace_nodes(self, nodes: list[Node]) -> None:
        self._nodes = {node.name: node for node in nodes}
        self.nodes_synced = True
        self._rebuild()
        self._listener.room_appeared(self._nodes)  # what changed meanwhile is unknown

    def replace_pods(self, pods: Iterable[Pod]) -> None:
        """Takes the pods not finished; the caller keeps its books of them."""
        # Let go of the old allocations before decoding the new ones: 100,000 pods
        # otherwise briefly need both (bench/scale_bench.py: peak 1.2 GiB, not 0.9).
        self.state = ClusterState()  # pragma: no mutate: frees early; _rebuild makes it
        self._pods = {}
        self._pod_problems = {}
        for pod in pods:
            self._pods[pod.key] = self._record(pod)
        self.pods_synced = True
        self._rebuild()
        self._listener.room_appeared(self._nodes)

    def apply_node(self, event_type: EventType, node: Node) -> None:
        if event_type is EventType.DELETED:
            self._nodes.pop(node.name, None)
            self._drop_node(node.name)
        else:
            current = self.state.nodes.get(node.name)
            before = current.inventory if current else None
            self._nodes[node.name] = node
            if not self._put_node(node):
                return  # a status update that changes nothing placement reads
            after = self.state.nodes.get(node.name)
            if adds_room(before, after.inventory if after else None):
                self._listener.room_appeared((node.name,))
        self._listener.node_changed(node.name)

    def apply_pod(self, event_type: EventType, pod: Pod) -> PodRecord | None:
        """The pod's record now; None when it is gone (deleted or finished)."""
        key = pod.key
        # A pod being deleted still runs on its GPUs: it is let go when gone or finished.
        if event_type is EventType.DELETED or pod.is_finished:
            self._pods.pop(key, None)
            self._pod_problems.pop(key, None)
            self._listener.record_gone(key)
            self._assumed.pop(key, None)
            self._set_allocation(key, None)
            return None
        record = self._pods[key] = self._record(pod)
        assumed = self._assumed.get(key)
        if assumed is not None:
            if assumed.uid == record.uid and record.allocation is None and not record.node:
                # An event from before our bind: the Binding is still on its way.
                return record
            del self._assumed[key]
        self._set_allocation(key, record.allocation or self._charge(record, key))
        return record

    def _charge(self, record: PodRecord, key: str | None = None) -> PodAllocation | None:
        """What a DRA-mode pod holds between kube-scheduler's bind and the driver's
        record (written at Prepare): what the allocator gives its claim on its node, the
        first eligible GPUs in slice order (dra.firstfit), against the books as they
        stand; what the books charge `key` on that node already, once made. None for
        any other pod."""
        if record.claim_request is None or not record.node:
            return None
        charged = self.state.allocation(key) if key is not None else None
        if charged is not None and charged.node == record.node:
            return charged
        state = self.state.nodes.get(record.node)
        if state is None:
            return None
        return allocation_on(state, record.claim_request, UNKNOWN_BIND_TIME)

    # ----- binds in flight

    def assume(self, pod_key: str, uid: str, allocation: PodAllocation) -> None:
        self._assumed[pod_key] = _Assumed(uid, allocation, self._clock())
        self._set_allocation(pod_key, allocation)

    def forget(self, pod_key: str, uid: str) -> None:
        """Undo assume(): the bind failed, the API's view of the pod stands."""
        assumed = self._assumed.get(pod_key)
        if assumed is None or assumed.uid != uid:
            return
        del self._assumed[pod_key]
        record = self._pods.get(pod_key)
        self._set_allocation(pod_key, record.allocation if record else None)

    def expire(self) -> list[str]:
        """Drops assumptions older than the TTL whose pod the API shows gone or unbound."""
        now = self._clock()
        if now < self._next_expiry:
            return []
        self._next_expiry = now + min(_EXPIRY_EVERY_S, self._assume_ttl_s)
        dropped = []
        for key, assumed in list(self._assumed.items()):
            if now - assumed.since < self._assume_ttl_s:
                continue
            record = self._pods.get(key)
            if record is None or (record.allocation is None and not record.node):
                del self._assumed[key]
                self._set_allocation(key, None)  # the API shows no allocation either
                dropped.append(key)
        for key in dropped:
            log.warning("dropped the assumed bind of %s: the watch never showed it", key)
        return dropped

    # ----- what the cache reads

    def node_policy(self, name: str) -> str:
        """The policy the node's label (or the default) names; KeyError when the node
        is not known."""
        return self._node_policies[name]

    def policies_in_use(self) -> Iterable[str]:
        """The policies some node's label (or the default) names."""
        return self._policy_use.keys()

    def pod(self, pod_key: str) -> PodRecord | None:
        """What the watch showed of the pod last (None: not seen, or gone)."""
        return self._pods.get(pod_key)

    def pod_uid(self, pod_key: str) -> str:
        record = self._pods.get(pod_key) or self._assumed.get(pod_key)
        return record.uid if record else ""  # pragma: no mutate: a pod on a node is one of both

    def moved_on(self, pod_key: str, uid: str) -> bool:
        """Whether the watch shows the pod bound, being deleted or created again."""
        record = self._pods.get(pod_key)
        return record is not None and bool(record.node or record.deleting or record.uid != uid)

    def node_problem(self, name: str) -> str | None:
        return self._node_problems.get(name)

    @property
    def node_problem_count(self) -> int:
        """Nodes whose GPUs could not be read."""
        return len(self._node_problems)

    @property
    def node_count(self) -> int:
        return len(self._nodes)

    @property
    def pod_count(self) -> int:
        return len(self._pods)

    @property
    def assumed(self) -> tuple[str, ...]:
        """The keys of the pods assumed, sorted."""
        return tuple(sorted(self._assumed))

    @property
    def pod_problems(self) -> Mapping[str, str]:
        """Why each damaged record cannot be trusted, by pod key (read only)."""
        return self._pod_problems

    def names(self) -> list[str]:
        """Nodes with GPUs or an unreadable inventory, by name."""
        return sorted(set(self.state.nodes) | set(self._node_problems))

    def allocatable(self, name: str) -> dict[str, int]:
        """The allocatable of each of our resources the node's status shows: what the
        kubelet took from the device plugin."""
        return _our_allocatable(self._nodes.get(name))

    def gpu_shapes(self) -> Mapping[NodeMode, GpuShape] | None:
        """Per mode, the largest GPU and the most GPUs of any node in it; None until the
        nodes are listed. Kept until a node's GPUs, labels or readability change
        (`_drop_node`): the webhook asks for every pod created, and a pass over every
        node under the lock (1,000 nodes: about 1.3 ms) held up filter and bind beside
        it (bench/bind_bench.py)."""
        if not self.nodes_synced:
            return None
        if self._gpu_shapes is None:
            self._gpu_shapes = _gpu_shapes(self.state.nodes.values())
        return self._gpu_shapes

    def details(self, name: str, with_pods: bool) -> NodeDetails:
        """A copy of what a node of `names()` holds."""
        state: NodeState | None = self.state.nodes.get(name)
        policy = self._node_policies[name]  # every node known has one, even an unreadable one
        return node_details(
            name, state, policy, self._node_problems.get(name), self._assumed, with_pods
        )

    # ----- internals

    def _record(self, pod: Pod) -> PodRecord:
        # A damaged record is never left out: it is charged as ACK's keys say, or held
        # as an unknown allocation on its node (annotation.read); shown in /inspect, the
        # log, /metrics and an event on the pod.
        reading = annotation.read(pod)
        problem = reading.problem
        if problem is None:
            self._pod_problems.pop(pod.key, None)
            self._listener.record_gone(pod.key)
        elif self._pod_problems.get(pod.key) != problem:
            log.warning("pod %s: %s", pod.key, problem)
            self._pod_problems[pod.key] = problem
            self._listener.record_damaged(pod.key, pod.metadata.uid, problem)
        return PodRecord(
            pod.metadata.uid,
            pod.spec.node_name,
            reading.allocation,
            pod.spec.priority or 0,
            pod.is_deleting,
            _claim_request(pod) if reading.allocation is None and pod.spec.node_name else None,
        )

    def _rebuild(self) -> None:
        self.state = ClusterState()
        self._gpu_shapes = None
        self._node_policies = {}
        self._node_problems = {}
        self._policy_use = Counter()
        for node in self._nodes.values():
            self._put_node(node)
        for key, record in self._pods.items():
            if record.allocation is not None:
                self.state.add_pod(key, record.allocation)
        for key, record in self._pods.items():
            # After every record: the allocator's choice depends on what the node holds.
            charged = self._charge(record)
            if charged is not None:
                self.state.add_pod(key, charged)
        for key, assumed in list(self._assumed.items()):
            seen = self._pods.get(key)
            if seen is not None and (seen.allocation is not None or seen.node):
                del self._assumed[key]  # the listing already shows what came of it
            else:
                self.state.add_pod(key, assumed.allocation)
        self._listener.rebuilt()

    def _put_node(self, node: Node) -> bool:
        """Takes the node's labels and GPUs; False when nothing placement reads changed."""
        name = node.name
        policy = self._choice.of_node(node.metadata.labels)
        try:
            inventory = node_gpus(node, self._max_pods_per_gpu)
            problem = None
        except AnnotationError as err:
            inventory, problem = None, str(err)
        current = self.state.nodes.get(name)
        if (
            self._node_policies.get(name) == policy
            and self._node_problems.get(name) == problem
            and (current.inventory if current else None) == inventory
        ):
            return False
        self._drop_node(name, keep_pods=True)
        self._node_policies[name] = policy
        self._policy_use[policy] += 1
        if inventory is None:
            log.warning("node %s: %s", name, problem)
            self._node_problems[name] = problem or ""
            self.state.remove_node(name)
        else:
            self.state.set_node(inventory)
        return True

    def _drop_node(self, name: str, keep_pods: bool = False) -> None:
        self._gpu_shapes = None  # a node's GPUs or labels change through here, or _rebuild
        policy = self._node_policies.pop(name, None)
        if policy is not None:
            self._policy_use[policy] -= 1
            if not self._policy_use[policy]:
                del self._policy_use[policy]
        self._node_problems.pop(name, None)
        if not keep_pods:
            self.state.remove_node(name)

    def _set_allocation(self, pod_key: str, allocation: PodAllocation | None) -> None:
        old = self.state.allocation(pod_key)
        if old == allocation:
            return
        if allocation is None:
            self.state.remove_pod(pod_key)
            if old is not None:
                self._listener.room_appeared((old.node,))
        else:
            self.state.add_pod(pod_key, allocation)
        for node in {a.node for a in (old, allocation) if a is not None}:
            self._listener.node_changed(node)


def _claim_request(pod: Pod) -> PodRequest | None:
    try:
        return rewritten_request(pod)
    except PodRefused:
        return None  # the webhook rewrites only pods that keep every rule


def _our_allocatable(node: Node | None) -> dict[str, int]:
    quantities = node.status.allocatable if node is not None else {}
    return {
        resource: parse_quantity(quantities.get(resource, "0")) or 0
        for resource in MANAGED_RESOURCES
    }


def _gpu_shapes(states: Iterable[NodeState]) -> dict[NodeMode, GpuShape]:
    shapes: dict[NodeMode, GpuShape] = {}
    for state in states:
        mode, gpus = state.inventory.mode, state.inventory.gpus
        if mode is not None and gpus:
            shapes[mode] = shapes.get(mode, GpuShape(0, 0)).widened(
                GpuShape(max(g.mem for g in gpus), len(gpus))
            )
    return shapes
