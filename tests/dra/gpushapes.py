"""The devices our slices publish (docs/dra.md#the-slice),
in the base units the allocator model counts in."""

from gpushare.dra.allocator import Device, DeviceRequest
from gpushare.dra.capacity import Capacity, RequestPolicy, ValidRange

DRIVER = "gpu.gpushare.io"
GI = 1 << 30

SHARES_POLICY = RequestPolicy(default=1, valid_values=(1, 20))
CORES_POLICY = RequestPolicy(default=0, valid_range=ValidRange(min=0, max=100, step=5))


def memory_policy(mem_gib: int) -> RequestPolicy:
    """`validRange{min: 1Gi, step: 1Gi}`, default the full value."""
    return RequestPolicy(default=mem_gib * GI, valid_range=ValidRange(min=GI, step=GI))


def shared_gpu(index: int, mem_gib: int = 15, cores: bool = True, pool: str = "node-a") -> Device:
    """A GPU of a sharing node: memory, cores (where compute is isolated) and shares."""
    capacity = {"memory": Capacity(mem_gib * GI, memory_policy(mem_gib))}
    if cores:
        capacity["cores"] = Capacity(100, CORES_POLICY)
    capacity["shares"] = Capacity(20, SHARES_POLICY)
    return Device(
        driver=DRIVER,
        pool=pool,
        name=f"gpu-{index}",
        attributes={"uuid": f"GPU-{index}", "index": index, "model": "Tesla T4", "mode": "share"},
        capacity=capacity,
        allow_multiple_allocations=True,
    )


def exclusive_gpu(index: int, mem_gib: int = 15, pool: str = "node-a") -> Device:
    """A GPU of a non-sharing node: memory only, no policy, one claim at a time."""
    return Device(
        driver=DRIVER,
        pool=pool,
        name=f"gpu-{index}",
        attributes={"uuid": f"GPU-{index}", "index": index},
        capacity={"memory": Capacity(mem_gib * GI)},
    )


def ours(device: Device) -> bool:
    """The DeviceClass `gpu.gpushare.io`: `device.driver == "gpu.gpushare.io"`."""
    return device.driver == DRIVER


def gpus(name: str, count: int = 1, **capacity: int) -> DeviceRequest:
    """A request of our webhook's claims: `count` GPUs with capacity requests."""
    return DeviceRequest(name=name, selects=ours, count=count, capacity=capacity)
