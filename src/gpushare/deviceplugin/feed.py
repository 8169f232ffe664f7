"""The current device list of one resource, which ListAndWatch streams follow.

Every message is the full list (the kubelet replaces its whole view with each
one, docs/contracts.md#listandwatch-and-health); a new version is published on every health or mode
change, and streams wake up to send it.
"""

import threading
from collections.abc import Sequence

from gpushare.deviceplugin.devices import HEALTHY, UNHEALTHY, Device
from gpushare.kubeletapi.deviceplugin.v1beta1 import api_pb2 as pb


def list_message(devices: Sequence[Device]) -> pb.ListAndWatchResponse:
    return pb.ListAndWatchResponse(
        devices=[pb.Device(ID=d.id, health=HEALTHY if d.healthy else UNHEALTHY) for d in devices]
    )


class DeviceFeed:
    def __init__(self, resource: str) -> None:
        self.resource = resource
        self._cond = threading.Condition()
        self._version = 0
        self._message = pb.ListAndWatchResponse()

    def publish(self, devices: Sequence[Device]) -> int:
        message = list_message(devices)
        with self._cond:
            self._version += 1
            self._message = message
            self._cond.notify_all()
            return self._version

    def current(self) -> tuple[int, pb.ListAndWatchResponse]:
        with self._cond:
            return self._version, self._message

    def wait_newer(
        self, version: int, timeout: float
    ) -> tuple[int, pb.ListAndWatchResponse] | None:
        with self._cond:
            if self._version == version:
                self._cond.wait(timeout)
            if self._version == version:
                return None
            return self._version, self._message

    def wake(self) -> None:
        """Lets waiting streams look at their stop condition now."""
        with self._cond:
            self._cond.notify_all()
