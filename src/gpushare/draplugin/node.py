"""What the driver knows of its node: the GPUs the backend found, their health, and the
node's labels (its sharing mode), as immutable snapshots the preparer, the publisher
and the health stream read. A change wakes the publisher and the health stream."""

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from gpushare.gpunode.backends.port import HealthChange, PhysicalGpu
from gpushare.inventory import Gpu
from gpushare.labels import NodeMode, isolation_disabled, node_mode


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    name: str
    uid: str = ""
    physical: tuple[PhysicalGpu, ...] = ()
    unhealthy: frozenset[int] = frozenset()
    why_unhealthy: Mapping[int, str] = field(default_factory=dict)
    """What the backend said when each unhealthy GPU went so (the health stream's message)."""
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def mode(self) -> NodeMode | None:
        return node_mode(self.labels)

    @property
    def isolation_disabled(self) -> bool:
        return isolation_disabled(self.mode, self.labels)

    @property
    def gpus(self) -> tuple[Gpu, ...]:
        return tuple(
            replace(p.gpu, healthy=p.gpu.healthy and p.gpu.index not in self.unhealthy)
            for p in self.physical
        )

    def by_index(self) -> dict[int, Gpu]:
        return {g.index: g for g in self.gpus}

    def physical_of(self, indices: tuple[int, ...]) -> list[PhysicalGpu]:
        found = {p.gpu.index: p for p in self.physical}
        return [found[i] for i in indices if i in found]


class DriverNode:
    """Thread-safe: the backend's health thread, the node watch and the gRPC workers
    all use it."""

    def __init__(self, name: str) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._version = 0
        self._snapshot = NodeSnapshot(name)
        self._on_change: Callable[[], None] = lambda: None

    def on_change(self, callback: Callable[[], None]) -> None:
        """Calls `callback` (outside the lock) after every change."""
        self._on_change = callback

    def snapshot(self) -> NodeSnapshot:
        with self._lock:
            return self._snapshot

    def versioned(self) -> tuple[int, NodeSnapshot]:
        """The snapshot and its version, which every change increments."""
        with self._lock:
            return self._version, self._snapshot

    def wait_changed(self, seen: int, timeout: float) -> None:
        """Returns once the version is past `seen`, at wake(), or after `timeout` seconds."""
        with self._changed:
            if self._version == seen:
                self._changed.wait(timeout)

    def wake(self) -> None:
        """Wakes every wait_changed (a watcher that is going away)."""
        with self._changed:
            self._changed.notify_all()

    def set_gpus(self, physical: tuple[PhysicalGpu, ...]) -> None:
        self._update(physical=physical)

    def set_node(self, uid: str, labels: Mapping[str, str]) -> None:
        self._update(uid=uid, labels=dict(labels))

    def health_changed(self, change: HealthChange) -> None:
        with self._lock:
            unhealthy = set(self._snapshot.unhealthy)
            why = dict(self._snapshot.why_unhealthy)
        if change.healthy:
            unhealthy.discard(change.index)
            why.pop(change.index, None)
        else:
            unhealthy.add(change.index)
            why[change.index] = change.reason
        self._update(unhealthy=frozenset(unhealthy), why_unhealthy=why)

    def _update(self, **changes: object) -> None:
        with self._lock:
            before = self._snapshot
            self._snapshot = replace(before, **changes)  # type: ignore[arg-type]
            changed = self._snapshot != before
            if changed:
                self._version += 1
                self._changed.notify_all()
        if changed:
            self._on_change()
