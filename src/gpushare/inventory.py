"""A node's GPUs: what the device plugin found, as the scheduler side reads it.

The plugin publishes each GPU (index, UUID, model, memory, health) in the node
annotation `gpushare.io/gpus`, so GPUs of different sizes on one node are
placed correctly. A node without it (an ACK node, a plugin not yet started)
falls back to ACK's rule: allocatable gpu-mem split evenly over gpu-count.
"""

import hashlib
import json
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from gpushare.errors import AnnotationError
from gpushare.labels import NodeMode, node_mode
from gpushare.objects import Node
from gpushare.resources import CORE_PER_GPU, DEFAULT_MAX_PODS_PER_GPU, GPU_COUNT, GPU_MEM

NODE_GPUS_ANNOTATION: Final = "gpushare.io/gpus"

_MIB: Final = 1 << 20


class MemoryRounding(StrEnum):
    """How a GPU's memory becomes whole GiB (`--gpu-memory-rounding`)."""

    UP = "up"
    DOWN = "down"


def gpu_mem_gib(total_bytes: int, rounding: MemoryRounding = MemoryRounding.UP) -> int:
    """The GiB a GPU counts as, from the total memory NVML reports in bytes.

    Up (the default) is what ACK counts: its documentation shows a Tesla T4
    (15,109 MiB) as 15 GiB (`ALIYUN_COM_GPU_MEM_DEV=15`, 60 on a node with four)
    and an A10 (22,731 to 23,028 MiB) as 23 GiB; only rounding whole MiB up to
    the next GiB gives both (rounding to nearest makes the A10 22). Whole MiB
    first, as nvidia-smi shows them, so a few bytes over a GiB boundary do not
    add one. Down is the open-source gpushare-device-plugin's `MiB / 1024`
    (T4 14, A10 22), for clusters whose pods were sized for it.
    """
    mib = max(0, total_bytes // _MIB)
    if rounding is MemoryRounding.DOWN:
        return mib // 1024
    return -(-mib // 1024)


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    uuid: str
    mem: int
    """Memory capacity in the node's units (GiB on Kubernetes nodes)."""
    model: str = ""
    core: int = CORE_PER_GPU
    healthy: bool = True


@dataclass(frozen=True, slots=True)
class NodeGpus:
    """Everything placement needs to know about a node besides what runs on it."""

    node: str
    mode: NodeMode | None
    gpus: tuple[Gpu, ...]
    max_pods_per_gpu: int = DEFAULT_MAX_PODS_PER_GPU
    cpu_milli: int | None = None
    """Host CPU capacity in milli-cores where placement tracks it (the simulator);
    None on Kubernetes nodes, whose CPU the kube-scheduler accounts."""
    memory_mib: int | None = None
    """Host memory capacity in MiB where placement tracks it; None otherwise."""

    @property
    def total_mem(self) -> int:
        return sum(g.mem for g in self.gpus)

    def gpu(self, index: int) -> Gpu:
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        raise KeyError(f"node {self.node} has no GPU {index}")


def adds_room(before: NodeGpus | None, after: NodeGpus | None) -> bool:
    """Whether a pod may fit on `after` that fitted nowhere on `before`: the node is
    new or readable again, its mode changed, a GPU appeared, grew or became healthy,
    or more pods may share a GPU. A change of placement policy orders candidates
    only, so it adds no room."""
    if after is None:
        return False
    if before is None or before.mode != after.mode:
        return True
    if after.max_pods_per_gpu > before.max_pods_per_gpu:
        return True
    usable = {gpu.index: gpu for gpu in before.gpus if gpu.healthy}
    return any(gpu.healthy and not _within(gpu, usable.get(gpu.index)) for gpu in after.gpus)


def _within(gpu: Gpu, before: Gpu | None) -> bool:
    return before is not None and gpu.mem <= before.mem and gpu.core <= before.core


class _GpuRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")
    index: int
    uuid: str
    memGiB: int
    model: str = ""
    healthy: bool = True


_GPU_RECORDS = TypeAdapter(list[_GpuRecord])


def encode_gpus(gpus: tuple[Gpu, ...]) -> str:
    """The value of the node annotation the device plugin writes."""
    records = [
        {"index": g.index, "uuid": g.uuid, "memGiB": g.mem, "model": g.model, "healthy": g.healthy}
        for g in gpus
    ]
    return json.dumps(records, separators=(",", ":"))


def decode_gpus(value: str) -> tuple[Gpu, ...]:
    try:
        records = _GPU_RECORDS.validate_json(value)
    except ValidationError as err:
        raise AnnotationError(f"{NODE_GPUS_ANNOTATION} is malformed: {err}") from err
    return tuple(
        Gpu(index=r.index, uuid=r.uuid, mem=r.memGiB, model=r.model, healthy=r.healthy)
        for r in sorted(records, key=lambda r: r.index)
    )


def node_gpus(
    node: Node,
    max_pods_per_gpu: int = DEFAULT_MAX_PODS_PER_GPU,
) -> NodeGpus:
    """The node's GPU inventory from its mode label, GPU annotation and allocatable."""
    annotation = node.metadata.annotations.get(NODE_GPUS_ANNOTATION)
    gpus = decode_gpus(annotation) if annotation else _even_split(node)
    return NodeGpus(
        node=node.name,
        mode=node_mode(node.metadata.labels),
        gpus=gpus,
        max_pods_per_gpu=max_pods_per_gpu,
    )


def _even_split(node: Node) -> tuple[Gpu, ...]:
    """A node whose plugin publishes no per-GPU annotation (ACK's own): its GPU memory
    split evenly over its GPU count; no GPUs when either is missing or unreadable."""
    allocatable = node.status.allocatable
    if GPU_COUNT not in allocatable or GPU_MEM not in allocatable:
        return ()
    try:
        count, total = int(allocatable[GPU_COUNT]), int(allocatable[GPU_MEM])
    except ValueError:
        return ()
    return tuple(Gpu(index=i, uuid="", mem=total // count) for i in range(count))


_LAYOUT_ITEM = re.compile(r"^\s*(?:(\d+)\s*[xX*]\s*)?(\d+)\s*(GiB|G|GB)?\s*(?::\s*(.+?))?\s*$")


def parse_layout(spec: str, node: str = "node", model: str = "Mock-GPU") -> tuple[Gpu, ...]:
    """GPUs from a layout like `2x16GiB,1x80GiB` (count x size, optional `:model`).

    The mock GPU backend, the demo and kind nodes describe their GPUs this way.
    UUIDs are stable for a node name and index, so restarts see the same GPUs.
    """
    gpus: list[Gpu] = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        match = _LAYOUT_ITEM.match(item)
        if match is None:
            raise ValueError(
                f"GPU layout item {item!r} is not COUNTxSIZEGiB[:MODEL] (e.g. 2x16GiB,1x80GiB)"
            )
        count = int(match.group(1) or 1)
        size = int(match.group(2))
        if count < 1 or size < 1:
            raise ValueError(f"GPU layout item {item!r} needs a count and size of at least 1")
        for _ in range(count):
            index = len(gpus)
            gpus.append(
                Gpu(
                    index=index,
                    uuid=mock_uuid(node, index),
                    mem=size,
                    model=match.group(4) or model,
                )
            )
    if not gpus:
        raise ValueError("GPU layout is empty; give at least one GPU, e.g. 1x16GiB")
    return tuple(gpus)


def mock_uuid(node: str, index: int) -> str:
    digest = hashlib.sha1(f"{node}/{index}".encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
