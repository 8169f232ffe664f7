"""Pod events posted off the caller's path: the binder's `GpuAllocated`.

An event is one more API write, a round trip to the API server; made inside bind,
kube-scheduler's Bind extension point would wait for it although the pod is already
bound. So bind queues it and answers, and one daemon thread posts the queued events
in order. An API error is logged and the event not tried again (post_pod_event):
an event must never turn a done bind into an error.

The queue is bounded: while the API server falls behind, an event that does not fit
is dropped and counted (gpushare_extender_events_dropped_total{reason="queue-full"})
rather than held in memory or waited for. Stopping first posts what is queued for a
short while, so that a clean shutdown loses nothing; what is left then is dropped
and counted (reason "stopped").
"""

import logging
import threading
import time
from collections import deque
from typing import Final, NamedTuple

from prometheus_client import Counter

from gpushare.cluster import Cluster, EventSeverity, ObjectRef
from gpushare.extender.background import BackgroundWorker
from gpushare.extender.metrics import EventDrop
from gpushare.extender.podevents import post_pod_event

log = logging.getLogger(__name__)

CAPACITY: Final = 10_000
"""Events queued at most: minutes of binds at kube-scheduler's pace, a few MB."""
DRAIN_S: Final = 2.0
"""How long stopping waits for the queued events to be posted."""


class PodEvent(NamedTuple):
    pod: ObjectRef
    severity: EventSeverity
    reason: str
    message: str


class PodEventQueue(BackgroundWorker):
    """`post` queues an event and returns at once; the thread posts them in order."""

    def __init__(self, cluster: Cluster, dropped: Counter, capacity: int = CAPACITY) -> None:
        """`dropped`: the counter of events not posted, by EventDrop."""
        super().__init__("pod-events")
        self._cluster = cluster
        self._dropped = dropped
        self._capacity = capacity
        self._changed = threading.Condition()
        self._queue: deque[PodEvent] = deque()
        self._posting = False
        """An event is taken off the queue and not posted yet."""
        self._overflowing = False
        """Events are being dropped: logged once, when the first one is."""
        self._stopping = False

    def post(self, pod: ObjectRef, severity: EventSeverity, reason: str, message: str) -> None:
        """Queues the event (Cluster.record_event's arguments); never waits, never raises."""
        with self._changed:
            if self._stopping:
                self._dropped.labels(EventDrop.STOPPED).inc()
                return
            if len(self._queue) >= self._capacity:
                self._dropped.labels(EventDrop.QUEUE_FULL).inc()
                if not self._overflowing:
                    self._overflowing = True
                    log.warning(
                        "%d pod events wait for the API server: dropping new ones (counted "
                        'in gpushare_extender_events_dropped_total{reason="queue-full"}) '
                        "until it catches up",
                        self._capacity,
                    )
                return
            self._overflowing = False
            self._queue.append(PodEvent(pod, severity, reason, message))
        self.wake()

    def work(self) -> int:
        """Posts the queued events, oldest first; how many were posted."""
        posted = 0
        while (event := self._take()) is not None:
            try:
                posted += post_pod_event(self._cluster, *event)
            except Exception:  # a bug, not the API: the events after it still go
                pod = f"{event.pod.namespace}/{event.pod.name}"
                log.exception("posting the %s event of pod %s failed", event.reason, pod)
            with self._changed:
                self._posting = False
                self._changed.notify_all()
        return posted

    def flush(self, timeout: float) -> bool:
        """Waits until the queue is empty and no event is being posted (each one posted
        or failed); False when `timeout` seconds passed first."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._queue and not self._posting, timeout)

    def stop(self, timeout: float = DRAIN_S) -> None:
        """Posts what is queued for up to `timeout` seconds, then stops; the events
        still queued are dropped."""
        deadline = time.monotonic() + timeout
        self.flush(timeout)
        with self._changed:
            self._stopping = True
            left = len(self._queue)
            self._queue.clear()
        if left:
            self._dropped.labels(EventDrop.STOPPED).inc(left)
            log.warning("stopped with %d pod events not posted", left)
        super().stop(max(0.0, deadline - time.monotonic()))

    def _take(self) -> PodEvent | None:
        with self._changed:
            if not self._queue:
                return None
            self._posting = True
            return self._queue.popleft()
