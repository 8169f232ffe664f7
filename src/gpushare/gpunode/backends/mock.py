"""The mock GPU backend: GPUs described by a layout (`2x16GiB,1x80GiB`), for
tests, the demo and kind nodes without GPUs.

Health can be flipped two ways: `set_healthy()` (tests), or a file the backend
polls that lists the indices of the GPUs to report unhealthy (operators on kind:
`echo 1 > /tmp/gpushare-mock-unhealthy-gpus` inside the plugin's container;
empty the file to heal them).
"""

import logging
import re
import threading
from collections.abc import Sequence
from pathlib import Path

from gpushare.gpunode.backends.port import (
    DeviceNode,
    HealthChange,
    HealthListener,
    PhysicalGpu,
)
from gpushare.inventory import Gpu, parse_layout

log = logging.getLogger(__name__)

_INDICES = re.compile(r"[\s,]+")


class MockBackend:
    name = "mock"

    def __init__(
        self,
        gpus: Sequence[Gpu],
        health_file: Path | None = None,
        poll_interval: float = 1.0,
    ) -> None:
        self._gpus = tuple(gpus)
        self._health_file = health_file
        self._poll_interval = poll_interval
        self._lock = threading.Lock()
        self._set_unhealthy: set[int] = set()
        self._file_unhealthy: frozenset[int] = frozenset()
        self._file_stamp: tuple[int, int] | None = None
        self._reported: dict[int, bool] = {g.index: g.healthy for g in self._gpus}
        self._listeners: list[HealthListener] = []

    @classmethod
    def from_layout(
        cls, layout: str, node: str, health_file: Path | None = None, poll_interval: float = 1.0
    ) -> "MockBackend":
        """GPUs from a layout (--mock-gpus: gpushare.nodeflags reads a file it names);
        UUIDs as inventory.parse_layout makes them for `node`, so the demo's nodes and
        this backend agree."""
        return cls(parse_layout(layout, node), health_file, poll_interval)

    def discover(self) -> tuple[PhysicalGpu, ...]:
        self._read_health_file()
        with self._lock:
            return tuple(
                PhysicalGpu(Gpu(g.index, g.uuid, g.mem, g.model, g.core, self._healthy(g)), g.index)
                for g in self._gpus
            )

    def device_nodes(self, gpus: Sequence[PhysicalGpu]) -> list[DeviceNode]:
        return []

    def set_gpus(self, gpus: Sequence[Gpu]) -> None:
        """Replaces the node's GPUs, as if one was added or taken out: the plugin finds
        them at its next listing (tests)."""
        with self._lock:
            self._gpus = tuple(gpus)
            self._reported = {g.index: self._reported.get(g.index, g.healthy) for g in gpus}

    def set_healthy(self, index: int, healthy: bool) -> None:
        if index not in self._reported:
            raise ValueError(f"mock backend has no GPU {index} (it has {len(self._gpus)})")
        with self._lock:
            if healthy:
                self._set_unhealthy.discard(index)
            else:
                self._set_unhealthy.add(index)
        self._announce("set through the mock backend")

    def watch_health(self, listener: HealthListener, stop: threading.Event) -> None:
        with self._lock:
            self._listeners.append(listener)
        try:
            self._announce("mock backend state at start", force=True)
            while not stop.wait(self._poll_interval):
                # Announced whether this poll or a discover() read the change: what the
                # listeners were told last is compared, not the file's last reading.
                self._read_health_file()
                self._announce(f"listed in {self._health_file}")
        finally:
            with self._lock:
                self._listeners.remove(listener)

    def _healthy(self, gpu: Gpu) -> bool:
        unhealthy = self._set_unhealthy | self._file_unhealthy
        return gpu.healthy and gpu.index not in unhealthy

    def _announce(self, reason: str, force: bool = False) -> None:
        with self._lock:
            changes = []
            for gpu in self._gpus:
                healthy = self._healthy(gpu)
                if force or self._reported[gpu.index] != healthy:
                    self._reported[gpu.index] = healthy
                    changes.append(HealthChange(gpu.index, healthy, reason))
            listeners = list(self._listeners)
        for change in changes:
            for listener in listeners:
                listener(change)

    def _read_health_file(self) -> bool:
        """Re-reads the health file when it changed; True when its content did."""
        if self._health_file is None:
            return False
        try:
            stat = self._health_file.stat()
            stamp = (stat.st_ino, stat.st_mtime_ns)
            text = self._health_file.read_text() if stamp != self._file_stamp else None
        except FileNotFoundError:
            stamp, text = (0, 0), ""
        if stamp == self._file_stamp or text is None:
            return False
        self._file_stamp = stamp
        try:
            unhealthy = frozenset(int(part) for part in _INDICES.split(text.strip()) if part)
        except ValueError:
            log.warning(
                "mock health file %s should list GPU indices (e.g. `0,2`), got %r; ignored",
                self._health_file,
                text.strip(),
            )
            return False
        with self._lock:
            changed = unhealthy != self._file_unhealthy
            self._file_unhealthy = unhealthy
        return changed
