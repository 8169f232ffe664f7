"""The environment of a container: the cGPU contract between the device plugin
(which writes it in Allocate) and the isolation agent (which reads it back from
/proc/<pid>/environ, so enforcement needs no API access). A container under the CUDA
interposer can change its processes' environment; for it, the node's grant
(gpushare.grant, written beside from the same limits) is what the library and the agent
hold it to."""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from gpushare.allocation import ContainerAllocation, PodAllocation
from gpushare.objects import Pod

NVIDIA_VISIBLE_DEVICES: Final = "NVIDIA_VISIBLE_DEVICES"
MEM_IDX: Final = "ALIYUN_COM_GPU_MEM_IDX"
MEM_POD: Final = "ALIYUN_COM_GPU_MEM_POD"
MEM_CONTAINER: Final = "ALIYUN_COM_GPU_MEM_CONTAINER"
MEM_DEV: Final = "ALIYUN_COM_GPU_MEM_DEV"
VISIBLE_DEVICES: Final = "ALIYUN_COM_GPU_VISIBLE_DEVICES"
SCHD_WEIGHT: Final = "ALIYUN_COM_GPU_SCHD_WEIGHT"
HIGH_PRIO: Final = "ALIYUN_COM_GPU_HIGH_PRIO"
CGPU_DISABLE: Final = "CGPU_DISABLE"
CORE_PERCENTAGE: Final = "GPUSHARE_GPU_CORE_PERCENTAGE"
"""Ours: the compute percent per GPU (comma list), 0 where compute is not limited."""
POD: Final = "GPUSHARE_POD"
"""Ours: namespace/name of the pod, so node tools can name it without the API."""
CONTAINER: Final = "GPUSHARE_CONTAINER"
CUDA_REGION: Final = "GPUSHARE_CUDA_REGION"
"""Ours: the path of the container's accounting region, a file every process of it that
loads the CUDA interposer maps shared, and the isolation agent reads and writes."""
CUDA_LOG: Final = "GPUSHARE_CUDA_LOG"
"""Ours, set by the user: how much the CUDA interposer says on stderr, 0 (nothing) to 3
(every decision); 1, its refusals, by default."""

INTERPOSER_IN_CONTAINER: Final = "/usr/local/lib/gpushare/libgpushare-cuda.so"
"""Where Allocate mounts the CUDA interposer in a container, and the node's ld.so.preload
(mounted over the container's /etc/ld.so.preload) names it."""
ACCOUNTING_DIR_IN_CONTAINER: Final = "/run/gpushare"
"""Where Allocate mounts the container's accounting directory (read-write)."""
REGION_FILE: Final = "cuda-region"
"""The region's file name in the accounting directory."""
GRANT_IN_CONTAINER: Final = "/etc/gpushare/grant"
"""Where Allocate mounts the container's grant (read-only): what the node decided for it
(gpushare.grant). The interposer is built to read it there (its build's GS_GRANT_PATH)."""

DEFAULT_WEIGHT: Final = 1


@dataclass(frozen=True, slots=True)
class ContainerLimits:
    """What the isolation agent enforces for one container, per GPU."""

    pod: str
    container: str
    gpu_uuids: tuple[str, ...]
    gpu_indices: tuple[int, ...]
    mem_gib: tuple[int, ...]
    dev_mem_gib: tuple[int, ...]
    core_percent: tuple[int, ...]
    weight: int = DEFAULT_WEIGHT
    high_priority: bool = False
    isolation_disabled: bool = False


def container_env(
    pod: Pod,
    allocation: PodAllocation,
    container: ContainerAllocation,
    isolation_disabled: bool,
) -> dict[str, str]:
    """The variables the device plugin hands the container in its Allocate answer.

    Weight and high priority are the user's to set in the pod spec (as on ACK);
    they are echoed here with their defaults so the agent always finds them.
    """
    own_env = _spec_env(pod, container)
    uuids = ",".join(s.uuid for s in container.gpus)
    env = {
        NVIDIA_VISIBLE_DEVICES: uuids,
        VISIBLE_DEVICES: uuids,
        MEM_IDX: _join(s.index for s in container.gpus),
        MEM_POD: str(allocation.total_mem),
        MEM_CONTAINER: _join(s.mem for s in container.gpus),
        MEM_DEV: _join(s.gpu_mem for s in container.gpus),
        CORE_PERCENTAGE: _join(0 if container.exclusive else s.core for s in container.gpus),
        SCHD_WEIGHT: own_env.get(SCHD_WEIGHT, str(DEFAULT_WEIGHT)),
        HIGH_PRIO: own_env.get(HIGH_PRIO, "0"),
        POD: pod.key,
        CONTAINER: container.name,
    }
    if isolation_disabled or container.exclusive:
        env[CGPU_DISABLE] = "true"
    return env


def isolated_at_the_call(pod: Pod, container: ContainerAllocation, env: Mapping[str, str]) -> bool:
    """Whether the CUDA interposer loads into the container: its memory is capped (the
    answer's `env` carries no CGPU_DISABLE: not share mode, not cgpu.disable.isolation,
    not a whole GPU) and the pod did not turn cGPU off itself with CGPU_DISABLE=true in
    the container's environment, as ACK documents."""
    own = _spec_env(pod, container).get(CGPU_DISABLE, "")
    return CGPU_DISABLE not in env and own.strip().lower() != "true"


def limits_from_env(env: Mapping[str, str]) -> ContainerLimits | None:
    """The limits in a process environment, or None for a process gpushare did not
    start. Raises ValueError naming the variable when one is malformed."""
    if MEM_CONTAINER not in env:
        return None
    indices = _ints(env, MEM_IDX)
    mem = _ints(env, MEM_CONTAINER)
    count = len(mem)
    return ContainerLimits(
        pod=env.get(POD, ""),
        container=env.get(CONTAINER, ""),
        gpu_uuids=tuple(u for u in env.get(VISIBLE_DEVICES, "").split(",") if u),
        gpu_indices=indices,
        mem_gib=mem,
        dev_mem_gib=_ints(env, MEM_DEV) or (0,) * count,
        core_percent=_ints(env, CORE_PERCENTAGE) or (0,) * count,
        weight=_ints(env, SCHD_WEIGHT)[0] if env.get(SCHD_WEIGHT) else DEFAULT_WEIGHT,
        high_priority=_flag(env.get(HIGH_PRIO)),
        isolation_disabled=_flag(env.get(CGPU_DISABLE)),
    )


def _flag(value: str | None) -> bool:
    """ACK's switches: on when "1" or "true" in any case, off otherwise or unset."""
    return value is not None and value.strip().lower() in ("1", "true")


def _spec_env(pod: Pod, container: ContainerAllocation) -> dict[str, str]:
    spec = container.spec_in(pod)
    return {e.name: e.value for e in spec.env if e.value is not None} if spec else {}


def _join(values: Iterable[object]) -> str:
    return ",".join(str(v) for v in values)


def _ints(env: Mapping[str, str], name: str) -> tuple[int, ...]:
    raw = env.get(name, "").strip()
    if not raw:
        return ()
    try:
        return tuple(int(part) for part in raw.split(","))
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a comma list of whole numbers") from None
