"""The cluster port: the few Kubernetes API operations gpushare needs, typed.

Semantics follow the API server where they matter: every write bumps a
resourceVersion, a patch with a stale resourceVersion is a Conflict, watches
deliver events in order from a resourceVersion and raise Expired (410 Gone)
when that version is too old, and binding an already-bound pod is refused.
"""

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, Protocol, TypeVar

from gpushare.dra.objects import DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice
from gpushare.dra.validation import FieldError
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


class Invalid(ClusterError):
    """The API server refused the object it was sent (HTTP 422 Unprocessable Entity);
    `errors` name each field and say why."""

    def __init__(self, what: str, errors: Sequence[FieldError]) -> None:
        self.errors = tuple(errors)
        super().__init__(f"{what} is invalid: " + "; ".join(str(e) for e in self.errors))


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


class DraCluster(Protocol):
    """The resource.k8s.io/v1 objects of DRA mode (DRA-INTERFACES §4, §8).

    Writes are validated as the API server validates them (Invalid names the fields)
    and lose, silently, the fields of feature gates the server has off (§5). Updates
    replace the whole object, on the condition that its metadata.resourceVersion is
    still the stored one when it carries one (else Conflict); a create with only
    metadata.generateName gets a name made from it; a create of a name taken is a
    Conflict; a missing object is NotFound."""

    def get_resource_slice(self, name: str) -> ResourceSlice: ...

    def list_resource_slices(
        self, driver: str | None = None, node_name: str | None = None
    ) -> list[ResourceSlice]:
        """All slices, or those of one driver and/or one node (spec.driver, spec.nodeName
        field selectors), in name order."""
        ...

    def create_resource_slice(self, resource_slice: ResourceSlice) -> ResourceSlice: ...

    def update_resource_slice(self, resource_slice: ResourceSlice) -> ResourceSlice:
        """Its driver, pool name and node are immutable."""
        ...

    def delete_resource_slice(self, name: str) -> None: ...

    def delete_resource_slices(self, node_name: str, driver: str | None = None) -> None:
        """Every slice of one node (of one driver): what the kubelet removes when it
        starts, or when a driver's plugin goes away."""
        ...

    def get_resource_claim(self, namespace: str, name: str) -> ResourceClaim: ...

    def list_resource_claims(self, namespace: str | None = None) -> list[ResourceClaim]: ...

    def create_resource_claim(self, claim: ResourceClaim) -> ResourceClaim:
        """In its namespace ("default" when it names none); its status is not stored."""
        ...

    def update_resource_claim(self, claim: ResourceClaim) -> ResourceClaim:
        """Metadata only: the spec is immutable (Invalid), the status is left as stored."""
        ...

    def update_resource_claim_status(self, claim: ResourceClaim) -> ResourceClaim:
        """The status only (the /status subresource): spec and metadata stay as stored."""
        ...

    def delete_resource_claim(self, namespace: str, name: str) -> None: ...

    def get_resource_claim_template(self, namespace: str, name: str) -> ResourceClaimTemplate: ...

    def create_resource_claim_template(
        self, template: ResourceClaimTemplate
    ) -> ResourceClaimTemplate: ...

    def list_device_classes(self) -> list[DeviceClass]: ...

    def create_device_class(self, device_class: DeviceClass) -> DeviceClass: ...
