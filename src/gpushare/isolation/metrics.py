"""Prometheus metrics of the isolation agent, on their own registry (served on --metrics-port).

Per container and GPU: memory used against its cap, compute used against its share, the
time it was held back, and what the CUDA interposer counted in its region (launches held
at the gate, allocations refused at the cap). Per container: its region distrusted, and
its processes that fail closed (what they left in its accounting directory). Per GPU:
utilisation, memory, policy and whether the agent can see it. A container's series carry
`namespace`, `pod` and `container` as Kubernetes names them, so they join with
kube-state-metrics, and its `container_id`. Its series are created at 0 when the agent
first publishes it, moved from the next publish on (so that increase() sees an event
found at the agent's first look at it), and removed when it is forgotten; the node's and
each GPU's exist from the start.
"""

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpushare.isolation.failclosed import FailedClosed
from gpushare.isolation.interposer.region import GpuUsage, Refusal
from gpushare.isolation.memory import MemoryAction
from gpushare.isolation.treecodec import FILE_NAMES, ContainerEntry, TreeContent
from gpushare.telemetry.series import at_zero

CONTAINER_LABELS: Final = ("node", "gpu", "namespace", "pod", "container", "container_id")
GPU_LABELS: Final = ("node", "gpu")
REGION_LABELS: Final = ("node", "namespace", "pod", "container", "container_id")
"""A container's labels for what concerns it whole (its region), not one of its GPUs."""


def container_labels(node: str, gpu: int, entry: ContainerEntry) -> tuple[str, ...]:
    """A container's labels on one GPU. Its pod is `namespace/name` in the tree; a pod the
    agent could not name (`uid:...`, `-`) keeps that text as `pod`, with no namespace."""
    namespace, _, name = entry.pod.rpartition("/")
    return (node, str(gpu), namespace, name, entry.name, entry.id)


@dataclass(slots=True)
class _ContainerSeries:
    """The children of one container on one GPU, and the cumulative counts last seen."""

    gauges: tuple[Gauge, ...]
    counters: tuple[Counter, ...]
    seen: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class _RegionSeries:
    """The labels of one container's region series, and the cumulative counts last seen."""

    labels: tuple[str, ...]
    seen: dict[str, float] = field(default_factory=dict)


class AgentMetrics:
    """Every series carries `node` (like the device plugin's), so a dashboard can filter
    by node however the agent is scraped."""

    def __init__(self, node: str = "", registry: CollectorRegistry | None = None) -> None:
        self.node = node
        self.registry = registry or CollectorRegistry()
        r = self.registry
        per_container = list(CONTAINER_LABELS)
        self.memory_used = Gauge(
            "gpushare_isolation_memory_used_bytes",
            "GPU memory a container's processes hold on one GPU",
            per_container,
            registry=r,
        )
        self.memory_cap = Gauge(
            "gpushare_isolation_memory_cap_bytes",
            "GPU memory a container may hold on one GPU (0: not capped)",
            per_container,
            registry=r,
        )
        self.utilisation = Gauge(
            "gpushare_isolation_utilization_percent",
            "Share of one GPU's compute a container used over the recent window",
            per_container,
            registry=r,
        )
        self.compute_limit = Gauge(
            "gpushare_isolation_compute_limit_percent",
            "Share of one GPU's compute the policy promises a container while it has work",
            per_container,
            registry=r,
        )
        self.interposer = Gauge(
            "gpushare_isolation_interposer",
            "1 when a container runs under the CUDA interposer (memory refused at the call, "
            "launches paced), 0 when the agent enforces after the fact (freezing, over-cap "
            "action)",
            per_container,
            registry=r,
        )
        self.throttled = Counter(
            "gpushare_isolation_throttled_seconds",
            "Time the scheduler held a container off the GPU (frozen, or its gate closed)",
            per_container,
            registry=r,
        )
        self.held = Counter(
            "gpushare_isolation_held_seconds",
            "Time a container's work was held back: its launches waiting at the interposer's "
            "closed gate (summed over its threads), or the container frozen",
            per_container,
            registry=r,
        )
        self.launches_held = Counter(
            "gpushare_isolation_launches_held",
            "Kernel launches the CUDA interposer held at the container's closed gate",
            per_container,
            registry=r,
        )
        self.allocations_refused = Counter(
            "gpushare_isolation_allocations_refused",
            "Allocations the CUDA interposer refused at the container's memory cap",
            per_container,
            registry=r,
        )
        self.violations = Counter(
            "gpushare_isolation_memory_cap_violations",
            "Times a container went over its GPU memory cap, by the action taken",
            [*per_container, "action"],
            registry=r,
        )
        self.backstop_actions = Counter(
            "gpushare_isolation_memory_backstop_actions",
            "Over-cap actions (kills, or reported episodes) on a container paced by the CUDA "
            "interposer, over its cap plus slack: its library was bypassed",
            [*per_container, "action"],
            registry=r,
        )
        self.region_distrusted = Counter(
            "gpushare_isolation_region_distrusted",
            "Times a container's region could not be used (not a regular file, wrong size, a "
            "garbled header, I/O failing), by why; meanwhile it is frozen and capped after "
            "the fact like a container without the interposer",
            [*REGION_LABELS, "reason"],
            registry=r,
        )
        self.allocations_failed_closed = Counter(
            "gpushare_isolation_allocations_failed_closed",
            "Allocations the CUDA interposer refused because it failed closed (it cannot "
            "trust the container's grant, cap, region or slot): every allocation of such a "
            "process is refused, whatever its cap",
            list(REGION_LABELS),
            registry=r,
        )
        self.processes_failed_closed = Gauge(
            "gpushare_isolation_processes_failed_closed",
            "refusing-<pid> files in the container's accounting directory at the latest "
            "read, one per process that failed closed (it stays after the process exits)",
            list(REGION_LABELS),
            registry=r,
        )
        self.distrusted_regions = Gauge(
            "gpushare_isolation_distrusted_regions",
            "Containers on the node whose region cannot be used now",
            ["node"],
            registry=r,
        )
        self.policy = Gauge(
            "gpushare_isolation_gpu_policy",
            "The cGPU scheduling policy of each GPU (0 fair-share .. 5 native)",
            list(GPU_LABELS),
            registry=r,
        )
        self.gpu_utilisation = Gauge(
            "gpushare_isolation_gpu_utilization_percent",
            "Share of the GPU's compute its containers used over the recent window",
            list(GPU_LABELS),
            registry=r,
        )
        self.gpu_memory_used = Gauge(
            "gpushare_isolation_gpu_memory_used_bytes",
            "GPU memory the processes on the GPU hold",
            list(GPU_LABELS),
            registry=r,
        )
        self.gpu_memory_total = Gauge(
            "gpushare_isolation_gpu_memory_total_bytes",
            "The GPU's memory",
            list(GPU_LABELS),
            registry=r,
        )
        self.gpu_healthy = Gauge(
            "gpushare_isolation_gpu_healthy",
            "1 while the agent's latest tick observed the GPU, 0 when it failed (it cannot "
            "see, so everything runs freely)",
            list(GPU_LABELS),
            registry=r,
        )
        self.refused_writes = Counter(
            "gpushare_isolation_control_writes_refused",
            "Writes to the control tree the agent refused (the old value was restored)",
            ["node", "file"],
            registry=r,
        )
        self.late_ticks = Counter(
            "gpushare_isolation_late_ticks",
            "Scheduling ticks that started more than one slice after they were due",
            ["node"],
            registry=r,
        )
        self.slice_seconds = Gauge(
            "gpushare_isolation_slice_seconds",
            "The configured scheduling slice (--slice-ms)",
            ["node"],
            registry=r,
        )
        self.tick_seconds = Histogram(
            "gpushare_isolation_tick_seconds",
            "Time one scheduling tick took (observe, enforce, decide, apply, publish)",
            ["node"],
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25),
            registry=r,
        ).labels(node)
        at_zero(self.refused_writes, [node], FILE_NAMES)
        at_zero(self.late_ticks, [node])
        at_zero(self.slice_seconds, [node])
        at_zero(self.distrusted_regions, [node])
        self._gauges = (
            self.memory_used,
            self.memory_cap,
            self.utilisation,
            self.compute_limit,
            self.interposer,
        )
        self._counters = (
            self.throttled,
            self.held,
            self.launches_held,
            self.allocations_refused,
        )
        self._series: dict[tuple[str, int], _ContainerSeries] = {}
        self._labels: dict[tuple[str, int], tuple[str, ...]] = {}
        self._regions: dict[str, _RegionSeries] = {}
        self._action = MemoryAction.KILL

    def configure(self, gpus: Sequence[int], slice_s: float, action: MemoryAction) -> None:
        """What the agent runs with: its GPUs' series exist from now on."""
        self.slice_seconds.labels(self.node).set(slice_s)
        self._action = action
        per_gpu = (self.policy, self.gpu_utilisation, self.gpu_memory_used, self.gpu_memory_total)
        for gpu in gpus:
            labels = (self.node, str(gpu))
            for gauge in per_gpu:
                gauge.labels(*labels)
            self.gpu_healthy.labels(*labels).set(1)

    def seen(self, gpus: Iterable[int], healthy: bool) -> None:
        """Whether the latest tick could observe these GPUs."""
        for gpu in gpus:
            self.gpu_healthy.labels(self.node, str(gpu)).set(1 if healthy else 0)

    def late_tick(self) -> None:
        self.late_ticks.labels(self.node).inc()

    def held_off(
        self, frozen: Collection[str], interposed: Collection[str], elapsed: float
    ) -> None:
        """The containers held last slice (`elapsed` long), on each GPU they use; the time
        the interposer's gate held launches comes from its region instead (publish)."""
        for (key, _), series in self._series.items():
            if key in frozen:
                throttled, held, _, _ = series.counters
                throttled.inc(elapsed)
                if key not in interposed:
                    held.inc(elapsed)

    def publish(
        self,
        content: TreeContent,
        interposer: Mapping[tuple[str, int], GpuUsage] | None = None,
        *,
        backstops: Callable[[str, int], int] = lambda key, gpu: 0,
        distrusts: Callable[[str], Mapping[Refusal, int]] = lambda key: {},
        distrusted: int = 0,
        failed_closed: Callable[[str], FailedClosed] = lambda key: FailedClosed(),
    ) -> None:
        """Set the gauges from what the control tree shows and move the counters on by what
        the interposer's regions count (by container and GPU), the backstop's actions on
        paced containers (by container and GPU), the times each container's region was
        distrusted and the allocations its processes refused failing closed (cumulative
        counts each); gone containers are dropped. A container's
        counters first published here move from the next publish on."""
        interposer = interposer or {}
        present: set[tuple[str, int]] = set()
        containers: set[str] = set()
        self.distrusted_regions.labels(self.node).set(distrusted)
        for gpu in content.gpus:
            gpu_labels = (self.node, str(gpu.index))
            self.policy.labels(*gpu_labels).set(int(gpu.policy))
            self.gpu_utilisation.labels(*gpu_labels).set(gpu.util or 0.0)
            self.gpu_memory_total.labels(*gpu_labels).set(gpu.mem_bytes)
            self.gpu_memory_used.labels(*gpu_labels).set(sum(c.mem_used for c in gpu.containers))
            for c in gpu.containers:
                at = (c.id, gpu.index)
                present.add(at)
                labels = container_labels(self.node, gpu.index, c)
                if c.id not in containers:  # once per container, on its first GPU
                    containers.add(c.id)
                    self._publish_region(c.id, labels, distrusts(c.id), failed_closed(c.id))
                series = self._series.get(at)
                if series is None:
                    series = self._add(at, labels)
                    new = True
                else:
                    new = False
                used, cap, util, limit, under = series.gauges
                used.set(c.mem_used)
                cap.set(c.memsize)
                util.set(c.util or 0.0)
                limit.set(100.0 if c.limit is None else c.limit)
                under.set(1 if c.interposer else 0)
                if new:
                    continue
                self._advance(series.seen, "violations", c.violations, self._violations(at))
                backstop = self.backstop_actions.labels(*labels, self._action)
                self._advance(series.seen, "backstops", backstops(c.id, gpu.index), backstop)
                usage = interposer.get(at)
                if usage is not None:
                    _, held, launches, refused = series.counters
                    self._advance(series.seen, "held_ns", usage.held_ns, held, scale=1e-9)
                    self._advance(series.seen, "launches_held", usage.launches_held, launches)
                    self._advance(series.seen, "refused", usage.allocations_refused, refused)
        for at in set(self._series) - present:
            self._remove(at)
        for key in set(self._regions) - containers:
            labels = self._regions.pop(key).labels
            for refusal in Refusal:
                self.region_distrusted.remove(*labels, refusal)
            self.allocations_failed_closed.remove(*labels)
            self.processes_failed_closed.remove(*labels)

    def _publish_region(
        self,
        key: str,
        labels: tuple[str, ...],
        counts: Mapping[Refusal, int],
        failed: FailedClosed,
    ) -> None:
        """The container's series as a whole: counters created at 0 when first published,
        moved on by `counts` and `failed` from the next publish on."""
        node, _, *rest = labels
        region = self._regions.get(key)
        new = region is None
        if region is None:
            region = self._regions[key] = _RegionSeries((node, *rest))
        self.processes_failed_closed.labels(*region.labels).set(failed.processes)
        refused = self.allocations_failed_closed.labels(*region.labels)
        if new:
            for refusal in Refusal:
                self.region_distrusted.labels(*region.labels, refusal)
            return
        for refusal, count in counts.items():
            counter = self.region_distrusted.labels(*region.labels, refusal)
            self._advance(region.seen, refusal, count, counter)
        self._advance(region.seen, "failed_closed", failed.allocations, refused)

    def _add(self, at: tuple[str, int], labels: tuple[str, ...]) -> _ContainerSeries:
        series = _ContainerSeries(
            tuple(g.labels(*labels) for g in self._gauges),
            tuple(c.labels(*labels) for c in self._counters),
        )
        for action in MemoryAction:
            self.violations.labels(*labels, action)
            self.backstop_actions.labels(*labels, action)
        self._series[at] = series
        self._labels[at] = labels
        return series

    def _violations(self, at: tuple[str, int]) -> Counter:
        return self.violations.labels(*self._labels[at], self._action)

    def _remove(self, at: tuple[str, int]) -> None:
        labels = self._labels.pop(at)
        del self._series[at]
        for metric in (*self._gauges, *self._counters):
            metric.remove(*labels)
        for action in MemoryAction:
            self.violations.remove(*labels, action)
            self.backstop_actions.remove(*labels, action)

    @staticmethod
    def _advance(
        seen: dict[str, float], name: str, total: float, counter: Counter, scale: float = 1.0
    ) -> None:
        """Moves `counter` on by what a cumulative count grew since last seen; a count that
        went down started again (a region made anew), so all of it is new."""
        last = seen.get(name, 0.0)
        grown = total - last if total >= last else total
        if grown > 0:
            counter.inc(grown * scale)
        seen[name] = total
