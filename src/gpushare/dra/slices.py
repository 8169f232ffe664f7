"""The node's GPUs as the ResourceSlice the DRA driver publishes (docs/dra.md#the-slice).

One pool per node, named for it, in one slice; one device per healthy GPU, `gpu-<index>`.
On a node that shares, a device takes many claims (`allowMultipleAllocations`, which
needs DRAConsumableCapacity) and its capacities carry the resource model's rules as
request policies: memory in whole GiB, compute in steps of 5 percent up to 100 (only
where the node isolates compute), and 20 claims a GPU. Elsewhere each device is a
whole GPU. An unhealthy GPU is left out: nothing new is allocated on it, and what runs
there keeps its claim (the allocation is in the claim, not the slice).
"""

from collections.abc import Sequence
from dataclasses import dataclass

from gpushare.dra.claims import CORES, DRIVER, MEMORY, SHARES
from gpushare.dra.objects import (
    CapacityRequestPolicy,
    CapacityRequestPolicyRange,
    Device,
    DeviceAttribute,
    DeviceCapacity,
    ObjectMeta,
    OwnerReference,
    ResourcePool,
    ResourceSlice,
    ResourceSliceSpec,
)
from gpushare.inventory import Gpu
from gpushare.labels import NodeMode
from gpushare.resources import CORE_PER_GPU, CORE_STEP, DEFAULT_MAX_PODS_PER_GPU, GPU_CORE


@dataclass(frozen=True, slots=True)
class NodeRef:
    """The node the slice belongs to: its name, and its UID for the owner reference
    that lets the garbage collector remove the slice with the Node (DRA-INTERFACES §8)."""

    name: str
    uid: str


def device_name(index: int) -> str:
    return f"gpu-{index}"


def node_slice(
    node: NodeRef,
    gpus: Sequence[Gpu],
    mode: NodeMode | None,
    sharing: bool,
    generation: int = 0,
) -> ResourceSlice:
    """The slice of the node's healthy GPUs. `sharing`: publish shareable devices (the
    cluster has consumable capacity and the node a sharing mode); else whole GPUs."""
    shares = sharing and mode is not None
    return ResourceSlice(
        metadata=ObjectMeta(
            generate_name=f"{node.name}-{DRIVER}-",
            owner_references=[
                OwnerReference(
                    api_version="v1", kind="Node", name=node.name, uid=node.uid, controller=True
                )
            ],
        ),
        spec=ResourceSliceSpec(
            driver=DRIVER,
            pool=ResourcePool(name=node.name, generation=generation, resource_slice_count=1),
            node_name=node.name,
            devices=[_device(g, mode, shares) for g in gpus if g.healthy],
        ),
    )


def _device(gpu: Gpu, mode: NodeMode | None, shares: bool) -> Device:
    attributes = {
        "uuid": DeviceAttribute.of(gpu.uuid),
        "index": DeviceAttribute.of(gpu.index),
        "mode": DeviceAttribute.of(mode.value if mode is not None else "exclusive"),
    }
    if gpu.model:
        attributes["model"] = DeviceAttribute.of(gpu.model[:64])
    memory = f"{gpu.mem}Gi"
    if not shares:
        return Device(
            name=device_name(gpu.index),
            attributes=attributes,
            capacity={
                MEMORY: DeviceCapacity(value=memory),
                SHARES: DeviceCapacity(value=str(DEFAULT_MAX_PODS_PER_GPU)),
            },
        )
    capacity = {
        MEMORY: DeviceCapacity(
            value=memory,
            request_policy=CapacityRequestPolicy(
                default=memory, valid_range=CapacityRequestPolicyRange(min="1Gi", step="1Gi")
            ),
        ),
        SHARES: DeviceCapacity(
            value=str(DEFAULT_MAX_PODS_PER_GPU),
            request_policy=CapacityRequestPolicy(
                default="1", valid_values=["1", str(DEFAULT_MAX_PODS_PER_GPU)]
            ),
        ),
    }
    if mode is not None and GPU_CORE in mode.advertised_resources:
        capacity[CORES] = DeviceCapacity(
            value=str(CORE_PER_GPU),
            request_policy=CapacityRequestPolicy(
                default="0",
                valid_range=CapacityRequestPolicyRange(
                    min="0", max=str(CORE_PER_GPU), step=str(CORE_STEP)
                ),
            ),
        )
    return Device(
        name=device_name(gpu.index),
        attributes=attributes,
        capacity=capacity,
        allow_multiple_allocations=True,
    )
