"""Pacing at the call: containers that run under the CUDA interposer are held at their
kernel launches (each GPU's gate in the container's region) instead of being frozen.

Allocate mounts each container's accounting directory from the node's interposer
directory (`<dir>/regions/<pod UID>/<container>/`); the interposer's processes map the
region file in it. The container can write every byte of it, so the agent reads it by
copy and believes no count in it (region.py). A container is paced while its region reads
as valid and every GPU process of it that the backend sees holds a live slot there,
matched by its pid in the container: one process without the interposer, and the
container is frozen again like any other. For the paced ones the agent writes, each
slice, each GPU's gate (open when that GPU's scheduler lets the container run) and share
target; a closed gate is written to hold for a few slices only, so launches flow again if
the agent stops. Their memory is refused at the call by the library, and still held to
the cap (with a slack) after the fact by the agent (memory.py).

A region that cannot be read or written (not a regular file, truncated or grown, a
garbled header, an I/O error) distrusts its container alone: it is not paced until its
region reads again, logged once when that starts and once when it ends. What the library
counts in a region (launches held, the time they waited, allocations refused) the agent
reads back for its metrics.
"""

import functools
import logging
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Final

from gpushare.environment import REGION_FILE
from gpushare.grant import GRANTS, REGION_DIR
from gpushare.isolation.backends.port import GpuProcess
from gpushare.isolation.interposer.region import (
    GpuUsage,
    Refusal,
    Region,
    RegionError,
    RegionView,
)
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
        self._views: dict[str, RegionView] = {}
        """This slice's read of each open region."""
        self._told: dict[str, bool] = {}
        """Per container: whether it was last logged as running under the interposer."""
        self._distrusted: dict[str, Refusal] = {}
        """Containers whose region cannot be used now, and why."""
        self._distrusts: dict[tuple[str, Refusal], int] = {}
        """Times each container's region was found unusable (episodes), by why."""

    def region_path(self, container: ObservedContainer) -> Path:
        """The region in the accounting directory of the container's grant; for a
        container started before grants (no grant in its mounts), the directory the
        plugin made by its pod UID and container name."""
        return _region_path(
            self._regions, container.grant_id, container.pod_uid, container.limits.container
        )

    def accounting_directory(self, container: ObservedContainer) -> Path | None:
        """The directory of the container's region; None when it cannot be told."""
        if not container.pod_uid and not container.grant_id:
            return None
        return self.region_path(container).parent

    def paced(self, observed: Mapping[str, ObservedContainer]) -> frozenset[str]:
        """The containers of `observed` paced at their launches now; regions of containers
        no longer observed are closed."""
        found: set[str] = set()
        self._views = {}
        for key, container in observed.items():
            view = self._view(key, container)
            stray = _unattached(container.processes, view)
            if view is not None and not stray:
                found.add(key)
            self._tell(key, container, view is not None and not stray, stray)
        for key in set(self._open) - set(observed):
            self._open.pop(key).close()
        for key in set(self._distrusted) - set(observed):
            self._trust(key, "it is no longer observed")
        for key in set(self._told) - set(observed):
            del self._told[key]
        return frozenset(found)

    def pace(
        self,
        observed: Mapping[str, ObservedContainer],
        paced: Collection[str],
        held: Mapping[int, frozenset[str]],
    ) -> frozenset[str]:
        """Writes the gates of the paced containers: closed on each GPU whose scheduler
        holds the container in the coming slice, open elsewhere. Those whose gates could
        not be written are not paced this slice (and distrusted): the others, returned,
        are."""
        written = set()
        for key in paced:
            container, region = observed[key], self._open[key]
            try:
                for position, index in enumerate(container.limits.gpu_indices[: region.gpu_count]):
                    region.set_gate(
                        position, open=key not in held.get(index, ()), for_s=self._hold_s
                    )
                    region.set_share(position, container.core_percent(index))
            except (RegionError, OSError) as err:
                self._distrust(key, container, region.path, err)
                continue
            written.add(key)
        return frozenset(written)

    def usage(self, observed: Mapping[str, ObservedContainer]) -> dict[tuple[str, int], GpuUsage]:
        """What the regions of the observed containers count, by (container, GPU index):
        those with a region read this slice, whether a process is attached now or not."""
        found = {}
        for key, view in self._views.items():
            container = observed.get(key)
            if container is None:
                continue
            indices = container.limits.gpu_indices
            for gpu in view.gpus:
                if gpu.index < len(indices):
                    found[(key, indices[gpu.index])] = gpu
        return found

    def distrusted(self) -> frozenset[str]:
        """The containers whose region cannot be used now."""
        return frozenset(self._distrusted)

    def distrusts(self, key: str) -> dict[Refusal, int]:
        """Times the container's region was found unusable since it was first seen, by why."""
        return {refusal: self._distrusts.get((key, refusal), 0) for refusal in Refusal}

    def forget(self, key: str) -> None:
        """A container gone for good: should its ID come back, it starts afresh."""
        self._distrusts = {at: n for at, n in self._distrusts.items() if at[0] != key}

    def release(self) -> None:
        """Opens every gate: the agent stops, or cannot see what it enforces."""
        for key, region in self._open.items():
            try:
                for position in range(region.gpu_count):
                    region.set_gate(position, open=True)
            except (RegionError, OSError) as err:
                log.debug("container %s: opening the gates of %s: %s", key, region.path, err)

    def close(self) -> None:
        self.release()
        for region in self._open.values():
            region.close()
        self._open.clear()

    def _view(self, key: str, container: ObservedContainer) -> RegionView | None:
        """The container's region read now; None when it has none, or one that cannot be
        used (then the container is distrusted until it reads again)."""
        path = self.region_path(container)
        region = self._open.get(key)
        try:
            if region is not None and (region.path != path or region.replaced()):
                self._open.pop(key).close()  # unlinked and made anew: another file
                region = None
            if region is None:
                if not container.pod_uid and not container.grant_id:
                    return None  # no way to tell where its region would be
                region = Region.open(path)
                self._open[key] = region
            view = region.view()
        except FileNotFoundError:
            self._trust(key, "its region is gone")
            return None
        except (RegionError, OSError) as err:
            self._distrust(key, container, path, err)
            return None
        self._trust(key, "its region reads again")
        self._views[key] = view
        return view

    def _distrust(self, key: str, container: ObservedContainer, path: Path, err: Exception) -> None:
        """Its region is closed (opened afresh next slice) and it is not paced."""
        region = self._open.pop(key, None)
        if region is not None:
            region.close()
        self._views.pop(key, None)
        refusal = err.refusal if isinstance(err, RegionError) else Refusal.IO
        if key in self._distrusted:
            return
        self._distrusted[key] = refusal
        self._distrusts[(key, refusal)] = self._distrusts.get((key, refusal), 0) + 1
        log.warning(
            "container %s (pod %s): its region %s cannot be used (%s): it is frozen and "
            "its memory capped after the fact like a container without the interposer",
            key,
            container.pod,
            path,
            err,
        )

    def _trust(self, key: str, why: str) -> None:
        if self._distrusted.pop(key, None) is not None:
            log.info("container %s: its region is no longer distrusted: %s", key, why)

    def _tell(
        self,
        key: str,
        container: ObservedContainer,
        under: bool,
        stray: Collection[GpuProcess],
    ) -> None:
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
                "container %s (pod %s) runs without the CUDA interposer%s: its memory cap "
                "is enforced after the fact, its compute share by freezing it",
                key,
                container.pod,
                "" if not stray else f" (pid {min(p.pid for p in stray)} is not attached)",
            )


@functools.lru_cache(maxsize=4096)  # asked every slice for every container: joins add up
def _region_path(regions: Path, grant_id: str, pod_uid: str, name: str) -> Path:
    if grant_id:
        return regions.parent / GRANTS / grant_id / REGION_DIR / REGION_FILE
    return regions / pod_uid / name / REGION_FILE


def _unattached(processes: Collection[GpuProcess], view: RegionView | None) -> list[GpuProcess]:
    """The GPU processes that hold no live slot of the region (all of them without one)."""
    if view is None:
        return list(processes)
    live = {p.pid for p in view.processes}
    return [p for p in processes if p.ns_pid is None or p.ns_pid not in live]
