"""The extender's picture of the cluster: the API's pods and nodes, plus its own
binds the watch has not shown yet ("assumed" pods, as kube-scheduler calls them).

It is the sink of the node and pod watch caches, so it is rebuilt from
annotations alone after every listing, and it never holds the only copy of
anything: an assumed allocation is also on its way to the API inside the
Binding. Everything here runs under one lock, which never leaves this class:
callers ask questions (answers, victims, details) or do operations (reserve,
assume, forget) through its methods, each one critical section. Scheduling
decisions read the state and reserve in the same critical section (`reserve`),
so concurrent binds cannot both take the last slice of a GPU.

Its placement policies are its own objects, made from a registry of factories
(gpushare.placement.policies), so what a policy learns from the pods filter sees belongs
to this extender alone. The verbs hand it the pod being placed as one value
(`pending` builds it: extender.pendingpod), read from the pod once per call.

It also keeps two books of waiting pods (extender.waiting), under the same lock:
the pods filter refused on every candidate node, with `on_capacity_freed` called
when a change it applies adds room, for the requeue nudge (extender.requeue), which
makes kube-scheduler retry them; and the pods that ask for our resources under a
schedulerName nobody serves, with `on_unserved` called when one joins, for the
worker that posts an event on each (extender.unserved).
"""

import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from datetime import datetime
from itertools import count
from typing import Any

from gpushare import annotation
from gpushare.allocation import PodAllocation
from gpushare.cluster import EventType
from gpushare.errors import AnnotationError, Refusal, Rule
from gpushare.extender.answertable import ANONYMOUS, Answers, AnswerTable, NodeFit, State
from gpushare.extender.damaged import DamagedRecords
from gpushare.extender.nodedetails import ClusterDetails, NodeDetails, node_details
from gpushare.extender.pendingpod import PendingPod, pending_pod
from gpushare.extender.policychoice import PolicyChoice
from gpushare.extender.waiting import RefusedPods, UnservedPods
from gpushare.inventory import adds_room, node_gpus
from gpushare.labels import NodeMode
from gpushare.objects import Node, Pod
from gpushare.placement.fit import Placement, PlacementPolicy, evaluate, to_allocation
from gpushare.placement.preemption import choose_victims
from gpushare.request import PodRequest, requests_gpu
from gpushare.resources import DEFAULT_MAX_PODS_PER_GPU, MANAGED_RESOURCES, parse_quantity
from gpushare.shapecache import ShapeCache
from gpushare.state import ClusterState, NodeView, Snapshot

log = logging.getLogger(__name__)

ASSUME_TTL_S = 300.0
"""How long an assumed bind may wait for the watch before it is dropped, if by
then the API shows the pod gone or still unbound."""

_FIT_TABLES = 64
"""Request shapes whose per-node results are kept (most recently used first)."""
_OBSERVED_LIMIT = 100_000
_STATE_FIELDS = tuple(f.name for f in fields(NodeView) if f.name != "name")
"""What placement reads of a node: its view, but for its name."""
_STATES_LIMIT = 100_000
"""Distinct node states numbered before the numbering starts over (bounds memory)."""

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
    """Pods the extender keeps: those asking for our resources or carrying an allocation."""
    annotations = pod.metadata.annotations
    return requests_gpu(pod) or any(key in annotations for key in annotation.ALL_KEYS)


class SchedulerCache:
    def __init__(
        self,
        choice: PolicyChoice | None = None,
        max_pods_per_gpu: int = DEFAULT_MAX_PODS_PER_GPU,
        assume_ttl_s: float = ASSUME_TTL_S,
        clock: Callable[[], float] = time.monotonic,
        served_schedulers: Sequence[str] | None = None,
    ) -> None:
        self._lock = threading.RLock()
        self.choice = PolicyChoice() if choice is None else choice
        self._policy_objects = self.choice.build()
        self.default_policy = self.choice.default
        self.max_pods_per_gpu = max_pods_per_gpu
        self.assume_ttl_s = assume_ttl_s
        self._clock = clock
        self._state = ClusterState()
        self._nodes: dict[str, Node] = {}
        self._node_policies: dict[str, str] = {}
        self._node_problems: dict[str, str] = {}
        self._gpu_shapes: dict[NodeMode, GpuShape] | None = None
        """gpu_shapes' answer, None until asked again after a node changed."""
        self._pods: dict[str, PodRecord] = {}
        self._pod_problems: dict[str, str] = {}
        self._assumed: dict[str, _Assumed] = {}
        self._policy_use: Counter[str] = Counter()
        self._fits: ShapeCache[AnswerTable] = ShapeCache(AnswerTable, _FIT_TABLES)
        self._state_numbers: dict[tuple[Any, ...], int] = {}
        """Each distinct node state (its view's fields but the name) by number."""
        self._node_states: dict[str, tuple[NodeView, int]] = {}
        """Each node's view last numbered, and its state's number."""
        self._numbers = count()
        self._observed: OrderedDict[str, None] = OrderedDict()
        self._filtered: OrderedDict[str, PendingPod] = OrderedDict()
        """The pods filter saw, by UID, newest last: what bind reads instead of the API."""
        self._next_expiry = 0.0
        # served_schedulers None: neither book looks at a pod's schedulerName.
        self._refused = RefusedPods(served_schedulers)
        self._unserved = UnservedPods(served_schedulers)
        self.on_capacity_freed: Callable[[], None] = lambda: None  # pragma: no mutate: no-op
        """Called (with the lock held) when room appeared on a node while refused pods
        wait: the requeue worker's wake-up (extender.requeue)."""
        self.on_unserved: Callable[[], None] = lambda: None  # pragma: no mutate: no-op
        self._damaged = DamagedRecords()
        self.on_damaged: Callable[[], None] = lambda: None  # pragma: no mutate: no-op
        """Called (with the lock held) when a pod's allocation record is found damaged:
        the wake-up of the worker that posts an event on it (extender.damaged)."""
        """Called (with the lock held) when a pod naming a scheduler nobody serves is
        noted: the wake-up of the worker that posts their events (extender.unserved)."""
        self._nodes_synced = False
        self._pods_synced = False

    @property
    def synced(self) -> bool:
        return self._nodes_synced and self._pods_synced

    # ----- sinks of the watch caches

    def node_sink(self) -> "_Sink":
        return _Sink(self.replace_nodes, self.apply_node)

    def pod_sink(self) -> "_Sink":
        return _Sink(self.replace_pods, self.apply_pod)

    def replace_nodes(self, nodes: list[Node]) -> None:
        with self._lock:
            self._nodes = {node.name: node for node in nodes}
            self._nodes_synced = True
            self._rebuild()
            self._capacity_freed(self._nodes)  # what changed while the watch was away is unknown

    def replace_pods(self, pods: list[Pod]) -> None:
        with self._lock:
            # Let go of the old allocations before decoding the new ones: 100,000 pods
            # otherwise briefly need both (bench/scale_bench.py: peak 1.2 GiB, not 0.9).
            self._state = ClusterState()  # pragma: no mutate: frees early; _rebuild makes it
            self._fits.clear()
            self._pods = {}
            self._pod_problems = {}
            self._unserved.relisted(pods)
            for pod in pods:
                if not pod.is_finished:
                    self._pods[pod.key] = self._record(pod)
                    self._unserved.note(pod)
                    self._refused.note_waiting(pod)
            self._damaged.relisted(self._pod_problems)
            self._pods_synced = True
            self._rebuild()
            self._capacity_freed(self._nodes)
            if self._unserved:
                self.on_unserved()

    def apply_node(self, event_type: EventType, node: Node) -> None:
        with self._lock:
            if event_type is EventType.DELETED:
                self._nodes.pop(node.name, None)
                self._drop_node(node.name)
            else:
                current = self._state.nodes.get(node.name)
                before = current.inventory if current else None
                self._nodes[node.name] = node
                if not self._put_node(node):
                    return  # a status update that changes nothing placement reads
                after = self._state.nodes.get(node.name)
                if adds_room(before, after.inventory if after else None):
                    self._capacity_freed((node.name,))
            self._changed(node.name)

    def apply_pod(self, event_type: EventType, pod: Pod) -> None:
        with self._lock:
            key = pod.key
            # A pod being deleted still runs on its GPUs: it is let go when gone or finished.
            if event_type is EventType.DELETED or pod.is_finished:
                self._pods.pop(key, None)
                self._pod_problems.pop(key, None)
                self._damaged.gone(key)
                self._assumed.pop(key, None)
                self._refused.drop(key)
                self._unserved.gone(pod)
                self._set_allocation(key, None)
                return
            record = self._pods[key] = self._record(pod)
            if self._unserved.note(pod):
                self.on_unserved()
            if record.node:
                self._refused.drop(key)
            assumed = self._assumed.get(key)
            if assumed is not None:
                if assumed.uid == record.uid and record.allocation is None and not record.node:
                    # An event from before our bind: the Binding is still on its way.
                    return
                del self._assumed[key]
            self._set_allocation(key, record.allocation)

    # ----- binds in flight

    def assume(self, pod_key: str, uid: str, allocation: PodAllocation) -> None:
        with self._lock:
            self._assumed[pod_key] = _Assumed(uid, allocation, self._clock())
            self._set_allocation(pod_key, allocation)

    def forget(self, pod_key: str, uid: str) -> None:
        """Undo assume(): the bind failed, the API's view of the pod stands."""
        with self._lock:
            assumed = self._assumed.get(pod_key)
            if assumed is None or assumed.uid != uid:
                return
            del self._assumed[pod_key]
            record = self._pods.get(pod_key)
            self._set_allocation(pod_key, record.allocation if record else None)

    def expire(self) -> list[str]:
        """Drops assumptions older than the TTL whose pod the API shows gone or unbound."""
        with self._lock:
            now = self._clock()
            if now < self._next_expiry:
                return []
            self._next_expiry = now + min(_EXPIRY_EVERY_S, self.assume_ttl_s)
            dropped = []
            for key, assumed in list(self._assumed.items()):
                if now - assumed.since < self.assume_ttl_s:
                    continue
                record = self._pods.get(key)
                if record is None or (record.allocation is None and not record.node):
                    del self._assumed[key]
                    self._set_allocation(key, None)  # the API shows no allocation either
                    dropped.append(key)
            for key in dropped:
                log.warning("dropped the assumed bind of %s: the watch never showed it", key)
            return dropped

    # ----- the books of waiting pods (extender.waiting), for the workers

    def take_requeue(self, limit: int) -> tuple[set[str], list[tuple[str, str]]]:
        """The nodes where room appeared since the last call, and up to `limit` refused
        pods (key, UID) still waiting, least recently refused first. Pods the watch
        shows bound, being deleted or created again are forgotten here; pods it has
        not shown yet are kept (patching one that is gone answers 404)."""
        with self._lock:
            return self._refused.take(limit, self._moved_on)

    def take_listed_waiting(self) -> bool:
        """Whether pods joined the nudge because a listing showed them waiting (once)."""
        with self._lock:
            return self._refused.take_listed_waiting()

    def forget_refused(self, pod_key: str, uid: str) -> None:
        """The API says the pod is gone."""
        with self._lock:
            self._refused.forget(pod_key, uid)

    def take_damaged(self) -> list[tuple[str, str, str]]:
        """The pods whose allocation record was found damaged (key, UID, what is wrong)
        since the last call, each once per problem (extender.damaged)."""
        with self._lock:
            return self._damaged.take()

    def take_unserved(self) -> list[tuple[str, str, str]]:
        """The pods naming a scheduler nobody serves (key, UID, schedulerName) noted
        since the last call, each taken once (UnservedPods.take)."""
        with self._lock:
            return self._unserved.take()

    # ----- what filter, prioritize, bind and preempt ask

    def pending(self, pod: Pod) -> PendingPod | None:
        """The pod as filter, prioritize, preempt and bind hand it to the methods below:
        its request, the policy it names among this cache's, its priority; None when it
        asks for none of our resources. Raises PodRefused when it breaks a rule. Reads
        no state, so it takes no lock."""
        return pending_pod(pod, self.choice)

    def filter(self, pod: PendingPod, names: list[str]) -> Answers:
        """Filter's answers for the pod, its policies taught about it first; while it
        fits nowhere it is remembered for the requeue nudge (extender.requeue)."""
        with self._lock:
            self._observe(pod.uid or pod.key, pod.request, pod.policy)
            if pod.uid:
                self._filtered[pod.uid] = pod
                self._filtered.move_to_end(pod.uid)
                # Far more pods than kube-scheduler has between filter and bind at once.
                if len(self._filtered) > 10_000:  # pragma: no mutate: a size, not a rule
                    self._filtered.popitem(last=False)  # pragma: no mutate: which goes, a size
            answers = self._answers(pod, names)
            self._refused.filtered(pod.key, pod.uid, answers.fits_nowhere())
            return answers

    def filtered(self, key: str, uid: str) -> PendingPod | None:
        """The pod `key` as filter last saw it with this UID, unless the watch shows it
        bound, being deleted or made again since: what bind places without reading the
        pod from the API server. A pod's resources cannot change after it is created."""
        with self._lock:
            pending = self._filtered.get(uid)
            if pending is None or pending.key != key:
                return None
            record = self._pods.get(key)
            if record is not None and (record.uid != uid or record.node or record.deleting):
                return None
            return pending

    def answers(self, pod: PendingPod, names: list[str]) -> Answers:
        """The pod's answer on each node, against the current state (what prioritize
        sends)."""
        with self._lock:
            return self._answers(pod, names)

    def priorities_json(self, pod: PendingPod, names: list[str]) -> str:
        """Prioritize's answer for the pod on these nodes, against the current state."""
        with self._lock:
            table = self._table(pod.request, pod.policy)
            return table.priorities_json(names, _Evaluation(self, pod.request, pod.policy))

    def reserve(self, pod: PendingPod, node: str, bound_at: datetime) -> PodAllocation | Refusal:
        """Places the pod on the node against the latest state and reserves the
        allocation (as assume()), in one critical section: a filter or a bind running
        beside it already counts it. Why it does not fit, when it does not."""
        with self._lock:
            # A reservation of ours for this very pod is stale: the pod is not bound.
            self.forget(pod.key, pod.uid)
            fit = self._evaluate(node, pod.request, pod.policy)
            state = self._state.nodes.get(node)
            if fit.placement is None or state is None:
                assert fit.refusal is not None
                return fit.refusal
            assignment = fit.placement.assignment
            allocation = to_allocation(pod.request, assignment, state.inventory, bound_at)
            self.assume(pod.key, pod.uid, allocation)
            return allocation

    def victims(self, node: str, pod: PendingPod, offered: list[str]) -> list[str]:
        """The UIDs to evict from the node for the pod, by its priority and our rules
        (gpushare.placement.preemption); `offered` when the scheduler's own UIDs make room and
        cost no more; empty when nothing helps. Pods being deleted count as gone."""
        with self._lock:
            state = self._state.nodes.get(node)
            if state is None:
                return []
            uids = {key: self._pod_uid(key) for key in state.pods}
            keys = {uid: key for key, uid in uids.items()}
            eligible: dict[str, int] = {}
            leaving = set()
            for key in state.pods:
                record = self._pods.get(key)
                if record is None:
                    continue  # assumed and not seen yet: its priority is unknown, it stays
                if record.deleting:
                    leaving.add(key)
                elif record.priority < pod.priority:
                    eligible[key] = record.priority
            eviction = choose_victims(
                state,
                pod.request,
                self._policy_for(node, pod.policy),
                eligible,
                offered=[keys[uid] for uid in offered if uid in keys],
                leaving=leaving,
            )
        if eviction is None:
            return []
        if eviction.keeps_offered:
            return offered
        return [uids[key] for key in eviction.pods]

    # ----- what /inspect, /metrics, the log and tests ask

    def counts(self) -> "CacheCounts":
        with self._lock:
            return CacheCounts(
                nodes=len(self._nodes),
                gpus=sum(len(state.inventory.gpus) for state in self._state.nodes.values()),
                pods=len(self._pods),
                placed=len(self._state.pod_nodes),
                assumed=len(self._assumed),
                refused=len(self._refused),
                problems=len(self._node_problems) + len(self._pod_problems),
                damaged=len(self._pod_problems),
            )

    def allocatable(self) -> dict[str, dict[str, int]]:
        """Per node with GPUs (or an unreadable inventory), the allocatable of each of our
        resources its Node status shows: what the kubelet took from the device plugin."""
        with self._lock:
            names = sorted(set(self._state.nodes) | set(self._node_problems))
            return {name: _our_allocatable(self._nodes.get(name)) for name in names}

    def gpu_shapes(self) -> Mapping[NodeMode, GpuShape] | None:
        """Per mode, the largest GPU and the most GPUs of any node in it (what the webhook
        asks of a request, extender.webhook); None until the nodes are listed.

        Kept until a node's GPUs, labels or readability change (`_drop_node`): the
        webhook asks for every pod created, and a pass over every node under the lock
        (1,000 nodes: about 1.3 ms) held up filter and bind beside it (bench/bind_bench.py)."""
        with self._lock:
            if not self._nodes_synced:
                return None
            if self._gpu_shapes is None:
                shapes: dict[NodeMode, GpuShape] = {}
                for state in self._state.nodes.values():
                    mode, gpus = state.inventory.mode, state.inventory.gpus
                    if mode is not None and gpus:
                        shapes[mode] = shapes.get(mode, GpuShape(0, 0)).widened(
                            GpuShape(max(g.mem for g in gpus), len(gpus))
                        )
                self._gpu_shapes = shapes
            return self._gpu_shapes

    def pod(self, pod_key: str) -> PodRecord | None:
        """What the watch showed of the pod last (None: not seen, or gone)."""
        with self._lock:
            return self._pods.get(pod_key)

    def assumed_keys(self) -> list[str]:
        with self._lock:
            return sorted(self._assumed)

    def refused_keys(self) -> list[str]:
        """The pods waiting for the requeue nudge, least recently refused first."""
        with self._lock:
            return self._refused.keys()

    def pod_problem(self, pod_key: str) -> str | None:
        with self._lock:
            return self._pod_problems.get(pod_key)

    def node_details(self, name: str) -> NodeDetails | None:
        """What the node holds, GPU by GPU and pod by pod; None when it is not known."""
        with self._lock:
            if name not in self._state.nodes and name not in self._node_problems:
                return None
            return self._details(name, with_pods=True)

    def nodes_details(
        self,
        with_pods: bool = False,  # pragma: no mutate: /metrics, its only user, reads no pod
    ) -> list[NodeDetails]:
        """Every node's details, by name (GPU by GPU; pod by pod when asked)."""
        with self._lock:
            names = sorted(set(self._state.nodes) | set(self._node_problems))
            return [self._details(name, with_pods) for name in names]

    def details(self) -> ClusterDetails:
        """The whole picture, at one instant: what /inspect shows."""
        with self._lock:
            nodes = [
                n for n in self.nodes_details(with_pods=True) if n.gpus or n.problem is not None
            ]
            return ClusterDetails(
                self.synced, tuple(nodes), tuple(sorted(self._assumed)), dict(self._pod_problems)
            )

    def snapshot(self) -> Snapshot:
        with self._lock:
            return self._state.snapshot()

    # ----- internals

    def _answers(self, pod: PendingPod, names: list[str]) -> Answers:
        """Nodes that did not change since an earlier request of the same shape are
        not evaluated again."""
        table = self._table(pod.request, pod.policy)
        return table.answers(names, _Evaluation(self, pod.request, pod.policy))

    def _policy_for(self, node: str, pod_policy: str | None) -> PlacementPolicy:
        name = pod_policy or self._node_policies[node]  # called for nodes with GPUs only
        return self._policy_objects[name]

    def _observe(self, uid: str, request: PodRequest, pod_policy: str | None) -> None:
        """policy.observe(request), once per pod, for each policy that may place it."""
        if uid in self._observed:
            return
        self._observed[uid] = None  # pragma: no mutate: an ordered set, values unread
        if len(self._observed) > _OBSERVED_LIMIT:
            self._observed.popitem(last=False)
        for name in self._policies(pod_policy):
            self._policy_objects[name].observe(request)

    def _policies(self, pod_policy: str | None) -> list[str]:
        """The policies that may place a pod: the one it names, else every node's."""
        return [pod_policy] if pod_policy else sorted({self.default_policy, *self._policy_use})

    def _pod_uid(self, pod_key: str) -> str:
        record = self._pods.get(pod_key) or self._assumed.get(pod_key)
        return record.uid if record else ""  # pragma: no mutate: a pod on a node is one of both

    def _details(self, name: str, with_pods: bool) -> NodeDetails:
        policy = self._node_policies[name]  # every node known has one, even an unreadable one
        return node_details(
            name,
            self._state.nodes.get(name),
            policy,
            self._node_problems.get(name),
            self._assumed,
            with_pods,
        )

    def _record(self, pod: Pod) -> PodRecord:
        # A damaged record is never left out: it is charged as ACK's keys say, or held
        # as an unknown allocation on its node (annotation.read); shown in /inspect, the
        # log, /metrics and an event on the pod.
        reading = annotation.read(pod)
        problem = reading.problem
        if problem is None:
            self._pod_problems.pop(pod.key, None)
            self._damaged.gone(pod.key)
        elif self._pod_problems.get(pod.key) != problem:
            log.warning("pod %s: %s", pod.key, problem)
            self._pod_problems[pod.key] = problem
            if self._damaged.note(pod.key, pod.metadata.uid, problem):
                self.on_damaged()
        return PodRecord(
            pod.metadata.uid,
            pod.spec.node_name,
            reading.allocation,
            pod.spec.priority or 0,
            pod.is_deleting,
        )

    def _rebuild(self) -> None:
        self._state = ClusterState()
        self._gpu_shapes = None
        self._node_states = {}
        self._node_policies = {}
        self._node_problems = {}
        self._policy_use = Counter()
        for node in self._nodes.values():
            self._put_node(node)
        for key, record in self._pods.items():
            if record.allocation is not None:
                self._state.add_pod(key, record.allocation)
        for key, assumed in list(self._assumed.items()):
            seen = self._pods.get(key)
            if seen is not None and (seen.allocation is not None or seen.node):
                del self._assumed[key]  # the listing already shows what came of it
            else:
                self._state.add_pod(key, assumed.allocation)
        self._fits.clear()
        if self.synced:
            self._number_states()

    def _number_states(self) -> None:
        # Once per listing rather than in the first request after it: at 5,000 nodes
        # making every node's view and state number takes ~80 ms, which the first pod
        # would wait for on top of evaluating its shape (bench/extender_bench.py).
        for name, node in self._state.nodes.items():
            # pragma: no mutate start, under another name the number is the same, only made twice
            self._state_number(name, node.view())
            # pragma: no mutate end

    def _put_node(self, node: Node) -> bool:
        """Takes the node's labels and GPUs; False when nothing placement reads changed."""
        name = node.name
        policy = self.choice.of_node(node.metadata.labels)
        try:
            inventory = node_gpus(node, self.max_pods_per_gpu)
            problem = None
        except AnnotationError as err:
            inventory, problem = None, str(err)
        current = self._state.nodes.get(name)
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
            self._state.remove_node(name)
        else:
            self._state.set_node(inventory)
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
            self._state.remove_node(name)
            self._node_states.pop(name, None)

    def _set_allocation(self, pod_key: str, allocation: PodAllocation | None) -> None:
        old = self._state.allocation(pod_key)
        if old == allocation:
            return
        if allocation is None:
            self._state.remove_pod(pod_key)
            if old is not None:
                self._capacity_freed((old.node,))
        else:
            self._state.add_pod(pod_key, allocation)
        for node in {a.node for a in (old, allocation) if a is not None}:
            self._changed(node)

    def _capacity_freed(self, nodes: Iterable[str]) -> None:
        if self._refused.room_appeared(nodes):
            self.on_capacity_freed()

    def _moved_on(self, pod_key: str, uid: str) -> bool:
        """Whether the watch shows the pod bound, being deleted or created again: it
        waits for no nudge any more."""
        record = self._pods.get(pod_key)
        return record is not None and bool(record.node or record.deleting or record.uid != uid)

    def _changed(self, node: str) -> None:
        self._fits.changed(node)

    def _table(self, request: PodRequest, pod_policy: str | None) -> AnswerTable:
        # Only these policies' epochs: another policy learning must not throw away
        # answers it had no part in (a full re-evaluation of every node).
        epochs = tuple(
            (name, self._policy_objects[name].epoch) for name in self._policies(pod_policy)
        )
        return self._fits.table((pod_policy, request.shape), epochs)

    def _state_number(self, name: str, view: NodeView) -> int:
        """The number of the node's state: equal for nodes whose views differ only by
        name. Numbers are never reused, so answers kept under an old one stay right."""
        known = self._node_states.get(name)
        if known is not None and known[0] is view:
            return known[1]
        nameless = tuple(map(view.__getattribute__, _STATE_FIELDS))
        number = self._state_numbers.get(nameless)
        if number is None:
            if len(self._state_numbers) >= _STATES_LIMIT:
                self._state_numbers.clear()
            number = self._state_numbers[nameless] = next(self._numbers)
        self._node_states[name] = (view, number)
        return number

    def _evaluate(self, name: str, request: PodRequest, pod_policy: str | None) -> NodeFit:
        state = self._state.nodes.get(name)
        if state is None:
            problem = self._node_problems.get(name)
            message = (
                f"node {name}: {problem}; fix the gpushare device plugin there"
                if problem
                else f"node {name} is not known to the gpushare extender (yet)"
            )
            refusal = Refusal(Rule.NODE_UNKNOWN, message)
            return NodeFit(None, refusal)
        return _fit(evaluate(state.view(), request, self._policy_for(name, pod_policy)))


class _Evaluation:
    """The answers a table has none of, for one request (answertable.Evaluation); called
    with the cache's lock held."""

    def __init__(self, cache: SchedulerCache, request: PodRequest, pod_policy: str | None):
        self.cache = cache
        self.request = request
        self.pod_policy = pod_policy

    def state(self, name: str) -> State | None:
        cache = self.cache
        node = cache._state.nodes.get(name)
        if node is None:
            return None
        policy = self.pod_policy or cache._node_policies[name]
        if not cache._policy_objects[policy].nameless:
            return None
        return (cache._state_number(name, node.view()), policy)

    def of_state(self, state: State, name: str) -> tuple[NodeView, NodeFit]:
        view = replace(self.cache._state.nodes[name].view(), name=ANONYMOUS)
        return view, self.again(state, view)

    def again(self, state: State, view: NodeView) -> NodeFit:
        return _fit(evaluate(view, self.request, self.cache._policy_objects[state[1]]))

    def of_node(self, name: str) -> NodeFit:
        return self.cache._evaluate(name, self.request, self.pod_policy)


def _fit(result: Placement | Refusal) -> NodeFit:
    if isinstance(result, Refusal):
        return NodeFit(None, result)
    return NodeFit(result, None)


def _our_allocatable(node: Node | None) -> dict[str, int]:
    quantities = node.status.allocatable if node is not None else {}
    return {
        resource: parse_quantity(quantities.get(resource, "0")) or 0
        for resource in MANAGED_RESOURCES
    }


@dataclass(frozen=True, slots=True)
class CacheCounts:
    nodes: int
    """Node objects the watch shows."""
    gpus: int
    pods: int
    """Pods kept: those asking for our resources or carrying an allocation."""
    placed: int
    """Allocations (the watch's and assumed ones) on nodes the cache knows."""
    assumed: int
    refused: int
    problems: int
    """Nodes and pods whose annotations could not be read."""
    damaged: int
    """Pods whose allocation record cannot be trusted (annotation.read)."""


@dataclass(frozen=True, slots=True)
class _Sink:
    """Adapts SchedulerCache to kubecluster.CacheSink for one kind."""

    replace: Callable[[list[Any]], None]
    apply: Callable[[EventType, Any], None]
