"""Bind: choose the GPUs, record the allocation on the pod and create the Binding.

Binds are serialised per node. The fit is re-checked against the latest state
and the allocation reserved in the cache in one critical section, so a filter
or a bind running beside it already counts it. The allocation annotations travel
inside the Binding: the API server merges a Binding's annotations into the pod
in the same atomic update that sets spec.nodeName (docs/contracts.md#binding), so a pod
is never bound without its allocation, nor annotated without being bound, and a
failed bind leaves nothing on the pod to undo. Only the cache reservation is
undone on failure.

The `GpuAllocated` event goes to `post_event`, which queues it (extender.eventqueue):
bind answers kube-scheduler after one API write, the Binding, and a failed event
never fails a bind.
"""

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime

from gpushare import annotation
from gpushare.allocation import PodAllocation
from gpushare.cluster import (
    AlreadyBound,
    Cluster,
    ClusterError,
    Conflict,
    EventSeverity,
    EventType,
    NotFound,
    ObjectRef,
)
from gpushare.errors import PodRefused, Refusal
from gpushare.extender.cache import SchedulerCache
from gpushare.extender.metrics import BindResult, ExtenderMetrics
from gpushare.extender.wire import BindingArgs, for_scheduler
from gpushare.objects import Pod

log = logging.getLogger(__name__)


class BindRefused(Exception):
    """The bind cannot be done; the message goes back to kube-scheduler as Error."""

    def __init__(self, message: str, undo: bool = True) -> None:
        super().__init__(message)
        self.undo = undo
        """False when the Binding may have been created after all: keep the cache's
        reservation until the watch shows what became of the pod (or it expires)."""


PostEvent = Callable[[ObjectRef, EventSeverity, str, str], None]
"""Cluster.record_event's arguments; returns without waiting for the API server."""


class Binder:
    def __init__(
        self,
        cluster: Cluster,
        cache: SchedulerCache,
        metrics: ExtenderMetrics,
        post_event: PostEvent,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._cluster = cluster
        self._cache = cache
        self._metrics = metrics
        self._post_event = post_event
        self._now = now
        self._node_locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def bind(self, args: BindingArgs) -> str:
        """The Error kube-scheduler reads: empty when the pod is bound to args.node."""
        try:
            self._bind(args)
        except BindRefused as refused:
            self._metrics.binds.labels(BindResult.REFUSED).inc()
            log.info(
                "bind %s/%s to %s refused: %s",
                args.pod_namespace,
                args.pod_name,
                args.node,
                refused,
            )
            return for_scheduler(str(refused))
        self._metrics.binds.labels(BindResult.BOUND).inc()
        return ""

    def _bind(self, args: BindingArgs) -> None:
        self._metrics.assumptions_expired.inc(len(self._cache.expire()))
        key = f"{args.pod_namespace}/{args.pod_name}"
        pending = self._cache.filtered(key, args.pod_uid)  # never one without a UID
        if pending is not None:
            # The pod filter saw, by its UID: no read of it from the API server. The
            # Binding's UID precondition refuses it if the pod was made again since,
            # and the API server if it was bound or is being deleted.
            target = ObjectRef("Pod", args.pod_name, args.pod_namespace, args.pod_uid)
        else:
            pod = self._read(args.pod_namespace, args.pod_name)
            if args.pod_uid and pod.metadata.uid != args.pod_uid:
                raise BindRefused(
                    f"pod {pod.key} was deleted and created again (UID {pod.metadata.uid}, "
                    f"the scheduler asked for {args.pod_uid})"
                )
            if pod.spec.node_name:
                self._already_bound(pod, pod.spec.node_name, args.node)
                return
            try:
                pending = self._cache.pending(pod)
            except PodRefused as refused:
                raise BindRefused(f"pod {pod.key}: {refused}") from None
            target = ObjectRef.of_pod(pod)
            if pending is None:  # not ours to allocate: bind it as the default binder would
                self._create_binding(target, args.node, None)
                return
        with self._node_lock(args.node):
            reserved = self._cache.reserve(pending, args.node, self._now())
            if isinstance(reserved, Refusal):
                raise BindRefused(f"pod {key} does not fit any more: {reserved}")
            allocation = reserved
            try:
                created = self._create_binding(target, args.node, annotation.encode(allocation))
            except BaseException as failed:
                # A refusal may come after the Binding was made: then the watch decides.
                if not isinstance(failed, BindRefused) or failed.undo:
                    self._cache.forget(key, target.uid)
                raise
        if created:
            self._post_event(
                target,
                EventSeverity.NORMAL,
                "GpuAllocated",
                f"node {args.node}: {_gpus(allocation)} ({pending.request.describe()})",
            )

    def _create_binding(
        self, pod: ObjectRef, node: str, annotations: dict[str, str] | None
    ) -> bool:
        """True when this call created the Binding, False when the pod already was
        bound to `node` (a retried request that had succeeded)."""
        try:
            self._cluster.bind_pod(pod.namespace, pod.name, node, pod.uid, annotations)
            return True
        except AlreadyBound as err:
            self._metrics.bind_conflicts.inc()
            self._already_bound(self._read(pod.namespace, pod.name), err.node, node)
            return False
        except (Conflict, NotFound) as err:
            if isinstance(err, Conflict):
                self._metrics.bind_conflicts.inc()
            raise BindRefused(
                f"bind pod {pod.namespace}/{pod.name} to node {node}: {err}"
            ) from None
        except ClusterError as err:
            # The answer was lost, not necessarily the bind: look before reporting.
            return self._confirm_after_error(pod, node, err)

    def _already_bound(self, latest: Pod, bound_to: str, wanted: str) -> None:
        if bound_to != wanted:
            raise BindRefused(f"pod {latest.key} is already bound to node {bound_to}, not {wanted}")
        # Bound where we were asked to bind it: success. What the API shows for the
        # pod (its allocation, if any) replaces our reservation.
        # pragma: no mutate start, apply_pod tells only DELETED apart: None would act alike
        self._cache.apply_pod(EventType.MODIFIED, latest)
        # pragma: no mutate end

    def _confirm_after_error(self, pod: ObjectRef, node: str, err: ClusterError) -> bool:
        key = f"{pod.namespace}/{pod.name}"
        try:
            latest = self._cluster.get_pod(pod.namespace, pod.name)
        except ClusterError as again:
            raise BindRefused(
                f"bind pod {key} to node {node}: {err} (and re-reading it: {again})",
                undo=False,  # pragma: no mutate: undo=None is as falsy as False
            ) from None
        if latest.metadata.uid == pod.uid and latest.spec.node_name == node:
            # pragma: no mutate start, apply_pod tells only DELETED apart: None would act alike
            self._cache.apply_pod(EventType.MODIFIED, latest)
            # pragma: no mutate end
            return True
        raise BindRefused(f"bind pod {key} to node {node}: {err}")

    def _read(self, namespace: str, name: str) -> Pod:
        try:
            return self._cluster.get_pod(namespace, name)
        except NotFound:
            raise BindRefused(f"pod {namespace}/{name} not found") from None
        except ClusterError as err:
            raise BindRefused(f"cannot read pod {namespace}/{name}: {err}") from None

    def _node_lock(self, node: str) -> threading.Lock:
        with self._locks_guard:
            lock = self._node_locks.get(node)
            if lock is None:
                lock = self._node_locks[node] = threading.Lock()
            return lock


def _gpus(allocation: PodAllocation) -> str:
    return ", ".join(
        f"{c.name} on GPU {','.join(str(s.index) for s in c.gpus)}" for c in allocation.containers
    )
