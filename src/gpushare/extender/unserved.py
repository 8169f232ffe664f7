"""Events on pods nobody will schedule: those asking for our resources under a
schedulerName that neither gpushare's scheduler nor the default scheduler serves.

The webhook's admission warning reaches only whoever created such a pod; for a
Job's or a Deployment's pods that is the controller, and the user is left with a
Pending pod and no event at all. So the extender's cache notes each such pod it
sees (at the first listing too) in its book of them (extender.waiting.UnservedPods),
and this worker posts one Warning event `SchedulerNotServed` on it, naming the
scheduler and the fix.
"""

import logging
from collections.abc import Sequence
from typing import Final

from gpushare.cluster import Cluster
from gpushare.extender.background import BackgroundWorker
from gpushare.extender.cache import SchedulerCache
from gpushare.extender.podevents import post_pod_warning
from gpushare.extender.schedulernames import unserved_warning

log = logging.getLogger(__name__)

SCHEDULER_NOT_SERVED: Final = "SchedulerNotServed"


class UnservedReporter(BackgroundWorker):
    """A daemon thread woken by the cache (`on_unserved`) that posts the events;
    API errors are logged, never raised (the pod is not tried again)."""

    def __init__(self, cluster: Cluster, cache: SchedulerCache, served: Sequence[str]) -> None:
        super().__init__("unserved-events")
        self._cluster = cluster
        self._cache = cache
        self._served = tuple(served)

    def work(self) -> int:
        """Posts the event of each pod noted since the last call; how many were posted."""
        posted = 0
        for key, uid, name in self._cache.take_unserved():
            message = unserved_message(name, self._served)
            if not post_pod_warning(self._cluster, key, uid, SCHEDULER_NOT_SERVED, message):
                continue
            log.info(
                'pod %s names schedulerName "%s", which nobody serves: event posted', key, name
            )
            posted += 1
        return posted


def unserved_message(name: str, served: Sequence[str]) -> str:
    """The webhook's warning, and the fix: a pod's schedulerName cannot change."""
    return (
        f"{unserved_warning(name, served)}. To have gpushare schedule it, set "
        f"spec.schedulerName to {served[0]} in the pod (or its Job's or Deployment's "
        f'template) and create it again, or add "{name}" to scheduler.extraSchedulerNames '
        "(--extra-scheduler-names)"
    )
