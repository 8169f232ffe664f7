"""Device plugin speed and message size, over its real gRPC unix sockets.

1. Allocate latency as the kubelet sees it, with 50 pods bound and waiting on
   the node (a new one is bound after each call, so 50 always wait). The
   caller is a separate process, as the kubelet is, and times each Allocate
   RPC; each call starts once the plugin has finished with the previous one
   (its `assigned` patch written and seen back through the watch), as kubelet
   admissions find it. Target p99 <= 2 ms. For scale, the same client timing a
   do-nothing gRPC server in the same way gives the floor of the machine, and
   the plugin's own work per call is timed in process, without gRPC.
2. ListAndWatch: the size of the full device list the kubelet receives for a
   core_mem node with 8 x 141 GiB GPUs (gRPC's default limit is 4 MB).

Run: .venv/bin/python bench/deviceplugin_bench.py [--calls N]
"""

import argparse
import multiprocessing
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from multiprocessing.connection import Connection
from pathlib import Path

import grpc

from deviceplugin.api.kubelet.deviceplugin.v1beta1 import api_pb2 as pb
from deviceplugin.api.kubelet.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from deviceplugin.kubelet import KubeletStandIn
from deviceplugin.mock import MockBackend
from deviceplugin.plugin import DevicePlugin, PluginConfig
from deviceplugin.registration import SOCKET_NAMES
from gpushare import annotation
from gpushare.cluster.memory import MemoryCluster, gpu_node
from gpushare.inventory import node_gpus, parse_layout
from gpushare.objects import Pod
from gpushare.placement import Assignment, to_allocation
from gpushare.request import parse_pod_request
from gpushare.resources import GPU_CORE, GPU_COUNT, GPU_MEM

NODE = "bench-node"
PENDING = 50
POD_MEM = 2
GPUS = 8
T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Node:
    """A node with the real plugin on mock GPUs and a kubelet stand-in."""

    def __init__(self, workdir: Path, layout: str, mode: str) -> None:
        self.cluster = MemoryCluster()
        self.cluster.add_node(gpu_node(NODE, parse_layout(layout, NODE), mode=mode))
        self.kubelet = KubeletStandIn(workdir / "dp")
        self.plugin = DevicePlugin(
            PluginConfig(NODE, workdir / "dp", pod_resources_socket=None),
            MockBackend.from_layout(layout, NODE),
            self.cluster,
        )
        self.bound = 0

    def __enter__(self) -> "Node":
        self.kubelet.start()
        self.plugin.start()
        wanted = set(self.plugin.node.snapshot().advertised)
        if not self.kubelet.wait_for(lambda: self.kubelet.registered() == wanted, 10):
            raise RuntimeError("the plugin did not register")
        return self

    def __exit__(self, *exc: object) -> None:
        self.plugin.stop()
        self.kubelet.stop()

    def bind(self) -> None:
        name = f"p{self.bound:05d}"
        limits = {GPU_MEM: str(POD_MEM)}
        spec = Pod.model_validate(
            {
                "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
                "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]},
            }
        )
        created = self.cluster.create_pod(spec)
        request = parse_pod_request(created)
        assert request is not None
        allocation = to_allocation(
            request,
            Assignment(((self.bound % GPUS,),), ()),
            node_gpus(self.cluster.get_node(NODE)),
            T0 + timedelta(milliseconds=self.bound),
        )
        self.cluster.bind_pod(
            "default", name, NODE, created.metadata.uid, annotation.encode(allocation)
        )
        self.bound += 1

    def settled(self) -> bool:
        """PENDING pods wait, and every answered pod is seen marked assigned."""
        queue = self.plugin.queue
        if len(queue.waiting(GPU_MEM)) != PENDING or not self.plugin.assignments.flush(0):
            return False
        marked = sum(1 for _, allocation in queue.bound_pods() if allocation.assigned)
        return marked == self.bound - PENDING


def _caller(socket: str, ids: list[str], calls: int, conn: Connection) -> None:
    """The kubelet's side, in its own process: one Allocate per go-ahead."""
    request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])
    latencies = []
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        stub = pb_grpc.DevicePluginStub(channel)
        for call in range(calls + 1):
            conn.recv()
            started = time.perf_counter()
            stub.Allocate(request)
            if call:  # the first call also opens the connection
                latencies.append(time.perf_counter() - started)
            conn.send(None)
    conn.send(latencies)


def _drive(socket: Path, ids: list[str], calls: int, between: Callable[[], None]) -> list[float]:
    ours, theirs = multiprocessing.Pipe()
    caller = multiprocessing.get_context("spawn").Process(
        target=_caller, args=(str(socket), ids, calls, theirs)
    )
    caller.start()
    for _ in range(calls + 1):
        ours.send(None)
        ours.recv()
        between()
    latencies = ours.recv()
    caller.join()
    return latencies


def bench_allocate(calls: int) -> list[float]:
    with tempfile.TemporaryDirectory(prefix="gp-bench-") as tmp, Node(
        Path(tmp), f"{GPUS}x80GiB", "cgpu"
    ) as node:
        for _ in range(PENDING):
            node.bind()
        if not _wait(node.settled):
            raise RuntimeError("the plugin did not see the bound pods")
        ids = sorted(node.kubelet.devices(GPU_MEM))[:POD_MEM]

        def next_pod() -> None:
            node.bind()
            if not _wait(node.settled):
                raise RuntimeError("the plugin did not catch up with the bound pods")

        return _drive(node.kubelet.plugin_dir / SOCKET_NAMES[GPU_MEM], ids, calls, next_pod)


class _Idle(pb_grpc.DevicePluginServicer):
    def Allocate(self, request, context):
        return pb.AllocateResponse(container_responses=[pb.ContainerAllocateResponse()])


def bench_floor(calls: int) -> list[float]:
    """The same caller against a server that does nothing, idle as long between calls."""
    with tempfile.TemporaryDirectory(prefix="gp-bench-") as tmp:
        socket = Path(tmp) / "idle.sock"
        server = grpc.server(ThreadPoolExecutor(8))
        pb_grpc.add_DevicePluginServicer_to_server(_Idle(), server)
        server.add_insecure_port(f"unix://{socket}")
        server.start()
        try:
            return _drive(socket, ["x"] * POD_MEM, calls, lambda: time.sleep(0.002))
        finally:
            server.stop(0)


def bench_in_process(calls: int) -> list[float]:
    """The plugin's own work per call (match, answer, records), without gRPC."""
    with tempfile.TemporaryDirectory(prefix="gp-bench-") as tmp, Node(
        Path(tmp), f"{GPUS}x80GiB", "cgpu"
    ) as node:
        for _ in range(PENDING):
            node.bind()
        ids = sorted(node.kubelet.devices(GPU_MEM))[:POD_MEM]
        latencies = []
        for _ in range(calls):
            if not _wait(node.settled):
                raise RuntimeError("the plugin did not catch up with the bound pods")
            started = time.perf_counter()
            node.plugin.allocator.allocate(GPU_MEM, ids)
            latencies.append(time.perf_counter() - started)
            node.bind()
        return latencies


def bench_list_size() -> dict[str, int]:
    with tempfile.TemporaryDirectory(prefix="gp-bench-") as tmp, Node(
        Path(tmp), "8x141GiB", "core_mem"
    ) as node:
        sizes = {}
        for resource in (GPU_MEM, GPU_COUNT, GPU_CORE):
            socket = node.kubelet.plugin_dir / SOCKET_NAMES[resource]
            with grpc.insecure_channel(f"unix://{socket}") as channel:
                stream = pb_grpc.DevicePluginStub(channel).ListAndWatch(pb.Empty())
                first = next(stream)
                stream.cancel()
            sizes[resource] = first.ByteSize()
        return sizes


def _wait(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.0005)
    return True


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _report(title: str, latencies: list[float]) -> None:
    ms = [x * 1000 for x in latencies]
    print(f"{title}, {len(ms)} calls:")
    print(
        f"  p50 {_percentile(ms, 0.5):.3f} ms  p99 {_percentile(ms, 0.99):.3f} ms  "
        f"mean {statistics.fmean(ms):.3f} ms  max {max(ms):.3f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="device plugin benchmark")
    parser.add_argument("--calls", type=int, default=1000, help="Allocate calls to time")
    args = parser.parse_args()

    _report(
        f"Allocate over a unix socket, {PENDING} pods waiting (target p99 <= 2 ms)",
        bench_allocate(args.calls),
    )
    _report("Floor: the same caller against a do-nothing gRPC server", bench_floor(args.calls))
    _report("The plugin's own work per Allocate, in process", bench_in_process(args.calls))
    sizes = bench_list_size()
    print("ListAndWatch full list, core_mem node with 8 x 141 GiB GPUs:")
    for resource, size in sizes.items():
        print(f"  {resource:<32} {size:>8} bytes ({size / 4 / 1024 / 1024:.2%} of 4 MB)")


if __name__ == "__main__":
    main()
