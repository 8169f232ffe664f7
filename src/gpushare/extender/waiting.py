"""The books of pods the extender's cache keeps: two of pods left waiting, for its
workers, and one of the pods filter saw, for bind.

`RefusedPods`: the pods filter refused on every candidate node, and those a
listing shows waiting for our scheduler; once room appears, the requeue nudge
(extender.requeue) makes kube-scheduler retry them. `UnservedPods`: the pods that
ask for our resources under a schedulerName nobody serves; each gets one
`SchedulerNotServed` event (extender.unserved). `FilteredPods`: the pods filter saw,
which bind places without reading them from the API server.

None is thread-safe. SchedulerCache calls them only under its one lock, so a
filter answer and the pod remembered for it, or a change applied and the nudge it
asks for, stay one critical section; the workers go through the cache too.
"""

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

from gpushare.extender.pendingpod import PendingPod
from gpushare.extender.schedulernames import unserved_scheduler
from gpushare.memo import BoundedMemo
from gpushare.objects import Pod
from gpushare.request import requests_gpu

_REFUSED_LIMIT = 10_000
"""Pods refused everywhere kept for the requeue nudge; the least recently refused go first."""
_NOTICED_LIMIT = 10_000
"""UIDs of pods with an unserved schedulerName told about already; the oldest go first."""


class RefusedPods:
    """The pods the requeue nudge asks kube-scheduler to retry, and the nodes where
    room appeared since it last did."""

    def __init__(self, served_schedulers: Sequence[str] | None) -> None:
        self.served_schedulers = served_schedulers
        """Every schedulerName our scheduler serves; None: listed pods are not looked at."""
        self._refused: BoundedMemo[str, str] = BoundedMemo(_REFUSED_LIMIT)
        """Pods whose last filter answer refused every candidate node, key → UID, least
        recently refused first."""
        self._freed: set[str] = set()
        self._listed_waiting = False
        """Set when a listing added waiting pods (see note_waiting)."""

    def __len__(self) -> int:
        return len(self._refused)

    def keys(self) -> list[str]:
        """Least recently refused first."""
        return list(self._refused)

    def filtered(self, pod_key: str, uid: str, refused_everywhere: bool) -> None:
        """Filter's verdict on a pod: remembered while every candidate node refuses it.
        One dict operation, as filter is the hot path."""
        if refused_everywhere:
            self._refused.put(pod_key, uid)
        elif self._refused:
            self._refused.pop(pod_key)

    def note_waiting(self, pod: Pod) -> None:
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
            self._refused.put(pod.key, pod.metadata.uid)
            self._listed_waiting = True

    def room_appeared(self, nodes: Iterable[str]) -> bool:
        """Notes the nodes where room appeared; True when pods wait for it."""
        if not self._refused:
            return False  # nobody waits: leave the worker asleep
        self._freed.update(nodes)
        return True

    def take(
        self, limit: int, moved_on: Callable[[str, str], bool]
    ) -> tuple[set[str], list[tuple[str, str]]]:
        """The nodes where room appeared since the last call, and up to `limit` pods
        (key, UID) still waiting, least recently refused first; those `moved_on`
        (key, UID) are forgotten on the way."""
        nodes, self._freed = self._freed, set()
        waiting: list[tuple[str, str]] = []
        gone = []
        for key, uid in self._refused.items():
            if moved_on(key, uid):
                gone.append(key)
                continue
            waiting.append((key, uid))
            if len(waiting) == limit:
                break
        for key in gone:
            self._refused.pop(key)
        return nodes, waiting

    def take_listed_waiting(self) -> bool:
        """Whether pods joined because a listing showed them waiting (once)."""
        listed, self._listed_waiting = self._listed_waiting, False
        return listed

    def forget(self, pod_key: str, uid: str) -> None:
        """The pod of that UID is gone (a newer one of its name stays)."""
        if self._refused.get(pod_key) == uid:
            self._refused.pop(pod_key)

    def drop(self, pod_key: str) -> None:
        """The pod is bound or gone, whichever UID it had."""
        self._refused.pop(pod_key)


class UnservedPods:
    """Unbound pods asking for our resources under a schedulerName neither ours nor
    the default scheduler's, not told about yet, and the UIDs told about already."""

    def __init__(self, served_schedulers: Sequence[str] | None) -> None:
        self.served_schedulers = served_schedulers
        """Every schedulerName our scheduler serves; None: pods naming another are not
        looked for."""
        self._unserved: OrderedDict[str, tuple[str, str]] = OrderedDict()
        """key → (UID, schedulerName)."""
        self._noticed: BoundedMemo[str, None] = BoundedMemo(_NOTICED_LIMIT)
        """The UIDs told about, the oldest first."""

    def __len__(self) -> int:
        return len(self._unserved)

    def relisted(self, pods: Iterable[Pod]) -> None:
        """A listing replaces the pods noted (note them again from it); a UID told about
        is kept while its pod is listed."""
        self._unserved = OrderedDict()
        listed = {pod.metadata.uid for pod in pods}
        kept: BoundedMemo[str, None] = BoundedMemo(_NOTICED_LIMIT)
        for uid in self._noticed:
            if uid in listed:
                kept.add(uid)
        self._noticed = kept

    def note(self, pod: Pod) -> bool:
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
            if self._unserved:
                self._unserved.pop(pod.key, None)
            return False
        joined = pod.key not in self._unserved
        self._unserved[pod.key] = (uid, name)
        return joined

    def gone(self, pod: Pod) -> None:
        """The pod was deleted or finished: a pod created again under its name is new."""
        self._unserved.pop(pod.key, None)
        self._noticed.pop(pod.metadata.uid, None)

    def take(self) -> list[tuple[str, str, str]]:
        """The pods noted (key, UID, schedulerName), each counted as told about from
        now on, so that it gets one event: a pod updated again, or listed again after
        a re-list, is not taken again while the UID is among the last 10,000 told
        about (a deleted pod's is forgotten)."""
        taken = [(key, uid, name) for key, (uid, name) in self._unserved.items()]
        self._unserved.clear()
        for _, uid, _ in taken:
            self._noticed.add(uid)
        return taken


_FILTERED_LIMIT = 10_000
"""Far more pods than kube-scheduler has between filter and bind at once."""


class FilteredPods:
    """The pods filter saw, by UID, newest last: what bind places without reading the
    pod from the API server (a pod's resources cannot change after it is created)."""

    def __init__(self) -> None:
        self._pods: BoundedMemo[str, PendingPod] = BoundedMemo(_FILTERED_LIMIT)

    def __len__(self) -> int:
        return len(self._pods)

    def saw(self, pod: PendingPod) -> None:
        if not pod.uid:
            return  # bind always names the UID: a pod without one is never looked up
        self._pods.put(pod.uid, pod)

    def get(self, key: str, uid: str) -> PendingPod | None:
        """The pod `key` as filter last saw it with this UID."""
        pending = self._pods.get(uid)
        return pending if pending is not None and pending.key == key else None
