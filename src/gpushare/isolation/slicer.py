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

    def held(
        self, gpus: Mapping[int, tuple[GpuSettings, Sequence[Tenant]]]
    ) -> dict[int, frozenset[str]]:
        """Per GPU, the containers its scheduler does not let run in the coming slice;
        `gpus`: each GPU's settings and tenants."""
        held: dict[int, frozenset[str]] = {}
        for index, scheduler in self._schedulers.items():
            settings, tenants = gpus[index]
            decided = scheduler.next_slice(settings, tenants)
            held[index] = frozenset(t.id for t in tenants if t.id not in decided.runs)
        return held


def frozen(held: Mapping[int, frozenset[str]]) -> frozenset[str]:
    """Containers to freeze: held on at least one of their GPUs (a frozen process cannot
    run on the GPUs that let it either)."""
    return frozenset().union(*held.values())


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
