"""The allocation annotation codec: our versioned JSON plus ACK's keys.

`gpushare.io/allocation` is the single source of truth. The ACK/gpushare keys
are written beside it so tooling built for ACK (kubectl inspect gpushare,
cGPU) reads our clusters, and they are read back when a pod was placed by
ACK's own scheduler before a migration.
"""

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from hashlib import blake2b
from typing import Final

from pydantic import ValidationError

from gpushare.allocation import (
    ALLOCATION_VERSION,
    UNKNOWN_BIND_TIME,
    ContainerAllocation,
    GpuSlice,
    PodAllocation,
)
from gpushare.environment import MEM_DEV, MEM_IDX, MEM_POD
from gpushare.errors import AnnotationError
from gpushare.objects import Pod
from gpushare.request import ContainerRole
from gpushare.resources import CORE_PER_GPU, GPU_CORE, GPU_MEM, RESOURCE

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


CHECK: Final = "check"
"""The member of our JSON that closes it: a digest of every byte written before it."""
_CHECK_DIGITS = 16


def encode(allocation: PodAllocation) -> dict[str, str]:
    """Every annotation that records the allocation on the pod."""
    assume_ns = str(int(allocation.bound_at.timestamp() * 1e9))
    app_slices = [s for c in allocation.containers if c.role is ContainerRole.APP for s in c.gpus]
    first = app_slices[0] if app_slices else next(iter(_slices(allocation)), None)
    annotations = {
        **_ack_record(allocation),
        MEM_DEV: str(first.gpu_mem if first else 0),
        ACK_ASSUME_TIME: assume_ns,
        ACK_V2_ASSUME_TIME: assume_ns,
    }
    annotations.update(assigned_annotations(allocation))
    return annotations


def assigned_annotations(allocation: PodAllocation) -> dict[str, str]:
    """The keys that change when the device plugin marks containers assigned."""
    flag = "true" if allocation.assigned else "false"
    return {
        ALLOCATION: _sealed(allocation.model_dump_json(by_alias=True)),
        ACK_ASSIGNED: flag,
        ACK_V2_ASSIGNED: flag,
    }


def _ack_record(allocation: PodAllocation) -> dict[str, str]:
    """ACK's keys that say where the pod's memory is: written beside ours, and what a
    record of ours without a check must agree with."""
    ack_v2: dict[str, dict[str, int]] = {}
    for container in allocation.containers:
        if container.role is ContainerRole.APP:
            per_gpu = ack_v2.setdefault(str(container.index), {})
            for s in container.gpus:
                per_gpu[str(s.index)] = per_gpu.get(str(s.index), 0) + s.mem
    return {
        MEM_IDX: ",".join(str(i) for i in allocation.gpu_indices),
        MEM_POD: str(allocation.total_mem),
        ACK_V2_ALLOCATION: json.dumps(ack_v2, separators=(",", ":")),
    }


def _sealed(body: str) -> str:
    """The JSON object `body` with the check of its exact text as its last member."""
    return f'{body[:-1]},"{CHECK}":"{_digest(body)}"}}'


def _digest(body: str) -> str:
    return blake2b(body.encode(), digest_size=_CHECK_DIGITS // 2).hexdigest()


def _unsealed(value: str, check: object) -> str:
    """The text the check was made of; raises AnnotationError when it does not match."""
    suffix = f',"{CHECK}":"{check}"}}'
    body = value.removesuffix(suffix) + "}"
    if not value.endswith(suffix) or not isinstance(check, str) or _digest(body) != check:
        raise AnnotationError(
            f"{ALLOCATION} fails its check: it was changed after gpushare wrote it"
        )
    return body


def removal() -> dict[str, None]:
    """A patch that deletes every allocation key (undoing a failed bind)."""
    return dict.fromkeys(ALL_KEYS)


@dataclass(frozen=True, slots=True)
class Reading:
    """What a pod holds as far as its records can be trusted (`read`)."""

    allocation: PodAllocation | None
    """Ours; else, when ours is damaged, what ACK's keys say; else, on a bound pod whose
    records are all damaged, an unknown allocation on its node (PodAllocation.unknown)."""
    problem: str | None = None
    """Why a record was not trusted; None when nothing was wrong."""


def read(pod: Pod) -> Reading:
    """The pod's allocation, failing safe: a damaged record is never dropped from the
    books, it is charged from ACK's keys when those can be read, or else held as an
    unknown allocation on the pod's node. The extender and the device plugin both read
    pods through this."""
    try:
        return Reading(decode(pod))
    except AnnotationError as err:
        problem = str(err)
    if ALLOCATION in pod.metadata.annotations and _has_ack_keys(pod.metadata.annotations):
        try:
            return Reading(_decode_ack(pod), f"{problem}; charged as ACK's keys say")
        except AnnotationError as err:
            problem = f"{problem}; and {err}"
    if not pod.spec.node_name:
        return Reading(None, problem)
    return Reading(
        PodAllocation.unknown_on(pod.spec.node_name),
        f"{problem}; node {pod.spec.node_name} takes no new GPU pod until the record is "
        "repaired or the pod is deleted",
    )


def decode(pod: Pod) -> PodAllocation | None:
    """The pod's allocation: ours if present, else one ACK's scheduler wrote, else None.

    Raises AnnotationError when an annotation is there but cannot be read or breaks a
    rule: it is never guessed at (`read` says what to charge then).
    """
    annotations = pod.metadata.annotations
    ours = annotations.get(ALLOCATION)
    if ours is not None:
        return _decode_ours(ours, annotations)
    if _has_ack_keys(annotations):
        return _decode_ack(pod)
    return None


def _has_ack_keys(annotations: Mapping[str, str]) -> bool:
    return ACK_V2_ALLOCATION in annotations or MEM_IDX in annotations


def _decode_ours(value: str, annotations: Mapping[str, str]) -> PodAllocation:
    """Ours, checked: against its check when it has one (what gpushare writes), else
    against ACK's keys beside it (what gpushare wrote before it had checks)."""
    try:
        document = json.loads(value)
        version = document.get("version")
    except (json.JSONDecodeError, AttributeError) as err:
        raise AnnotationError(f"{ALLOCATION} is not a JSON object: {err}") from err
    if isinstance(version, int) and version > ALLOCATION_VERSION:
        raise AnnotationError(
            f"{ALLOCATION} has version {version}, newer than this gpushare understands "
            f"({ALLOCATION_VERSION}); upgrade gpushare"
        )
    sealed = CHECK in document
    body = _unsealed(value, document[CHECK]) if sealed else value
    try:
        allocation = PodAllocation.model_validate_json(body)
    except ValidationError as err:
        raise AnnotationError(f"{ALLOCATION} is malformed: {err}") from err
    _check_rules(allocation, ALLOCATION)
    if not sealed:
        _check_against_ack(allocation, annotations)
    return allocation


def _check_rules(allocation: PodAllocation, record: str) -> PodAllocation:
    """What the model's types do not say: no slice over its GPU or over 100 percent."""
    for container in allocation.containers:
        for s in container.gpus:
            where = f"{record}: container {container.name!r} on GPU {s.index}"
            if s.core > CORE_PER_GPU:
                raise AnnotationError(
                    f"{where} holds {s.core} percent compute, more than a whole GPU"
                )
            if s.gpu_mem and s.mem > s.gpu_mem:
                raise AnnotationError(
                    f"{where} holds {s.mem} GiB, more than the GPU's {s.gpu_mem} GiB"
                )
    return allocation


def _check_against_ack(allocation: PodAllocation, annotations: Mapping[str, str]) -> None:
    """A record without a check is trusted only as far as ACK's keys beside it agree."""
    for key, expected in _ack_record(allocation).items():
        written = annotations.get(key)
        if written is not None and _ack_value(key, written) != _ack_value(key, expected):
            raise AnnotationError(
                f"{ALLOCATION} says {key} should be {expected}, but it is {written}"
            )


def _ack_value(key: str, value: str) -> object:
    """An ACK key's value as it compares: its JSON read, for the one that is JSON."""
    if key != ACK_V2_ALLOCATION:
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def _decode_ack(pod: Pod) -> PodAllocation:
    annotations = pod.metadata.annotations
    if not pod.spec.node_name:
        raise AnnotationError(f"pod {pod.key} has ACK allocation keys but no node")
    try:
        per_container = _ack_containers(pod, annotations)
        assumed = annotations.get(ACK_ASSUME_TIME) or annotations.get(ACK_V2_ASSUME_TIME)
        bound_at = (
            datetime.fromtimestamp(int(assumed) / 1e9, tz=UTC) if assumed else UNKNOWN_BIND_TIME
        )
        dev_mem = int(annotations.get(MEM_DEV, "0"))
        allocation = _ack_allocation(pod, per_container, bound_at, dev_mem)
    except (ValueError, AttributeError, TypeError, OverflowError) as err:
        # ValidationError is a ValueError: a negative index or size breaks the model
        raise AnnotationError(f"ACK allocation keys of pod {pod.key} are malformed: {err}") from err
    return _check_rules(allocation, f"ACK allocation keys of pod {pod.key}")


def _ack_allocation(
    pod: Pod, per_container: dict[int, dict[int, int]], bound_at: datetime, dev_mem: int
) -> PodAllocation:
    annotations = pod.metadata.annotations
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
