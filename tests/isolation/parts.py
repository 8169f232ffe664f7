"""Inputs for the agent's parts tested on their own: observed containers built directly,
and saved settings kept in memory."""

from collections.abc import Mapping

from gpushare.environment import ContainerLimits
from gpushare.isolation.backends.port import GpuProcess
from gpushare.isolation.workload import ObservedContainer


def observed(
    key: str,
    *processes: GpuProcess,
    gpus: tuple[int, ...] = (0,),
    mem_gib: tuple[int, ...] = (4,),
    core: tuple[int, ...] = (0,),
    weight: int = 1,
    high_priority: bool = False,
    disabled: bool = False,
) -> ObservedContainer:
    """A container of pod default/<key> with the limits given, running `processes`."""
    limits = ContainerLimits(
        pod=f"default/{key}",
        container="main",
        gpu_uuids=tuple(f"GPU-{i}" for i in gpus),
        gpu_indices=gpus,
        mem_gib=mem_gib,
        dev_mem_gib=tuple(16 for _ in gpus),
        core_percent=core,
        weight=weight,
        high_priority=high_priority,
        isolation_disabled=disabled,
    )
    return ObservedContainer(key, limits, "", processes)


def process(pid: int, gpu: int = 0, mem_bytes: int = 0, sm: float | None = 50.0) -> GpuProcess:
    return GpuProcess(pid, gpu, mem_bytes, sm)


class Saved:
    """Saved settings in memory, standing in for the control tree's file."""

    def __init__(self, settings: Mapping[str, str] | None = None) -> None:
        self.settings = dict(settings or {})

    def load_settings(self) -> dict[str, str]:
        return dict(self.settings)

    def save_settings(self, settings: Mapping[str, str]) -> None:
        self.settings = dict(settings)
