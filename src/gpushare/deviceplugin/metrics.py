"""Prometheus metrics of the device plugin (served on --metrics-port).

Every series carries the node's name. Per GPU, the plugin reports what the
chart's dashboard shows (memory, memory and compute held by the pods placed on
it, pods, health), computed at scrape time from the node's GPUs and the
allocation annotations of its pods. Per container placed here, on each of its GPUs,
it reports what the container was given (memory, compute share) and whether the
kubelet's Allocate for it was answered, from the moment the pod is bound until it is
gone: the isolation agent's series of a container begin only with its first GPU
process, so without these an assigned but idle container would be invisible.

Each plugin owns its registry, so tests and the demo can run several plugins in one
process. Every labelled series exists at 0 from the start, for every resource, result,
reason and call the plugin can report: Prometheus's increase() cannot see the first
event of a series born at 1.
"""

from collections.abc import Callable, Iterator
from enum import StrEnum
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpushare.allocation import PodAllocation
from gpushare.grant import GIB
from gpushare.inventory import Gpu
from gpushare.objects import Pod
from gpushare.resources import MANAGED_RESOURCES
from gpushare.telemetry.series import at_zero

PREFIX: Final = "gpushare_device_plugin"
CONTAINER_LABELS: Final = ("node", "gpu", "namespace", "pod", "container")
"""A container's labels on one GPU: the isolation agent's, less its container_id (which
the plugin never learns), so a dashboard joins the two on them."""
_LATENCY_BUCKETS: Final = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.25, 1.0)


class AllocateResult(StrEnum):
    OK = "ok"
    ERROR = "error"


class Refusal(StrEnum):
    """Why an Allocate call was refused."""

    NO_MATCH = "no-match"
    """No bound pod asks for it: the pod watch never showed one by the deadline."""
    NO_DEVICES = "no-devices"
    TIMEOUT = "timeout"
    """The deadline passed waiting for something other than the pod watch."""


class Call(StrEnum):
    """The kubelet's calls that have a deadline."""

    GET_PREFERRED_ALLOCATION = "GetPreferredAllocation"
    ALLOCATE = "Allocate"


class PluginMetrics:
    def __init__(self, node: str) -> None:
        self.node = node
        self.registry = CollectorRegistry()
        self._allocate = Counter(
            f"{PREFIX}_allocate",
            "Allocate calls from the kubelet, per resource and result (ok, error)",
            ["node", "resource", "result"],
            registry=self.registry,
        )
        self._failures = Counter(
            f"{PREFIX}_allocation_failures",
            "Allocate calls refused, per resource and reason (no-match, no-devices, timeout)",
            ["node", "resource", "reason"],
            registry=self.registry,
        )
        self._timeouts = Counter(
            f"{PREFIX}_answer_timeouts",
            "GetPreferredAllocation and Allocate calls that reached their deadline "
            "(--allocate-timeout) unmatched: refused, or answered without a preference",
            ["node", "call", "resource"],
            registry=self.registry,
        )
        self._match_latency = Histogram(
            f"{PREFIX}_match_latency_seconds",
            "Time to match an Allocate call to its container",
            ["node", "resource"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._registered = Gauge(
            f"{PREFIX}_registered_resources",
            "1 while the resource is registered with the kubelet, else 0",
            ["node", "resource"],
            registry=self.registry,
        )
        self._registrations = Counter(
            f"{PREFIX}_registrations",
            "Registrations with the kubelet (one more per kubelet restart)",
            ["node", "resource"],
            registry=self.registry,
        )
        self._repairs = Counter(
            f"{PREFIX}_annotation_repairs",
            "Allocation annotations corrected from the kubelet's PodResources",
            ["node"],
            registry=self.registry,
        )
        self._advertised = Gauge(
            f"{PREFIX}_advertised_devices",
            "Healthy devices in the latest ListAndWatch answer (0: the node offers nothing)",
            ["node", "resource"],
            registry=self.registry,
        )
        self._missing = Gauge(
            f"{PREFIX}_missing_gpus",
            "GPUs the backend no longer finds that pods bound to the node still hold: kept, "
            "Unhealthy, until those pods are gone",
            ["node"],
            registry=self.registry,
        )
        node_ = [node]
        at_zero(self._allocate, node_, MANAGED_RESOURCES, AllocateResult)
        at_zero(self._failures, node_, MANAGED_RESOURCES, Refusal)
        at_zero(self._timeouts, node_, Call, MANAGED_RESOURCES)
        at_zero(self._match_latency, node_, MANAGED_RESOURCES)
        at_zero(self._registered, node_, MANAGED_RESOURCES)
        at_zero(self._registrations, node_, MANAGED_RESOURCES)
        at_zero(self._repairs, node_)
        at_zero(self._advertised, node_, MANAGED_RESOURCES)
        at_zero(self._missing, node_)

    def allocated(self, resource: str, match_seconds: float) -> None:
        self._allocate.labels(self.node, resource, AllocateResult.OK).inc()
        self._match_latency.labels(self.node, resource).observe(match_seconds)

    def refused(self, resource: str, reason: Refusal) -> None:
        self._allocate.labels(self.node, resource, AllocateResult.ERROR).inc()
        self._failures.labels(self.node, resource, reason).inc()

    def timed_out(self, call: Call, resource: str) -> None:
        self._timeouts.labels(self.node, call, resource).inc()

    def advertised(self, resource: str, healthy_devices: int) -> None:
        self._advertised.labels(self.node, resource).set(healthy_devices)

    def missing_gpus(self, count: int) -> None:
        self._missing.labels(self.node).set(count)

    def registered(self, resource: str, registered: bool) -> None:
        self._registered.labels(self.node, resource).set(1 if registered else 0)
        if registered:
            self._registrations.labels(self.node, resource).inc()

    def repaired(self) -> None:
        self._repairs.labels(self.node).inc()

    def watch_gpus(
        self,
        gpus: Callable[[], tuple[Gpu, ...]],
        pods: Callable[[], list[tuple[Pod, PodAllocation]]],
    ) -> None:
        """Reports per-GPU and per-container gauges from these sources at every scrape:
        the node's GPUs, and the pods bound to it with their allocations."""
        self.registry.register(_GpuCollector(self.node, gpus, pods))
        self.registry.register(_ContainerCollector(self.node, pods))

    def value(self, name: str, **labels: str) -> float | None:
        """One sample, by metric name and labels besides `node` (for tests and tools)."""
        return self.registry.get_sample_value(name, {"node": self.node, **labels})


class _GpuCollector(Collector):
    def __init__(
        self,
        node: str,
        gpus: Callable[[], tuple[Gpu, ...]],
        pods: Callable[[], list[tuple[Pod, PodAllocation]]],
    ) -> None:
        self._node = node
        self._gpus = gpus
        self._pods = pods

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["node", "gpu"]
        total = GaugeMetricFamily(
            "gpushare_gpu_memory_total_gib", "Memory of the GPU, in GiB", labels=[*labels, "model"]
        )
        mem = GaugeMetricFamily(
            "gpushare_gpu_memory_allocated_gib",
            "GiB held by the pods placed on the GPU (from their allocation annotations)",
            labels=labels,
        )
        core = GaugeMetricFamily(
            "gpushare_gpu_core_allocated_percent",
            "Compute percent held by the pods placed on the GPU (100 for a whole GPU)",
            labels=labels,
        )
        pods = GaugeMetricFamily("gpushare_gpu_pods", "Pods sharing the GPU", labels=labels)
        healthy = GaugeMetricFamily(
            "gpushare_gpu_healthy", "1 when the GPU is healthy, else 0", labels=labels
        )
        held: dict[int, list[int]] = {}
        for _, allocation in self._pods():
            for index, (gib, percent) in allocation.charges().items():
                mem_, core_, count = held.get(index, [0, 0, 0])
                held[index] = [mem_ + gib, core_ + percent, count + 1]
        for gpu in self._gpus():
            key = [self._node, str(gpu.index)]
            gib, percent, count = held.get(gpu.index, [0, 0, 0])
            total.add_metric([*key, gpu.model], gpu.mem)
            mem.add_metric(key, gib)
            core.add_metric(key, percent)
            pods.add_metric(key, count)
            healthy.add_metric(key, 1 if gpu.healthy else 0)
        yield from (total, mem, core, pods, healthy)


class _ContainerCollector(Collector):
    """One series per container and GPU of every pod bound to the node, from its allocation:
    there from the bind (before the kubelet admits the pod, before any GPU process), gone
    with the pod."""

    def __init__(self, node: str, pods: Callable[[], list[tuple[Pod, PodAllocation]]]) -> None:
        self._node = node
        self._pods = pods

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = list(CONTAINER_LABELS)
        mem = GaugeMetricFamily(
            "gpushare_container_memory_allocated_bytes",
            "GPU memory the container was given on the GPU (its cap where memory is isolated)",
            labels=labels,
        )
        core = GaugeMetricFamily(
            "gpushare_container_core_allocated_percent",
            "Compute percent of the GPU the container was given (0: memory only, no share; "
            "100: the whole GPU)",
            labels=labels,
        )
        assigned = GaugeMetricFamily(
            "gpushare_container_assigned",
            "1 once the kubelet's Allocate for the container was answered, 0 while its pod is "
            "bound to the node and waits for admission",
            labels=labels,
        )
        for pod, allocation in self._pods():
            for container in allocation.containers:
                for s in container.gpus:
                    key = [
                        self._node,
                        str(s.index),
                        pod.metadata.namespace,
                        pod.metadata.name,
                        container.name,
                    ]
                    mem.add_metric(key, s.mem * GIB)
                    core.add_metric(key, s.core)
                    assigned.add_metric(key, 1 if container.assigned else 0)
        yield from (mem, core, assigned)
