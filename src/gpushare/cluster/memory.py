"""The in-memory cluster: an API server stand-in for tests, the demo and the simulator.

Thread-safe. Every write bumps one cluster-wide resourceVersion (as etcd does),
watchers get events in write order, and a bounded history lets a watch resume
from a recent version or fail with Expired, like a 410 Gone.
"""

import queue
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from gpushare.cluster.memorydra import MemoryDra
from gpushare.cluster.port import (
    AlreadyBound,
    Conflict,
    EventSeverity,
    EventType,
    Expired,
    Listing,
    NotFound,
    ObjectRef,
    WatchEvent,
)
from gpushare.dra.validation import DEFAULT_GATES, ApiGates
from gpushare.inventory import NODE_GPUS_ANNOTATION, Gpu, encode_gpus
from gpushare.labels import LABEL_SCHEDULE
from gpushare.objects import Node, NodeStatus, ObjectMeta, Pod, PodResourceClaimStatus, PodStatus
from gpushare.resources import CORE_PER_GPU, GPU_CORE, GPU_COUNT, GPU_MEM

_Obj = TypeVar("_Obj", Node, Pod)

HISTORY = 10_000
"""Events kept for watches that resume from an older resourceVersion."""


@dataclass(frozen=True, slots=True)
class RecordedEvent:
    ref: ObjectRef
    severity: EventSeverity
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class _Change:
    event: WatchEvent[Node] | WatchEvent[Pod]
    old: Pod | None
    """The pod before a pod change, so node-filtered watches see pods arrive and leave."""


_Translate = Callable[[_Change], WatchEvent[Any] | None]

_STOP = object()


class MemoryWatch(Generic[_Obj]):
    """Implements gpushare.cluster.Watch (no bookmarks: `resume_from` is the version of
    the last event iterated)."""

    def __init__(self, detach: Callable[["MemoryWatch[Any]"], None]) -> None:
        self._queue: queue.Queue[object] = queue.Queue()
        self._detach = detach
        self.resume_from = ""

    def push(self, event: WatchEvent[_Obj]) -> None:
        self._queue.put(event)

    def stop(self) -> None:
        self._detach(self)
        self._queue.put(_STOP)

    def __iter__(self) -> Iterator[WatchEvent[_Obj]]:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if isinstance(item, WatchEvent):
                self.resume_from = item.object.metadata.resource_version
            # Anything else was pushed by a caller for its own use, e.g. the bookmarks
            # of the test API server (tests/kubecluster/apiserver.py): passed through.
            yield item  # type: ignore[misc]


class MemoryCluster(MemoryDra):
    """Implements gpushare.cluster.Cluster, plus the writes that kubectl, the
    kubelet and controllers would make (create_pod, set_pod_phase, ...), and
    gpushare.cluster.DraCluster (MemoryDra) as an API server of `dra_gates` would."""

    def __init__(self, dra_gates: ApiGates = DEFAULT_GATES) -> None:
        self._lock = threading.RLock()
        self._version = 0
        super().__init__(dra_gates)
        self._nodes: dict[str, Node] = {}
        self._pods: dict[str, Pod] = {}
        self._history: deque[tuple[int, _Change]] = deque(maxlen=HISTORY)
        self._oldest = 0
        self._watches: list[tuple[MemoryWatch[Any], _Translate]] = []
        self.events: list[RecordedEvent] = []

    # ----- the port: nodes

    def get_node(self, name: str) -> Node:
        with self._lock:
            try:
                return self._nodes[name]
            except KeyError:
                raise NotFound(f'node "{name}" not found') from None

    def list_nodes(self, name: str | None = None) -> Listing[Node]:
        with self._lock:
            nodes = [n for n in self._nodes.values() if name in (None, n.name)]
            return Listing(nodes, str(self._version))

    def watch_nodes(self, resource_version: str, name: str | None = None) -> MemoryWatch[Node]:
        if name is None:
            return self._watch(resource_version, _kind_filter(Node))
        return self._watch(resource_version, _named_node_filter(name))

    def patch_node_annotations(self, name: str, annotations: Mapping[str, str | None]) -> Node:
        with self._lock:
            node = self.get_node(name)
            meta = node.metadata.model_copy(
                update={"annotations": _merged(node.metadata.annotations, annotations)}
            )
            return self._put_node(node.model_copy(update={"metadata": meta}), EventType.MODIFIED)

    # ----- the port: pods

    def get_pod(self, namespace: str, name: str) -> Pod:
        with self._lock:
            try:
                return self._pods[f"{namespace}/{name}"]
            except KeyError:
                raise NotFound(f'pods "{name}" not found in namespace "{namespace}"') from None

    def list_pods(self, node_name: str | None = None) -> Listing[Pod]:
        with self._lock:
            pods = [p for p in self._pods.values() if node_name in (None, p.spec.node_name)]
            return Listing(pods, str(self._version))

    def watch_pods(self, resource_version: str, node_name: str | None = None) -> MemoryWatch[Pod]:
        if node_name is None:
            return self._watch(resource_version, _kind_filter(Pod))
        return self._watch(resource_version, _node_filter(node_name))

    def patch_pod_annotations(
        self,
        namespace: str,
        name: str,
        annotations: Mapping[str, str | None],
        resource_version: str | None = None,
    ) -> Pod:
        with self._lock:
            pod = self.get_pod(namespace, name)
            if resource_version and resource_version != pod.metadata.resource_version:
                raise Conflict(
                    f"Operation cannot be fulfilled on pods {name!r}: the object has been "
                    f"modified (resourceVersion {resource_version} is not "
                    f"{pod.metadata.resource_version}); please apply your changes to the "
                    f"latest version and try again"
                )
            meta = pod.metadata.model_copy(
                update={"annotations": _merged(pod.metadata.annotations, annotations)}
            )
            return self._put_pod(pod.model_copy(update={"metadata": meta}), EventType.MODIFIED)

    def bind_pod(
        self,
        namespace: str,
        name: str,
        node_name: str,
        uid: str = "",
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        with self._lock:
            pod = self.get_pod(namespace, name)
            if uid and uid != pod.metadata.uid:
                raise Conflict(
                    f"Precondition failed for pod {pod.key}: UID in precondition {uid}, "
                    f"UID in object meta {pod.metadata.uid}"
                )
            if pod.metadata.deletion_timestamp is not None:
                raise Conflict(f"pod {pod.key} is being deleted, cannot be assigned to a host")
            if pod.spec.node_name:
                raise AlreadyBound(pod.key, pod.spec.node_name)
            meta = pod.metadata.model_copy(
                update={"annotations": _merged(pod.metadata.annotations, annotations or {})}
            )
            spec = pod.spec.model_copy(update={"node_name": node_name})
            self._put_pod(
                pod.model_copy(update={"metadata": meta, "spec": spec}), EventType.MODIFIED
            )

    def record_event(
        self, ref: ObjectRef, severity: EventSeverity, reason: str, message: str
    ) -> None:
        with self._lock:
            self.events.append(RecordedEvent(ref, severity, reason, message))

    # ----- what the rest of Kubernetes would do

    def add_node(self, node: Node) -> Node:
        with self._lock:
            kind = EventType.MODIFIED if node.name in self._nodes else EventType.ADDED
            if not node.metadata.uid:
                node = node.model_copy(
                    update={"metadata": node.metadata.model_copy(update={"uid": str(uuid.uuid4())})}
                )
            return self._put_node(node, kind)

    def set_node_labels(self, name: str, labels: Mapping[str, str | None]) -> Node:
        with self._lock:
            node = self.get_node(name)
            meta = node.metadata.model_copy(
                update={"labels": _merged(node.metadata.labels, labels)}
            )
            return self._put_node(node.model_copy(update={"metadata": meta}), EventType.MODIFIED)

    def create_pod(self, pod: Pod) -> Pod:
        with self._lock:
            if pod.key in self._pods:
                raise Conflict(f'pods "{pod.metadata.name}" already exists')
            meta = pod.metadata.model_copy(
                update={
                    "namespace": pod.metadata.namespace or "default",
                    "uid": pod.metadata.uid or str(uuid.uuid4()),
                    "creation_timestamp": pod.metadata.creation_timestamp or datetime.now(UTC),
                }
            )
            status = pod.status if pod.status.phase else PodStatus(phase="Pending")
            return self._put_pod(
                pod.model_copy(update={"metadata": meta, "status": status}), EventType.ADDED
            )

    def set_pod_phase(self, namespace: str, name: str, phase: str) -> Pod:
        with self._lock:
            pod = self.get_pod(namespace, name)
            status = pod.status.model_copy(update={"phase": phase})
            return self._put_pod(pod.model_copy(update={"status": status}), EventType.MODIFIED)

    def set_pod_claim_statuses(
        self, namespace: str, name: str, statuses: list[PodResourceClaimStatus]
    ) -> Pod:
        """What the resourceclaim controller writes through pods/status: the claim made
        for each of the pod's template claims (the API server drops a status sent with
        the pod's create)."""
        with self._lock:
            pod = self.get_pod(namespace, name)
            status = pod.status.model_copy(update={"resource_claim_statuses": statuses})
            return self._put_pod(pod.model_copy(update={"status": status}), EventType.MODIFIED)

    def begin_pod_deletion(self, namespace: str, name: str) -> Pod:
        """A graceful delete: the API server sets deletionTimestamp and keeps the pod
        while the kubelet stops its containers (delete_pod, once they have)."""
        with self._lock:
            pod = self.get_pod(namespace, name)
            meta = pod.metadata.model_copy(update={"deletion_timestamp": datetime.now(UTC)})
            return self._put_pod(pod.model_copy(update={"metadata": meta}), EventType.MODIFIED)

    def delete_pod(self, namespace: str, name: str) -> None:
        with self._lock:
            pod = self._pods.pop(self.get_pod(namespace, name).key)
            self._publish(WatchEvent(EventType.DELETED, self._stamped(pod)))

    def compact(self) -> None:
        """Forget the event history, as etcd compaction does: older watches get Expired."""
        with self._lock:
            self._history.clear()
            self._oldest = self._version

    # ----- internals

    def _stamped(self, obj: _Obj) -> _Obj:
        self._version += 1
        meta = obj.metadata.model_copy(update={"resource_version": str(self._version)})
        return obj.model_copy(update={"metadata": meta})

    def _put_node(self, node: Node, kind: EventType) -> Node:
        node = self._stamped(node)
        self._nodes[node.name] = node
        self._publish(WatchEvent(kind, node))
        return node

    def _put_pod(self, pod: Pod, kind: EventType) -> Pod:
        old = self._pods.get(pod.key)
        pod = self._stamped(pod)
        self._pods[pod.key] = pod
        self._publish(WatchEvent(kind, pod), old)
        return pod

    def _publish(self, event: WatchEvent[Node] | WatchEvent[Pod], old: Pod | None = None) -> None:
        change = _Change(event, old)
        if len(self._history) == self._history.maxlen:
            self._oldest = self._history[0][0]
        self._history.append((self._version, change))
        for watch, translate in self._watches:
            delivered = translate(change)
            if delivered is not None:
                watch.push(delivered)

    def _watch(self, resource_version: str, translate: "_Translate") -> MemoryWatch[Any]:
        with self._lock:
            since = int(resource_version or 0)
            watch: MemoryWatch[Any] = MemoryWatch(self._detach)
            if since:
                if since < self._oldest:
                    raise Expired(f"too old resource version: {since} ({self._oldest})")
                for version, change in self._history:
                    if version > since:
                        delivered = translate(change)
                        if delivered is not None:
                            watch.push(delivered)
            self._watches.append((watch, translate))
            return watch

    def _detach(self, watch: MemoryWatch[Any]) -> None:
        with self._lock:
            self._watches = [(w, t) for w, t in self._watches if w is not watch]


def _kind_filter(kind: type) -> "_Translate":
    def translate(change: _Change) -> WatchEvent[Any] | None:
        return change.event if isinstance(change.event.object, kind) else None

    return translate


def _named_node_filter(name: str) -> "_Translate":
    def translate(change: _Change) -> WatchEvent[Any] | None:
        node = change.event.object
        return change.event if isinstance(node, Node) and node.name == name else None

    return translate


def _node_filter(node_name: str) -> "_Translate":
    """Pods of one node, as a spec.nodeName field selector sees them: a pod that
    starts matching arrives as ADDED, one that stops matching leaves as DELETED."""

    def translate(change: _Change) -> WatchEvent[Any] | None:
        new = change.event.object
        if not isinstance(new, Pod):
            return None
        now = new.spec.node_name == node_name
        before = isinstance(change.old, Pod) and change.old.spec.node_name == node_name
        if change.event.type is EventType.DELETED:
            return change.event if now else None
        if now and not before:
            return WatchEvent(EventType.ADDED, new)
        if before and not now:
            return WatchEvent(EventType.DELETED, new)
        return change.event if now else None

    return translate


def _merged(current: Mapping[str, str], patch: Mapping[str, str | None]) -> dict[str, str]:
    merged = dict(current)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged


def gpu_node(
    name: str,
    gpus: tuple[Gpu, ...],
    mode: str | None = "cgpu",
    labels: Mapping[str, str] | None = None,
    ip: str = "",
) -> Node:
    """A node as the device plugin would leave it: labelled, GPU annotation and
    allocatable set (gpu-core.percentage only in core_mem mode)."""
    all_labels = dict(labels or {})
    if mode is not None:
        all_labels[LABEL_SCHEDULE] = mode
    allocatable = {GPU_MEM: str(sum(g.mem for g in gpus)), GPU_COUNT: str(len(gpus))}
    if mode == "core_mem":
        allocatable[GPU_CORE] = str(CORE_PER_GPU * len(gpus))
    addresses = [{"type": "InternalIP", "address": ip}] if ip else []
    return Node(
        metadata=ObjectMeta(
            name=name,
            labels=all_labels,
            annotations={NODE_GPUS_ANNOTATION: encode_gpus(gpus)},
        ),
        status=NodeStatus.model_validate(
            {"capacity": allocatable, "allocatable": allocatable, "addresses": addresses}
        ),
    )
