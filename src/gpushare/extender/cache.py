"""The extender's picture of the cluster: the API's pods and nodes, plus its own
binds the watch has not shown yet ("assumed" pods, as kube-scheduler calls them).

It is the sink of the node and pod watch caches, so it is rebuilt from
annotations alone after every listing, and it never holds the only copy of
anything: an assumed allocation is also on its way to the API inside the
Binding. Everything here runs under one lock; scheduling decisions read the
state and reserve in the same critical section, so concurrent binds cannot both
take the last slice of a GPU.

It also remembers the pods filter refused on every candidate node and calls
`on_capacity_freed` when a change it applies adds room, for the requeue nudge
(extender.requeue), which makes kube-scheduler retry them; and it remembers the
pods that ask for our resources under a schedulerName nobody serves and calls
`on_unserved`, for the worker that posts an event on each (extender.unserved).
"""

import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gpushare import annotation
from gpushare.allocation import PodAllocation
from gpushare.cluster import EventType
from gpushare.errors import AnnotationError, Refusal, Rule
from gpushare.extender.fittable import Answers, FitTable, NodeFit
from gpushare.extender.policychoice import node_policy
from gpushare.extender.schedulernames import unserved_scheduler
from gpushare.inventory import adds_room, node_gpus
from gpushare.labels import PlacementMode
from gpushare.objects import Node, Pod
from gpushare.placement import PlacementPolicy, evaluate, extender_score
from gpushare.policies import POLICIES
from gpushare.request import PodRequest, requests_gpu
from gpushare.resources import DEFAULT_MAX_PODS_PER_GPU
from gpushare.state import ClusterState, NodeState, Snapshot

log = logging.getLogger(__name__)

ASSUME_TTL_S = 300.0
"""How long an assumed bind may wait for the watch before it is dropped, if by
then the API shows the pod gone or still unbound."""

_FIT_TABLES = 64
"""Request shapes whose per-node results are kept (most recently used first)."""
_LOG_LIMIT = 50_000
_OBSERVED_LIMIT = 100_000
_EXPIRY_EVERY_S = 5.0
_REFUSED_LIMIT = 10_000
"""Pods refused everywhere kept for the requeue nudge; the least recently refused go first."""
_NOTICED_LIMIT = 10_000
"""UIDs of pods with an unserved schedulerName told about already; the oldest go first."""


@dataclass(slots=True)
class _PodRecord:
    uid: str
    node: str | None
    allocation: PodAllocation | None
    priority: int = 0
    """spec.priority (nil counts as 0, as in kube-scheduler): who preemption may evict."""
    deleting: bool = False
    """Deletion asked for: preemption counts its GPUs as freed and never picks it."""


@dataclass(slots=True)
class _Assumed:
    uid: str
    allocation: PodAllocation
    since: float


def interesting(pod: Pod) -> bool:
    """Pods the extender keeps: those asking for our resources or carrying an allocation."""
    annotations = pod.metadata.annotations
    return requests_gpu(pod) or any(key in annotations for key in annotation.ALL_KEYS)


class SchedulerCache:
    def __init__(
        self,
        default_policy: str = "binpack",
        max_pods_per_gpu: int = DEFAULT_MAX_PODS_PER_GPU,
        assume_ttl_s: float = ASSUME_TTL_S,
        clock: Callable[[], float] = time.monotonic,
        served_schedulers: Sequence[str] | None = None,
    ) -> None:
        self.lock = threading.RLock()
        self.default_policy = default_policy
        self.max_pods_per_gpu = max_pods_per_gpu
        self.assume_ttl_s = assume_ttl_s
        self._clock = clock
        self._placement_default = (
            PlacementMode(default_policy)
            if default_policy in PlacementMode.__members__.values()
            else PlacementMode.BINPACK
        )
        self.state = ClusterState()
        self.nodes: dict[str, Node] = {}
        self.node_policies: dict[str, str] = {}
        self.node_problems: dict[str, str] = {}
        self.pods: dict[str, _PodRecord] = {}
        self.pod_problems: dict[str, str] = {}
        self.assumed: dict[str, _Assumed] = {}
        self._policy_use: Counter[str] = Counter()
        self._tables: OrderedDict[tuple[Any, ...], FitTable] = OrderedDict()
        self._log: list[str] = []
        self._observed: OrderedDict[str, None] = OrderedDict()
        self._next_expiry = 0.0
        self.refused: OrderedDict[str, str] = OrderedDict()
        """Pods whose last filter answer refused every candidate node, key → UID, least
        recently refused first: those the requeue nudge asks kube-scheduler to retry."""
        self._freed: set[str] = set()
        self.listed_waiting = False
        """Set when a listing added waiting pods to `refused` (see _note_waiting)."""
        self.on_capacity_freed: Callable[[], None] = lambda: None
        """Called (with the lock held) when room appeared on a node while pods wait in
        `refused`: the requeue worker's wake-up (extender.requeue)."""
        self.served_schedulers = served_schedulers
        """Every schedulerName our scheduler serves; None: pods naming another are not
        looked for."""
        self.unserved: OrderedDict[str, tuple[str, str]] = OrderedDict()
        """Unbound pods asking for our resources under a schedulerName neither ours nor
        the default scheduler's, not told about yet: key → (UID, schedulerName)."""
        self._noticed: OrderedDict[str, None] = OrderedDict()
        self.on_unserved: Callable[[], None] = lambda: None
        """Called (with the lock held) when a pod joins `unserved`: the wake-up of the
        worker that posts their events (extender.unserved)."""
        self.nodes_synced = False
        self.pods_synced = False

    @property
    def synced(self) -> bool:
        return self.nodes_synced and self.pods_synced

    # ----- sinks of the watch caches

    def node_sink(self) -> "_Sink":
        return _Sink(self.replace_nodes, self.apply_node)

    def pod_sink(self) -> "_Sink":
        return _Sink(self.replace_pods, self.apply_pod)

    def replace_nodes(self, nodes: list[Node]) -> None:
        with self.lock:
            self.nodes = {node.name: node for node in nodes}
            self.nodes_synced = True
            self._rebuild()
            self._capacity_freed(self.nodes)  # what changed while the watch was away is unknown

    def replace_pods(self, pods: list[Pod]) -> None:
        with self.lock:
            # Let go of the old allocations before decoding the new ones: 100,000 pods
            # otherwise briefly need both (bench/scale_bench.py: peak 1.2 GiB, not 0.9).
            self.state = ClusterState()
            self._tables.clear()
            self.pods = {}
            self.pod_problems = {}
            self.unserved = OrderedDict()
            listed = {pod.metadata.uid for pod in pods}
            self._noticed = OrderedDict.fromkeys(uid for uid in self._noticed if uid in listed)
            for pod in pods:
                if not pod.is_finished:
                    self.pods[pod.key] = self._record(pod)
                    self._note_unserved(pod)
                    self._note_waiting(pod)
            self.pods_synced = True
            self._rebuild()
            self._capacity_freed(self.nodes)
            if self.unserved:
                self.on_unserved()

    def apply_node(self, event_type: EventType, node: Node) -> None:
        with self.lock:
            if event_type is EventType.DELETED:
                self.nodes.pop(node.name, None)
                self._drop_node(node.name)
            else:
                current = self.state.nodes.get(node.name)
                before = current.inventory if current else None
                self.nodes[node.name] = node
                if not self._put_node(node):
                    return  # a status update that changes nothing placement reads
                after = self.state.nodes.get(node.name)
                if adds_room(before, after.inventory if after else None):
                    self._capacity_freed((node.name,))
            self._changed(node.name)

    def apply_pod(self, event_type: EventType, pod: Pod) -> None:
        with self.lock:
            key = pod.key
            # A pod being deleted still runs on its GPUs: it is let go when gone or finished.
            if event_type is EventType.DELETED or pod.is_finished:
                self.pods.pop(key, None)
                self.pod_problems.pop(key, None)
                self.assumed.pop(key, None)
                self.refused.pop(key, None)
                self.unserved.pop(key, None)
                self._noticed.pop(pod.metadata.uid, None)
                self._set_allocation(key, None)
                return
            record = self.pods[key] = self._record(pod)
            if self._note_unserved(pod):
                self.on_unserved()
            if record.node:
                self.refused.pop(key, None)
            assumed = self.assumed.get(key)
            if assumed is not None:
                if assumed.uid == record.uid and record.allocation is None and not record.node:
                    # An event from before our bind: the Binding is still on its way.
                    return
                del self.assumed[key]
            self._set_allocation(key, record.allocation)

    # ----- binds in flight

    def assume(self, pod_key: str, uid: str, allocation: PodAllocation) -> None:
        with self.lock:
            self.assumed[pod_key] = _Assumed(uid, allocation, self._clock())
            self._set_allocation(pod_key, allocation)

    def forget(self, pod_key: str, uid: str) -> None:
        """Undo assume(): the bind failed, the API's view of the pod stands."""
        with self.lock:
            assumed = self.assumed.get(pod_key)
            if assumed is None or assumed.uid != uid:
                return
            del self.assumed[pod_key]
            record = self.pods.get(pod_key)
            self._set_allocation(pod_key, record.allocation if record else None)

    def expire(self) -> list[str]:
        """Drops assumptions older than the TTL whose pod the API shows gone or unbound."""
        with self.lock:
            now = self._clock()
            if now < self._next_expiry:
                return []
            self._next_expiry = now + min(_EXPIRY_EVERY_S, self.assume_ttl_s)
            dropped = []
            for key, assumed in list(self.assumed.items()):
                if now - assumed.since < self.assume_ttl_s:
                    continue
                record = self.pods.get(key)
                if record is None or (record.allocation is None and not record.node):
                    del self.assumed[key]
                    self._set_allocation(key, record.allocation if record else None)
                    dropped.append(key)
            for key in dropped:
                log.warning("dropped the assumed bind of %s: the watch never showed it", key)
            return dropped

    # ----- pods refused everywhere, for the requeue nudge

    def filtered(self, pod_key: str, uid: str, refused_everywhere: bool) -> None:
        """Filter's verdict on a pod: remembered while every candidate node refuses it.
        Call with the lock held; one dict operation, as filter is the hot path."""
        if refused_everywhere:
            self.refused[pod_key] = uid
            self.refused.move_to_end(pod_key)
            if len(self.refused) > _REFUSED_LIMIT:
                self.refused.popitem(last=False)
        elif self.refused:
            self.refused.pop(pod_key, None)

    def take_requeue(self, limit: int) -> tuple[set[str], list[tuple[str, str]]]:
        """The nodes where room appeared since the last call, and up to `limit` refused
        pods (key, UID) still waiting, least recently refused first. Pods the watch
        shows bound, being deleted or created again are forgotten here; pods it has
        not shown yet are kept (patching one that is gone answers 404)."""
        with self.lock:
            nodes, self._freed = self._freed, set()
            waiting: list[tuple[str, str]] = []
            gone = []
            for key, uid in self.refused.items():
                record = self.pods.get(key)
                if record is not None and (record.node or record.deleting or record.uid != uid):
                    gone.append(key)
                    continue
                waiting.append((key, uid))
                if len(waiting) == limit:
                    break
            for key in gone:
                del self.refused[key]
            return nodes, waiting

    def _note_waiting(self, pod: Pod) -> None:
        """A listed pod waiting for our scheduler joins the pods to nudge: while the
        extender was not there to answer (starting beside a kube-scheduler that already
        leads, restarted after a crash, or its watch away), kube-scheduler may have
        tried the pod, had its filter call fail, and parked it; 1.28 then retries it
        only on some later event or the five-minute flush."""
        if (
            self.served_schedulers is not None
            and pod.spec.scheduler_name in self.served_schedulers
            and not pod.spec.node_name
            and not pod.is_deleting
            and requests_gpu(pod)
        ):
            self.refused[pod.key] = pod.metadata.uid
            self.listed_waiting = True

    def take_listed_waiting(self) -> bool:
        """Whether pods joined the nudge because a listing showed them waiting (once)."""
        with self.lock:
            listed, self.listed_waiting = self.listed_waiting, False
            return listed

    def forget_refused(self, pod_key: str, uid: str) -> None:
        """The API says the pod is gone."""
        with self.lock:
            if self.refused.get(pod_key) == uid:
                del self.refused[pod_key]

    # ----- pods naming a scheduler nobody serves, for their event

    def take_unserved(self) -> list[tuple[str, str, str]]:
        """The pods in `unserved` (key, UID, schedulerName), each counted as told about
        from now on, so that it gets one event: a pod updated again, or listed again
        after a re-list, is not taken again while the UID is among the last 10,000
        told about (a deleted pod's is forgotten)."""
        with self.lock:
            taken = [(key, uid, name) for key, (uid, name) in self.unserved.items()]
            self.unserved.clear()
            for _, uid, _ in taken:
                self._noticed[uid] = None
                if len(self._noticed) > _NOTICED_LIMIT:
                    self._noticed.popitem(last=False)
            return taken

    # ----- what filter, prioritize, bind and preempt read (call with the lock held)

    def answers(self, request: PodRequest, pod_policy: str | None, names: list[str]) -> Answers:
        """The request's answer on each node, against the current state (nodes that
        did not change since an earlier request of the same shape are not evaluated
        again)."""
        table = self._table(request, pod_policy)
        return table.answers(names, lambda name: self._evaluate(name, request, pod_policy))

    def place(self, name: str, request: PodRequest, pod_policy: str | None) -> NodeFit:
        """A fresh evaluation against the latest state (what bind re-checks with)."""
        return self._evaluate(name, request, pod_policy)

    def policy_for(self, node: str, pod_policy: str | None) -> PlacementPolicy:
        return POLICIES[pod_policy or self.node_policies.get(node, self.default_policy)]

    def observe(self, uid: str, request: PodRequest, pod_policy: str | None) -> None:
        """policy.observe(request), once per pod, for each policy that may place it."""
        if uid in self._observed:
            return
        self._observed[uid] = None
        if len(self._observed) > _OBSERVED_LIMIT:
            self._observed.popitem(last=False)
        for name in self._policies(pod_policy):
            POLICIES[name].observe(request)

    def _policies(self, pod_policy: str | None) -> list[str]:
        """The policies that may place a pod: the one it names, else every node's."""
        return [pod_policy] if pod_policy else sorted({self.default_policy, *self._policy_use})

    def node_state(self, name: str) -> NodeState | None:
        return self.state.nodes.get(name)

    def pod_uid(self, pod_key: str) -> str:
        record = self.pods.get(pod_key) or self.assumed.get(pod_key)
        return record.uid if record else ""

    def snapshot(self) -> Snapshot:
        with self.lock:
            return self.state.snapshot()

    # ----- internals

    def _record(self, pod: Pod) -> _PodRecord:
        try:
            allocation = annotation.decode(pod)
            self.pod_problems.pop(pod.key, None)
        except AnnotationError as err:
            # Left out, never guessed at; shown in /inspect and the log.
            allocation = None
            if self.pod_problems.get(pod.key) != str(err):
                log.warning("pod %s: %s", pod.key, err)
            self.pod_problems[pod.key] = str(err)
        return _PodRecord(
            pod.metadata.uid,
            pod.spec.node_name,
            allocation,
            pod.spec.priority or 0,
            pod.is_deleting,
        )

    def _note_unserved(self, pod: Pod) -> bool:
        """Keeps `unserved` current for one pod; True when the pod joined it."""
        if self.served_schedulers is None:
            return False
        uid = pod.metadata.uid
        name = (
            None
            if pod.spec.node_name or pod.is_deleting or uid in self._noticed
            else unserved_scheduler(pod, self.served_schedulers)
        )
        if name is None:
            if self.unserved:
                self.unserved.pop(pod.key, None)
            return False
        joined = pod.key not in self.unserved
        self.unserved[pod.key] = (uid, name)
        return joined

    def _rebuild(self) -> None:
        self.state = ClusterState()
        self.node_policies = {}
        self.node_problems = {}
        self._policy_use = Counter()
        for node in self.nodes.values():
            self._put_node(node)
        for key, record in self.pods.items():
            if record.allocation is not None:
                self.state.add_pod(key, record.allocation)
        for key, assumed in list(self.assumed.items()):
            record = self.pods.get(key)
            if record is not None and (record.allocation is not None or record.node):
                del self.assumed[key]  # the listing already shows what came of it
            else:
                self.state.add_pod(key, assumed.allocation)
        self._tables.clear()
        self._log.clear()

    def _put_node(self, node: Node) -> bool:
        """Takes the node's labels and GPUs; False when nothing placement reads changed."""
        name = node.name
        policy = node_policy(node.metadata.labels, self.default_policy)
        try:
            inventory = node_gpus(node, self._placement_default, self.max_pods_per_gpu)
            problem = None
        except AnnotationError as err:
            inventory, problem = None, str(err)
        current = self.state.nodes.get(name)
        if (
            self.node_policies.get(name) == policy
            and self.node_problems.get(name) == problem
            and (current.inventory if current else None) == inventory
        ):
            return False
        self._drop_node(name, keep_pods=True)
        self.node_policies[name] = policy
        self._policy_use[policy] += 1
        if inventory is None:
            log.warning("node %s: %s", name, problem)
            self.node_problems[name] = problem or ""
            self.state.remove_node(name)
        else:
            self.state.set_node(inventory)
        return True

    def _drop_node(self, name: str, keep_pods: bool = False) -> None:
        policy = self.node_policies.pop(name, None)
        if policy is not None:
            self._policy_use[policy] -= 1
            if not self._policy_use[policy]:
                del self._policy_use[policy]
        self.node_problems.pop(name, None)
        if not keep_pods:
            self.state.remove_node(name)

    def _set_allocation(self, pod_key: str, allocation: PodAllocation | None) -> None:
        old = self.state.allocation(pod_key)
        if old == allocation:
            return
        if allocation is None:
            self.state.remove_pod(pod_key)
            if old is not None:
                self._capacity_freed((old.node,))
        else:
            self.state.add_pod(pod_key, allocation)
        for node in {a.node for a in (old, allocation) if a is not None}:
            self._changed(node)

    def _capacity_freed(self, nodes: Iterable[str]) -> None:
        if self.refused:  # nobody waits otherwise: leave the worker asleep
            self._freed.update(nodes)
            self.on_capacity_freed()

    def _changed(self, node: str) -> None:
        self._log.append(node)
        if len(self._log) > _LOG_LIMIT:
            for table in self._tables.values():
                self._catch_up(table)
                table.position = 0
            self._log.clear()

    def _catch_up(self, table: FitTable) -> None:
        for name in self._log[table.position :]:
            table.forget(name)
        table.position = len(self._log)

    def _table(self, request: PodRequest, pod_policy: str | None) -> FitTable:
        key = (pod_policy, request.shape)
        # Only these policies' epochs: another policy learning must not throw away
        # answers it had no part in (a full re-evaluation of every node).
        epochs = tuple((name, POLICIES[name].epoch) for name in self._policies(pod_policy))
        table = self._tables.get(key)
        if table is None or table.epochs != epochs:
            table = self._tables[key] = FitTable(len(self._log), epochs)
            if len(self._tables) > _FIT_TABLES:
                self._tables.popitem(last=False)
        else:
            self._tables.move_to_end(key)
            self._catch_up(table)
        return table

    def _evaluate(self, name: str, request: PodRequest, pod_policy: str | None) -> NodeFit:
        state = self.state.nodes.get(name)
        if state is None:
            problem = self.node_problems.get(name)
            message = (
                f"node {name}: {problem}; fix the gpushare device plugin there"
                if problem
                else f"node {name} is not known to the gpushare extender (yet)"
            )
            refusal = Refusal(Rule.NODE_UNKNOWN, message)
            return NodeFit(None, refusal, 0, str(refusal))
        result = evaluate(state.view(), request, self.policy_for(name, pod_policy))
        if isinstance(result, Refusal):
            return NodeFit(None, result, 0, str(result))
        return NodeFit(result, None, extender_score(result.score), "")


@dataclass(frozen=True, slots=True)
class _Sink:
    """Adapts SchedulerCache to kubecluster.CacheSink for one kind."""

    replace: Callable[[list[Any]], None]
    apply: Callable[[EventType, Any], None]
