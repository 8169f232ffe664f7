"""The cluster port: what the extender and the device plugin need from the
Kubernetes API, as one typed interface with two adapters (in-memory here; the
Kubernetes API one in `kubecluster`)."""

from gpushare.cluster.port import (
    AlreadyBound,
    Cluster,
    ClusterError,
    Conflict,
    DraCluster,
    EventSeverity,
    EventType,
    Expired,
    Invalid,
    Listing,
    NotFound,
    ObjectRef,
    Watch,
    WatchEvent,
)

__all__ = [
    "AlreadyBound",
    "Cluster",
    "ClusterError",
    "Conflict",
    "DraCluster",
    "EventSeverity",
    "EventType",
    "Expired",
    "Invalid",
    "Listing",
    "NotFound",
    "ObjectRef",
    "Watch",
    "WatchEvent",
]
