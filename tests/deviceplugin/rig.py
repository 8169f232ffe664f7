"""A node under test: the in-memory cluster, the kubelet stand-in and the real
plugin on the mock backend, talking gRPC over unix sockets in a temp dir."""

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import grpc

from gpushare import annotation
from gpushare.allocation import PodAllocation
from gpushare.cluster.memory import MemoryCluster, gpu_node
from gpushare.deviceplugin.plugin import DevicePlugin, PluginConfig
from gpushare.deviceplugin.registration import SOCKET_NAMES
from gpushare.gpunode.backends.mock import MockBackend
from gpushare.inventory import node_gpus, parse_layout
from gpushare.kubeletapi.deviceplugin.v1beta1 import api_pb2 as pb
from gpushare.kubeletapi.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from gpushare.objects import Pod
from gpushare.placement.fit import Assignment, to_allocation
from gpushare.request import parse_pod_request
from gpushare.standins.kubelet import KubeletStandIn
from tests.builders import T0, pod

WAIT = 5.0
"""Generous bound for anything that should take milliseconds."""


class Rig:
    def __init__(
        self,
        workdir: Path,
        node: str = "n1",
        layout: str = "2x16GiB",
        mode: str | None = "cgpu",
        labels: Mapping[str, str] | None = None,
        pod_resources: bool = True,
        backend_type: type[MockBackend] = MockBackend,
        cluster_type: type[MemoryCluster] = MemoryCluster,
        answer_within: float = 0.3,
        interposer_dir: Path | None = None,
        rediscover_interval: float = 0,
    ) -> None:
        self.interposer_dir = interposer_dir
        self.rediscover_interval = rediscover_interval
        self.node = node
        self.backend_type = backend_type
        self.layout = layout
        self.workdir = workdir
        self.answer_within = answer_within
        self.cluster = cluster_type()
        self.cluster.add_node(gpu_node(node, parse_layout(layout, node), mode=mode, labels=labels))
        self.kubelet = KubeletStandIn(
            workdir / "dp", workdir / "pr.sock" if pod_resources else None
        )
        self.health_file = workdir / "unhealthy"
        self.plugin: DevicePlugin | None = None
        self._bound = 0

    def start(self, reconcile_delay: float = 0.05) -> "Rig":
        self.kubelet.start()
        self.plugin = self.new_plugin(reconcile_delay)
        self.plugin.start()
        assert self.plugin.wait_synced(WAIT)
        self.wait_registered(self.plugin.node.snapshot().advertised)
        return self

    def new_plugin(self, reconcile_delay: float = 0.05) -> DevicePlugin:
        backend = self.backend_type.from_layout(
            self.layout, self.node, health_file=self.health_file, poll_interval=0.05
        )
        config = PluginConfig(
            self.node,
            self.kubelet.plugin_dir,
            self.kubelet.pod_resources_socket,
            reconcile_delay=reconcile_delay,
            reconcile_interval=3600,
            answer_within=self.answer_within,
            interposer_dir=self.interposer_dir,
            rediscover_interval=self.rediscover_interval,
        )
        return DevicePlugin(config, backend, self.cluster)

    def stop(self) -> None:
        if self.plugin is not None:
            self.plugin.stop()
        self.kubelet.stop()

    @property
    def backend(self) -> MockBackend:
        assert self.plugin is not None
        return self.plugin.backend  # type: ignore[return-value]

    def wait_registered(self, resources: Sequence[str], timeout: float = WAIT) -> None:
        """Waits until exactly `resources` are registered and each sent its list."""
        wanted = set(resources)

        def ready() -> bool:
            registered = self.kubelet.registered()
            return registered == wanted and all(self.kubelet.messages(r) for r in registered)

        assert self.kubelet.wait_for(ready, timeout), (
            f"registered {self.kubelet.registered()}, wanted {wanted}"
        )

    def bind(
        self,
        name: str,
        gpus: Sequence[Sequence[int]],
        mem: int | None = None,
        core: int | None = None,
        count: int | None = None,
        *,
        containers: list[dict] | None = None,
        init_containers: list[dict] | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> Pod:
        """Creates the pod and binds it here as the extender would: `gpus` lists the
        GPU indices of each container (init containers first, as the request orders
        them). Each pod is bound a second after the previous one."""
        created = self.cluster.create_pod(
            pod(
                name,
                mem,
                core,
                count,
                containers=containers,
                init_containers=init_containers,
                labels=labels,
            )
        )
        request = parse_pod_request(created)
        assert request is not None
        inventory = node_gpus(self.cluster.get_node(self.node))
        assignment = Assignment(tuple(tuple(g) for g in gpus), ())
        bound_at = T0 + timedelta(seconds=self._bound)
        self._bound += 1
        allocation = to_allocation(request, assignment, inventory, bound_at)
        self.cluster.bind_pod(
            "default", name, self.node, created.metadata.uid, annotation.encode(allocation)
        )
        return self.cluster.get_pod("default", name)

    def allocation(self, name: str) -> PodAllocation:
        found = annotation.decode(self.cluster.get_pod("default", name))
        assert found is not None
        return found

    def wait_assigned(self, name: str, timeout: float = WAIT) -> PodAllocation:
        assert self.plugin is not None
        assert self.plugin.assignments.flush(timeout)
        allocation = self.allocation(name)
        assert allocation.assigned, allocation
        return allocation


def eventually(condition: Callable[[], bool], timeout: float = WAIT) -> bool:
    """Polls `condition` until it holds; False when `timeout` passes first."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@contextmanager
def plugin_client(rig: Rig, resource: str) -> Iterator[pb_grpc.DevicePluginStub]:
    """A client on the plugin's socket for `resource`, to make calls the way a
    kubelet would in situations the stand-in does not produce by itself."""
    socket = rig.kubelet.plugin_dir / SOCKET_NAMES[resource]
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        yield pb_grpc.DevicePluginStub(channel)


def allocate(rig: Rig, resource: str, ids: Sequence[str]) -> pb.ContainerAllocateResponse:
    with plugin_client(rig, resource) as stub:
        response = stub.Allocate(
            pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)]),
            timeout=WAIT,
        )
    return response.container_responses[0]
