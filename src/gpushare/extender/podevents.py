"""One Warning event on a pod, posted by the extender's event workers (unserved.py,
damaged.py): an API error is logged, never raised, and the event not tried again."""

import logging

from gpushare.cluster import Cluster, ClusterError, EventSeverity, ObjectRef

log = logging.getLogger(__name__)


def post_pod_warning(cluster: Cluster, key: str, uid: str, reason: str, message: str) -> bool:
    """Whether the event on pod `key` (namespace/name) was posted."""
    namespace, name = key.split("/", 1)
    try:
        cluster.record_event(
            ObjectRef("Pod", name, namespace, uid), EventSeverity.WARNING, reason, message
        )
    except ClusterError as err:
        log.warning("could not post the %s event of pod %s: %s", reason, key, err)
        return False
    return True
