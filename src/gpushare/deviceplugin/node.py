"""The plugin's own node: its GPUs and their health (from the backend) and its
labels (from the cluster), as immutable snapshots everyone else reads."""

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property

from gpushare.deviceplugin.devices import DeviceCatalog
from gpushare.gpunode.backends.port import HealthChange, PhysicalGpu
from gpushare.inventory import Gpu
from gpushare.labels import NodeMode, isolation_disabled, node_mode


class NodeChange(StrEnum):
    HEALTH = "health"
    LABELS = "labels"
    GPUS = "gpus"
    """GPUs added or gone (rediscovery.py)."""


@dataclass(frozen=True)
class NodeSnapshot:
    gpus: tuple[PhysicalGpu, ...]
    labels: Mapping[str, str]
    catalog: DeviceCatalog = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "catalog", DeviceCatalog(self.inventory))

    @property
    def inventory(self) -> tuple[Gpu, ...]:
        return tuple(g.gpu for g in self.gpus)

    # Snapshots are read on every Allocate: derived values are computed once.
    @cached_property
    def mode(self) -> NodeMode | None:
        return node_mode(self.labels)

    @cached_property
    def advertised(self) -> tuple[str, ...]:
        """Resources this node offers now; none when it is not labelled for sharing."""
        mode = self.mode
        return mode.advertised_resources if mode is not None else ()

    @cached_property
    def isolation_disabled(self) -> bool:
        return isolation_disabled(self.mode, self.labels)

    def physical(self, indices: tuple[int, ...]) -> list[PhysicalGpu]:
        return [g for g in self.gpus if g.gpu.index in indices]


NodeListener = Callable[[NodeSnapshot, NodeChange], None]


class LocalNode:
    """Listeners are called in change order, under the lock: they must be quick
    and must not change the node."""

    def __init__(self, gpus: tuple[PhysicalGpu, ...]) -> None:
        self._lock = threading.RLock()
        self._snapshot = NodeSnapshot(gpus, {})
        self._labels_known = False
        self._listeners: list[NodeListener] = []

    def snapshot(self) -> NodeSnapshot:
        return self._snapshot

    def subscribe(self, listener: NodeListener) -> None:
        self._listeners.append(listener)

    def set_labels(self, labels: Mapping[str, str]) -> None:
        with self._lock:
            if self._labels_known and dict(labels) == dict(self._snapshot.labels):
                return
            self._labels_known = True
            self._snapshot = NodeSnapshot(self._snapshot.gpus, dict(labels))
            self._notify(self._snapshot, NodeChange.LABELS)

    def set_health(self, change: HealthChange) -> bool:
        """Applies a health change; False when the GPU was already in that state."""
        with self._lock:
            gpus = []
            changed = False
            for g in self._snapshot.gpus:
                if g.gpu.index == change.index and g.gpu.healthy != change.healthy:
                    changed = True
                    g = PhysicalGpu(_with_health(g.gpu, change.healthy), g.minor)
                gpus.append(g)
            if not changed:
                return False
            self._snapshot = NodeSnapshot(tuple(gpus), self._snapshot.labels)
            self._notify(self._snapshot, NodeChange.HEALTH)
        return True

    def update_gpus(
        self, update: Callable[[tuple[PhysicalGpu, ...]], tuple[PhysicalGpu, ...]]
    ) -> bool:
        """Replaces the GPUs by `update(current GPUs)`, under the lock so that no health
        change is lost in between; False when that changes nothing."""
        with self._lock:
            gpus = update(self._snapshot.gpus)
            if gpus == self._snapshot.gpus:
                return False
            self._snapshot = NodeSnapshot(gpus, self._snapshot.labels)
            self._notify(self._snapshot, NodeChange.GPUS)
        return True

    def _notify(self, snapshot: NodeSnapshot, change: NodeChange) -> None:
        for listener in self._listeners:
            listener(snapshot, change)


def _with_health(gpu: Gpu, healthy: bool) -> Gpu:
    return Gpu(gpu.index, gpu.uuid, gpu.mem, gpu.model, gpu.core, healthy)
