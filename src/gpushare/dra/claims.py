"""ACK's requests as DRA claims, and a claim's allocation as our allocation record.

An ACK pod asks `aliyun.com/gpu-mem: 4`: 4 GiB of one GPU. KEP-5004's mapping of an
extended resource to a DeviceClass would read that as four devices (DRA-INTERFACES §7),
so in DRA mode the webhook rewrites the pod instead: one claim per pod, made from a
template, with one request per GPU-using container that asks the device's capacities
(docs/dra.md#acks-pods-unchanged). Prepare turns the scheduler's allocation of that
claim back into the `ContainerAllocation` the device plugin would have made, so both
modes hand a container the same environment and grant.
"""

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from gpushare.allocation import ContainerAllocation, GpuSlice, PodAllocation
from gpushare.dra.objects import (
    CELDeviceSelector,
    DeviceClass,
    DeviceClassSpec,
    DeviceSelector,
    ObjectMeta,
)
from gpushare.grant import GIB
from gpushare.inventory import Gpu
from gpushare.objects import Pod
from gpushare.request import ContainerRequest, ContainerRole, PodRequest
from gpushare.resources import CORE_PER_GPU, DEFAULT_MAX_PODS_PER_GPU

DRIVER: Final = "gpu.gpushare.io"
"""The driver's name: ResourceSlice spec.driver, allocation results' driver, CDI vendor."""
DEVICE_CLASS: Final = DRIVER
POD_CLAIM: Final = "gpushare"
"""The name of the claim the webhook adds to a pod (`spec.resourceClaims[].name`)."""
TEMPLATE_PREFIX: Final = "gpushare-"

MEMORY: Final = "memory"
"""Capacity: the GPU's memory in whole GiB, as ACK counts it ("15Gi")."""
CORES: Final = "cores"
"""Capacity: compute percent, step 5; only where the node isolates compute."""
SHARES: Final = "shares"
"""Capacity: the claims a GPU takes (DEFAULT_MAX_PODS_PER_GPU); a whole GPU takes them all."""

SHARED_SELECTOR: Final = "device.allowMultipleAllocations == true"
"""A slice of a GPU only on a device that shares: a non-sharing device would give the
whole GPU to a pod that asked a slice."""


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """One request of the claim: one container's GPUs."""

    name: str
    """The container's name (requests and containers are DNS labels alike)."""
    count: int
    capacity: tuple[tuple[str, str], ...]
    """Capacity name → quantity, in a fixed order."""
    shared: bool

    def manifest(self) -> dict[str, object]:
        exactly: dict[str, object] = {"deviceClassName": DEVICE_CLASS, "count": self.count}
        if self.shared:
            exactly["selectors"] = [{"cel": {"expression": SHARED_SELECTOR}}]
        exactly["capacity"] = {"requests": dict(self.capacity)}
        return {"name": self.name, "exactly": exactly}


def claim_requests(request: PodRequest) -> tuple[ClaimRequest, ...]:
    """Per GPU-using container, what its request asks of each of its GPUs."""
    return tuple(_claim_request(c) for c in request.containers)


def _claim_request(container: ContainerRequest) -> ClaimRequest:
    if container.exclusive:
        return ClaimRequest(
            container.name, container.gpus, ((SHARES, str(DEFAULT_MAX_PODS_PER_GPU)),), False
        )
    capacity = [(MEMORY, f"{container.mem}Gi")]
    if container.core:
        capacity.append((CORES, str(container.core)))
    return ClaimRequest(container.name, container.gpus, tuple(capacity), True)


def template_spec(requests: Sequence[ClaimRequest]) -> dict[str, object]:
    """The ResourceClaimTemplate's `spec` (API JSON)."""
    return {"spec": {"devices": {"requests": [r.manifest() for r in requests]}}}


def template_name(requests: Sequence[ClaimRequest]) -> str:
    """Named for its content: pods of one shape share a template, and a template never
    changes under a name (a claim template's spec is the pods' contract)."""
    canonical = json.dumps(template_spec(requests), sort_keys=True, separators=(",", ":"))
    return TEMPLATE_PREFIX + hashlib.sha256(canonical.encode()).hexdigest()[:10]


@dataclass(frozen=True, slots=True)
class DeviceResult:
    """One result of the allocation that names our driver, in whole units."""

    request: str
    """The base request name (a `/sub` suffix is dropped)."""
    device: str
    share_id: str | None
    memory_bytes: int | None
    cores: int | None
    shares: int | None


class AllocationError(ValueError):
    """The allocation cannot be served on this node; the message says why."""


def device_index(device: str) -> int:
    """`gpu-3` → 3. Raises AllocationError for a name this driver never published."""
    prefix, _, number = device.partition("-")
    if prefix != "gpu" or not number.isdigit() or (number != "0" and number.startswith("0")):
        raise AllocationError(f"device {device!r} is not one this driver publishes (gpu-<index>)")
    return int(number)


def container_places(pod: Pod) -> dict[str, tuple[ContainerRole, int]]:
    """Each container's role and position in its list, by name."""
    places = {
        c.name: (ContainerRole.SIDECAR if c.restart_policy == "Always" else ContainerRole.INIT, i)
        for i, c in enumerate(pod.spec.init_containers)
    }
    places.update({c.name: (ContainerRole.APP, i) for i, c in enumerate(pod.spec.containers)})
    return places


def pod_allocation(
    results: Iterable[DeviceResult],
    gpus: Mapping[int, Gpu],
    node: str,
    bound_at: datetime,
    users: Callable[[str], Sequence[str]],
    places: Mapping[str, tuple[ContainerRole, int]] | None = None,
) -> PodAllocation:
    """The allocation record of one claim's results on this node, one container entry
    per request, named after the container that uses it (`users(request)`, the pod's
    containers naming it; the request's own name when it is not exactly one), with its
    role and position there (`places`, `container_places(pod)`: an init container's
    memory is not the pod's while it runs, as in the device plugin's record).

    A result without shareID holds its GPU whole (DRA-INTERFACES §6), and so does one
    that took all of a shared GPU's `shares`: the container is exclusive, as a
    `gpu-count` container is. Memory is whole GiB, rounded up as the
    allocator rounds to the policy's step. Raises AllocationError for a device this node
    lacks or a request mixing whole and shared GPUs."""
    by_request: dict[str, list[DeviceResult]] = {}
    for result in results:
        by_request.setdefault(result.request, []).append(result)
    containers = []
    for position, (request, devices) in enumerate(by_request.items()):
        exclusive = {_holds_whole(d) for d in devices}
        if len(exclusive) != 1:
            raise AllocationError(f"request {request!r} mixes whole and shared devices")
        whole = exclusive.pop()
        named = users(request)
        name = named[0] if len(named) == 1 else request
        role, index = (places or {}).get(name, (ContainerRole.APP, position))
        containers.append(
            ContainerAllocation(
                name=name,
                role=role,
                index=index,
                gpus=tuple(_slice(d, gpus, whole) for d in devices),
                exclusive=whole,
            )
        )
    return PodAllocation(node=node, bound_at=bound_at, containers=tuple(containers))


def _holds_whole(result: DeviceResult) -> bool:
    """A device given without shareID (it does not share), or every share of a shared
    one (a `gpu-count` container's request)."""
    return result.share_id is None or result.shares == DEFAULT_MAX_PODS_PER_GPU


def _slice(result: DeviceResult, gpus: Mapping[int, Gpu], whole: bool) -> GpuSlice:
    index = device_index(result.device)
    gpu = gpus.get(index)
    if gpu is None:
        raise AllocationError(f"device {result.device} is not on this node (GPU {index} absent)")
    if whole:
        return GpuSlice(index=index, uuid=gpu.uuid, mem=gpu.mem, gpu_mem=gpu.mem)
    mem = gpu.mem if result.memory_bytes is None else -(-result.memory_bytes // GIB)
    core = result.cores or 0
    if mem > gpu.mem or core > CORE_PER_GPU:
        raise AllocationError(
            f"device {result.device} was allocated {mem} GiB and {core} percent; "
            f"GPU {index} has {gpu.mem} GiB"
        )
    return GpuSlice(index=index, uuid=gpu.uuid, mem=mem, core=core, gpu_mem=gpu.mem)


def device_class() -> DeviceClass:
    """The DeviceClass the chart installs: every device of this driver. No
    extendedResourceName: KEP-5004 would read aliyun.com/gpu-mem as a device count."""
    return DeviceClass(
        metadata=ObjectMeta(name=DEVICE_CLASS),
        spec=DeviceClassSpec(
            selectors=[
                DeviceSelector(cel=CELDeviceSelector(expression=f'device.driver == "{DRIVER}"'))
            ]
        ),
    )
