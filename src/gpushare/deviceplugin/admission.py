"""Which container an Allocate call is for (docs/contracts.md#matching-allocate-to-a-container).

Allocate carries device IDs, not the pod. The kubelet admits one pod at a time,
init containers first, then app containers in order, and makes one call per
container per resource, asking for as many IDs as the container's limit. So the
queue holds every container bound to this node by the extender (allocation
annotation) that has not been answered yet, in that order, and a call goes to
the first one waiting for that resource with that count: containers of a pod
whose admission is under way first, then the oldest bound pod.

The served set (memory) and the `assigned` flags (annotation) together say who
was answered; the annotation survives a plugin restart, the set covers the
moments before our own patch comes back through the watch.

The kubelet learns of a pod from its own watch and may ask before ours has
delivered it, so a call that matches nothing waits, until its deadline, for the
queue to change (it wakes on every change) before it is refused. A call that
ended meanwhile (the kubelet restarted, our server stopped) takes nothing: its
answer would go nowhere and the container would wait in vain for another.
"""

import bisect
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property

from gpushare import annotation
from gpushare.allocation import ContainerAllocation, PodAllocation
from gpushare.deviceplugin.deadline import Deadline
from gpushare.objects import Container, Pod
from gpushare.request import ContainerRole
from gpushare.resources import RESOURCES

_EPOCH = datetime.fromtimestamp(0, tz=UTC)
_LISTED = 8
"""Waiting containers named in an error message before `and N more`."""
_LOCK_GRACE = 0.5
"""Seconds a call whose deadline has passed still waits for the lock: it may have
been spent already (see Allocator._deadline), and the watch holds the lock only
for moments."""


@dataclass(frozen=True, slots=True)
class WaitingContainer:
    pod: Pod
    allocation: PodAllocation
    container: ContainerAllocation
    requests: Mapping[str, int]
    """Our resources in the container's limits, with the count the kubelet asks for."""

    @property
    def key(self) -> tuple[str, str]:
        return (self.pod.metadata.uid, self.container.name)

    def describe(self, resource: str) -> str:
        return f"{self.pod.key} container {self.container.name} ({self.requests[resource]})"


@dataclass(frozen=True, slots=True)
class Match:
    waiting: WaitingContainer
    complete: bool
    """Every advertised resource of the container is answered: mark it assigned."""
    reallocation: bool = False
    """An assigned container asked for again (node reboot); answered the same way."""


class NoMatch(LookupError):
    """No waiting container fits the call; the message says what was asked, how
    long it waited and what was waiting."""


class CallEnded(Exception):
    """The call ended while it waited; no container was taken for it."""


class QueueBusy(TimeoutError):
    """The pod list stayed locked until the call's deadline."""


def _always() -> bool:
    return True


@dataclass(frozen=True, eq=False)
class _BoundPod:
    pod: Pod
    allocation: PodAllocation
    containers: tuple[WaitingContainer, ...]
    """Containers with our resources, in the kubelet's admission order."""
    raw: str | None
    """The allocation annotation as read, to skip parsing it again when unchanged."""

    @property
    def order(self) -> tuple[datetime, datetime, str]:
        created = self.pod.metadata.creation_timestamp or _EPOCH
        return (self.allocation.bound_at, created, self.pod.key)

    @cached_property
    def open(self) -> bool:
        """Some container is not marked assigned yet and may still be admitted."""
        return self.admissible and any(not c.container.assigned for c in self.containers)

    @property
    def admissible(self) -> bool:
        """False for a pod being deleted: it keeps its GPUs (and its place in the
        queue) until it is gone, but the kubelet starts none of its containers, so
        no Allocate call is for it."""
        return not self.pod.is_deleting

    @cached_property
    def started(self) -> bool:
        """Some container is marked assigned: the kubelet is admitting this pod."""
        return any(c.container.assigned for c in self.containers)

    def first_waiting(
        self, resource: str, count: int, served: Mapping[tuple[str, str], set[str]]
    ) -> WaitingContainer | None:
        if not self.admissible:
            return None
        for waiting in self.containers:
            if waiting.requests.get(resource) == count and _waits(waiting, resource, served):
                return waiting
        return None


def _order(bound: _BoundPod) -> tuple[datetime, datetime, str]:
    return bound.order


class AdmissionQueue:
    def __init__(self, node_name: str) -> None:
        self.node_name = node_name
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._pods: dict[str, _BoundPod] = {}
        self._open: list[_BoundPod] = []
        """Pods with containers not yet assigned, oldest binding first: all a call
        looks at, so a node full of running pods does not slow Allocate down."""
        self._served: dict[tuple[str, str], set[str]] = {}
        self._unreadable: dict[str, str] = {}

    # ----- fed by the pod watch

    def replace(self, pods: Iterable[Pod]) -> None:
        with self._lock:
            previous = self._pods
            self._pods = {}
            self._unreadable.clear()
            for pod in pods:
                # pragma: no mutate start, the previous parse only saves work: a new one is equal
                bound = self._bound(pod, previous.get(pod.metadata.uid))
                # pragma: no mutate end
                if bound is not None:
                    self._pods[pod.metadata.uid] = bound
            self._open = sorted((b for b in self._pods.values() if b.open), key=_order)
            live = {c.key for bound in self._pods.values() for c in bound.containers}
            self._served = {k: v for k, v in self._served.items() if k in live}
            self._changed.notify_all()

    def upsert(self, pod: Pod) -> None:
        with self._lock:
            uid = pod.metadata.uid
            bound = self._bound(pod, self._drop(uid))
            if bound is not None:
                self._pods[uid] = bound
                if bound.open:
                    bisect.insort(self._open, bound, key=_order)
                for c in bound.containers:
                    if c.container.assigned:
                        self._served.pop(c.key, None)  # the annotation says it now
            self._changed.notify_all()

    def remove(self, pod: Pod) -> None:
        with self._lock:
            uid = pod.metadata.uid
            self._drop(uid)
            self._unreadable.pop(pod.key, None)
            self._served = {k: v for k, v in self._served.items() if k[0] != uid}
            self._changed.notify_all()

    # ----- read by Allocate and GetPreferredAllocation

    def peek(
        self,
        resource: str,
        count: int,
        deadline: Deadline | None = None,
        active: Callable[[], bool] = _always,
    ) -> WaitingContainer | None:
        """The container the next call of `count` IDs of `resource` will go to,
        waiting until `deadline` for one to arrive (None: no wait) while `active()`."""
        self._acquire(deadline)
        try:
            return self._first_within(resource, count, deadline, active)
        finally:
            self._lock.release()

    def take(
        self,
        resource: str,
        count: int,
        advertised: Iterable[str],
        answered: tuple[str, str] | None = None,
        deadline: Deadline | None = None,
        active: Callable[[], bool] = _always,
    ) -> Match:
        """Matches a call and marks the container answered for `resource`.

        Waits until `deadline` for a matching container to arrive. Failing
        that, `answered` (pod UID, container) names the container a call with the
        very same device IDs was answered for: when it is still bound here, the
        kubelet is asking again (after a node reboot) and gets the same answer.
        `active()` false (the call ended) stops the wait and takes nothing.
        """
        self._acquire(deadline)
        try:
            waiting = self._first_within(resource, count, deadline, active)
            reallocation = False
            if waiting is None and answered is not None:
                waiting = self._container(answered, resource, count)
                reallocation = True
            if not active():
                raise CallEnded(f"the call for {count} {resource} ended before it was answered")
            if waiting is None:
                raise NoMatch(self._no_match(resource, count, deadline))
            served = self._served.setdefault(waiting.key, set())
            served.add(resource)
            complete = set(waiting.requests) & set(advertised) <= served
            return Match(waiting, complete, reallocation)
        finally:
            self._lock.release()

    def mark_served(self, uid: str, container: str, resources: Iterable[str]) -> None:
        with self._lock:
            self._served.setdefault((uid, container), set()).update(resources)

    def forget_served(self, uid: str, container: str) -> None:
        with self._lock:
            self._served.pop((uid, container), None)

    def uids(self) -> list[str]:
        with self._lock:
            return list(self._pods)

    def bound_pods(self) -> list[tuple[Pod, PodAllocation]]:
        with self._lock:
            return [(b.pod, b.allocation) for b in sorted(self._pods.values(), key=_order)]

    def waiting(self, resource: str) -> list[WaitingContainer]:
        with self._lock:
            return [w for b in self._open for w in b.containers if self._waits(w, resource)]

    # ----- internals (called with the lock held, but _acquire)

    def _acquire(self, deadline: Deadline | None) -> None:
        """Takes the lock, giving up at `deadline`: the watch thread holds it only
        to apply a change, but a call must not outwait its deadline for it."""
        if deadline is None:
            self._lock.acquire()
        elif not self._lock.acquire(timeout=max(deadline.remaining(), _LOCK_GRACE)):
            raise QueueBusy(
                f"the list of pods bound to node {self.node_name} stayed locked until its "
                f"deadline ({deadline.budget:g} s)"
            )

    def _drop(self, uid: str) -> _BoundPod | None:
        bound = self._pods.pop(uid, None)
        if bound is not None and bound.open:
            self._open.remove(bound)
        return bound

    def _bound(self, pod: Pod, before: _BoundPod | None) -> _BoundPod | None:
        self._unreadable.pop(pod.key, None)
        if pod.spec.node_name != self.node_name or pod.is_finished:
            return None
        raw = pod.metadata.annotations.get(annotation.ALLOCATION)
        if before is not None and raw is not None and raw == before.raw:
            allocation: PodAllocation | None = before.allocation  # unchanged: skip the parse
        else:
            # The extender's rule, read by the same codec: a damaged record is charged as
            # ACK's keys say or held unknown there, and no container of it is matched here.
            reading = annotation.read(pod)
            if reading.problem is not None:
                self._unreadable[pod.key] = reading.problem
                return None
            allocation = reading.allocation
        if allocation is None or allocation.node != self.node_name:
            return None
        containers = []
        for container in sorted(allocation.containers, key=_admission_rank):
            requests = _requests(container.spec_in(pod))
            if requests:
                containers.append(WaitingContainer(pod, allocation, container, requests))
        return _BoundPod(pod, allocation, tuple(containers), raw)

    def _first_within(
        self,
        resource: str,
        count: int,
        deadline: Deadline | None,
        active: Callable[[], bool],
    ) -> WaitingContainer | None:
        while True:
            found = self._first(resource, count)
            remaining = deadline.remaining() if deadline is not None else 0.0
            if found is not None or remaining <= 0 or not active():
                return found
            self._changed.wait(remaining)  # every change of the queue wakes it

    def _waits(self, waiting: WaitingContainer, resource: str) -> bool:
        return _waits(waiting, resource, self._served)

    def _first(self, resource: str, count: int) -> WaitingContainer | None:
        """A pod whose admission is under way first (normally none or one), else
        the oldest binding."""
        under_way = {uid for uid, _ in self._served} | {
            b.pod.metadata.uid for b in self._open if b.started
        }
        pods = [self._pods[uid] for uid in under_way if uid in self._pods]
        for bound in sorted(pods, key=_order) + self._open:
            waiting = bound.first_waiting(resource, count, self._served)
            if waiting is not None:
                return waiting
        return None

    def _container(
        self, key: tuple[str, str], resource: str, count: int
    ) -> WaitingContainer | None:
        bound = self._pods.get(key[0])
        if bound is None or not bound.admissible:
            return None
        for waiting in bound.containers:
            if waiting.key == key and waiting.requests.get(resource) == count:
                return waiting
        return None

    def _no_match(self, resource: str, count: int, deadline: Deadline | None) -> str:
        waiting = [w for b in self._open for w in b.containers if self._waits(w, resource)]
        asked = f"Allocate asked for {count} {resource} on node {self.node_name}"
        waited = (
            f" (waited {deadline.budget:g} s for the API watch to show one)"
            if deadline is not None and deadline.budget > 0
            else ""
        )
        if waiting:
            named = ", ".join(w.describe(resource) for w in waiting[:_LISTED])
            more = f" and {len(waiting) - _LISTED} more" if len(waiting) > _LISTED else ""
            text = (
                f"{asked}, but no waiting container asks for {count}{waited}; waiting for "
                f"{resource}: {named}{more}"
            )
        else:
            text = (
                f"{asked}, but no container bound to this node waits for {resource}{waited}; "
                f"pods get shared GPUs only when the gpushare scheduler extender placed them "
                f"(schedulerName gpushare-scheduler, annotation {annotation.ALLOCATION})"
            )
        if self._unreadable:
            bad = "; ".join(f"{key}: {reason}" for key, reason in sorted(self._unreadable.items()))
            text += f"; unreadable allocations: {bad}"
        return text


def _waits(
    waiting: WaitingContainer, resource: str, served: Mapping[tuple[str, str], set[str]]
) -> bool:
    return (
        resource in waiting.requests
        and not waiting.container.assigned
        and resource not in served.get(waiting.key, ())
    )


def _admission_rank(container: ContainerAllocation) -> tuple[int, int]:
    # pragma: no mutate block, a rank only orders: 2 for app containers would sort the same
    return (1 if container.role is ContainerRole.APP else 0, container.index)


def _requests(container: Container | None) -> dict[str, int]:
    """The counts the kubelet asks for: whole-number limits of our resources."""
    if container is None:
        return {}
    counts = {r.name: r.requested(container.resources.limits) for r in RESOURCES}
    return {name: count for name, count in counts.items() if count > 0}
