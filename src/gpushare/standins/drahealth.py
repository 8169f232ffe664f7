"""The kubelet's side of the DRA health stream (DRA-INTERFACES §2c), for
DraKubeletStandIn: with gate ResourceHealthStatus on, it opens NodeWatchResources on a
plugin that lists `v1alpha1.DRAResourceHealth`, keeps each device's latest health,
counts one not updated within its timeout (≤ 0: 30 s) as Unknown, and opens the stream
again RETRY_S seconds after it breaks.
"""

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import grpc

from gpushare.kubeletapi.dra.health.v1alpha1 import api_pb2 as health
from gpushare.kubeletapi.dra.health.v1alpha1 import api_pb2_grpc as health_grpc

log = logging.getLogger(__name__)

RETRY_S: Final = 5.0
DEFAULT_TIMEOUT_S: Final = 30
MESSAGE_MAX: Final = 1024
_STATUSES: Final[dict[int, str]] = {health.HEALTHY: "Healthy", health.UNHEALTHY: "Unhealthy"}


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    status: str
    """Healthy, Unhealthy or Unknown, as the pod's allocatedResourcesStatus says."""
    message: str = ""


@dataclass(frozen=True, slots=True)
class _Seen:
    health: int
    """HealthStatus: UNKNOWN 0, HEALTHY 1, UNHEALTHY 2."""
    updated: float
    """Unix seconds, as the driver sent it."""
    timeout: float
    message: str


class HealthWatcher:
    """One driver's stream."""

    def __init__(
        self,
        endpoint: str,
        clock: Callable[[], float] = time.time,
        retry_s: float = RETRY_S,
    ) -> None:
        self.endpoint = endpoint
        self.streams_opened = 0
        self._clock = clock
        self._retry_s = retry_s
        self._lock = threading.Condition()
        self._devices: dict[tuple[str, str], _Seen] = {}
        self._messages = 0
        self._stopped = threading.Event()
        self._call: Any = None
        """The stream being read (a grpc call: cancel() ends it)."""
        self._thread = threading.Thread(target=self._run, name="dra-health", daemon=True)

    def start(self) -> "HealthWatcher":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        with self._lock:
            call = self._call
        if call is not None:
            call.cancel()
        self._thread.join(timeout=10)

    def health(self, pool: str, device: str) -> DeviceHealth:
        with self._lock:
            seen = self._devices.get((pool, device))
        if seen is None or self._clock() - seen.updated > seen.timeout:
            return DeviceHealth("Unknown")
        status = _STATUSES.get(seen.health, "Unknown")
        return DeviceHealth(status, seen.message)

    def wait_messages(self, count: int, timeout: float) -> bool:
        """Waits until `count` messages have come (all streams together)."""
        with self._lock:
            return self._lock.wait_for(lambda: self._messages >= count, timeout)

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                self._watch()
            except grpc.RpcError as err:
                if not self._stopped.is_set():
                    log.info("the health stream of %s broke: %s", self.endpoint, err.code())
            self._stopped.wait(self._retry_s)

    def _watch(self) -> None:
        with grpc.insecure_channel(f"unix:{self.endpoint}") as channel:
            stream = health_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
                health.NodeWatchResourcesRequest()
            )
            with self._lock:
                self._call = stream
                self.streams_opened += 1
            if self._stopped.is_set():
                stream.cancel()
            for response in stream:
                self._take(response)

    def _take(self, response: Any) -> None:
        devices = {}
        for device in response.devices:
            timeout = device.health_check_timeout_seconds
            devices[(device.device.pool_name, device.device.device_name)] = _Seen(
                device.health,
                float(device.last_updated_time),
                float(timeout if timeout > 0 else DEFAULT_TIMEOUT_S),
                device.message[:MESSAGE_MAX],
            )
        with self._lock:
            self._devices = devices  # the full list each time: a device left out is unknown
            self._messages += 1
            self._lock.notify_all()
