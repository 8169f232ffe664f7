"""The gRPC DevicePlugin service of one resource, on its own unix socket.

ListAndWatch sends the full device list at once and again on every change,
and ends only when the server stops (the kubelet treats an ended stream as a
failure, docs/contracts.md#listandwatch-and-health). GetPreferredAllocation never
fails (an error would fail the pod's admission,
docs/contracts.md#getpreferredallocation): without an opinion it answers an empty
list.

Every call is answered: GetPreferredAllocation and Allocate within their
deadline (deadline.py), a call beyond the handler threads at once with
RESOURCE_EXHAUSTED rather than queued behind them, and what follows an answer
runs off gRPC's polling thread (allocator.FollowUps).
"""

import logging
import os
import stat
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Final

import grpc

from gpushare.deviceplugin.allocator import AllocationRefused, Allocator, AnswerTimeout
from gpushare.deviceplugin.collector import ADMISSION_CALLS
from gpushare.deviceplugin.feed import DeviceFeed
from gpushare.kubeletapi.deviceplugin.v1beta1 import api_pb2 as pb
from gpushare.kubeletapi.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

_STREAM_POLL: Final = 0.5
_WORKERS: Final = 8
_STOP_WAIT: Final = 5.0
"""Seconds to wait for the gRPC server to stop before going on without it."""

OPTIONS: Final = pb.DevicePluginOptions(
    pre_start_required=False, get_preferred_allocation_available=True
)


class ResourceServer:
    def __init__(
        self, resource: str, socket_path: Path, feed: DeviceFeed, allocator: Allocator
    ) -> None:
        self.resource = resource
        self.socket_path = socket_path
        self._feed = feed
        self.allocator = allocator
        self._stopped = threading.Event()
        self._delivered = threading.Condition()
        self._delivered_version = 0
        self._server: grpc.Server | None = None
        self._inode: int | None = None

    @property
    def endpoint(self) -> str:
        """What Register carries: the socket's file name, not its path
        (docs/contracts.md#device-plugin-registration)."""
        return self.socket_path.name

    def start(self) -> None:
        self.socket_path.unlink(missing_ok=True)
        server = grpc.server(
            ThreadPoolExecutor(_WORKERS, thread_name_prefix=self.endpoint),
            maximum_concurrent_rpcs=_WORKERS,
        )
        pb_grpc.add_DevicePluginServicer_to_server(_Service(self), server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        server.start()
        self._server = server
        self._inode = os.stat(self.socket_path).st_ino

    def stop(self, grace: float = 1.0) -> None:
        self._stopped.set()
        self._feed.wake()
        if self._server is not None and not self._server.stop(grace).wait(_STOP_WAIT):
            log.error(
                "the gRPC server of %s did not stop within %.0fs; going on without it",
                self.resource,
                _STOP_WAIT,
            )
        if self.intact():
            self.socket_path.unlink(missing_ok=True)

    def intact(self) -> bool:
        """False once our socket file is gone or replaced (a kubelet restart removes it)."""
        try:
            st = os.stat(self.socket_path)
        except FileNotFoundError:
            return False
        return stat.S_ISSOCK(st.st_mode) and st.st_ino == self._inode

    def wait_delivered(self, version: int, timeout: float) -> bool:
        """Waits until a ListAndWatch stream has sent the list of `version`."""
        with self._delivered:
            return self._delivered.wait_for(lambda: self._delivered_version >= version, timeout)

    def stream(self, context: grpc.ServicerContext) -> Iterator[pb.ListAndWatchResponse]:
        version, message = self._feed.current()
        while True:
            yield message
            with self._delivered:
                self._delivered_version = max(self._delivered_version, version)
                self._delivered.notify_all()
            newer = None
            while newer is None:
                if self._stopped.is_set() or not context.is_active():
                    return
                newer = self._feed.wait_newer(version, _STREAM_POLL)
            version, message = newer


class _Service(pb_grpc.DevicePluginServicer):
    def __init__(self, server: ResourceServer) -> None:
        self._server = server
        self._resource = server.resource

    def GetDevicePluginOptions(
        self, request: pb.Empty, context: grpc.ServicerContext
    ) -> pb.DevicePluginOptions:
        return OPTIONS

    def ListAndWatch(
        self, request: pb.Empty, context: grpc.ServicerContext
    ) -> Iterator[pb.ListAndWatchResponse]:
        log.info("kubelet opened ListAndWatch for %s", self._resource)
        return self._server.stream(context)

    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> pb.PreferredAllocationResponse:
        ADMISSION_CALLS.during(context)
        responses = []
        for container in request.container_requests:
            try:
                ids = self._server.allocator.preferred(self._resource, container, context.is_active)
            except Exception:
                log.exception("GetPreferredAllocation for %s failed; no preference", self._resource)
                ids = []
            responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return pb.PreferredAllocationResponse(container_responses=responses)

    def Allocate(
        self, request: pb.AllocateRequest, context: grpc.ServicerContext
    ) -> pb.AllocateResponse:
        ADMISSION_CALLS.during(context)
        allocator = self._server.allocator
        responses = []

        def after_answer(step: Callable[[], None]) -> None:
            hand_over = partial(allocator.follow_ups.put, step)
            if not context.add_callback(hand_over):
                hand_over()  # the call has already ended

        for container in request.container_requests:
            try:
                responses.append(
                    allocator.allocate(
                        self._resource, list(container.devices_ids), after_answer, context.is_active
                    )
                )
            except AllocationRefused as refused:
                log.warning("Allocate refused: %s", refused)
                context.abort(_status(refused), str(refused))
            except Exception as err:
                log.exception("Allocate for %s failed", self._resource)
                context.abort(grpc.StatusCode.INTERNAL, f"Allocate for {self._resource}: {err}")
        return pb.AllocateResponse(container_responses=responses)

    def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


def _status(refused: AllocationRefused) -> grpc.StatusCode:
    if isinstance(refused, AnswerTimeout):
        return grpc.StatusCode.DEADLINE_EXCEEDED
    return grpc.StatusCode.FAILED_PRECONDITION
