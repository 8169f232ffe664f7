"""The GPU port: what the plugin needs from the hardware, with two backends
(`nvml` for real GPUs, `mock` for tests, the demo and kind)."""

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from gpushare.inventory import Gpu


@dataclass(frozen=True, slots=True)
class PhysicalGpu:
    """A GPU as discovered: the inventory record plus what only the node needs."""

    gpu: Gpu
    minor: int
    """The N of /dev/nvidiaN."""


@dataclass(frozen=True, slots=True)
class DeviceNode:
    """A device file the container needs (a DeviceSpec in the Allocate answer)."""

    host_path: str
    container_path: str
    permissions: str = "rw"


@dataclass(frozen=True, slots=True)
class HealthChange:
    index: int
    healthy: bool
    reason: str


HealthListener = Callable[[HealthChange], None]


class DeviceBackend(Protocol):
    name: str

    def discover(self) -> tuple[PhysicalGpu, ...]:
        """The node's GPUs, ordered by index. Raises RuntimeError with a reason
        an operator can act on when the GPUs cannot be read."""
        ...

    def device_nodes(self, gpus: Sequence[PhysicalGpu]) -> list[DeviceNode]:
        """Device files a container using these GPUs needs; empty for mock GPUs."""
        ...

    def watch_health(self, listener: HealthListener, stop: threading.Event) -> None:
        """Blocks until `stop` is set, calling `listener` whenever a GPU turns
        unhealthy or healthy again."""
        ...
