"""A small kubelet: the DRA side (DRA-INTERFACES §1, §3), speaking the real gRPC over
real unix sockets, for the tests and `gpushare demo`.

It registers DRA plugins from `<root>/plugins_registry` (pluginwatcher.py) and prepares a
pod's claims as the kubelet does before creating the pod's sandbox: pre-checks first
(the claim exists with the pod's UID, is allocated, lists the pod in reservedFor, and
each of its drivers is registered), then one NodePrepareResources per driver with the
pod's claims not yet prepared. An answer counts only when every claim sent has an entry,
no entry names a claim not sent, and no entry has an error. A claim is unprepared when
the last pod using it goes. The prepared claims are kept like the kubelet's checkpoint:
across restart(), after which they are prepared again at the pod's next prepare.

Containers get their CDI devices' edits (cdi.py) through container_edits(). Slices are
wiped through the `wipe_slices(node, driver)` hook: for every driver (None) at start, and
for a driver that has had no plugin for `disconnect_grace_s`.
"""

import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import grpc

from gpushare.cluster import DraCluster, NotFound
from gpushare.standins.cdi import CdiError, ContainerEdits, resolve
from gpushare.standins.drahealth import DeviceHealth, HealthWatcher
from gpushare.standins.pluginwatcher import (
    APIS,
    ClaimAnswer,
    DeviceAnswer,
    DraClient,
    PluginRegistration,
    PluginWatcher,
)

log = logging.getLogger(__name__)

REGISTRY: Final = "plugins_registry"
DISCONNECT_GRACE: Final = 30.0
"""Seconds a driver may be without a plugin before its slices go (§3)."""


class PrepareFailed(Exception):
    """FailedPrepareDynamicResources: the pod gets no sandbox; retried at its next sync."""


class UnprepareFailed(Exception):
    """The pod's deletion waits; the kubelet retries."""


@dataclass(frozen=True, slots=True)
class PodClaim:
    """A ResourceClaim of the pod, as the pod's status names it."""

    namespace: str
    uid: str
    name: str


@dataclass(frozen=True, slots=True)
class ClaimView:
    """What the kubelet reads of a ResourceClaim from the API server."""

    uid: str
    allocated: bool
    drivers: tuple[str, ...]
    """Every distinct status.allocation.devices.results[].driver."""
    reserved_for: tuple[str, ...]
    """UIDs of the pods in status.reservedFor."""


ClaimLookup = Callable[[str, str], ClaimView | None]
"""(namespace, name) -> the claim, None when it does not exist."""
DraCall = Callable[[Sequence[tuple[str, str, str]]], Mapping[str, ClaimAnswer]]
"""DraClient.prepare or .unprepare."""
SliceWiper = Callable[[str, str | None], None]
"""(node, driver) -> delete the driver's ResourceSlices of the node; every driver's: None."""


@dataclass
class _ClaimInfo:
    """One checkpoint entry."""

    claim: PodClaim
    drivers: tuple[str, ...]
    pods: set[str] = field(default_factory=set)
    devices: list[DeviceAnswer] = field(default_factory=list)
    prepared: bool = False
    """Not checkpointed: a restarted kubelet prepares the claim again."""


class DraKubeletStandIn:
    def __init__(
        self,
        root: Path,
        node_name: str,
        claims: ClaimLookup,
        cdi_dir: Path,
        wipe_slices: SliceWiper | None = None,
        versions: Sequence[str] = tuple(APIS),
        disconnect_grace_s: float = DISCONNECT_GRACE,
        poll_interval: float = 0.05,
        resource_health: bool = False,
        health_retry_s: float = 5.0,
    ) -> None:
        """`resource_health`: gate ResourceHealthStatus (on from 1.36): watch the health
        stream of a driver that serves one (drahealth.py)."""
        self.root = root
        self.node_name = node_name
        self.cdi_dir = cdi_dir
        self.restarts = 0
        self._claims = claims
        self._wipe = wipe_slices or (lambda node, driver: None)
        self._watcher = PluginWatcher(
            root / REGISTRY,
            versions,
            lambda driver: self._wipe(node_name, driver),
            disconnect_grace_s,
            poll_interval,
            self._registered,
        )
        self._lock = threading.Lock()
        self._checkpoint: dict[str, _ClaimInfo] = {}
        self._resource_health = resource_health
        self._health_retry_s = health_retry_s
        self._health: dict[str, HealthWatcher] = {}

    # ----- lifecycle

    def start(self) -> None:
        self._watcher.registry_dir.mkdir(parents=True, exist_ok=True)
        self._wipe(self.node_name, None)
        self._watcher.start()

    def stop(self) -> None:
        self._watcher.stop()
        with self._lock:
            watchers, self._health = list(self._health.values()), {}
        for watcher in watchers:
            watcher.stop()

    def _registered(self, registration: PluginRegistration) -> None:
        """The newest plugin of a driver serves its health stream."""
        if not (self._resource_health and registration.health):
            return
        watcher = HealthWatcher(registration.endpoint, retry_s=self._health_retry_s)
        with self._lock:
            old = self._health.get(registration.driver)
            self._health[registration.driver] = watcher
        if old is not None:
            old.stop()
        watcher.start()

    def health_watcher(self, driver: str) -> HealthWatcher | None:
        with self._lock:
            return self._health.get(driver)

    def device_health(self, driver: str, pool: str, device: str) -> DeviceHealth:
        """What the pod's status would say of the device: Unknown without a stream."""
        watcher = self.health_watcher(driver)
        return watcher.health(pool, device) if watcher else DeviceHealth("Unknown")

    def restart(self) -> None:
        """A kubelet restart: connections and registrations go, every slice of the node
        is wiped, the plugins register again from their sockets; the checkpoint stays,
        its claims to be prepared again."""
        self.stop()
        with self._lock:
            for info in self._checkpoint.values():
                info.prepared = False
        self.restarts += 1
        self.start()

    # ----- what tests and the demo look at

    @property
    def registrations(self) -> list[PluginRegistration]:
        return list(self._watcher.registrations)

    @property
    def refusals(self) -> list[tuple[str, str]]:
        """(registration socket name, error) of every refused registration."""
        return list(self._watcher.refusals)

    def plugins(self) -> list[PluginRegistration]:
        """The plugins registered now, oldest first."""
        return self._watcher.plugins()

    def registered(self) -> dict[str, str]:
        """Driver -> the DRA version the kubelet speaks with its newest plugin."""
        return {p.driver: p.version for p in self._watcher.plugins()}

    def wait_for(self, condition: Callable[[], bool], timeout: float) -> bool:
        """Waits until `condition()` holds, re-checking on every registration change."""
        with self._watcher.changed:
            return self._watcher.changed.wait_for(condition, timeout)

    def pods_of(self, claim_uid: str) -> set[str]:
        """The pods the checkpoint holds the claim for; empty once it is unprepared."""
        with self._lock:
            info = self._checkpoint.get(claim_uid)
            return set(info.pods) if info else set()

    def devices(self, claim_uid: str) -> list[DeviceAnswer]:
        with self._lock:
            info = self._checkpoint.get(claim_uid)
            return list(info.devices) if info and info.prepared else []

    # ----- prepare and unprepare (§3)

    def prepare(self, pod_uid: str, claims: Sequence[PodClaim]) -> None:
        """Prepares the pod's claims; raises PrepareFailed."""
        drivers = {claim.uid: self._checked(pod_uid, claim) for claim in claims}
        with self._lock:
            todo = []
            for claim in claims:
                info = self._checkpoint.setdefault(claim.uid, _ClaimInfo(claim, drivers[claim.uid]))
                info.pods.add(pod_uid)
                if not info.prepared:
                    todo.append(info)
        devices: dict[str, list[DeviceAnswer]] = defaultdict(list)
        for client, batch in self._batches(todo, PrepareFailed):
            for uid, answer in _answered(
                "NodePrepareResources", client.prepare, batch, PrepareFailed
            ):
                devices[uid] += answer.devices
        with self._lock:
            for info in todo:
                info.devices = devices[info.claim.uid]
                info.prepared = True

    def unprepare(self, pod_uid: str) -> None:
        """The pod is gone: unprepares the claims no other pod uses; raises UnprepareFailed
        (the claims stay in the checkpoint, and the next unprepare tries them again)."""
        with self._lock:
            for info in self._checkpoint.values():
                info.pods.discard(pod_uid)
            todo = [info for info in self._checkpoint.values() if not info.pods]
        failures = []
        done = {info.claim.uid for info in todo}
        for client, batch in self._batches(todo, UnprepareFailed):
            try:
                _answered("NodeUnprepareResources", client.unprepare, batch, UnprepareFailed)
            except UnprepareFailed as failed:
                failures.append(str(failed))
                done -= {claim.uid for claim in batch}
        with self._lock:
            for uid in done:
                self._checkpoint.pop(uid, None)
        if failures:
            raise UnprepareFailed("; ".join(failures))

    def _checked(self, pod_uid: str, claim: PodClaim) -> tuple[str, ...]:
        """The pre-checks, no RPC; the claim's drivers."""
        named = f"ResourceClaim {claim.namespace}/{claim.name}"
        view = self._claims(claim.namespace, claim.name)
        if view is None:
            raise PrepareFailed(f"failed to fetch {named}: not found")
        if view.uid != claim.uid:
            raise PrepareFailed(f"{named} has UID {view.uid}, the pod's has {claim.uid}")
        if not view.allocated:
            raise PrepareFailed(f"{named} is not allocated")
        if pod_uid not in view.reserved_for:
            raise PrepareFailed(f"pod {pod_uid} is not allowed to use {named}: not reserved for it")
        registered = self.registered()
        for driver in view.drivers:
            if driver not in registered:
                raise PrepareFailed(f"DRA driver {driver} is not registered ({named})")
        return view.drivers

    def _batches(
        self, infos: Sequence[_ClaimInfo], failure: type[Exception]
    ) -> list[tuple[DraClient, list[PodClaim]]]:
        """One call per driver, with that driver's claims."""
        by_driver: dict[str, list[PodClaim]] = defaultdict(list)
        for info in infos:
            for driver in info.drivers:
                by_driver[driver].append(info.claim)
        batches = []
        for driver, claims in sorted(by_driver.items()):
            client = self._watcher.client(driver)
            if client is None:
                raise failure(f"DRA driver {driver} is not registered")
            batches.append((client, claims))
        return batches

    # ----- the CDI hand-off

    def cdi_device_ids(self, claim_uid: str, request: str = "") -> list[str]:
        """The IDs of the claim's devices that serve `request`: devices naming no request
        serve every one, an empty request takes every device (§3)."""
        ids = [
            device_id
            for device in self.devices(claim_uid)
            if not request or not device.request_names or request in device.request_names
            for device_id in device.cdi_device_ids
        ]
        return list(dict.fromkeys(ids))

    def container_edits(self, pod_uid: str, claim_uid: str, request: str = "") -> ContainerEdits:
        """What the runtime applies to a container of the pod whose resources.claims
        names this claim (and request); raises CdiError as the runtime fails."""
        with self._lock:
            info = self._checkpoint.get(claim_uid)
            usable = info is not None and info.prepared and pod_uid in info.pods
        if not usable:
            raise CdiError(f"claim {claim_uid} is not prepared for pod {pod_uid}")
        return resolve(self.cdi_dir, self.cdi_device_ids(claim_uid, request))


def _answered(
    call: str, rpc: DraCall, claims: Sequence[PodClaim], failure: type[Exception]
) -> list[tuple[str, ClaimAnswer]]:
    """The per-claim answers, once the response rules hold (§3); raises `failure`."""
    sent = {claim.uid: claim for claim in claims}
    try:
        answers = rpc([(c.namespace, c.uid, c.name) for c in claims])
    except grpc.RpcError as err:
        details = f"{err.code().name}: {err.details()}" if isinstance(err, grpc.Call) else err
        raise failure(f"{call} failed: {details}") from None
    for uid, answer in sorted(answers.items()):
        if uid not in sent:
            raise failure(f"{call} answered for ResourceClaim UID {uid!r}, which it was not sent")
        if answer.error:
            raise failure(f"{call} failed for ResourceClaim {sent[uid].name}: {answer.error}")
    skipped = len(sent) - len(answers)
    if skipped:
        raise failure(f"{call} skipped {skipped} ResourceClaims")
    return sorted(answers.items())


def claim_lookup(cluster: "DraCluster") -> ClaimLookup:
    """What the kubelet reads of a claim, from the API (None when it does not exist)."""

    def view(namespace: str, name: str) -> ClaimView | None:
        try:
            claim = cluster.get_resource_claim(namespace, name)
        except NotFound:
            return None
        allocation = claim.status.allocation
        results = allocation.devices.results if allocation else []
        return ClaimView(
            claim.metadata.uid or "",
            allocation is not None,
            tuple(dict.fromkeys(r.driver for r in results)),
            tuple(sorted(claim.reserved_pod_uids())),
        )

    return view
