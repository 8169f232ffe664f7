"""The Kubernetes-API adapter of the cluster port (`KubeCluster`) and the watch-driven
cache that keeps a component's view of the cluster current (`WatchCache`)."""

from gpushare.kubecluster.cluster import KubeCluster
from gpushare.kubecluster.watchcache import CacheSink, WatchCache

__all__ = ["CacheSink", "KubeCluster", "WatchCache"]
