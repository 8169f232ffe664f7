"""The requeue nudge: makes kube-scheduler retry pods filter refused everywhere as
soon as the extender sees GPU capacity free up.

kube-scheduler requeues an unschedulable pod on cluster events, but it learns of
an event (a pod deleted or finished, a node's GPUs healthy again) from its own
watch, and may retry before the extender's watch has delivered the same event:
filter then refuses again on stale state, and since no plugin of the scheduler
refused the pod, it waits for some later event or the periodic flush of
unschedulable pods (up to five minutes). So once the extender's cache has applied
a change that adds room, this worker patches the annotation `gpushare.io/requeued-at`
onto the pods still waiting (the cache's book of them, extender.waiting.RefusedPods):
an update of the pod itself, which moves it back to the scheduler's active queue
(kube-scheduler 1.28 requeues on any change outside status and the resourceVersion;
1.29+ with queueing hints on any event for a pod only an extender refused).

The same nudge goes to every pod a listing of pods shows waiting for our scheduler
(at start, or when the watch lists again): kube-scheduler may have tried them while
the extender could not answer (a new pod whose kube-scheduler leads before its
extender serves, an extender restarted after a crash), and parked them after the
failed call.
"""

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Final

from gpushare.cluster import Cluster, ClusterError, NotFound
from gpushare.extender.background import BackgroundWorker
from gpushare.extender.cache import SchedulerCache
from gpushare.extender.metrics import ExtenderMetrics, RequeueResult

log = logging.getLogger(__name__)

REQUEUED_AT_ANNOTATION: Final = "gpushare.io/requeued-at"
LINGER_S = 0.15
"""How long the worker waits after the first change before patching, so that a burst
of deletions makes one nudge."""
BATCH = 100
"""Pods patched per nudge at most, least recently refused first."""
_NODES_NAMED = 5


class Requeuer(BackgroundWorker):
    """A daemon thread woken by the cache (`on_capacity_freed`) that patches the
    waiting pods; API errors are logged, never raised, and a pod that is gone (404)
    is forgotten."""

    def __init__(
        self,
        cluster: Cluster,
        cache: SchedulerCache,
        metrics: ExtenderMetrics,
        linger_s: float = LINGER_S,
        batch: int = BATCH,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        super().__init__("requeue", linger_s)
        self._cluster = cluster
        self._cache = cache
        self._metrics = metrics
        self._batch = batch
        self._now = now

    def work(self) -> int:
        return self.nudge()

    def nudge(self) -> int:
        """Patches the pods still waiting; how many were patched."""
        nodes, waiting = self._cache.take_requeue(self._batch)
        if not nodes or not waiting:
            return 0
        stamp = self._now().isoformat(timespec="milliseconds").replace("+00:00", "Z")
        requeued = 0
        for key, uid in waiting:
            namespace, name = key.split("/", 1)
            try:
                self._cluster.patch_pod_annotations(
                    namespace, name, {REQUEUED_AT_ANNOTATION: stamp}
                )
            except NotFound:
                self._cache.forget_refused(key, uid)
                self._metrics.requeues.labels(RequeueResult.GONE).inc()
                continue
            except ClusterError as err:
                self._metrics.requeues.labels(RequeueResult.FAILED).inc()
                log.warning("could not requeue pod %s: %s", key, err)
                continue
            self._metrics.requeues.labels(RequeueResult.REQUEUED).inc()
            requeued += 1
        if requeued and self._cache.take_listed_waiting():
            log.info(
                "requeued %d pods waiting for our scheduler, listed when the extender "
                "(re)started watching: kube-scheduler may have tried them while the "
                "extender could not answer",
                requeued,
            )
        elif requeued:
            log.info(
                "requeued %d pods refused earlier after GPU capacity freed on %s",
                requeued,
                _where(nodes),
            )
        return requeued


def _where(nodes: set[str]) -> str:
    names = sorted(nodes)
    if len(names) == 1:
        return f"node {names[0]}"
    if len(names) <= _NODES_NAMED:
        return f"nodes {', '.join(names)}"
    return f"{len(names)} nodes ({', '.join(names[:_NODES_NAMED])}, …)"
