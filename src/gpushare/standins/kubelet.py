"""A small kubelet: the device-manager side of the device plugin and PodResources
APIs (docs/contracts.md#device-plugin-api-v1beta1, docs/contracts.md#podresources-api-v1).

It serves Registration on a real unix socket (`kubelet.sock`), dials back to a
registering plugin, calls GetDevicePluginOptions, holds ListAndWatch, and
admits pods the way the kubelet does: one pod at a time, init containers first,
one GetPreferredAllocation + Allocate per container and resource, device IDs
picked from the healthy unallocated set after the pod's reusable init-container
devices. It also serves PodResources List from what it allocated. Tests and
`gpushare demo` drive the real plugin through it; `restart()` does what a
kubelet restart does to the plugin directory.
"""

import logging
import os
import random
import re
import stat
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import grpc

from gpushare.deviceplugin.devices import HEALTHY
from gpushare.deviceplugin.registration import API_VERSION, KUBELET_SOCKET
from gpushare.kubeletapi.deviceplugin.v1beta1 import api_pb2 as pb
from gpushare.kubeletapi.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from gpushare.kubeletapi.podresources.v1 import api_pb2 as pr
from gpushare.kubeletapi.podresources.v1 import api_pb2_grpc as pr_grpc
from gpushare.objects import Container, Pod

log = logging.getLogger(__name__)

CHECKPOINT: Final = "kubelet_internal_checkpoint"
DIAL_TIMEOUT: Final = 10.0
_NAME_PART = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")


class AdmissionFailed(Exception):
    """The pod fails admission (UnexpectedAdmissionError on a real kubelet)."""


def is_extended_resource_name(name: str) -> bool:
    """Enough of the extended resource name rules for a stand-in: a domain, not
    kubernetes.io, a valid name part (docs/contracts.md#extended-resource-names)."""
    domain, _, part = name.partition("/")
    return (
        bool(domain and part)
        and "kubernetes.io" not in domain
        and not name.startswith("requests.")
        and bool(_NAME_PART.match(part))
    )


@dataclass(frozen=True, slots=True)
class Registration:
    resource: str
    endpoint: str
    options: pb.DevicePluginOptions


@dataclass
class AdmittedContainer:
    pod: str
    name: str
    init: bool
    envs: dict[str, str] = field(default_factory=dict)
    devices: list[pb.DeviceSpec] = field(default_factory=list)
    mounts: list[pb.Mount] = field(default_factory=list)
    device_ids: dict[str, list[str]] = field(default_factory=dict)
    duplicate_envs: list[str] = field(default_factory=list)
    """Keys two answers both set (the kubelet keeps the first,
    docs/contracts.md#merging-allocate-answers)."""


class _Endpoint:
    """A registered plugin: its client and the device list its stream sent last."""

    def __init__(
        self, registration: Registration, socket: Path, changed: threading.Condition
    ) -> None:
        self.registration = registration
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.stub = pb_grpc.DevicePluginStub(self.channel)
        self.devices: dict[str, str] = {}
        self.messages = 0
        self.stream_ended = False
        self._closed = False
        self._changed = changed
        self._call = self.stub.ListAndWatch(pb.Empty())
        self._thread = threading.Thread(
            target=self._follow, name=f"law-{registration.resource}", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._closed = True
        self._call.cancel()
        self.channel.close()

    def _follow(self) -> None:
        try:
            for message in self._call:
                with self._changed:
                    self.devices = {d.ID: d.health for d in message.devices}
                    self.messages += 1
                    self._changed.notify_all()
        except grpc.RpcError:
            pass
        with self._changed:
            if not self._closed:
                # An ended stream makes every device of the resource unhealthy
                # (docs/contracts.md#listandwatch-and-health).
                self.stream_ended = True
                self.devices = dict.fromkeys(self.devices, "Unhealthy")
            self._changed.notify_all()


class KubeletStandIn:
    def __init__(
        self,
        plugin_dir: Path,
        pod_resources_socket: Path | None = None,
        seed: int = 0,
    ) -> None:
        self.plugin_dir = plugin_dir
        self.socket = plugin_dir / KUBELET_SOCKET
        self.pod_resources_socket = pod_resources_socket
        self.registrations: list[Registration] = []
        self.restarts = 0
        self._rng = random.Random(seed)
        self._changed = threading.Condition()
        self._endpoints: dict[str, _Endpoint] = {}
        self._admission = threading.Lock()
        self._pods: dict[str, Pod] = {}
        self._allocated: dict[tuple[str, str, str], list[str]] = {}
        self._server: grpc.Server | None = None
        self._pod_resources: grpc.Server | None = None

    # ----- lifecycle

    def start(self) -> None:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        # Regular files a real kubelet keeps here; plugins must leave them alone.
        (self.plugin_dir / CHECKPOINT).write_text("{}")
        (self.plugin_dir / "DEPRECATION").write_text("")
        self._serve_registration()
        if self.pod_resources_socket is not None:
            self.pod_resources_socket.parent.mkdir(parents=True, exist_ok=True)
            self.pod_resources_socket.unlink(missing_ok=True)
            server = grpc.server(ThreadPoolExecutor(2))
            pr_grpc.add_PodResourcesListerServicer_to_server(_PodResources(self), server)
            server.add_insecure_port(f"unix://{self.pod_resources_socket}")
            server.start()
            self._pod_resources = server

    def stop(self) -> None:
        self._drop_endpoints()
        for server in (self._server, self._pod_resources):
            if server is not None:
                server.stop(0).wait()

    def restart(self) -> None:
        """What a kubelet restart does (docs/contracts.md#kubelet-restarts): connections
        drop, every unix socket in the plugin directory is removed, then kubelet.sock
        is created afresh."""
        if self._server is not None:
            self._server.stop(0).wait()
        self._drop_endpoints()
        for path in self.plugin_dir.iterdir():
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                path.unlink()
        self.restarts += 1
        self._serve_registration()

    # ----- what tests and the demo look at

    def wait_for(self, condition: Callable[[], bool], timeout: float) -> bool:
        """Waits until `condition()` holds, re-checking on every registration or
        device list; False when `timeout` seconds pass first."""
        with self._changed:
            return self._changed.wait_for(condition, timeout)

    def registered(self) -> set[str]:
        with self._changed:
            return {r for r, e in self._endpoints.items() if not e.stream_ended}

    def devices(self, resource: str) -> dict[str, str]:
        """The device list the plugin's stream sent last: ID -> health."""
        with self._changed:
            endpoint = self._endpoints.get(resource)
            return dict(endpoint.devices) if endpoint else {}

    def messages(self, resource: str) -> int:
        with self._changed:
            endpoint = self._endpoints.get(resource)
            return endpoint.messages if endpoint else 0

    def capacity(self, resource: str) -> tuple[int, int]:
        """(capacity, allocatable) as the node status would show them
        (docs/contracts.md#listandwatch-and-health)."""
        devices = self.devices(resource)
        return len(devices), sum(1 for h in devices.values() if h == HEALTHY)

    def allocated(self, pod: Pod, container: str, resource: str) -> list[str]:
        with self._admission:
            return list(self._allocated.get((pod.metadata.uid, container, resource), []))

    # ----- admission (docs/contracts.md#allocate)

    def admit(self, pod: Pod) -> list[AdmittedContainer]:
        """Admits one pod: its containers' answers, merged as the kubelet merges them.
        Raises AdmissionFailed (the pod's devices are released) like the kubelet."""
        with self._admission:
            uid = pod.metadata.uid
            self._pods[uid] = pod
            reusable: dict[str, set[str]] = {}
            admitted = []
            try:
                for container in pod.spec.init_containers:
                    entry = self._admit_container(pod, container, reusable, init=True)
                    for resource, ids in entry.device_ids.items():
                        pool = reusable.setdefault(resource, set())
                        if container.restart_policy == "Always":
                            pool.difference_update(ids)
                        else:
                            pool.update(ids)
                    admitted.append(entry)
                for container in pod.spec.containers:
                    entry = self._admit_container(pod, container, reusable, init=False)
                    for resource, ids in entry.device_ids.items():
                        reusable.get(resource, set()).difference_update(ids)
                    admitted.append(entry)
            except AdmissionFailed:
                self._release(uid)
                raise
            return admitted

    def forget(self, pod: Pod) -> None:
        """The pod is gone: its devices are free again."""
        with self._admission:
            self._release(pod.metadata.uid)

    def _admit_container(
        self, pod: Pod, container: Container, reusable: dict[str, set[str]], init: bool
    ) -> AdmittedContainer:
        entry = AdmittedContainer(pod.key, container.name, init)
        resources = list(container.resources.limits.items())
        self._rng.shuffle(resources)  # the kubelet walks a Go map: any order
        for resource, quantity in resources:
            with self._changed:
                endpoint = self._endpoints.get(resource)
            if endpoint is None:
                continue
            ids = self._pick(pod, container, endpoint, int(quantity), reusable.get(resource, set()))
            try:
                response = endpoint.stub.Allocate(
                    pb.AllocateRequest(
                        container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)]
                    ),
                    timeout=DIAL_TIMEOUT,
                )
            except grpc.RpcError as err:
                raise AdmissionFailed(
                    f"Allocate failed due to rpc error: code = {err.code().name} desc = "
                    f"{err.details()}, which is unexpected"
                ) from None
            if not response.container_responses:
                raise AdmissionFailed(f"Allocate for {resource} answered no container response")
            self._allocated[(pod.metadata.uid, container.name, resource)] = ids
            entry.device_ids[resource] = ids
            answer = response.container_responses[0]
            for key, value in answer.envs.items():
                if key in entry.envs:
                    entry.duplicate_envs.append(key)
                    continue
                entry.envs[key] = value
            known = {d.container_path for d in entry.devices}
            entry.devices += [d for d in answer.devices if d.container_path not in known]
            mounted = {m.container_path for m in entry.mounts}
            entry.mounts += [m for m in answer.mounts if m.container_path not in mounted]
        return entry

    def _pick(
        self,
        pod: Pod,
        container: Container,
        endpoint: _Endpoint,
        needed: int,
        reusable: set[str],
    ) -> list[str]:
        """devicesToAllocate: reusable devices first, then the plugin's preference
        among the healthy unallocated ones, then any of those."""
        resource = endpoint.registration.resource
        chosen = self._rng.sample(sorted(reusable), min(needed, len(reusable)))
        if len(chosen) == needed:
            return chosen
        healthy = {i for i, h in self.devices(resource).items() if h == HEALTHY}
        in_use = {i for (uid, _, r), ids in self._allocated.items() if r == resource for i in ids}
        available = sorted(healthy - in_use - set(chosen))
        missing = needed - len(chosen)
        if len(available) < missing:
            raise AdmissionFailed(
                f"requested number of devices unavailable for {resource}. "
                f"Requested: {needed}, Available: {len(available) + len(chosen)}"
            )
        if endpoint.registration.options.get_preferred_allocation_available:
            chosen += self._preferred(endpoint, available, chosen, needed)
        rest = sorted(set(available) - set(chosen))
        chosen += self._rng.sample(rest, needed - len(chosen))
        self._rng.shuffle(chosen)
        return chosen

    def _preferred(
        self, endpoint: _Endpoint, available: list[str], chosen: list[str], needed: int
    ) -> list[str]:
        request = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=available + chosen,
                    must_include_deviceIDs=chosen,
                    allocation_size=needed,
                )
            ]
        )
        try:
            response = endpoint.stub.GetPreferredAllocation(request, timeout=DIAL_TIMEOUT)
        except grpc.RpcError as err:
            raise AdmissionFailed(
                f"GetPreferredAllocation failed: {err.details()}, which is unexpected"
            ) from None
        if not response.container_responses:
            return []
        candidates = set(available)
        preferred = response.container_responses[0].deviceIDs
        picked = list(dict.fromkeys(i for i in preferred if i in candidates))
        return picked[: needed - len(chosen)]

    def _release(self, uid: str) -> None:
        self._pods.pop(uid, None)
        self._allocated = {k: v for k, v in self._allocated.items() if k[0] != uid}

    # ----- registration (docs/contracts.md#device-plugin-registration)

    def _serve_registration(self) -> None:
        self.socket.unlink(missing_ok=True)
        server = grpc.server(ThreadPoolExecutor(4))
        pb_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server

    def register(self, request: pb.RegisterRequest) -> str | None:
        """Returns why the registration is refused, or None once it is in place."""
        if request.version != API_VERSION:
            return f"Unsupported version {request.version!r}; supported: {API_VERSION}"
        if not is_extended_resource_name(request.resource_name):
            return f"invalid name of device plugin socket: {request.resource_name!r}"
        if not request.endpoint or "/" in request.endpoint:
            return f"endpoint {request.endpoint!r} must be a socket file name in {self.plugin_dir}"
        socket = self.plugin_dir / request.endpoint
        # A blocking dial, as the kubelet's: wait for the socket to accept, then ask.
        with grpc.insecure_channel(f"unix://{socket}") as probe:
            try:
                options = pb_grpc.DevicePluginStub(probe).GetDevicePluginOptions(
                    pb.Empty(), timeout=DIAL_TIMEOUT, wait_for_ready=True
                )
            except grpc.RpcError as err:
                return f"cannot connect to the plugin at {socket}: {err.details()}"
        registration = Registration(request.resource_name, request.endpoint, options)
        endpoint = _Endpoint(registration, socket, self._changed)
        with self._changed:
            old = self._endpoints.get(request.resource_name)
            self._endpoints[request.resource_name] = endpoint
            self.registrations.append(registration)
            self._changed.notify_all()
        if old is not None:
            old.close()
        return None

    def _drop_endpoints(self) -> None:
        with self._changed:
            endpoints = list(self._endpoints.values())
            self._endpoints.clear()
            self._changed.notify_all()
        for endpoint in endpoints:
            endpoint.close()

    def pod_resources(self) -> pr.ListPodResourcesResponse:
        """App containers and sidecars of admitted pods, one entry per device
        (docs/contracts.md#podresources-api-v1)."""
        with self._admission:
            pods = []
            for uid, pod in self._pods.items():
                listed = [c for c in pod.spec.init_containers if c.restart_policy == "Always"]
                containers = []
                for container in [*listed, *pod.spec.containers]:
                    devices = [
                        pr.ContainerDevices(resource_name=resource, device_ids=[device_id])
                        for (owner, name, resource), ids in sorted(self._allocated.items())
                        if owner == uid and name == container.name
                        for device_id in ids
                    ]
                    containers.append(pr.ContainerResources(name=container.name, devices=devices))
                pods.append(
                    pr.PodResources(
                        name=pod.metadata.name,
                        namespace=pod.metadata.namespace,
                        containers=containers,
                    )
                )
            return pr.ListPodResourcesResponse(pod_resources=pods)


class _Registration(pb_grpc.RegistrationServicer):
    def __init__(self, kubelet: KubeletStandIn) -> None:
        self._kubelet = kubelet

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.Empty:
        refused = self._kubelet.register(request)
        if refused is not None:
            log.warning("kubelet stand-in refused registration: %s", refused)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, refused)
        return pb.Empty()


class _PodResources(pr_grpc.PodResourcesListerServicer):
    def __init__(self, kubelet: KubeletStandIn) -> None:
        self._kubelet = kubelet

    def List(
        self, request: pr.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> pr.ListPodResourcesResponse:
        return self._kubelet.pod_resources()
