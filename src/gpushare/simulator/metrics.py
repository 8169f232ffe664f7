"""The benchmark's metrics (docs/placement.md#benchmark-metrics), recorded after every pod.

Each event (one pod offered) falls in the bin round(arrived %); a bin's value is
the mean over its events. Per bin: unallocated GPU %, fragmentation amount (% of
capacity) and ratio (% of idle GPU) against the trace's target workload, occupied
nodes (any CPU or GPU allocated) and used GPUs (any GPU allocated).
"""

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpushare.simulator.trace import PodClass, TracePod


@dataclass(slots=True)
class _Bin:
    events: int = 0
    unallocated: float = 0.0
    frag_amount: float = 0.0
    frag_ratio: float = 0.0
    occupied: float = 0.0
    used_gpus: float = 0.0


@dataclass(frozen=True, slots=True)
class BinMeans:
    """Means over the events of one arrived-% bin."""

    events: int
    unallocated_pct: float
    frag_amount_pct: float
    frag_ratio_pct: float
    occupied_nodes: float
    used_gpus: float


@dataclass(slots=True)
class Recorder:
    capacity: int
    """milli-GPU of the cluster."""
    node_frag: list[float]
    """F of each node now, against the trace's target workload."""
    arrived: int = 0
    placed: int = 0
    failed: Counter[PodClass] = field(default_factory=Counter)
    failed_by_100: Counter[PodClass] = field(default_factory=Counter)
    _bins: dict[int, _Bin] = field(default_factory=dict)
    _frag_total: float = 0.0
    _busy: set[int] = field(default_factory=set)
    _used_gpus: set[tuple[int, int]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._frag_total = sum(self.node_frag)

    def offered(
        self,
        pod: TracePod,
        node: int | None,
        frag_after: float | None,
        gpus: Sequence[int] = (),
    ) -> None:
        """One pod was offered: placed on `node`'s `gpus` (leaving it with F = frag_after)
        or failed."""
        self.arrived += pod.gpu_total
        if node is None or frag_after is None:
            self.failed[pod.kind] += 1
            if round(self.arrived_pct) <= 100:
                self.failed_by_100[pod.kind] += 1
        else:
            self.placed += pod.gpu_total
            self._frag_total += frag_after - self.node_frag[node]
            self.node_frag[node] = frag_after
            if node not in self._busy and (pod.gpu_total or pod.cpu_milli):
                self._busy.add(node)
            self._used_gpus.update((node, i) for i in gpus)
        self._record()

    @property
    def arrived_pct(self) -> float:
        return 100.0 * self.arrived / self.capacity

    def _record(self) -> None:
        key = round(self.arrived_pct)
        b = self._bins.get(key)
        if b is None:
            b = self._bins[key] = _Bin()
        idle = self.capacity - self.placed
        b.events += 1
        b.unallocated += 100.0 * idle / self.capacity
        b.frag_amount += 100.0 * self._frag_total / self.capacity
        b.frag_ratio += 100.0 * self._frag_total / idle if idle > 0 else 0.0
        b.occupied += len(self._busy)
        b.used_gpus += len(self._used_gpus)

    def bins(self) -> dict[int, BinMeans]:
        return {
            key: BinMeans(
                events=b.events,
                unallocated_pct=b.unallocated / b.events,
                frag_amount_pct=b.frag_amount / b.events,
                frag_ratio_pct=b.frag_ratio / b.events,
                occupied_nodes=b.occupied / b.events,
                used_gpus=b.used_gpus / b.events,
            )
            for key, b in sorted(self._bins.items())
        }
