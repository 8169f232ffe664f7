"""Prometheus metrics of the extender: request latency per verb, binds and their
conflicts, filter rejections by rule, requeue nudges, and what is allocated on each GPU.

Each extender has its own registry, so several can live in one process (tests,
the demo); the per-GPU gauges are read from the cache at scrape time.
"""

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpushare.extender.cache import SchedulerCache

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


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
        self.binds = Counter(
            "gpushare_extender_binds",
            "Bind requests by result (bound, refused)",
            ["result"],
            registry=self.registry,
        )
        self.bind_conflicts = Counter(
            "gpushare_extender_bind_conflicts",
            "Binds the API server answered with 409 Conflict (already bound, UID changed)",
            registry=self.registry,
        )
        self.filter_rejections = Counter(
            "gpushare_extender_filter_rejections",
            "Nodes refused by filter, by the rule the pod broke there",
            ["rule"],
            registry=self.registry,
        )
        self.requeues = Counter(
            "gpushare_extender_requeues",
            "Pods refused on every node, patched so that kube-scheduler retries them after "
            "GPU capacity freed, by result (requeued, gone, failed)",
            ["result"],
            registry=self.registry,
        )
        self.admission = Counter(
            "gpushare_admission_reviews",
            "Admission reviews answered, by webhook and outcome",
            ["webhook", "allowed"],
            registry=self.registry,
        )
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
        for node in self._cache.nodes_details():
            for gpu in node.gpus:
                values = [node.name, str(gpu.index), gpu.uuid]
                mem.add_metric(values, gpu.allocated_mem)
                mem_total.add_metric(values, gpu.mem)
                core.add_metric(values, gpu.allocated_core)
                pods.add_metric(values, gpu.pod_count)
        counts = self._cache.counts()
        assumed.add_metric([], counts.assumed)
        refused.add_metric([], counts.refused)
        yield from (mem, mem_total, core, pods, assumed, refused)
