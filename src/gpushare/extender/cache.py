"""The scheduler cache: the one lock, the books, and the entry points of the verbs,
the watch and the workers.

It is the sink of the node and pod watch caches. Behind it are two rooms, each
owning its state and neither thread-safe: the mirror of the API's pods, nodes and
assumed binds (extender.mirror), and the answer engine — policies, node states and
answer tables (extender.engine). Everything runs under one lock, which never leaves
this class: callers ask questions (answers, victims, details) or do operations
(reserve, forget) through its methods, each one critical section. Scheduling
decisions read the state and reserve in the same critical section (`reserve`), so
concurrent binds cannot both take the last slice of a GPU.

It keeps the books (extender.waiting, extender.damaged) under the same lock: the pods
filter saw, which bind places without reading them; the pods filter refused on every
candidate node, with `on_capacity_freed` called when a change adds room, for the
requeue nudge (extender.requeue); the pods that ask for our resources under a
schedulerName nobody serves, with `on_unserved` called when one joins
(extender.unserved); and the pods whose allocation record is damaged, with
`on_damaged` called when one is noted (extender.damaged).
"""

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpushare.allocation import PodAllocation
from gpushare.cluster import EventType
from gpushare.errors import Refusal
from gpushare.extender.answertable import Answers
from gpushare.extender.damaged import Damaged, DamagedRecords
from gpushare.extender.engine import AnswerEngine
from gpushare.extender.mirror import ClusterMirror, GpuShape, PodRecord
from gpushare.extender.nodedetails import ClusterDetails, NodeDetails
from gpushare.extender.pendingpod import PendingPod, claim_pending_pod, pending_pod
from gpushare.extender.policychoice import PolicyChoice
from gpushare.extender.waiting import FilteredPods, RefusedPods, UnservedPods
from gpushare.labels import NodeMode
from gpushare.objects import Node, Pod
from gpushare.placement.fit import to_allocation
from gpushare.placement.preemption import choose_victims
from gpushare.resources import DEFAULT_MAX_PODS_PER_GPU
from gpushare.state import Snapshot

ASSUME_TTL_S = 300.0
"""How long an assumed bind may wait for the watch before it is dropped, if by
then the API shows the pod gone or still unbound."""


def _nothing() -> None:
    """What a wake-up does until a worker is wired to it."""


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
        self._filtered = FilteredPods()
        # served_schedulers None: neither book looks at a pod's schedulerName.
        self._refused = RefusedPods(served_schedulers)
        self._unserved = UnservedPods(served_schedulers)
        self._damaged = DamagedRecords()
        listener = _Listener(self._refused, self._damaged, self._room_freed, self._noted_damaged)
        self._mirror = ClusterMirror(self.choice, max_pods_per_gpu, assume_ttl_s, listener, clock)
        self._engine = listener.engine = AnswerEngine(self.choice, self._mirror)
        self.on_capacity_freed: Callable[[], None] = _nothing
        """Called (with the lock held) when room appeared on a node while refused pods
        wait: the requeue worker's wake-up (extender.requeue)."""
        self.on_unserved: Callable[[], None] = _nothing
        """Called (with the lock held) when a pod naming a scheduler nobody serves is
        noted: the wake-up of the worker that posts their events (extender.unserved)."""
        self.on_damaged: Callable[[], None] = _nothing
        """Called (with the lock held) when a pod's allocation record is found damaged:
        the wake-up of the worker that posts an event on it (extender.damaged)."""

    @property
    def synced(self) -> bool:
        return self._mirror.synced

    # ----- sinks of the watch caches

    def node_sink(self) -> "_Sink":
        return _Sink(self.replace_nodes, self.apply_node)

    def pod_sink(self) -> "_Sink":
        return _Sink(self.replace_pods, self.apply_pod)

    def replace_nodes(self, nodes: list[Node]) -> None:
        with self._lock:
            self._mirror.replace_nodes(nodes)

    def replace_pods(self, pods: list[Pod]) -> None:
        with self._lock:
            self._engine.clear()
            self._unserved.relisted(pods)
            running = [pod for pod in pods if not pod.is_finished]
            for pod in running:
                self._unserved.note(pod)
                self._refused.note_waiting(pod)
            self._mirror.replace_pods(running)
            self._damaged.relisted(self._mirror.pod_problems)
            if self._unserved:
                self.on_unserved()

    def apply_node(self, event_type: EventType, node: Node) -> None:
        with self._lock:
            self._mirror.apply_node(event_type, node)

    def apply_pod(self, event_type: EventType, pod: Pod) -> None:
        with self._lock:
            record = self._mirror.apply_pod(event_type, pod)
            if record is None:
                self._refused.drop(pod.key)
                self._unserved.gone(pod)
                return
            if self._unserved.note(pod):
                self.on_unserved()
            if record.node:
                self._refused.drop(pod.key)

    # ----- what filter, prioritize, bind and preempt ask

    def pending(self, pod: Pod) -> PendingPod | None:
        """The pod as filter, prioritize, preempt and bind hand it to the methods below:
        its request, the policy it names among this cache's, its priority; None when it
        asks for none of our resources. Raises PodRefused when it breaks a rule. Reads
        no state, so it takes no lock."""
        return pending_pod(pod, self.choice)

    def claim_pending(self, pod: Pod) -> PendingPod | None:
        """A DRA-mode pod as prioritize-claims hands it to claim_priorities_json: the ACK
        request it was rewritten from; None when it is not such a pod. Raises PodRefused."""
        return claim_pending_pod(pod, self.choice)

    def claim_priorities_json(self, pod: PendingPod, names: list[str]) -> str:
        """Prioritize's answer for a DRA-mode pod, its policies taught about it first:
        kube-scheduler filters such a pod itself (its DRA plugin), so this is the one
        call that shows it to the extender before it is placed."""
        with self._lock:
            self._engine.observe(pod.uid or pod.key, pod.request, pod.policy)
            return self._engine.priorities_json(pod, names)

    def filter(self, pod: PendingPod, names: list[str]) -> Answers:
        """Filter's answers for the pod, its policies taught about it first; while it
        fits nowhere it is remembered for the requeue nudge (extender.requeue)."""
        with self._lock:
            self._engine.observe(pod.uid or pod.key, pod.request, pod.policy)
            self._filtered.saw(pod)
            answers = self._engine.answers(pod, names)
            self._refused.filtered(pod.key, pod.uid, answers.fits_nowhere())
            return answers

    def filtered(self, key: str, uid: str) -> PendingPod | None:
        """The pod `key` as filter last saw it with this UID, unless the watch shows it
        bound, being deleted or made again since: what bind places without reading the
        pod from the API server."""
        with self._lock:
            pending = self._filtered.get(key, uid)
            if pending is None or self._mirror.moved_on(key, uid):
                return None
            return pending

    def answers(self, pod: PendingPod, names: list[str]) -> Answers:
        """The pod's answer on each node, against the current state."""
        with self._lock:
            return self._engine.answers(pod, names)

    def priorities_json(self, pod: PendingPod, names: list[str]) -> str:
        """Prioritize's answer for the pod on these nodes, against the current state."""
        with self._lock:
            return self._engine.priorities_json(pod, names)

    def reserve(self, pod: PendingPod, node: str, bound_at: datetime) -> PodAllocation | Refusal:
        """Places the pod on the node against the latest state and reserves the
        allocation (an assumed bind), in one critical section: a filter or a bind
        running beside it already counts it. Why it does not fit, when it does not."""
        with self._lock:
            # A reservation of ours for this very pod is stale: the pod is not bound.
            self._mirror.forget(pod.key, pod.uid)
            fit = self._engine.evaluate(node, pod.request, pod.policy)
            state = self._mirror.state.nodes.get(node)
            if fit.placement is None or state is None:
                assert fit.refusal is not None
                return fit.refusal
            assignment = fit.placement.assignment
            allocation = to_allocation(pod.request, assignment, state.inventory, bound_at)
            self._mirror.assume(pod.key, pod.uid, allocation)
            return allocation

    def forget(self, pod_key: str, uid: str) -> None:
        """Undo reserve(): the bind failed, the API's view of the pod stands."""
        with self._lock:
            self._mirror.forget(pod_key, uid)

    def expire(self) -> list[str]:
        """Drops assumed binds older than the TTL whose pod the API shows gone or unbound."""
        with self._lock:
            return self._mirror.expire()

    def victims(self, node: str, pod: PendingPod, offered: list[str]) -> list[str]:
        """The UIDs to evict from the node for the pod, by its priority and our rules
        (gpushare.placement.preemption); `offered` when the scheduler's own UIDs make room and
        cost no more; empty when nothing helps. Pods being deleted count as gone."""
        with self._lock:
            mirror = self._mirror
            state = mirror.state.nodes.get(node)
            if state is None:
                return []
            uids = {key: mirror.pod_uid(key) for key in state.pods}
            keys = {uid: key for key, uid in uids.items()}
            eligible: dict[str, int] = {}
            leaving = set()
            for key in state.pods:
                record = mirror.pod(key)
                if record is None:
                    continue  # assumed and not seen yet: its priority is unknown, it stays
                if record.deleting:
                    leaving.add(key)
                elif record.priority < pod.priority:
                    eligible[key] = record.priority
            eviction = choose_victims(
                state,
                pod.request,
                self._engine.policy_on(node, pod.policy),
                eligible,
                offered=[keys[uid] for uid in offered if uid in keys],
                leaving=leaving,
            )
        if eviction is None:
            return []
        if eviction.keeps_offered:
            return offered
        return [uids[key] for key in eviction.pods]

    # ----- the books of waiting pods, for the workers

    def take_requeue(self, limit: int) -> tuple[set[str], list[tuple[str, str]]]:
        """The nodes where room appeared since the last call, and up to `limit` refused
        pods (key, UID) still waiting, least recently refused first. Pods the watch
        shows bound, being deleted or created again are forgotten here; pods it has
        not shown yet are kept (patching one that is gone answers 404)."""
        with self._lock:
            return self._refused.take(limit, self._mirror.moved_on)

    def take_listed_waiting(self) -> bool:
        """Whether pods joined the nudge because a listing showed them waiting (once)."""
        with self._lock:
            return self._refused.take_listed_waiting()

    def forget_refused(self, pod_key: str, uid: str) -> None:
        """The API says the pod is gone."""
        with self._lock:
            self._refused.forget(pod_key, uid)

    def take_damaged(self) -> list[Damaged]:
        """The pods whose allocation record was found damaged (key, UID, what is wrong)
        since the last call, each once per problem (extender.damaged)."""
        with self._lock:
            return self._damaged.take()

    def take_unserved(self) -> list[tuple[str, str, str]]:
        """The pods naming a scheduler nobody serves (key, UID, schedulerName) noted
        since the last call, each taken once (UnservedPods.take)."""
        with self._lock:
            return self._unserved.take()

    # ----- what /inspect, /metrics, the webhook and the log ask

    def counts(self) -> "CacheCounts":
        with self._lock:
            mirror = self._mirror
            nodes = mirror.state.nodes.values()
            damaged = len(mirror.pod_problems)
            return CacheCounts(
                nodes=mirror.node_count,
                gpus=sum(len(state.inventory.gpus) for state in nodes),
                pods=mirror.pod_count,
                placed=len(mirror.state.pod_nodes),
                assumed=len(mirror.assumed),
                refused=len(self._refused),
                problems=mirror.node_problem_count + damaged,
                damaged=damaged,
            )

    def allocatable(self) -> dict[str, dict[str, int]]:
        """Per node with GPUs (or an unreadable inventory), the allocatable of each of our
        resources its Node status shows: what the kubelet took from the device plugin."""
        with self._lock:
            return {name: self._mirror.allocatable(name) for name in self._mirror.names()}

    def gpu_shapes(self) -> Mapping[NodeMode, GpuShape] | None:
        """Per mode, the largest GPU and the most GPUs of any node in it (what the webhook
        asks of a request, extender.webhook); None until the nodes are listed."""
        with self._lock:
            return self._mirror.gpu_shapes()

    def pod(self, pod_key: str) -> PodRecord | None:
        """What the watch showed of the pod last (None: not seen, or gone)."""
        with self._lock:
            return self._mirror.pod(pod_key)

    def node_details(self, name: str) -> NodeDetails | None:
        """What the node holds, GPU by GPU and pod by pod; None when it is not known."""
        with self._lock:
            if name not in self._mirror.state.nodes and self._mirror.node_problem(name) is None:
                return None
            return self._mirror.details(name, with_pods=True)

    def nodes_details(
        self,
        with_pods: bool = False,  # pragma: no mutate: /metrics, its only user, reads no pod
    ) -> list[NodeDetails]:
        """Every node's details, by name (GPU by GPU; pod by pod when asked)."""
        with self._lock:
            return [self._mirror.details(name, with_pods) for name in self._mirror.names()]

    def details(self) -> ClusterDetails:
        """The whole picture, at one instant: what /inspect shows."""
        with self._lock:
            mirror = self._mirror
            nodes = [
                n for n in self.nodes_details(with_pods=True) if n.gpus or n.problem is not None
            ]
            return ClusterDetails(
                mirror.synced,
                tuple(nodes),
                mirror.assumed,
                dict(mirror.pod_problems),
                tuple(self._refused.keys()),
            )

    def policy_epochs(self) -> tuple[int, ...]:
        """Each policy's epoch (what it has learned moves it), by name: what
        bench/extender_bench.py reads to tell why a request re-evaluated nodes."""
        with self._lock:
            return self._engine.epochs()

    def snapshot(self) -> Snapshot:
        with self._lock:
            return self._mirror.state.snapshot()

    # The wake-ups are looked up when called: the workers are wired after the cache is made.
    def _room_freed(self) -> None:
        self.on_capacity_freed()

    def _noted_damaged(self) -> None:
        self.on_damaged()


class _Listener:
    """What the mirror tells, passed on to the engine and the books (under the lock)."""

    engine: AnswerEngine

    def __init__(
        self,
        refused: RefusedPods,
        damaged: DamagedRecords,
        room_freed: Callable[[], None],
        noted_damaged: Callable[[], None],
    ) -> None:
        self._refused = refused
        self._damaged = damaged
        self._room_freed = room_freed
        self._noted_damaged = noted_damaged

    def node_changed(self, name: str) -> None:
        self.engine.node_changed(name)

    def rebuilt(self) -> None:
        self.engine.rebuilt()

    def room_appeared(self, names: Iterable[str]) -> None:
        if self._refused.room_appeared(names):
            self._room_freed()

    def record_damaged(self, key: str, uid: str, problem: str) -> None:
        if self._damaged.note(key, uid, problem):
            self._noted_damaged()

    def record_gone(self, key: str) -> None:
        self._damaged.gone(key)


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
