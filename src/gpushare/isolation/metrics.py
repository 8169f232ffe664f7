"""Prometheus metrics of the isolation agent, on their own registry (served on --metrics-port)."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpushare.isolation.treecodec import TreeContent

_CONTAINER = ["node", "gpu", "container", "pod"]


class AgentMetrics:
    """Every series carries `node` (like the device plugin's), so a dashboard can filter
    by node however the agent is scraped."""

    def __init__(self, node: str = "", registry: CollectorRegistry | None = None) -> None:
        self.node = node
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.memory_used = Gauge(
            "gpushare_isolation_memory_used_bytes",
            "GPU memory a container's processes hold on one GPU",
            _CONTAINER,
            registry=r,
        )
        self.memory_cap = Gauge(
            "gpushare_isolation_memory_cap_bytes",
            "GPU memory a container may hold on one GPU (0: not capped)",
            _CONTAINER,
            registry=r,
        )
        self.utilisation = Gauge(
            "gpushare_isolation_utilization_percent",
            "Share of one GPU's compute a container used over the recent window",
            _CONTAINER,
            registry=r,
        )
        self.compute_limit = Gauge(
            "gpushare_isolation_compute_limit_percent",
            "Share of one GPU's compute the policy promises a container while it has work",
            _CONTAINER,
            registry=r,
        )
        self.interposer = Gauge(
            "gpushare_isolation_interposer",
            "1 when a container runs under the CUDA interposer (memory refused at the call, "
            "launches paced), 0 when the agent enforces after the fact (freezing, over-cap "
            "action)",
            _CONTAINER,
            registry=r,
        )
        self.throttled = Counter(
            "gpushare_isolation_throttled_seconds",
            "Time a container spent frozen by the time-slice scheduler",
            ["node", "container", "pod"],
            registry=r,
        )
        self.violations = Counter(
            "gpushare_isolation_memory_cap_violations",
            "Times a container went over its GPU memory cap",
            [*_CONTAINER, "action"],
            registry=r,
        )
        self.policy = Gauge(
            "gpushare_isolation_gpu_policy",
            "The cGPU scheduling policy of each GPU (0 fair-share .. 5 native)",
            ["node", "gpu"],
            registry=r,
        )
        self.refused_writes = Counter(
            "gpushare_isolation_control_writes_refused",
            "Writes to the control tree the agent refused (the old value was restored)",
            ["node", "file"],
            registry=r,
        )
        self.tick_seconds = Histogram(
            "gpushare_isolation_tick_seconds",
            "Time one scheduling tick took (observe, enforce, decide, apply, publish)",
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25),
            registry=r,
        )
        self._series: dict[tuple[str, str, str, str], tuple[Gauge, ...]] = {}

    def publish(self, content: TreeContent) -> None:
        """Set the gauges from what the control tree shows, dropping gone containers."""
        gauges = (
            self.memory_used,
            self.memory_cap,
            self.utilisation,
            self.compute_limit,
            self.interposer,
        )
        present: set[tuple[str, str, str, str]] = set()
        for gpu in content.gpus:
            self.policy.labels(self.node, str(gpu.index)).set(int(gpu.policy))
            for c in gpu.containers:
                labels = (self.node, str(gpu.index), c.id, c.pod)
                present.add(labels)
                if labels not in self._series:
                    self._series[labels] = tuple(g.labels(*labels) for g in gauges)
                used, cap, util, limit, interposer = self._series[labels]
                used.set(c.mem_used)
                cap.set(c.memsize)
                util.set(c.util or 0.0)
                limit.set(100.0 if c.limit is None else c.limit)
                interposer.set(1 if c.interposer else 0)
        for labels in set(self._series) - present:
            for gauge in gauges:
                gauge.remove(*labels)
            del self._series[labels]
