"""Resource names, labels and the units the Kubernetes-facing model counts in.

Each resource is one `Resource` record: its name, the kind its device IDs carry, the
device plugin's socket for it, how many units one GPU (or a container's slice of one)
holds, and whether only nodes that isolate compute advertise it. The device plugin's
tables (device IDs, sockets, what a node advertises, what a container holds) are
derived from `RESOURCES`: adding a resource is one record here.
"""

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, Protocol

GPU_MEM: Final = "aliyun.com/gpu-mem"
"""GPU memory in GiB on one GPU (or split over M GPUs with the pod label below)."""

GPU_COUNT: Final = "aliyun.com/gpu-count"
"""As a resource limit: whole GPUs, exclusive. As a pod label: split gpu-mem over M GPUs."""

GPU_CORE: Final = "aliyun.com/gpu-core.percentage"
"""Compute share of one GPU in percent, a multiple of 5 in 5..100."""


class Measured(Protocol):
    """A GPU's capacity or a container's slice of one, in the model's units."""

    @property
    def mem(self) -> int: ...

    @property
    def core(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Resource:
    name: str
    device_kind: str
    """The middle part of its device IDs, `<gpu>-<kind>-<n>` (deviceplugin/devices.py)."""
    socket: str
    """The file name of the device plugin's socket that serves it."""
    units: Callable[[Measured], int]
    """Its device IDs on one GPU: a GPU's whole capacity, or what a container holds of it."""
    needs_compute_isolation: bool = False
    """Advertised only by nodes that isolate compute (core_mem)."""

    def requested(self, limits: Mapping[str, str]) -> int:
        """The count the kubelet allocates a container: its limit, 0 when absent or not a
        whole number (the webhook refuses such a pod before it gets anywhere)."""
        return parse_quantity(limits.get(self.name, "")) or 0


RESOURCES: Final = (
    Resource(GPU_MEM, "mem", "gpushare-mem.sock", lambda gpu: gpu.mem),
    Resource(GPU_COUNT, "gpu", "gpushare-count.sock", lambda gpu: 1),
    Resource(GPU_CORE, "core", "gpushare-core.sock", lambda gpu: gpu.core, True),
)
RESOURCE: Final = {r.name: r for r in RESOURCES}
MANAGED_RESOURCES: Final = tuple(RESOURCE)

_WHOLE_NUMBER = re.compile(r"^\+?[0-9]+$")


def parse_quantity(value: str) -> int | None:
    """A limit of ours as a whole number of units (`3`, ` +3 `), None when it is not one.

    The one grammar of our quantities: the webhook refuses what this reads as None, and
    whoever reads a pod it let through (the plugin, the ACK codec) reads the same number.
    ASCII digits only: `str.isdigit` also takes `²`, which `int` refuses."""
    text = value.strip()
    return int(text) if _WHOLE_NUMBER.match(text) else None


POD_LABEL_GPU_COUNT: Final = "aliyun.com/gpu-count"

CORE_STEP: Final = 5
CORE_PER_GPU: Final = 100
DEFAULT_MAX_PODS_PER_GPU: Final = 20

SCHEDULER_NAME: Final = "gpushare-scheduler"

ACK_SCHEDULER_NAME: Final = "ack-co-scheduler"
"""The scheduler name ACK's documentation writes into GPU-sharing pods (its sample Job
gpu-share-sample); gpushare serves it too by default, so those pods run unchanged."""
