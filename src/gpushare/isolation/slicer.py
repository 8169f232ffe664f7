"""Slice scheduling for the whole node: each GPU's TimeSliceScheduler, and the containers to
freeze in the coming slice.

A container on several GPUs runs only in a slice where all of them let it, so
the frozen set is the union over the GPUs of those their scheduler holds.
"""

from collections.abc import Callable, Iterable, Mapping, Sequence

from gpushare.isolation.policy import GpuSettings
from gpushare.isolation.roster import ContainerRoster
from gpushare.isolation.settings import SettingsStore
from gpushare.isolation.timeslice import Tenant, TimeSliceScheduler


class NodeSlicer:
    def __init__(self, gpus: Iterable[int], slice_s: float, now: Callable[[], float]) -> None:
        self._schedulers = {index: TimeSliceScheduler(slice_s, now) for index in gpus}

    def frozen(self, gpus: Mapping[int, tuple[GpuSettings, Sequence[Tenant]]]) -> frozenset[str]:
        """Containers that may not run in the coming slice on at least one of their GPUs;
        `gpus`: each GPU's settings and tenants."""
        frozen: set[str] = set()
        for index, scheduler in self._schedulers.items():
            settings, tenants = gpus[index]
            decided = scheduler.next_slice(settings, tenants)
            frozen.update(t.id for t in tenants if t.id not in decided.runs)
        return frozenset(frozen)


def tenants(gpu: int, settings: SettingsStore, roster: ContainerRoster) -> list[Tenant]:
    """The GPU's scheduled containers (isolation not off) as its scheduler sees them."""
    grants = settings.grants(gpu)
    usage = roster.members(gpu)
    return [
        Tenant(
            key, grants[key], c.high_priority, c.core_percent, usage[key].active, usage[key].used_s
        )
        for key, c in settings.containers(gpu).items()
        if not c.disabled
    ]
