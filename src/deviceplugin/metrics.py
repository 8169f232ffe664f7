"""Prometheus metrics of the device plugin (served on --metrics-port).

Each plugin owns its registry, so tests and the demo can run several plugins
in one process.
"""

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

PREFIX: Final = "gpushare_device_plugin"
_LATENCY_BUCKETS: Final = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.25, 1.0)


class PluginMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.allocations = Counter(
            f"{PREFIX}_allocations",
            "Allocate calls answered, per resource",
            ["resource"],
            registry=self.registry,
        )
        self.failures = Counter(
            f"{PREFIX}_allocation_failures",
            "Allocate calls refused, per resource and reason (no-match, no-devices, error)",
            ["resource", "reason"],
            registry=self.registry,
        )
        self.match_latency = Histogram(
            f"{PREFIX}_match_latency_seconds",
            "Time to match an Allocate call to its container",
            ["resource"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registered = Gauge(
            f"{PREFIX}_registered_resources",
            "1 while the resource is registered with the kubelet, else 0",
            ["resource"],
            registry=self.registry,
        )
        self.registrations = Counter(
            f"{PREFIX}_registrations",
            "Successful registrations with the kubelet (more than one: kubelet restarts)",
            ["resource"],
            registry=self.registry,
        )
        self.unhealthy_gpus = Gauge(
            f"{PREFIX}_unhealthy_gpus", "GPUs reported Unhealthy", registry=self.registry
        )
        self.repairs = Counter(
            f"{PREFIX}_annotation_repairs",
            "Allocation annotations corrected from the kubelet's PodResources",
            registry=self.registry,
        )

    def serve(self, port: int) -> None:
        start_http_server(port, registry=self.registry)
