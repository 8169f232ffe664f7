"""The kubelet's plugin watcher and DRA plugin manager, as far as a DRA driver sees them
(DRA-INTERFACES §1, §3), for DraKubeletStandIn.

Every poll it lists `<root>/plugins_registry`: a unix socket that appears (names starting
with "." and other files are ignored) is dialled, asked GetInfo (1 s), and accepted when
it is a DRAPlugin whose supported_versions lists one we know: the first such entry is
the version used. The outcome goes back through NotifyRegistrationStatus; a refused or
unreachable plugin is tried again a second later. A socket removed (or replaced)
deregisters its plugin. A driver left without a plugin for the grace period is reported
through `on_gone`, where the kubelet deletes the driver's ResourceSlices.
"""

import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Final

import grpc

from gpushare.kubeletapi.dra.v1 import api_pb2 as dra1
from gpushare.kubeletapi.dra.v1 import api_pb2_grpc as dra1_grpc
from gpushare.kubeletapi.dra.v1beta1 import api_pb2 as dra1beta1
from gpushare.kubeletapi.dra.v1beta1 import api_pb2_grpc as dra1beta1_grpc
from gpushare.kubeletapi.pluginregistration.v1 import api_pb2 as reg
from gpushare.kubeletapi.pluginregistration.v1 import api_pb2_grpc as reg_grpc

log = logging.getLogger(__name__)

DRA_PLUGIN: Final = "DRAPlugin"
HEALTH_SERVICE: Final = "v1alpha1.DRAResourceHealth"
"""Listed beside the DRAPlugin versions by a driver that serves the health stream."""
APIS: Final[dict[str, tuple[ModuleType, ModuleType]]] = {
    "v1.DRAPlugin": (dra1, dra1_grpc),
    "v1beta1.DRAPlugin": (dra1beta1, dra1beta1_grpc),
}
"""The DRA versions a 1.35/1.36 kubelet knows; a 1.34 one knows only v1beta1 (§2b)."""
GET_INFO_TIMEOUT: Final = 1.0
NOTIFY_TIMEOUT: Final = 5.0
CALL_TIMEOUT: Final = 45.0
"""NodePrepareResources / NodeUnprepareResources (§3)."""
RETRY_INTERVAL: Final = 1.0

SocketId = tuple[int, int]


@dataclass(frozen=True, slots=True)
class PluginRegistration:
    driver: str
    endpoint: str
    version: str
    socket: Path
    """The registration socket."""
    health: bool = False
    """It lists the health stream (v1alpha1.DRAResourceHealth) too."""


@dataclass(frozen=True, slots=True)
class DeviceAnswer:
    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None


@dataclass(frozen=True, slots=True)
class ClaimAnswer:
    error: str
    devices: tuple[DeviceAnswer, ...] = ()


class DraClient:
    """A registered plugin: a long-lived connection to its endpoint, in its version."""

    def __init__(self, registration: PluginRegistration) -> None:
        self.registration = registration
        self._api, stubs = APIS[registration.version]
        self._channel = grpc.insecure_channel(f"unix:{registration.endpoint}")
        self._stub = stubs.DRAPluginStub(self._channel)

    def prepare(self, claims: Sequence[tuple[str, str, str]]) -> dict[str, ClaimAnswer]:
        """(namespace, uid, name) each; raises grpc.RpcError as the call does."""
        response = self._stub.NodePrepareResources(
            self._api.NodePrepareResourcesRequest(claims=self._claims(claims)),
            timeout=CALL_TIMEOUT,
        )
        return {uid: ClaimAnswer(a.error, self._devices(a)) for uid, a in response.claims.items()}

    def unprepare(self, claims: Sequence[tuple[str, str, str]]) -> dict[str, ClaimAnswer]:
        response = self._stub.NodeUnprepareResources(
            self._api.NodeUnprepareResourcesRequest(claims=self._claims(claims)),
            timeout=CALL_TIMEOUT,
        )
        return {uid: ClaimAnswer(a.error) for uid, a in response.claims.items()}

    def close(self) -> None:
        self._channel.close()

    def _claims(self, claims: Sequence[tuple[str, str, str]]) -> list[Any]:
        return [self._api.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims]

    def _devices(self, answer: Any) -> tuple[DeviceAnswer, ...]:
        with_share_id = "share_id" in self._api.Device.DESCRIPTOR.fields_by_name
        return tuple(
            DeviceAnswer(
                tuple(d.request_names),
                d.pool_name,
                d.device_name,
                tuple(d.cdi_device_ids),
                d.share_id if with_share_id and d.HasField("share_id") else None,
            )
            for d in answer.devices
        )


@dataclass
class _Plugin:
    socket_id: SocketId
    client: DraClient
    since: float


class PluginWatcher:
    def __init__(
        self,
        registry_dir: Path,
        versions: Sequence[str],
        on_gone: Callable[[str], None],
        grace: float,
        poll_interval: float,
        on_registered: Callable[[PluginRegistration], None] = lambda registration: None,
    ) -> None:
        unknown = set(versions) - set(APIS)
        if unknown:
            raise ValueError(f"unknown DRA versions {sorted(unknown)}; known: {list(APIS)}")
        self.registry_dir = registry_dir
        self.versions = tuple(versions)
        self.registrations: list[PluginRegistration] = []
        self.refusals: list[tuple[str, str]] = []
        """(socket name, error) of every NotifyRegistrationStatus(false) sent."""
        self.changed = threading.Condition()
        self._on_gone = on_gone
        self._on_registered = on_registered
        self._grace = grace
        self._poll_interval = poll_interval
        self._plugins: dict[Path, _Plugin] = {}
        self._retry_at: dict[Path, tuple[SocketId, float]] = {}
        self._gone_since: dict[str, float] = {}
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stopped.clear()
        self._thread = threading.Thread(target=self._run, name="dra-plugin-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """What the kubelet forgets when it stops: every plugin and every grace period."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self.changed:
            plugins = list(self._plugins.values())
            self._plugins.clear()
            self._retry_at.clear()
            self._gone_since.clear()
            self.changed.notify_all()
        for plugin in plugins:
            plugin.client.close()

    def client(self, driver: str) -> DraClient | None:
        """The driver's newest registered plugin (§1: the kubelet uses the newest)."""
        with self.changed:
            mine = [p for p in self._plugins.values() if p.client.registration.driver == driver]
            return max(mine, key=lambda p: p.since).client if mine else None

    def plugins(self) -> list[PluginRegistration]:
        """The registered plugins, oldest first."""
        with self.changed:
            by_age = sorted(self._plugins.values(), key=lambda p: p.since)
            return [p.client.registration for p in by_age]

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                self._step()
            except Exception:
                log.exception("DRA plugin watcher step failed")
            self._stopped.wait(self._poll_interval)

    def _step(self) -> None:
        present = _sockets(self.registry_dir)
        for path in [
            p for p, plugin in self._plugins.items() if present.get(p) != plugin.socket_id
        ]:
            self._deregister(path)
        now = time.monotonic()
        for path, socket_id in present.items():
            retry = self._retry_at.get(path)
            waiting = retry is not None and retry[0] == socket_id and now < retry[1]
            if path not in self._plugins and not waiting and not self._stopped.is_set():
                self._register(path, socket_id)
        for driver, since in list(self._gone_since.items()):
            if time.monotonic() - since >= self._grace:
                del self._gone_since[driver]
                log.info("DRA driver %s has had no plugin for %.0fs", driver, self._grace)
                self._on_gone(driver)

    def _register(self, path: Path, socket_id: SocketId) -> None:
        with grpc.insecure_channel(f"unix:{path}") as channel:
            stub = reg_grpc.RegistrationStub(channel)
            try:
                info = stub.GetInfo(
                    reg.InfoRequest(), timeout=GET_INFO_TIMEOUT, wait_for_ready=True
                )
                registration, refusal = self._validate(path, info)
                stub.NotifyRegistrationStatus(
                    reg.RegistrationStatus(plugin_registered=refusal is None, error=refusal or ""),
                    timeout=NOTIFY_TIMEOUT,
                )
            except grpc.RpcError as err:
                log.warning("registering the plugin at %s failed: %s", path, _details(err))
                self._retry_at[path] = (socket_id, time.monotonic() + RETRY_INTERVAL)
                return
        with self.changed:
            if refusal is not None or registration is None:
                self.refusals.append((path.name, refusal or ""))
                self._retry_at[path] = (socket_id, time.monotonic() + RETRY_INTERVAL)
            else:
                self._retry_at.pop(path, None)
                self._plugins[path] = _Plugin(socket_id, DraClient(registration), time.monotonic())
                self._gone_since.pop(registration.driver, None)
                self.registrations.append(registration)
                log.info("registered DRA driver %s (%s)", registration.driver, registration.version)
            self.changed.notify_all()
        if registration is not None and refusal is None:
            self._on_registered(registration)

    def _validate(
        self, path: Path, info: reg.PluginInfo
    ) -> tuple[PluginRegistration | None, str | None]:
        """The registration, or why the kubelet refuses it."""
        if info.type != DRA_PLUGIN:
            return None, f"no handler registered for plugin type {info.type!r}"
        if not info.name:
            return None, "plugin name is empty"
        offered = list(info.supported_versions)
        version = next((v for v in offered if v in self.versions), None)
        if version is None:
            return (
                None,
                f"none of the versions {offered} is supported; known: {list(self.versions)}",
            )
        endpoint = info.endpoint or str(path)
        taken = {p.client.registration.endpoint for p in self._plugins.values()}
        if endpoint in taken:
            return None, f"endpoint {endpoint} is already registered"
        health = HEALTH_SERVICE in offered
        return PluginRegistration(info.name, endpoint, version, path, health), None

    def _deregister(self, path: Path) -> None:
        with self.changed:
            plugin = self._plugins.pop(path)
            driver = plugin.client.registration.driver
            if not any(p.client.registration.driver == driver for p in self._plugins.values()):
                self._gone_since[driver] = time.monotonic()
            self.changed.notify_all()
        plugin.client.close()
        log.info("deregistered the DRA plugin at %s (driver %s)", path, driver)


def _sockets(folder: Path) -> dict[Path, SocketId]:
    found = {}
    for path in folder.iterdir() if folder.is_dir() else ():
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISSOCK(st.st_mode) and not path.name.startswith("."):
            found[path] = (st.st_ino, st.st_ctime_ns)
    return found


def _details(err: grpc.RpcError) -> str:
    return f"{err.code().name}: {err.details()}" if isinstance(err, grpc.Call) else str(err)
