"""One event on a pod, posted by the extender's event workers (unserved.py,
damaged.py, eventqueue.py): an API error is logged, never raised, and the event not
tried again."""

import logging

from gpushare.cluster import Cluster, ClusterError, EventSeverity, ObjectRef

log = logging.getLogger(__name__)


def post_pod_event(
    cluster: Cluster, pod: ObjectRef, severity: EventSeverity, reason: str, message: str
) -> bool:
    """Whether the event on `pod` was posted."""
    try:
        cluster.record_event(pod, severity, reason, message)
    except ClusterError as err:
        log.warning(
            "could not post the %s event of pod %s/%s: %s", reason, pod.namespace, pod.name, err
        )
        return False
    return True


def post_pod_warning(cluster: Cluster, key: str, uid: str, reason: str, message: str) -> bool:
    """Whether the Warning event on pod `key` (namespace/name) was posted."""
    namespace, name = key.split("/", 1)
    pod = ObjectRef("Pod", name, namespace, uid)
    return post_pod_event(cluster, pod, EventSeverity.WARNING, reason, message)
