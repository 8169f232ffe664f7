"""The driver's registration with the kubelet's plugin watcher (DRA-INTERFACES §1).

The kubelet watches `<root>/plugins_registry` for unix sockets. Ours,
`<driver>-reg.sock`, answers GetInfo with the driver name, the DRA socket's absolute
path and the DRA API versions we serve, v1 first: the kubelet takes the first entry it
knows. It then tells us the outcome through NotifyRegistrationStatus. Removing the
socket (stop()) deregisters.
"""

import logging
import threading
from pathlib import Path
from typing import Final

import grpc

from gpushare.draplugin.health import SERVICE as HEALTH_SERVICE
from gpushare.draplugin.unixserver import UnixServer
from gpushare.kubeletapi.pluginregistration.v1 import api_pb2 as reg
from gpushare.kubeletapi.pluginregistration.v1 import api_pb2_grpc as reg_grpc

log = logging.getLogger(__name__)

PLUGIN_TYPE: Final = "DRAPlugin"
SUPPORTED_VERSIONS: Final = ("v1.DRAPlugin", "v1beta1.DRAPlugin", HEALTH_SERVICE)
"""gRPC service names, preferred first (the kubelet takes the first DRAPlugin it knows);
then the optional health stream (health.py), which a kubelet with ResourceHealthStatus
watches."""


def registration_socket(plugins_registry: Path, driver: str) -> Path:
    return plugins_registry / f"{driver}-reg.sock"


class RegistrationServer:
    def __init__(self, plugins_registry: Path, driver: str, endpoint: Path) -> None:
        self.driver = driver
        self.endpoint = endpoint.absolute()
        """The DRA socket: a plain absolute path, which the kubelet dials as unix:<path>."""
        self.registered = threading.Event()
        self.last_error = ""
        """Why the kubelet last refused us; empty once it accepts."""
        self._server = UnixServer(
            registration_socket(plugins_registry, driver), "registration", workers=2, max_calls=8
        )

    @property
    def socket_path(self) -> Path:
        return self._server.path

    def info(self) -> reg.PluginInfo:
        return reg.PluginInfo(
            type=PLUGIN_TYPE,
            name=self.driver,
            endpoint=str(self.endpoint),
            supported_versions=list(SUPPORTED_VERSIONS),
        )

    def notify(self, registered: bool, error: str) -> None:
        if registered:
            self.last_error = ""
            self.registered.set()
            log.info(
                "the kubelet registered DRA driver %s (endpoint %s)", self.driver, self.endpoint
            )
            return
        self.last_error = error
        self.registered.clear()
        log.warning(
            "the kubelet refused DRA driver %s: %s", self.driver, error or "(no reason given)"
        )

    def start(self) -> None:
        self._server.start(
            lambda server: reg_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        )
        log.info("serving plugin registration for %s on %s", self.driver, self.socket_path)

    def stop(self) -> None:
        """Removes the socket: the kubelet deregisters the driver."""
        self._server.stop(grace=0)
        self.registered.clear()


class _Registration(reg_grpc.RegistrationServicer):
    def __init__(self, registration: RegistrationServer) -> None:
        self._registration = registration

    def GetInfo(self, request: reg.InfoRequest, context: grpc.ServicerContext) -> reg.PluginInfo:
        return self._registration.info()

    def NotifyRegistrationStatus(
        self, request: reg.RegistrationStatus, context: grpc.ServicerContext
    ) -> reg.RegistrationStatusResponse:
        self._registration.notify(request.plugin_registered, request.error)
        return reg.RegistrationStatusResponse()
