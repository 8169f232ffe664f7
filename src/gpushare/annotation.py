"""The allocation annotation codec: our versioned JSON plus ACK's keys.

`gpushare.io/allocation` is the single source of truth. The ACK/gpushare keys
are written beside it so tooling built for ACK (kubectl inspect gpushare,
cGPU) reads our clusters, and they are read back when a pod was placed by
ACK's own scheduler before a migration.
"""

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Final

from pydantic import ValidationError

from gpushare.allocation import ALLOCATION_VERSION, ContainerAllocation, GpuSlice, PodAllocation
from gpushare.environment import MEM_DEV, MEM_IDX, MEM_POD
from gpushare.errors import AnnotationError
from gpushare.objects import Pod
from gpushare.request import ContainerRole
from gpushare.resources import GPU_CORE, GPU_MEM, RESOURCE

ALLOCATION: Final = "gpushare.io/allocation"

ACK_ASSUME_TIME: Final = "ALIYUN_COM_GPU_MEM_ASSUME_TIME"
ACK_ASSIGNED: Final = "ALIYUN_COM_GPU_MEM_ASSIGNED"
ACK_V2_ALLOCATION: Final = "scheduler.framework.gpushare.allocation"
ACK_V2_ASSIGNED: Final = "scheduler.framework.gpushare.assigned"
ACK_V2_ASSUME_TIME: Final = "scheduler.framework.gpushare.assume-time"

ALL_KEYS: Final = (
    ALLOCATION,
    MEM_IDX,
    MEM_POD,
    MEM_DEV,
    ACK_ASSUME_TIME,
    ACK_ASSIGNED,
    ACK_V2_ALLOCATION,
    ACK_V2_ASSIGNED,
    ACK_V2_ASSUME_TIME,
)


def encode(allocation: PodAllocation) -> dict[str, str]:
    """Every annotation that records the allocation on the pod."""
    assume_ns = str(int(allocation.bound_at.timestamp() * 1e9))
    app_slices = [
        (c, s) for c in allocation.containers if c.role is ContainerRole.APP for s in c.gpus
    ]
    first = app_slices[0][1] if app_slices else next(iter(_slices(allocation)), None)
    ack_v2: dict[str, dict[str, int]] = {}
    for container, s in app_slices:
        per_gpu = ack_v2.setdefault(str(container.index), {})
        per_gpu[str(s.index)] = per_gpu.get(str(s.index), 0) + s.mem
    annotations = {
        ALLOCATION: allocation.model_dump_json(by_alias=True),
        MEM_IDX: ",".join(str(i) for i in allocation.gpu_indices),
        MEM_POD: str(allocation.total_mem),
        MEM_DEV: str(first.gpu_mem if first else 0),
        ACK_ASSUME_TIME: assume_ns,
        ACK_V2_ALLOCATION: json.dumps(ack_v2, separators=(",", ":")),
        ACK_V2_ASSUME_TIME: assume_ns,
    }
    annotations.update(assigned_annotations(allocation))
    return annotations


def assigned_annotations(allocation: PodAllocation) -> dict[str, str]:
    """The keys that change when the device plugin marks containers assigned."""
    flag = "true" if allocation.assigned else "false"
    return {
        ALLOCATION: allocation.model_dump_json(by_alias=True),
        ACK_ASSIGNED: flag,
        ACK_V2_ASSIGNED: flag,
    }


def removal() -> dict[str, None]:
    """A patch that deletes every allocation key (undoing a failed bind)."""
    return dict.fromkeys(ALL_KEYS)


def decode(pod: Pod) -> PodAllocation | None:
    """The pod's allocation: ours if present, else one ACK's scheduler wrote, else None.

    Raises AnnotationError when an annotation is there but cannot be read.
    """
    annotations = pod.metadata.annotations
    ours = annotations.get(ALLOCATION)
    if ours is not None:
        return _decode_ours(ours)
    if ACK_V2_ALLOCATION in annotations or MEM_IDX in annotations:
        return _decode_ack(pod)
    return None


def _decode_ours(value: str) -> PodAllocation:
    try:
        version = json.loads(value).get("version")
    except (json.JSONDecodeError, AttributeError) as err:
        raise AnnotationError(f"{ALLOCATION} is not a JSON object: {err}") from err
    if isinstance(version, int) and version > ALLOCATION_VERSION:
        raise AnnotationError(
            f"{ALLOCATION} has version {version}, newer than this gpushare understands "
            f"({ALLOCATION_VERSION}); upgrade gpushare"
        )
    try:
        return PodAllocation.model_validate_json(value)
    except ValidationError as err:
        raise AnnotationError(f"{ALLOCATION} is malformed: {err}") from err


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
"""When a pod ACK's scheduler placed without a bind time counts as bound: first."""


def _decode_ack(pod: Pod) -> PodAllocation:
    annotations = pod.metadata.annotations
    if not pod.spec.node_name:
        raise AnnotationError(f"pod {pod.key} has ACK allocation keys but no node")
    try:
        per_container = _ack_containers(pod, annotations)
        assumed = annotations.get(ACK_ASSUME_TIME) or annotations.get(ACK_V2_ASSUME_TIME)
        bound_at = datetime.fromtimestamp(int(assumed) / 1e9, tz=UTC) if assumed else _EPOCH
        dev_mem = int(annotations.get(MEM_DEV, "0"))
    except (ValueError, AttributeError, TypeError, OverflowError) as err:
        raise AnnotationError(f"ACK allocation keys of pod {pod.key} are malformed: {err}") from err
    flag = annotations.get(ACK_ASSIGNED) or annotations.get(ACK_V2_ASSIGNED)
    assigned = flag is not None and flag.lower() == "true"
    containers = []
    for index, per_gpu in sorted(per_container.items()):
        spec = pod.spec.container(index)
        core = RESOURCE[GPU_CORE].requested(spec.resources.limits) if spec else 0
        slices = tuple(
            GpuSlice(index=gpu, mem=mem, core=core, gpu_mem=dev_mem)
            for gpu, mem in sorted(per_gpu.items())
        )
        containers.append(
            ContainerAllocation(
                name=spec.name if spec else f"container-{index}",
                role=ContainerRole.APP,
                index=index,
                gpus=slices,
                assigned=assigned,
            )
        )
    return PodAllocation(
        node=pod.spec.node_name,
        bound_at=bound_at,
        containers=tuple(containers),
    )


def _ack_containers(pod: Pod, annotations: Mapping[str, str]) -> dict[int, dict[int, int]]:
    v2 = annotations.get(ACK_V2_ALLOCATION)
    if v2:
        raw = json.loads(v2)
        return {int(c): {int(g): int(m) for g, m in gpus.items()} for c, gpus in raw.items()}
    # ACK's first version: one GPU index for the whole pod, memory per container limits.
    index_key = annotations.get(MEM_IDX)
    if index_key is None:
        raise ValueError(f"{ACK_V2_ALLOCATION} is empty and there is no {MEM_IDX}")
    gpu = int(index_key.split(",")[0])
    result = {}
    for index, container in enumerate(pod.spec.containers):
        mem = RESOURCE[GPU_MEM].requested(container.resources.limits)
        if mem:
            result[index] = {gpu: mem}
    return result


def _slices(allocation: PodAllocation) -> list[GpuSlice]:
    return [s for c in allocation.containers for s in c.gpus]
