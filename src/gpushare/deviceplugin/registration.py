"""Keeps one registered gRPC server per advertised resource
(docs/contracts.md#device-plugin-registration, docs/contracts.md#kubelet-restarts).

A single thread owns the servers and, every poll interval or when woken:
- starts and registers a server for each resource the node's mode advertises
  (server up first; endpoint = the socket's file name; version v1beta1);
- withdraws a resource the mode no longer advertises: an empty device list
  first, which drops the node's capacity at once, then the server stops;
- notices a kubelet restart (our socket removed, or kubelet.sock re-created)
  and registers again on a freshly started server, well within a second;
- retries a failed registration with backoff, at once when kubelet.sock changes.
"""

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import grpc

from gpushare.backoff import Backoff
from gpushare.deviceplugin.allocator import Allocator
from gpushare.deviceplugin.feed import DeviceFeed
from gpushare.deviceplugin.metrics import PluginMetrics
from gpushare.deviceplugin.server import OPTIONS, ResourceServer
from gpushare.deviceplugin.worker import start_daemon
from gpushare.kubeletapi.deviceplugin.v1beta1 import api_pb2 as pb
from gpushare.kubeletapi.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from gpushare.resources import RESOURCES

log = logging.getLogger(__name__)

API_VERSION: Final = "v1beta1"
KUBELET_SOCKET: Final = "kubelet.sock"
SOCKET_NAMES: Final = {r.name: r.socket for r in RESOURCES}
MAX_SOCKET_PATH: Final = 107
"""sun_path holds 108 bytes including the terminating NUL."""
WITHDRAW_FLUSH: Final = 1.0
"""Seconds to wait for the empty list to reach the kubelet before stopping."""
REGISTER_BACKOFF: Final = Backoff(initial=0.5, maximum=5.0)
"""Between retries of a refused registration (at once when kubelet.sock changes)."""

SocketId = tuple[int, int]


def register(kubelet_socket: Path, endpoint: str, resource: str, timeout: float) -> None:
    """Registration/Register; raises grpc.RpcError when the kubelet refuses."""
    with grpc.insecure_channel(f"unix://{kubelet_socket}") as channel:
        pb_grpc.RegistrationStub(channel).Register(
            pb.RegisterRequest(
                version=API_VERSION, endpoint=endpoint, resource_name=resource, options=OPTIONS
            ),
            timeout=timeout,
        )


def socket_id(path: Path) -> SocketId | None:
    """Identity of a socket file; a re-created file gets a new one."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_ctime_ns)


@dataclass
class _Slot:
    server: ResourceServer
    registered_with: SocketId | None = None
    failed_with: SocketId | None = None
    next_try: float = 0.0
    failures: int = 0


class Registrar:
    def __init__(
        self,
        plugin_dir: Path,
        feeds: Mapping[str, DeviceFeed],
        allocator: Allocator,
        advertised: Callable[[], tuple[str, ...]],
        metrics: PluginMetrics,
        poll_interval: float = 0.1,
        register_timeout: float = 10.0,
        backoff: Backoff = REGISTER_BACKOFF,
    ) -> None:
        longest = max((str(plugin_dir / name) for name in SOCKET_NAMES.values()), key=len)
        if len(longest) > MAX_SOCKET_PATH:
            raise ValueError(
                f"socket path {longest} is longer than {MAX_SOCKET_PATH} bytes, the limit of "
                f"a unix socket address; use a shorter --device-plugin-dir"
            )
        self.plugin_dir = plugin_dir
        self.kubelet_socket = plugin_dir / KUBELET_SOCKET
        self._feeds = feeds
        self._allocator = allocator
        self._advertised = advertised
        self._metrics = metrics
        self._poll_interval = poll_interval
        self._register_timeout = register_timeout
        self._backoff = backoff
        self._slots: dict[str, _Slot] = {}
        self._kubelet_seen: bool | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = start_daemon("registrar", self._run)

    def stop(self) -> None:
        """Stops the servers without withdrawing: a restarting plugin keeps the
        node's capacity through the kubelet's grace period."""
        self._stopped.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
        with self._lock:
            for resource, slot in self._slots.items():
                slot.server.stop(grace=0)
                self._metrics.registered(resource, False)
            self._slots.clear()

    def wake(self) -> None:
        self._wake.set()

    def registered(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(sorted(r for r, s in self._slots.items() if s.registered_with))

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                self.step()
            except Exception:
                log.exception("device plugin registration step failed")
            self._wake.wait(self._poll_interval)
            self._wake.clear()

    def step(self) -> None:
        with self._lock:
            wanted = self._advertised()
            for resource in [r for r in self._slots if r not in wanted]:
                self._withdraw(resource)
            kubelet = socket_id(self.kubelet_socket)
            self._note_kubelet(kubelet is not None, bool(wanted))
            for resource in wanted:
                if self._stopped.is_set():
                    return
                self._keep(resource, kubelet)

    def _note_kubelet(self, present: bool, needed: bool) -> None:
        """Says once when the kubelet's socket goes missing, and when it is back."""
        if present == self._kubelet_seen or not (needed or present):
            return
        self._kubelet_seen = present
        if present:
            log.info("kubelet socket %s is there", self.kubelet_socket)
        else:
            log.warning(
                "waiting for the kubelet: no %s (is --device-plugin-dir the kubelet's device "
                "plugin directory, mounted read-write?)",
                self.kubelet_socket,
            )

    def _keep(self, resource: str, kubelet: SocketId | None) -> None:
        slot = self._slots.get(resource)
        if slot is not None and not slot.server.intact():
            log.info("socket of %s was removed (kubelet restart?); starting afresh", resource)
            self._drop(slot)
            slot = None
        elif slot is not None and slot.registered_with and slot.registered_with != kubelet:
            log.info("kubelet.sock was re-created (kubelet restart); re-registering %s", resource)
            self._drop(slot)
            slot = None
        if slot is None:
            server = ResourceServer(
                resource,
                self.plugin_dir / SOCKET_NAMES[resource],
                self._feeds[resource],
                self._allocator,
            )
            server.start()
            slot = self._slots[resource] = _Slot(server)
        if slot.registered_with or kubelet is None:
            return
        if kubelet == slot.failed_with and time.monotonic() < slot.next_try:
            return
        self._register(slot, kubelet)

    def _drop(self, slot: _Slot) -> None:
        """Stops the old server before a fresh one registers: an old stream ending
        later would disconnect the new registration (docs/contracts.md#kubelet-restarts)."""
        self._metrics.registered(slot.server.resource, False)
        slot.server.stop(grace=0)
        del self._slots[slot.server.resource]

    def _register(self, slot: _Slot, kubelet: SocketId) -> None:
        resource = slot.server.resource
        try:
            register(self.kubelet_socket, slot.server.endpoint, resource, self._register_timeout)
        except grpc.RpcError as err:
            details = err.details() if isinstance(err, grpc.Call) else str(err)
            # A new kubelet.sock is a new kubelet: its refusals start a new count.
            slot.failures = slot.failures + 1 if kubelet == slot.failed_with else 1
            delay = self._backoff.delay(slot.failures)
            log.warning(
                "registering %s with the kubelet at %s failed: %s; retrying in %.1fs",
                resource,
                self.kubelet_socket,
                details,
                delay,
            )
            slot.failed_with = kubelet
            slot.next_try = time.monotonic() + delay
            return
        slot.registered_with = kubelet
        slot.failed_with = None
        slot.failures = 0
        self._metrics.registered(resource, True)
        log.info("registered %s with the kubelet (endpoint %s)", resource, slot.server.endpoint)

    def _withdraw(self, resource: str) -> None:
        slot = self._slots.pop(resource)
        feed = self._feeds[resource]
        version, message = feed.current()
        if message.devices:
            version = feed.publish([])
        if slot.registered_with:
            slot.server.wait_delivered(version, WITHDRAW_FLUSH)
        slot.server.stop()
        self._metrics.registered(resource, False)
        log.info("withdrew %s: the node's mode no longer advertises it", resource)
