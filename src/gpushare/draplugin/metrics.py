"""Prometheus metrics of the DRA driver (served on --metrics-port; docs/metrics.md).

What an operator asks of it: are claims being prepared, and when not, why (the claim
unreadable, not fitting beside the others, the node's files); is the slice current;
how much of each GPU the prepared claims hold. Every labelled series exists at 0 from
the start (gpushare.telemetry.series).
"""

from collections.abc import Callable, Iterator
from enum import StrEnum
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpushare.telemetry.series import at_zero

PREFIX: Final = "gpushare_dra_plugin"


class Outcome(StrEnum):
    """How a claim's Prepare ended."""

    PREPARED = "prepared"
    REPEATED = "repeated"
    """Prepared before: the recorded answer was given again (a kubelet retry)."""
    OVER_COMMIT = "over-commit"
    """It did not fit beside the claims prepared on the node: refused."""
    ERROR = "error"
    """Anything else: the claim or pod unreadable, a device not on the node, a file."""


HeldPerGpu = Callable[[], dict[int, tuple[int, int, int]]]
"""GPU index → (GiB, compute percent, claims) the prepared claims hold."""


class DriverMetrics:
    def __init__(self, node: str, held: HeldPerGpu = dict) -> None:
        self.registry = CollectorRegistry()
        self._node = node
        self._prepares = Counter(
            f"{PREFIX}_prepares",
            "Claims the kubelet asked to prepare, by outcome",
            ["node", "outcome"],
            registry=self.registry,
        )
        at_zero(self._prepares, [node], list(Outcome))
        self._unprepares = Counter(
            f"{PREFIX}_unprepares", "Claims unprepared", ["node"], registry=self.registry
        )
        at_zero(self._unprepares, [node])
        self._slice_writes = Counter(
            f"{PREFIX}_slice_writes",
            "ResourceSlice creates and updates the driver made",
            ["node"],
            registry=self.registry,
        )
        at_zero(self._slice_writes, [node])
        self._sharing = Gauge(
            f"{PREFIX}_sharing",
            "1 while the node's GPUs are published shareable; 0 when whole (--sharing off, "
            "or the API server dropped sharing: DRAConsumableCapacity off)",
            ["node"],
            registry=self.registry,
        )
        at_zero(self._sharing, [node])
        self.registry.register(_Held(node, held))

    def prepared(self, outcome: Outcome) -> None:
        self._prepares.labels(self._node, outcome).inc()

    def unprepared(self) -> None:
        self._unprepares.labels(self._node).inc()

    def slice_written(self, sharing: bool) -> None:
        self._slice_writes.labels(self._node).inc()
        self._sharing.labels(self._node).set(1 if sharing else 0)


class _Held(Collector):
    """Per GPU, what the prepared claims hold, at scrape time from the books."""

    def __init__(self, node: str, held: HeldPerGpu) -> None:
        self._node = node
        self._held = held

    def collect(self) -> Iterator[GaugeMetricFamily]:
        memory = GaugeMetricFamily(
            f"{PREFIX}_gpu_memory_held_gib",
            "GPU memory the prepared claims hold, GiB",
            labels=["node", "gpu"],
        )
        core = GaugeMetricFamily(
            f"{PREFIX}_gpu_core_held_percent",
            "Compute share the prepared claims hold, percent",
            labels=["node", "gpu"],
        )
        claims = GaugeMetricFamily(
            f"{PREFIX}_gpu_claims", "Prepared claims' slices on the GPU", labels=["node", "gpu"]
        )
        for index, (gib, percent, count) in sorted(self._held().items()):
            labels = [self._node, str(index)]
            memory.add_metric(labels, gib)
            core.add_metric(labels, percent)
            claims.add_metric(labels, count)
        yield from (memory, core, claims)
