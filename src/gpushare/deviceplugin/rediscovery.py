"""The node's GPUs found again while the plugin runs: a GPU added, or one gone, changes
what the node advertises without a restart.

Every `interval` seconds the backend lists the GPUs again and `reconcile` merges the
list into the node's (by UUID, which survives a renumbering):

- a GPU found for the first time joins with the health the backend reports;
- a GPU still there keeps the health the health watch gave it (discovery does not
  judge health) and takes what discovery says of the rest (memory, model, minor);
- a GPU no longer found is dropped, unless a pod bound to the node still holds it: the
  books say so, and forgetting it would let its slices be given again when it comes
  back. It stays, Unhealthy, logged as missing, until its pods are gone (or it is found
  again, when it takes the health discovery reports). A GPU found under the index of a
  missing one takes that index: two GPUs cannot share it.

Pure but for the `Rediscovery` thread: the merge is tested without one.
"""

import logging
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from typing import Final

from gpushare.gpunode.backends.port import DeviceBackend, PhysicalGpu
from gpushare.inventory import Gpu

log = logging.getLogger(__name__)

REDISCOVER_INTERVAL: Final = 30.0
"""Seconds between two listings of the GPUs: a GPU added shows in the node's capacity
within this long."""


@dataclass(frozen=True)
class Merged:
    gpus: tuple[PhysicalGpu, ...]
    """The node's GPUs from now on, by index."""
    added: tuple[Gpu, ...] = ()
    dropped: tuple[Gpu, ...] = ()
    """Gone, and no pod holds them."""
    missing: tuple[Gpu, ...] = ()
    """Gone while pods still hold them: kept, Unhealthy."""
    found_again: tuple[Gpu, ...] = ()
    """Missing ones the backend lists again."""


def reconcile(
    current: tuple[PhysicalGpu, ...],
    found: tuple[PhysicalGpu, ...],
    held: Collection[int],
    missing: Collection[str],
) -> Merged:
    """Merges `found` into `current`. `held`: the GPU indices the node's pods hold;
    `missing`: UUIDs of GPUs kept while gone."""
    known = {g.gpu.uuid: g for g in current}
    found_uuids = {g.gpu.uuid for g in found}
    gpus: dict[int, PhysicalGpu] = {}
    added, found_again = [], []
    for g in found:
        before = known.get(g.gpu.uuid)
        if before is None:
            added.append(g.gpu)
        elif g.gpu.uuid in missing:
            found_again.append(g.gpu)
        else:
            g = replace(g, gpu=replace(g.gpu, healthy=before.gpu.healthy))
        gpus[g.gpu.index] = g
    dropped, kept = [], []
    for g in current:
        if g.gpu.uuid in found_uuids:
            continue
        if g.gpu.index in held and g.gpu.index not in gpus:
            kept.append(g.gpu)
            gpus[g.gpu.index] = replace(g, gpu=replace(g.gpu, healthy=False))
        else:
            dropped.append(g.gpu)
    return Merged(
        tuple(gpus[i] for i in sorted(gpus)),
        tuple(added),
        tuple(dropped),
        tuple(kept),
        tuple(found_again),
    )


GpuUpdate = Callable[[tuple[PhysicalGpu, ...]], tuple[PhysicalGpu, ...]]


class Rediscovery:
    """Lists the GPUs every `interval` seconds and hands the node its new list.

    `apply(update)` runs `update` on the node's current GPUs under the node's lock (so a
    health change in between is not lost); `held()` names the GPU indices the node's
    pods hold."""

    def __init__(
        self,
        backend: DeviceBackend,
        apply: Callable[[GpuUpdate], object],
        held: Callable[[], Collection[int]],
        interval: float = REDISCOVER_INTERVAL,
    ) -> None:
        self._backend = backend
        self._apply = apply
        self._held = held
        self.interval = interval
        self._missing: set[str] = set()
        self._lock = threading.RLock()
        """Reentrant: the node's listeners read `missing` while the merge is applied."""

    @property
    def missing(self) -> int:
        """How many GPUs are kept while gone."""
        with self._lock:
            return len(self._missing)

    def run(self, stopped: threading.Event) -> None:
        while not stopped.wait(self.interval):
            self.once()

    def once(self) -> None:
        """One listing; a failing one is logged and changes nothing."""
        try:
            found = self._backend.discover()
        except Exception as err:
            log.warning("listing the GPUs again failed (%s); keeping the known ones", err)
            return
        held = frozenset(self._held())
        with self._lock:
            self._apply(lambda current: self._merge(current, found, held))

    def _merge(
        self, current: tuple[PhysicalGpu, ...], found: tuple[PhysicalGpu, ...], held: frozenset[int]
    ) -> tuple[PhysicalGpu, ...]:
        merged = reconcile(current, found, held, self._missing)
        for gpu in merged.added:
            log.warning(
                "GPU %d (%s, %d GiB) appeared: advertising it", gpu.index, gpu.uuid, gpu.mem
            )
        for gpu in merged.found_again:
            log.warning("GPU %d (%s) is back", gpu.index, gpu.uuid)
        for gpu in merged.dropped:
            if gpu.index in held:
                log.error(
                    "GPU %d (%s) is gone and another GPU took its index: the pods holding "
                    "GPU %d are charged to that one now",
                    gpu.index,
                    gpu.uuid,
                    gpu.index,
                )
            else:
                log.warning("GPU %d (%s) is gone: no longer advertised", gpu.index, gpu.uuid)
        for gpu in merged.missing:
            if gpu.uuid not in self._missing:
                log.error(
                    "GPU %d (%s) is gone, but pods bound to this node hold it: kept in the "
                    "books, Unhealthy, until they are gone (see docs/troubleshooting.md)",
                    gpu.index,
                    gpu.uuid,
                )
        self._missing = {g.uuid for g in merged.missing}
        return merged.gpus
