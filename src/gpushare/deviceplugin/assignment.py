"""Writes the plugin's view back to the pod's allocation annotation: `assigned`
per container after Allocate, and repairs after reconciliation.

Every write is a patch with the pod's resourceVersion as precondition, retried
on Conflict against a fresh read, so a concurrent writer (the extender, a
repair) is never overwritten. Marking happens on a background thread, off the
Allocate path: the kubelet admits pods one at a time and waits for each answer.
The thread lingers a moment after a mark, so the answer leaves before it takes
the interpreter, and a pod's containers, answered in quick succession, are
marked in one patch.
"""

import logging
from collections import deque
from collections.abc import Callable, Iterable
from functools import partial

from gpushare import annotation
from gpushare.allocation import PodAllocation
from gpushare.cluster import Cluster, Conflict, NotFound
from gpushare.deviceplugin.worker import Worker
from gpushare.errors import AnnotationError
from gpushare.objects import Pod

log = logging.getLogger(__name__)

ATTEMPTS = 5
LINGER = 0.02
"""Seconds between a mark and its patch."""

AllocationChange = Callable[[PodAllocation], PodAllocation]


def patch_allocation(cluster: Cluster, pod: Pod, change: AllocationChange) -> Pod | None:
    """Applies `change` to the pod's allocation; None when the pod is gone, was
    replaced (other UID) or has no readable allocation any more."""
    uid = pod.metadata.uid
    for attempt in range(ATTEMPTS):
        if attempt:
            try:
                pod = cluster.get_pod(pod.metadata.namespace, pod.metadata.name)
            except NotFound:
                return None
        if pod.metadata.uid != uid:
            return None
        try:
            current = annotation.decode(pod)
        except AnnotationError as err:
            log.warning("cannot update the allocation of %s: %s", pod.key, err)
            return None
        if current is None:
            return None
        updated = change(current)
        if updated == current:
            return pod
        moved = [c.gpus for c in updated.containers] != [c.gpus for c in current.containers]
        patch = annotation.encode(updated) if moved else annotation.assigned_annotations(updated)
        try:
            return cluster.patch_pod_annotations(
                pod.metadata.namespace,
                pod.metadata.name,
                patch,
                resource_version=pod.metadata.resource_version,
            )
        except Conflict:
            continue
        except NotFound:
            return None
    log.warning("gave up updating the allocation of %s after %d conflicts", pod.key, ATTEMPTS)
    return None


class AssignmentWriter(Worker):
    def __init__(self, cluster: Cluster, linger: float = LINGER) -> None:
        super().__init__("assignment-writer")
        self._cluster = cluster
        self._linger = linger
        self._todo: deque[tuple[Pod, str]] = deque()
        self._busy = False

    def queue(self, pod: Pod, container: str) -> None:
        """Marks the container without waking the thread (see wake())."""
        with self._cond:
            self._todo.append((pod, container))

    def wake(self) -> None:
        """Has the thread write what is queued. Allocate wakes it only once its answer
        has left: a woken thread competes for the interpreter with the answer."""
        with self._cond:
            self._cond.notify_all()

    def flush(self, timeout: float) -> bool:
        """Waits until every container queued so far is written; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._todo and not self._busy, timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._todo or self._stopped)
                self._busy = True
                self._cond.wait_for(lambda: self._stopped, self._linger)
                if self._stopped:
                    return
                batch = list(self._todo)
                self._todo.clear()
            try:
                for pod, names in _by_pod(batch):
                    mark = partial(PodAllocation.with_assigned, names=names)
                    patch_allocation(self._cluster, pod, mark)
            except Exception:
                log.exception("marking containers assigned failed")
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()


def _by_pod(batch: Iterable[tuple[Pod, str]]) -> list[tuple[Pod, set[str]]]:
    """One patch per pod, starting from the newest copy of it in the batch."""
    grouped: dict[str, tuple[Pod, set[str]]] = {}
    for pod, container in batch:
        _, names = grouped.get(pod.metadata.uid, (pod, set()))
        names.add(container)
        grouped[pod.metadata.uid] = (pod, names)
    return list(grouped.values())
