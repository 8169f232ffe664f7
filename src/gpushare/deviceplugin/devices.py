"""Fake device IDs: the units the kubelet counts, each naming the GPU it belongs to.

The kubelet allocates extended resources by counting device IDs
(docs/contracts.md#device-ids-are-counted), so the plugin advertises one ID per
unit: per GiB of each GPU for gpu-mem, one per GPU for gpu-count, per percent of
each GPU for gpu-core.percentage. An ID
reads `<gpu>-<kind>-<n>`, e.g. `GPU-8a1f…-mem-3`, where `<gpu>` is the GPU's UUID
(stable across reboots, unlike the index), so the kubelet's records and
PodResources name the real GPU. A UUID that would push an ID past the 63
characters the API allows, or that holds other characters than [A-Za-z0-9._-], is
replaced by a short digest of it.
"""

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from gpushare.inventory import Gpu
from gpushare.resources import RESOURCE, RESOURCES

HEALTHY: Final = "Healthy"
UNHEALTHY: Final = "Unhealthy"
MAX_ID_LENGTH: Final = 63

_RESOURCE_OF_KIND: Final = {r.device_kind: r.name for r in RESOURCES}
_SAFE_UUID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,47}$")
_DEVICE_ID = re.compile(rf"^(?P<gpu>.+)-(?P<kind>{'|'.join(_RESOURCE_OF_KIND)})-(?P<unit>\d+)$")


@dataclass(frozen=True, slots=True)
class DeviceId:
    gpu_key: str
    resource: str
    unit: int

    def __str__(self) -> str:
        return f"{self.gpu_key}-{RESOURCE[self.resource].device_kind}-{self.unit}"


def gpu_key(uuid: str) -> str:
    """The GPU's part of its device IDs: the UUID itself when it is short and plain."""
    if _SAFE_UUID.match(uuid):
        return uuid
    return "gpu-" + hashlib.sha1(uuid.encode()).hexdigest()[:16]


def parse_device_id(value: str) -> DeviceId | None:
    match = _DEVICE_ID.match(value)
    if match is None:
        return None
    return DeviceId(match["gpu"], _RESOURCE_OF_KIND[match["kind"]], int(match["unit"]))


def units(resource: str, gpu: Gpu) -> int:
    """How many device IDs of `resource` one GPU contributes."""
    if resource not in RESOURCE:
        raise ValueError(f"{resource} is not a gpushare resource")
    return RESOURCE[resource].units(gpu)


@dataclass(frozen=True, slots=True)
class Device:
    id: str
    gpu_index: int
    healthy: bool


@dataclass(frozen=True)
class DeviceCatalog:
    """Every device ID of every resource on the node, from its GPUs and their health."""

    gpus: tuple[Gpu, ...]
    _by_key: dict[str, Gpu] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_key = {gpu_key(g.uuid): g for g in self.gpus}
        if len(by_key) != len(self.gpus):
            raise ValueError("two GPUs share a UUID; device IDs would collide")
        object.__setattr__(self, "_by_key", by_key)

    def devices(self, resource: str) -> list[Device]:
        return [
            Device(str(DeviceId(gpu_key(g.uuid), resource, n)), g.index, g.healthy)
            for g in self.gpus
            for n in range(units(resource, g))
        ]

    def gpu_of(self, device_id: str) -> Gpu | None:
        parsed = parse_device_id(device_id)
        return None if parsed is None else self._by_key.get(parsed.gpu_key)


def preferred_ids(
    catalog: DeviceCatalog,
    wanted: Sequence[tuple[int, int]],
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
) -> list[str]:
    """The IDs to prefer when `wanted` lists (GPU index, units) the container needs.

    Starts from the IDs the kubelet insists on, then takes available IDs of each
    wanted GPU in unit order; never more than `size`. A shorter answer is fine:
    the kubelet fills the rest itself.
    """
    chosen = list(dict.fromkeys(must_include))[:size]
    need = dict(wanted)
    for device_id in chosen:
        gpu = catalog.gpu_of(device_id)
        if gpu is not None and need.get(gpu.index, 0) > 0:
            need[gpu.index] -= 1
    taken = set(chosen)
    by_gpu: dict[int, list[tuple[int, str]]] = {}
    for device_id in available:
        parsed = parse_device_id(device_id)
        gpu = catalog.gpu_of(device_id)
        if parsed is not None and gpu is not None and device_id not in taken:
            by_gpu.setdefault(gpu.index, []).append((parsed.unit, device_id))
    for index, count in need.items():
        for _, device_id in sorted(by_gpu.get(index, []))[: max(count, 0)]:
            if len(chosen) >= size:
                return chosen
            chosen.append(device_id)
    return chosen
