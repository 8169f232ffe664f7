"""Confirms allocations against the kubelet's PodResources and repairs the
annotations where they disagree (see repair.py), recording an event on each pod.

Runs a short while after each Allocate (the kubelet records an allocation only
after Allocate returned, docs/contracts.md#podresources-api-v1), and every
`interval` seconds, which also covers a plugin restart.
"""

import logging
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Final

import grpc

from gpushare.allocation import PodAllocation
from gpushare.cluster import Cluster, EventSeverity, ObjectRef
from gpushare.deviceplugin.admission import AdmissionQueue
from gpushare.deviceplugin.assignment import AssignmentWriter, patch_allocation
from gpushare.deviceplugin.journal import GrantJournal
from gpushare.deviceplugin.metrics import PluginMetrics
from gpushare.deviceplugin.podresources import holdings, list_pod_resources
from gpushare.deviceplugin.repair import Plan, Repair, plan
from gpushare.deviceplugin.worker import Worker
from gpushare.gpunode.interposer import InterposerMounts
from gpushare.objects import Pod
from gpushare.resources import MANAGED_RESOURCES

log = logging.getLogger(__name__)

EVENT_REASON: Final = "GpuAllocationRepaired"
FLUSH_TIMEOUT: Final = 5.0


class Reconciler(Worker):
    def __init__(
        self,
        socket: Path,
        queue: AdmissionQueue,
        journal: GrantJournal,
        assignments: AssignmentWriter,
        cluster: Cluster,
        metrics: PluginMetrics,
        delay: float = 2.0,
        interval: float = 60.0,
        ready: Callable[[], bool] = lambda: True,
        interposer: InterposerMounts | None = None,
    ) -> None:
        super().__init__("reconciler", join_timeout=10)
        self._interposer = interposer
        self.socket = socket
        self._queue = queue
        self._assignments = assignments
        self._ready = ready
        self._journal = journal
        self._cluster = cluster
        self._metrics = metrics
        self._delay = delay
        self._interval = interval
        self._due = time.monotonic()
        self._runs = 0

    def poke(self) -> None:
        """Reconcile `delay` seconds from now (or sooner if already due)."""
        with self._cond:
            self._due = min(self._due, time.monotonic() + self._delay)
            self._cond.notify_all()

    @property
    def runs(self) -> int:
        with self._cond:
            return self._runs

    def _run(self) -> None:
        while True:
            with self._cond:
                # Re-reads the due time after every wake-up: poke() brings it forward.
                while not self._stopped and time.monotonic() < self._due:
                    self._cond.wait(self._due - time.monotonic())
                if self._stopped:
                    return
                self._due = time.monotonic() + self._interval
            try:
                self.reconcile()
            except grpc.RpcError as err:
                self._postpone(err)
            except Exception:
                log.exception("reconciliation with PodResources failed")
            with self._cond:
                self._runs += 1
                self._cond.notify_all()

    def reconcile(self) -> Plan | None:
        """One pass: read PodResources, plan, apply. None when there is nothing to
        compare yet (no socket, or the pods not listed yet)."""
        if not self.socket.exists():
            log.debug("no PodResources socket at %s; nothing to confirm", self.socket)
            return None
        if not self._ready():
            self.poke()
            return None
        # Our own `assigned` marks land first, so a repair is never overwritten by one.
        self._assignments.flush(FLUSH_TIMEOUT)
        response = list_pod_resources(self.socket)
        bound = {pod.key: (pod, allocation) for pod, allocation in self._queue.bound_pods()}
        allocations = {key: allocation for key, (_, allocation) in bound.items()}
        result = plan(
            holdings(response, MANAGED_RESOURCES), self._journal.open_grants(), allocations
        )
        by_pod: dict[str, list[Repair]] = defaultdict(list)
        for repair in result.repairs:
            by_pod[repair.pod_key].append(repair)
        for key, repairs in by_pod.items():
            self._apply(bound[key][0], repairs)
        self._journal.settle(list(result.settled))
        return result

    def _apply(self, pod: Pod, repairs: list[Repair]) -> None:
        by_container = {r.container: r for r in repairs}

        def change(allocation: PodAllocation) -> PodAllocation:
            containers = []
            for c in allocation.containers:
                r = by_container.get(c.name)
                if r is not None:
                    update: dict[str, object] = {"assigned": r.assigned}
                    if r.gpus is not None:
                        update["gpus"] = r.gpus
                    c = c.model_copy(update=update)
                containers.append(c)
            return allocation.model_copy(update={"containers": tuple(containers)})

        if patch_allocation(self._cluster, pod, change) is None:
            log.warning("could not repair the allocation of %s (pod gone?)", pod.key)
            return
        uid = pod.metadata.uid
        for repair in repairs:
            if repair.interposer_grant and self._interposer is not None:
                self._interposer.relabel(repair.interposer_grant, pod, repair.container)
            if repair.assigned:
                self._queue.mark_served(uid, repair.container, repair.resources)
            else:
                self._queue.forget_served(uid, repair.container)
            moved = repair.moves or not repair.assigned
            self._cluster.record_event(
                ObjectRef.of_pod(pod),
                EventSeverity.WARNING if moved else EventSeverity.NORMAL,
                EVENT_REASON,
                repair.message,
            )
            self._metrics.repaired()
            log.warning("repaired the allocation of %s: %s", pod.key, repair.message)

    def _postpone(self, err: grpc.RpcError) -> None:
        """Backs off to the periodic pass (the kubelet rate-limits this API with
        RESOURCE_EXHAUSTED); a later Allocate brings the next pass forward."""
        details = err.details() if isinstance(err, grpc.Call) else str(err)
        log.warning(
            "PodResources List at %s failed (%s); next try in %.0fs",
            self.socket,
            details,
            self._interval,
        )
