"""Device plugin speed and message size, over its real gRPC unix sockets.

1. Allocate latency as the kubelet sees it, with 50 pods bound and waiting on
   the node (a new one is bound after each call, so 50 always wait). The
   caller is a separate process, as the kubelet is, and times each Allocate
   RPC; each call starts once the plugin has finished with the previous one
   (its `assigned` patch written and seen back through the watch), as kubelet
   admissions find it. Target p99 <= 2 ms. The plugin process has frozen its
   start-up objects out of the garbage collector, as gpushare-device-plugin
   does once synced. Two callers, where both can run:
   - the kubelet's own stack: a Go gRPC client (bench/kubeletcaller), built
     here when `go` and grpc-go are installed (Debian: golang-go and
     golang-google-grpc-dev); skipped with the reason otherwise;
   - a Python gRPC client, which adds its own overhead to every call.
   For scale, each caller also times a do-nothing gRPC server with the calls
   spaced as the Allocate calls were (an idle gap makes every call slower: the
   machine's floor), and the plugin's own work per call is timed in process.
2. ListAndWatch: the size of the full device list the kubelet receives for a
   core_mem node with 8 x 141 GiB GPUs (gRPC's default limit is 4 MB).

Run: .venv/bin/python bench/deviceplugin_bench.py [--calls N]
"""

import argparse
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
from gobuild import go_build

from gpushare import annotation
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
from gpushare.resources import GPU_CORE, GPU_COUNT, GPU_MEM
from gpushare.standins.kubelet import KubeletStandIn

NODE = "bench-node"
PENDING = 50
MAX_PODS = 110
"""The kubelet's default max-pods: once the node holds this many, the oldest
answered pod finishes (is deleted) as each new one is bound, so the node stays
as full as a busy node can be, within the rules (at most 14 pods, 28 GiB a GPU)."""
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
        self.live: deque[str] = deque()

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
        self.live.append(name)
        while len(self.live) > MAX_PODS:
            self.cluster.delete_pod("default", self.live.popleft())

    def settled(self) -> bool:
        """PENDING pods wait, and every answered pod on the node is seen marked assigned."""
        queue = self.plugin.queue
        if len(queue.waiting(GPU_MEM)) != PENDING or not self.plugin.assignments.flush(0):
            return False
        marked = sum(1 for _, allocation in queue.bound_pods() if allocation.assigned)
        return marked == len(self.live) - PENDING


ALLOCATE = "/v1beta1.DevicePlugin/Allocate"
GO_CALLER = Path(__file__).parent / "kubeletcaller"
DEBIAN_GOPATH = Path("/usr/share/gocode")


class Caller:
    """The kubelet's side, in its own process: one timed call per line it reads."""

    def __init__(self, name: str, argv: list[str]) -> None:
        self.name = name
        self._argv = argv

    def drive(
        self, socket: Path, ids: list[str], calls: int, between: Callable[[], None]
    ) -> tuple[list[float], list[float]]:
        """Seconds per call (the first, which also connects, left out) and seconds
        spent in `between` after each."""
        request = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)]
        )
        argv = [*self._argv, str(socket), ALLOCATE, request.SerializeToString().hex()]
        latencies, gaps = [], []
        with subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        ) as caller:
            assert caller.stdin is not None and caller.stdout is not None
            for call in range(calls + 1):
                caller.stdin.write("\n")
                caller.stdin.flush()
                answer = caller.stdout.readline()
                if not answer.strip().isdigit():
                    raise RuntimeError(f"{self.name} caller: {answer.strip() or 'no answer'}")
                if call:
                    latencies.append(int(answer) / 1e9)
                started = time.perf_counter()
                between()
                gaps.append(time.perf_counter() - started)
            caller.stdin.close()
        return latencies, gaps


def python_caller() -> Caller:
    return Caller("Python", [sys.executable, __file__, "--caller"])


def go_caller(workdir: Path) -> Caller | str:
    """The Go caller, built into `workdir`; why not, when it cannot be built."""
    env = {}
    if "GOPATH" not in os.environ and DEBIAN_GOPATH.is_dir():
        env = {"GOPATH": str(DEBIAN_GOPATH), "GO111MODULE": "off"}  # Debian's packaged grpc-go
    built = go_build(GO_CALLER, workdir / "kubeletcaller", env, "golang-google-grpc-dev")
    if isinstance(built, str):
        return built
    return Caller("Go (grpc-go, as the kubelet)", [str(built)])


def serve_calls(socket: str, method: str, request_hex: str) -> None:
    """The Python caller's loop (run as `deviceplugin_bench.py --caller ...`)."""
    request = bytes.fromhex(request_hex)
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        call = channel.unary_unary(method, _registered_method=True)
        for _ in sys.stdin:
            started = time.perf_counter()
            try:
                call(request)
            except grpc.RpcError as err:
                print(f"error: {err}", flush=True)
                continue
            print(round((time.perf_counter() - started) * 1e9), flush=True)


def bench_allocate(calls: int, caller: Caller) -> tuple[list[float], list[float]]:
    with (
        tempfile.TemporaryDirectory(prefix="gp-bench-") as tmp,
        Node(Path(tmp), f"{GPUS}x80GiB", "cgpu") as node,
    ):
        for _ in range(PENDING):
            node.bind()
        if not _wait(node.settled):
            raise RuntimeError("the plugin did not see the bound pods")
        gc.freeze()  # what gpushare-device-plugin does once synced
        ids = sorted(node.kubelet.devices(GPU_MEM))[:POD_MEM]

        def next_pod() -> None:
            node.bind()
            if not _wait(node.settled):
                raise RuntimeError("the plugin did not catch up with the bound pods")

        socket = node.kubelet.plugin_dir / SOCKET_NAMES[GPU_MEM]
        return caller.drive(socket, ids, calls, next_pod)


class _Idle(pb_grpc.DevicePluginServicer):
    def Allocate(self, request, context):
        return pb.AllocateResponse(container_responses=[pb.ContainerAllocateResponse()])


def bench_floor(calls: int, caller: Caller, gap: float) -> list[float]:
    """The same caller against a server that does nothing, `gap` seconds between calls."""
    with tempfile.TemporaryDirectory(prefix="gp-bench-") as tmp:
        socket = Path(tmp) / "idle.sock"
        server = grpc.server(ThreadPoolExecutor(8))
        pb_grpc.add_DevicePluginServicer_to_server(_Idle(), server)
        server.add_insecure_port(f"unix://{socket}")
        server.start()
        try:
            latencies, _ = caller.drive(socket, ["x"] * POD_MEM, calls, lambda: time.sleep(gap))
            return latencies
        finally:
            server.stop(0)


def bench_in_process(calls: int) -> list[float]:
    """The plugin's own work per call (match, answer, records), without gRPC."""
    with (
        tempfile.TemporaryDirectory(prefix="gp-bench-") as tmp,
        Node(Path(tmp), f"{GPUS}x80GiB", "cgpu") as node,
    ):
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
    with (
        tempfile.TemporaryDirectory(prefix="gp-bench-") as tmp,
        Node(Path(tmp), "8x141GiB", "core_mem") as node,
    ):
        sizes = {}
        for resource in (GPU_MEM, GPU_COUNT, GPU_CORE):
            socket = node.kubelet.plugin_dir / SOCKET_NAMES[resource]
            with grpc.insecure_channel(f"unix://{socket}") as channel:
                stream = pb_grpc.DevicePluginStub(channel).ListAndWatch(pb.Empty())
                first = next(stream)
                stream.cancel()
            sizes[resource] = first.ByteSize()
        return sizes


def bench_reregistration(restarts: int) -> list[float]:
    """Seconds from a kubelet restart (kubelet.sock re-created, plugin sockets
    wiped) until the plugin has registered every resource again."""
    took = []
    with (
        tempfile.TemporaryDirectory(prefix="gp-bench-rereg-") as tmp,
        Node(Path(tmp), "2x16GiB", "share") as node,
    ):
        wanted = len(node.plugin.node.snapshot().advertised)
        for _ in range(restarts):
            expected = len(node.kubelet.registrations) + wanted
            started = time.perf_counter()
            node.kubelet.restart()
            if not _wait(lambda n=expected: len(node.kubelet.registrations) >= n):
                raise RuntimeError("the plugin did not register again within 10 s")
            took.append(time.perf_counter() - started)
    return took


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
    if sys.argv[1:2] == ["--caller"]:
        serve_calls(*sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description="device plugin benchmark")
    parser.add_argument("--calls", type=int, default=1000, help="Allocate calls to time")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="gp-bench-go-") as tmp:
        go = go_caller(Path(tmp))
        callers = [python_caller()]
        if isinstance(go, Caller):
            callers.insert(0, go)
        else:
            print(f"Go caller skipped: {go}")
        for caller in callers:
            latencies, gaps = bench_allocate(args.calls, caller)
            _report(
                f"Allocate over a unix socket, {PENDING} pods waiting, {caller.name} caller "
                "(target p99 <= 2 ms)",
                latencies,
            )
            gap = statistics.median(gaps)
            _report(
                f"Floor: the {caller.name} caller against a do-nothing gRPC server, "
                f"calls {gap * 1000:.1f} ms apart as above",
                bench_floor(args.calls, caller, gap),
            )
    _report("The plugin's own work per Allocate, in process", bench_in_process(args.calls))
    _report("Re-registration after a kubelet restart (target p99 < 1 s)", bench_reregistration(20))
    sizes = bench_list_size()
    print("ListAndWatch full list, core_mem node with 8 x 141 GiB GPUs:")
    for resource, size in sizes.items():
        print(f"  {resource:<32} {size:>8} bytes ({size / 4 / 1024 / 1024:.2%} of 4 MB)")


if __name__ == "__main__":
    main()
