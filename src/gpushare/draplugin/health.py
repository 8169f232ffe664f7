"""The DRA health stream (DRA-INTERFACES §2c): `v1alpha1.DRAResourceHealth`, served on
the DRA socket beside the DRAPlugin services.

The kubelet (gate ResourceHealthStatus: on from 1.36) opens NodeWatchResources once
and reads every device's health from it; it shows the health of a pod's allocated
devices in the pod's status (`allocatedResourcesStatus`), as it does for a device
plugin's devices. Each message lists every GPU of the node (the slice drops an
unhealthy GPU; the stream still names it, so the pods on it learn why). A message goes
out at the start, at every change of the node and every RESEND_S seconds: the kubelet
counts a device whose health is older than its timeout (HEALTH_TIMEOUT_S, sent with it;
30 s where the kubelet is older than 1.35 and ignores it) as Unknown.
"""

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Final

import grpc

from gpushare.dra.slices import device_name
from gpushare.draplugin.node import DriverNode, NodeSnapshot
from gpushare.kubeletapi.dra.health.v1alpha1 import api_pb2 as health
from gpushare.kubeletapi.dra.health.v1alpha1 import api_pb2_grpc as health_grpc

log = logging.getLogger(__name__)

SERVICE: Final = "v1alpha1.DRAResourceHealth"
"""The name the registration lists beside the DRAPlugin versions."""
RESEND_S: Final = 10.0
HEALTH_TIMEOUT_S: Final = 60
"""Six resends: a driver that stops sending for a minute has its devices shown Unknown."""
MAX_STREAMS: Final = 2
"""Open streams at once (each holds a worker): the kubelet keeps one, and a second while
it replaces a broken one."""
MESSAGE_MAX: Final = 1024
"""The kubelet keeps the first 1024 characters of a message."""


class HealthService(health_grpc.DRAResourceHealthServicer):
    def __init__(
        self,
        node: DriverNode,
        resend_s: float = RESEND_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._node = node
        self._resend_s = resend_s
        self._clock = clock
        self._lock = threading.Lock()
        self._open = 0

    @property
    def open_streams(self) -> int:
        with self._lock:
            return self._open

    def NodeWatchResources(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        with self._lock:
            if self._open >= MAX_STREAMS:
                context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"{self._open} health streams are open already (at most {MAX_STREAMS})",
                )
            self._open += 1
        context.add_callback(self._node.wake)  # a closed stream stops waiting at once
        log.info("the kubelet watches the GPUs' health")
        try:
            while context.is_active():
                version, snapshot = self._node.versioned()
                yield self.response(snapshot)
                self._node.wait_changed(version, self._resend_s)
        finally:
            with self._lock:
                self._open -= 1
            log.info("the kubelet's health stream closed")

    def response(self, snapshot: NodeSnapshot) -> Any:
        """Every GPU of the node and its health, as one message."""
        now = int(self._clock())
        return health.NodeWatchResourcesResponse(
            devices=[
                health.DeviceHealth(
                    device=health.DeviceIdentifier(
                        pool_name=snapshot.name, device_name=device_name(gpu.index)
                    ),
                    health=health.HEALTHY if gpu.healthy else health.UNHEALTHY,
                    last_updated_time=now,
                    health_check_timeout_seconds=HEALTH_TIMEOUT_S,
                    message=""
                    if gpu.healthy
                    else _unhealthy(gpu.index, snapshot.why_unhealthy.get(gpu.index, "")),
                )
                for gpu in snapshot.gpus
            ]
        )


def _unhealthy(index: int, why: str) -> str:
    said = f"GPU {index} is unhealthy" + (f": {why}" if why else "")
    return said[:MESSAGE_MAX]
