"""Pacing at the call: containers that run under the CUDA interposer are held at their
kernel launches (each GPU's gate in the container's region) instead of being frozen.

Allocate mounts each container's accounting directory from the node's interposer
directory (`<dir>/regions/<pod UID>/<container>/`); the interposer's processes map the
region file in it. A container counts as running under the interposer while its region
has a process attached. For those the agent writes, each slice, each GPU's gate (open
when that GPU's scheduler lets the container run) and share target; a closed gate is
written to hold for a few slices only, so launches flow again if the agent stops. Their
memory is capped at the call, so the agent does not kill for it either. Everything else
keeps the after-the-fact enforcement: freezing and the over-cap action. What the library
counts in a region (launches held, the time they waited, allocations refused) the agent
reads back for its metrics.
"""

import logging
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Final

from gpushare.environment import REGION_FILE
from gpushare.isolation.interposer.region import GpuUsage, Region, RegionError
from gpushare.isolation.workload import ObservedContainer

log = logging.getLogger(__name__)

REGIONS: Final = "regions"
HOLD_SLICES: Final = 5
"""A closed gate holds at most this many slices unless written again."""


class RegionPacer:
    def __init__(self, directory: Path, slice_s: float) -> None:
        self._regions = directory / REGIONS
        self._hold_s = HOLD_SLICES * slice_s
        self._open: dict[str, Region] = {}
        self._told: dict[str, bool] = {}
        """Per container: whether it was last logged as running under the interposer."""

    def region_path(self, container: ObservedContainer) -> Path:
        return self._regions / container.pod_uid / container.limits.container / REGION_FILE

    def interposed(self, observed: Mapping[str, ObservedContainer]) -> frozenset[str]:
        """The containers of `observed` with a process under the interposer now; regions of
        containers no longer observed are closed."""
        found: set[str] = set()
        for key, container in observed.items():
            region = self._region(key, container)
            if region is not None:
                region.reap()  # a process killed since: its slot and memory come back
            under = region is not None and region.attached > 0
            if under:
                found.add(key)
            self._tell(key, container, under)
        for key in set(self._open) - set(observed):
            self._open.pop(key).close()
            self._told.pop(key, None)
        return frozenset(found)

    def pace(
        self,
        observed: Mapping[str, ObservedContainer],
        interposed: Collection[str],
        held: Mapping[int, frozenset[str]],
    ) -> None:
        """Writes the gates of the interposed containers: closed on each GPU whose
        scheduler holds the container in the coming slice, open elsewhere."""
        for key in interposed:
            container, region = observed[key], self._open[key]
            for position, index in enumerate(container.limits.gpu_indices[: region.gpu_count]):
                region.set_gate(position, open=key not in held.get(index, ()), for_s=self._hold_s)
                region.set_share(position, container.core_percent(index))

    def usage(self, observed: Mapping[str, ObservedContainer]) -> dict[tuple[str, int], GpuUsage]:
        """What the regions of the observed containers count, by (container, GPU index):
        those with a region at all, whether a process is attached now or not."""
        found = {}
        for key, region in self._open.items():
            container = observed.get(key)
            if container is None:
                continue
            indices = container.limits.gpu_indices
            for gpu in region.gpus():
                if gpu.index < len(indices):
                    found[(key, indices[gpu.index])] = gpu
        return found

    def release(self) -> None:
        """Opens every gate: the agent stops, or cannot see what it enforces."""
        for region in self._open.values():
            for position in range(region.gpu_count):
                region.set_gate(position, open=True)

    def close(self) -> None:
        self.release()
        for region in self._open.values():
            region.close()
        self._open.clear()

    def _region(self, key: str, container: ObservedContainer) -> Region | None:
        region = self._open.get(key)
        if region is not None:
            return region
        path = self.region_path(container)
        if not container.pod_uid or not path.is_file():
            return None
        try:
            region = Region.open(path)
        except (RegionError, OSError) as err:
            log.warning("container %s: its region %s is unusable: %s", key, path, err)
            return None
        self._open[key] = region
        return region

    def _tell(self, key: str, container: ObservedContainer, under: bool) -> None:
        if self._told.get(key) == under:
            return
        self._told[key] = under
        if under:
            log.info(
                "container %s (pod %s) runs under the CUDA interposer: memory is "
                "refused at the call, launches are paced",
                key,
                container.pod,
            )
        else:
            log.info(
                "container %s (pod %s) runs without the CUDA interposer: its memory cap "
                "is enforced after the fact, its compute share by freezing it",
                key,
                container.pod,
            )
