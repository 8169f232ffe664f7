"""The cluster port: the few Kubernetes API operations gpushare needs, typed.

Semantics follow the API server where they matter: every write bumps a
resourceVersion, a patch with a stale resourceVersion is a Conflict, watches
deliver events in order from a resourceVersion and raise Expired (410 Gone)
when that version is too old, and binding an already-bound pod is refused.
"""

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, Protocol, TypeVar

from gpushare.objects import Node, Pod

T = TypeVar("T", Node, Pod)


class ClusterError(Exception):
    """An API call failed; the message says which and why."""


class NotFound(ClusterError):
    pass


class Conflict(ClusterError):
    """A precondition (resourceVersion, UID) failed: re-read and retry."""


class AlreadyBound(Conflict):
    def __init__(self, pod_key: str, node: str) -> None:
        self.node = node
        super().__init__(f'pod {pod_key} is already assigned to node "{node}"')


class Expired(ClusterError):
    """The watch's resourceVersion is too old (HTTP 410 Gone): list again."""


class EventType(StrEnum):
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"


class EventSeverity(StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


@dataclass(frozen=True, slots=True)
class WatchEvent(Generic[T]):
    type: EventType
    object: T


@dataclass(frozen=True, slots=True)
class Listing(Generic[T]):
    items: list[T]
    resource_version: str
    """Start a watch here to see every change after the list."""


@dataclass(frozen=True, slots=True)
class ObjectRef:
    kind: str
    name: str
    namespace: str = ""
    uid: str = ""

    @classmethod
    def of_pod(cls, pod: Pod) -> "ObjectRef":
        meta = pod.metadata
        return cls("Pod", meta.name, meta.namespace, meta.uid)


class Watch(Protocol[T]):
    """A stream of events; iteration ends after stop() or when the server ends it.

    `Cluster.watch_*` returns once the server has accepted the watch: a version too
    old raises Expired there (or from the iteration, as the API server may also say
    so in the stream)."""

    @property
    def resume_from(self) -> str:
        """The resourceVersion of the last event or bookmark seen ("" before any):
        where a watch that replaces this one starts, without a list. Bookmarks carry
        the collection's version while none of its objects changes, so a quiet
        collection does not fall out of the server's window (Expired, a full list)."""
        ...

    def __iter__(self) -> Iterator[WatchEvent[T]]: ...

    def stop(self) -> None: ...


class Cluster(Protocol):
    def get_node(self, name: str) -> Node: ...

    def list_nodes(self, name: str | None = None) -> Listing[Node]:
        """All nodes, or only the one named (a metadata.name field selector): a node's
        own component must not receive every other node's heartbeats."""
        ...

    def watch_nodes(self, resource_version: str, name: str | None = None) -> Watch[Node]: ...

    def patch_node_annotations(self, name: str, annotations: Mapping[str, str | None]) -> Node:
        """Merge annotations into the node; a None value deletes the key."""
        ...

    def get_pod(self, namespace: str, name: str) -> Pod: ...

    def list_pods(self, node_name: str | None = None) -> Listing[Pod]:
        """All pods, or those bound to one node (a spec.nodeName field selector)."""
        ...

    def watch_pods(self, resource_version: str, node_name: str | None = None) -> Watch[Pod]: ...

    def patch_pod_annotations(
        self,
        namespace: str,
        name: str,
        annotations: Mapping[str, str | None],
        resource_version: str | None = None,
    ) -> Pod:
        """Merge annotations into the pod; None deletes a key. With resource_version,
        the patch applies only to that version of the pod, else Conflict."""
        ...

    def bind_pod(
        self,
        namespace: str,
        name: str,
        node_name: str,
        uid: str = ...,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        """Create the pod's Binding; AlreadyBound if it has a node, Conflict on a UID
        mismatch, NotFound if it is gone. Annotations are merged in the same update."""
        ...

    def record_event(
        self, ref: ObjectRef, severity: EventSeverity, reason: str, message: str
    ) -> None: ...
