"""Keeps the node's ResourceSlice equal to its GPUs (DRA-INTERFACES §4, §8).

Published at start, again on every change of the GPUs' health, and every `resync_s`
the node and its GPUs are read again (a label change of its mode, a GPU added or gone
is published within that time) and the slice checked against what the API holds: the kubelet deletes
every slice of its node when it starts, and a driver's slices 30 s after it lost the
driver (§3), so a slice that went missing is made again. A changed slice is written
with the pool's generation one higher.

An API server without DRAConsumableCapacity drops a slice's sharing fields without an
error (§5): the publisher reads back what was stored, and where sharing was lost it
says so, naming the gate, and publishes whole GPUs, which is what the scheduler will
allocate anyway.
"""

import logging
import threading
from collections.abc import Callable
from typing import Final

from gpushare.backoff import Backoff
from gpushare.cluster import Cluster, ClusterError, DraCluster
from gpushare.dra.claims import DRIVER
from gpushare.dra.objects import ResourceSlice
from gpushare.dra.slices import NodeRef, node_slice
from gpushare.draplugin.metrics import DriverMetrics
from gpushare.draplugin.node import DriverNode
from gpushare.inventory import NODE_GPUS_ANNOTATION, Gpu, encode_gpus

log = logging.getLogger(__name__)

RESYNC_S: Final = 10.0
GATE: Final = "DRAConsumableCapacity"


class SlicePublisher:
    def __init__(
        self,
        node: DriverNode,
        cluster: Cluster,
        dra: DraCluster,
        sharing: bool,
        resync_s: float = RESYNC_S,
        backoff: Backoff | None = None,
        refresh: Callable[[], None] = lambda: None,
        metrics: DriverMetrics | None = None,
    ) -> None:
        self._metrics = metrics or DriverMetrics(node.snapshot().name)
        self._node = node
        self._cluster = cluster
        self._refresh = refresh
        self._dra = dra
        self._sharing = sharing
        self.sharing_lost = False
        """The API server dropped the sharing fields: whole GPUs are published."""
        self._resync_s = resync_s
        self._backoff = backoff or Backoff()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.published = threading.Event()

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="slice-publisher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def withdraw(self) -> None:
        """Deletes the node's slices of this driver (uninstall, or a mode change away)."""
        self._dra.delete_resource_slices(self._node.snapshot().name, DRIVER)
        log.info("withdrew the ResourceSlices of node %s", self._node.snapshot().name)

    def publish(self) -> ResourceSlice | None:
        """Makes the API's slice equal to the node; the slice stored, None while the
        node's own object is not known yet (its UID owns the slice)."""
        snapshot = self._node.snapshot()
        if not snapshot.uid:
            return None
        sharing = self._sharing and not self.sharing_lost
        own = self._dra.list_resource_slices(DRIVER, snapshot.name)
        current = own[0] if own else None
        generation = current.spec.pool.generation if current else 0
        desired = node_slice(
            NodeRef(snapshot.name, snapshot.uid), snapshot.gpus, snapshot.mode, sharing, generation
        )
        for extra in own[1:]:
            self._dra.delete_resource_slice(extra.metadata.name)
        if current is None:
            stored = self._dra.create_resource_slice(desired)
            log.info("published the ResourceSlice of node %s: %s", snapshot.name, _describe(stored))
        elif current.spec.model_copy(update={"pool": desired.spec.pool}) != desired.spec:
            spec = desired.spec.model_copy(
                update={"pool": desired.spec.pool.model_copy(update={"generation": generation + 1})}
            )
            stored = self._dra.update_resource_slice(current.model_copy(update={"spec": spec}))
            log.info("updated the ResourceSlice of node %s: %s", snapshot.name, _describe(stored))
        else:
            stored = current
        if stored is not current:
            self._metrics.slice_written(
                any(d.allow_multiple_allocations for d in stored.spec.devices)
            )
            self._annotate_node(snapshot.name, snapshot.gpus)
        if sharing and _lost_sharing(desired, stored):
            self.sharing_lost = True
            log.error(
                "the API server dropped the sharing of node %s's GPUs (allowMultipleAllocations, "
                "request policies): feature gate %s is off in kube-apiserver. Each GPU is "
                "published whole; enable %s in kube-apiserver and kube-scheduler (on by default "
                "from Kubernetes 1.36) and restart this driver to share them",
                snapshot.name,
                GATE,
                GATE,
            )
            return self.publish()
        self.published.set()
        return stored

    def _annotate_node(self, name: str, gpus: tuple[Gpu, ...]) -> None:
        """The node's GPUs in the annotation the device plugin writes, for `kubectl
        inspect cgpu`; the slice is what the scheduler reads."""
        try:
            self._cluster.patch_node_annotations(name, {NODE_GPUS_ANNOTATION: encode_gpus(gpus)})
        except ClusterError as err:
            log.warning("the GPU annotation of node %s was not written: %s", name, err)

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                self._refresh()
                self.publish()
                failures = 0
                wait = self._resync_s
            except ClusterError as err:
                failures += 1
                wait = self._backoff.delay(failures)
                log.warning("publishing the ResourceSlice failed (retry in %.1fs): %s", wait, err)
            self._wake.wait(wait)
            self._wake.clear()


def _lost_sharing(desired: ResourceSlice, stored: ResourceSlice) -> bool:
    asked = any(d.allow_multiple_allocations for d in desired.spec.devices)
    kept = any(d.allow_multiple_allocations for d in stored.spec.devices)
    return asked and not kept


def _describe(stored: ResourceSlice) -> str:
    devices = stored.spec.devices
    shared = sum(1 for d in devices if d.allow_multiple_allocations)
    return (
        f"{stored.metadata.name}, generation {stored.spec.pool.generation}, "
        f"{len(devices)} GPU(s), {shared} shared"
    )
