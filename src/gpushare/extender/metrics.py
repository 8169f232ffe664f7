"""Prometheus metrics of the extender: request latency per verb, binds and their
conflicts, filter rejections by rule, requeue nudges, admission reviews and their
errors, pod events dropped, and what is allocated on each GPU.

Each extender has its own registry, so several can live in one process (tests,
the demo); the per-GPU and per-node gauges are read from the cache at scrape time.
Every labelled series exists at 0 from the start, for every label value the code can
emit: Prometheus's increase() cannot see the first event of a series born at 1.
"""

from collections.abc import Iterator
from enum import StrEnum

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpushare.errors import Rule
from gpushare.extender.cache import SchedulerCache
from gpushare.resources import MANAGED_RESOURCES
from gpushare.telemetry.series import at_zero

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


class Verb(StrEnum):
    """The scheduler-extender verbs kube-scheduler calls (served on loopback)."""

    FILTER = "filter"
    PRIORITIZE = "prioritize"
    PRIORITIZE_CLAIMS = "prioritize-claims"
    """DRA mode: scores for pods rewritten to a claim (verbs.prioritize_claims)."""
    BIND = "bind"
    PREEMPT = "preempt"


class Webhook(StrEnum):
    """The admission webhooks the API server calls."""

    VALIDATE = "validate"
    MUTATE = "mutate"


class BindResult(StrEnum):
    BOUND = "bound"
    REFUSED = "refused"


class RequeueResult(StrEnum):
    REQUEUED = "requeued"
    GONE = "gone"
    FAILED = "failed"


class EventDrop(StrEnum):
    """Why a queued pod event (extender.eventqueue) was not posted."""

    QUEUE_FULL = "queue-full"
    STOPPED = "stopped"


ALLOWED = ("true", "false")
"""An AdmissionReview's answer, as the `allowed` label writes it."""


class ExtenderMetrics:
    def __init__(self, cache: SchedulerCache) -> None:
        self.registry = CollectorRegistry()
        self.latency = Histogram(
            "gpushare_extender_request_duration_seconds",
            "Time to answer one extender or webhook request, by verb",
            ["verb"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        at_zero(self.latency, [*Verb, *Webhook])
        self.binds = Counter(
            "gpushare_extender_binds",
            "Bind requests by result (bound, refused)",
            ["result"],
            registry=self.registry,
        )
        at_zero(self.binds, BindResult)
        self.bind_conflicts = Counter(
            "gpushare_extender_bind_conflicts",
            "Binds the API server answered with 409 Conflict (already bound, UID changed)",
            registry=self.registry,
        )
        self.assumptions_expired = Counter(
            "gpushare_extender_assumptions_expired",
            "Reservations (assumed binds) dropped because the watch never showed them",
            registry=self.registry,
        )
        self.filter_rejections = Counter(
            "gpushare_extender_filter_rejections",
            "Nodes refused by filter, by the rule the pod broke there",
            ["rule"],
            registry=self.registry,
        )
        at_zero(self.filter_rejections, Rule)
        self.requeues = Counter(
            "gpushare_extender_requeues",
            "Pods refused on every node, patched so that kube-scheduler retries them after "
            "GPU capacity freed, by result (requeued, gone, failed)",
            ["result"],
            registry=self.registry,
        )
        at_zero(self.requeues, RequeueResult)
        self.admission = Counter(
            "gpushare_admission_reviews",
            "Admission reviews answered, by webhook and outcome",
            ["webhook", "allowed"],
            registry=self.registry,
        )
        at_zero(self.admission, Webhook, ALLOWED)
        self.admission_errors = Counter(
            "gpushare_admission_errors",
            "Admission reviews answered with an error status (malformed, oversized, internal) "
            "instead of allow or deny, by webhook",
            ["webhook"],
            registry=self.registry,
        )
        at_zero(self.admission_errors, Webhook)
        self.events_dropped = Counter(
            "gpushare_extender_events_dropped",
            "Pod events (GpuAllocated) dropped before they were posted, by reason: queue-full "
            "(the API server fell behind), stopped (still queued when the extender stopped)",
            ["reason"],
            registry=self.registry,
        )
        at_zero(self.events_dropped, EventDrop)
        self.registry.register(_GpuCollector(cache))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _GpuCollector(Collector):
    def __init__(self, cache: SchedulerCache) -> None:
        self._cache = cache

    def collect(self) -> Iterator[Metric]:
        labels = ["node", "gpu", "uuid"]
        mem = GaugeMetricFamily(
            "gpushare_scheduler_gpu_memory_allocated_gib",
            "GPU memory allocated to pods, as the extender sees it (GiB)",
            labels=labels,
        )
        mem_total = GaugeMetricFamily(
            "gpushare_scheduler_gpu_memory_total_gib",
            "GPU memory the device plugin reports (GiB)",
            labels=labels,
        )
        core = GaugeMetricFamily(
            "gpushare_scheduler_gpu_core_allocated_percent",
            "GPU compute allocated to pods, as the extender sees it (percent of one GPU)",
            labels=labels,
        )
        pods = GaugeMetricFamily(
            "gpushare_scheduler_gpu_pods",
            "Pods sharing the GPU, as the extender sees it",
            labels=labels,
        )
        assumed = GaugeMetricFamily(
            "gpushare_extender_assumed_pods", "Binds the watch has not shown yet"
        )
        refused = GaugeMetricFamily(
            "gpushare_extender_refused_pods",
            "Pods whose last filter refused every candidate node (requeued when room appears)",
        )
        damaged = GaugeMetricFamily(
            "gpushare_extender_damaged_allocation_records",
            "Pods whose allocation record cannot be trusted (charged as ACK's keys say, or "
            "held as an unknown allocation on their node)",
        )
        unknown = GaugeMetricFamily(
            "gpushare_scheduler_node_unknown_allocations",
            "Pods on the node whose allocation is not known; the node takes no new GPU pod "
            "while it is above 0",
            labels=["node"],
        )
        allocatable = GaugeMetricFamily(
            "gpushare_scheduler_node_gpu_allocatable",
            "The node's allocatable of each gpushare resource, as its Node status says "
            "(what the kubelet got from the device plugin; 0 while it advertises none)",
            labels=["node", "resource"],
        )
        for name, quantities in self._cache.allocatable().items():
            for resource in MANAGED_RESOURCES:
                allocatable.add_metric([name, resource], quantities.get(resource, 0))
        for node in self._cache.nodes_details():
            unknown.add_metric([node.name], len(node.unknown))
            for gpu in node.gpus:
                values = [node.name, str(gpu.index), gpu.uuid]
                mem.add_metric(values, gpu.allocated_mem)
                mem_total.add_metric(values, gpu.mem)
                core.add_metric(values, gpu.allocated_core)
                pods.add_metric(values, gpu.pod_count)
        counts = self._cache.counts()
        assumed.add_metric([], counts.assumed)
        refused.add_metric([], counts.refused)
        damaged.add_metric([], counts.damaged)
        yield from (mem, mem_total, core, pods, assumed, refused, damaged, unknown, allocatable)
