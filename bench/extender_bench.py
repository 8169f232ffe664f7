"""Extender speed on a 5,000-node cluster: filter+prioritize latency and bind throughput.

Filter+prioritize are measured as kube-scheduler calls them with nodeCacheCapable
true (NodeNames only, every node a candidate, in a new order for each pod as
kube-scheduler's parallel filter lists them; prioritize gets the nodes that passed),
for a stream of new pods, each bound to its best node before the next so one node
changes per pod.
In-process, the handlers are timed from JSON bytes in to JSON bytes out (parsing,
the cache, encoding), in wall-clock and in thread-CPU time (what the handler costs
when other processes share the CPUs). Over HTTP on loopback, the scheduler side
(httpx, keep-alive) runs in its own process as kube-scheduler does and binds each
pod it places; its wall-clock includes its own encoding and decoding.
The first pod of a request shape evaluates every node: that cold cost is printed
apart, and the stream is measured after one warm-up pod per shape.
Bind throughput is in-process, one thread, on the in-memory cluster, with the
watch following every bind as it would the API server.
The policy is the extender's default placement (`--policy`, fgd-lookahead unless
told), learning its workload from the pods filter sees as the extender does.
Thread CPU per pod adds bind's to filter's and prioritize's, to compare with
kube-scheduler's own CPU per pod. The JSON codec line times decoding a filter body
and encoding a filter answer of every node with the standard library and with
orjson (what the verbs use).
The event-loop thread's CPU per pod over HTTP, against the handlers' in process, is
what HTTP costs the extender whatever else runs on the machine.
Over HTTP a second time, the scheduler side is kube-scheduler's own stack: a Go
client (bench/schedulercaller: net/http, encoding/json, the extender/v1 shapes),
built when `go` is on PATH (Debian: golang-go) and skipped with the reason
otherwise. What HTTP adds is its round trip minus the handlers' time for the same
requests, with and without the client's own JSON work; its floor, the same Go
stream against a server that only reads each body and sends answers of the same
bytes, kept beforehand.
Run: .venv/bin/python bench/extender_bench.py [--nodes 5000] [--policy fgd-lookahead]
"""

import argparse
import gc
import json
import multiprocessing
import os
import random
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
from gobuild import go_build
from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import Response
from starlette.routing import Route

from gpushare.cluster.memory import MemoryCluster, gpu_node
from gpushare.extender.argsreader import ExtenderArgsReader
from gpushare.extender.server import HttpServer
from gpushare.extender.service import ExtenderConfig, ExtenderService
from gpushare.inventory import parse_layout
from gpushare.objects import Pod

LAYOUTS = [("cgpu", "4x16GiB"), ("cgpu", "8x24GiB"), ("core_mem", "2x16GiB"), ("share", "1x80GiB")]
SHAPES: list[tuple[dict[str, str], dict[str, str]]] = [
    ({"aliyun.com/gpu-mem": "2"}, {}),
    ({"aliyun.com/gpu-mem": "4"}, {}),
    ({"aliyun.com/gpu-mem": "8"}, {"aliyun.com/gpu-count": "2"}),
    ({"aliyun.com/gpu-mem": "3", "aliyun.com/gpu-core.percentage": "30"}, {}),
    ({"aliyun.com/gpu-count": "1"}, {}),
]


def make_pod(name: str, shape: int) -> Pod:
    limits, labels = SHAPES[shape]
    return Pod.model_validate(
        {
            "metadata": {"name": name, "namespace": "bench", "labels": labels},
            "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
        }
    )


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def line(label: str, samples_ms: list[float]) -> str:
    return (
        f"  {label:<38} p50 {statistics.median(samples_ms):7.2f} ms"
        f"   p99 {percentile(samples_ms, 0.99):7.2f} ms   (n={len(samples_ms)})"
    )


class Collections:
    """The garbage collector's passes per generation, and the thread CPU they took."""

    def __init__(self) -> None:
        self.counts = [0, 0, 0]
        self.ms_per_generation = [0.0, 0.0, 0.0]
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.thread_time()
        else:
            self.counts[info["generation"]] += 1
            took = (time.thread_time() - self._started) * 1e3
            self.ms_per_generation[info["generation"]] += took

    def close(self) -> None:
        gc.callbacks.remove(self._callback)


class Request:
    """What applied to one filter+prioritize: the learned workload moved since the
    last pod of this shape (its states are evaluated again), a candidate list the
    extender had not read recently, garbage collections during the handlers."""

    def __init__(self, causes: "Causes", shape: Any, body: bytes) -> None:
        self.causes = causes
        self.shape = shape
        self.new_filter_list = causes.new_list(body)
        self.new_prioritize_list = False
        self.filter_cpu = 0.0
        self.cpu = 0.0
        self.moved = False
        self.gcs = [0, 0, 0]
        self.gc_ms = 0.0
        self.gc_ms_per_generation = [0.0, 0.0, 0.0]
        self._entered: tuple[list[int], list[float]] = ([], [])

    def enter(self) -> None:
        """A handler starts: collections from here to `leave` count."""
        gc_ = self.causes.gc
        self._entered = (list(gc_.counts), list(gc_.ms_per_generation))

    def leave(self) -> None:
        gc_ = self.causes.gc
        counts, ms = self._entered
        for g in range(3):
            self.gcs[g] += gc_.counts[g] - counts[g]
            self.gc_ms_per_generation[g] += gc_.ms_per_generation[g] - ms[g]
        self.gc_ms = sum(self.gc_ms_per_generation)

    def filtered(self, cpu_ms: float) -> None:
        self.filter_cpu = cpu_ms
        epochs = self.causes.epochs()
        self.moved = self.causes.last_epochs.get(self.shape, epochs) != epochs
        self.causes.last_epochs[self.shape] = epochs

    def prioritizing(self, body: bytes) -> None:
        self.new_prioritize_list = self.causes.new_list(body)

    def done(self, cpu_ms: float) -> None:
        self.cpu = cpu_ms
        self.causes.requests.append(self)

    def labels(self) -> list[str]:
        found = []
        if self.moved:
            found.append("workload moved")
        if self.new_filter_list:
            found.append("new filter list")
        if self.new_prioritize_list:
            found.append("new prioritize list")
        if self.gcs[2]:
            found.append("gen-2 GC")
        elif self.gcs[1]:
            found.append("gen-1 GC")
        return found or ["none of these"]


class Causes:
    """Per request of the stream, what applied to it (`Request`), to explain its tail."""

    def __init__(self, bench: "Bench") -> None:
        self.bench = bench
        self.requests: list[Request] = []
        self.last_epochs: dict[Any, tuple[int, ...]] = {}
        self.gc = Collections()

    def epochs(self) -> tuple[int, ...]:
        return self.bench.extender.cache.policy_epochs()

    def new_list(self, body: bytes) -> bool:
        """Neither the bytes nor the set of names of a list the reader remembers."""
        reader = self.bench.extender.args_reader
        if any(body.endswith(tail) for tail in reader._tails):
            return False
        names = set(orjson.loads(body[body.rindex(b'"NodeNames":') + 12 : -1]))
        return not any(names == set(known) for known in reader._tails.values())

    def start(self, pod: Pod, body: bytes) -> Request:
        pending = self.bench.extender.cache.pending(pod)
        return Request(self, pending.request.shape if pending else None, body)

    def report(self, skip: int, target_ms: float) -> list[str]:
        """The slowest 1% of the stream's requests (after the first `skip`, the cold
        ones) with what applied to each, and per cause how many requests were over
        `target_ms` of thread CPU."""
        self.gc.close()
        stream = self.requests[skip:]
        ordered = sorted(stream, key=lambda r: -r.cpu)
        lines = [f"  slowest 1% of the stream (thread CPU, of {len(stream)}):"]
        for r in ordered[: max(1, len(stream) // 100)]:
            lines.append(
                f"    {r.cpu:6.2f} ms (filter {r.filter_cpu:5.2f}, prioritize "
                f"{r.cpu - r.filter_cpu:5.2f}; GC {r.gc_ms:5.2f} ms, passes {r.gcs}): "
                + ", ".join(r.labels())
            )
        gc_ms = sum(r.gc_ms for r in stream)
        lines.append(
            f"  garbage collection inside the handlers: {gc_ms:.1f} ms of "
            f"{sum(r.cpu for r in stream):.1f} ms thread CPU, passes per generation "
            f"{[sum(r.gcs[g] for r in stream) for g in range(3)]}, taking "
            f"{[round(sum(r.gc_ms_per_generation[g] for r in stream)) for g in range(3)]} ms"
        )
        tally: dict[str, list[float]] = {}
        for r in stream:
            tally.setdefault(" + ".join(r.labels()), []).append(r.cpu)
        lines.append(f"  per cause: requests, over {target_ms:g} ms, median and max thread CPU")
        for label, cpus in sorted(tally.items(), key=lambda kv: -max(kv[1])):
            over = sum(1 for c in cpus if c > target_ms)
            lines.append(
                f"    {label:<44} {len(cpus):4d} {over:4d}  "
                f"{statistics.median(cpus):6.2f} {max(cpus):6.2f} ms"
            )
        return lines


class Bench:
    def __init__(self, nodes: int, seed: int, policy: str) -> None:
        self.rng = random.Random(seed)
        self.cluster = MemoryCluster()
        for i in range(nodes):
            mode, layout = LAYOUTS[i % len(LAYOUTS)]
            name = f"node-{i:05d}"
            self.cluster.add_node(gpu_node(name, parse_layout(layout, name), mode=mode))
        self.names = sorted(n.name for n in self.cluster.list_nodes().items)
        self.policy = policy
        self.service = self.start()
        self.extender = self.service.extender
        self.count = 0
        self.causes = Causes(self)

    def start(self) -> ExtenderService:
        service = ExtenderService(
            self.cluster, ExtenderConfig(default_placement=self.policy)
        ).start_watching()
        assert service.wait_synced(120)
        return service

    def restart(self) -> None:
        """A new extender listing the cluster as it is now, as gpushare-extender starts
        on a cluster already holding pods (its first requests find every node's state
        made at the listing, not a node changed by each bind since)."""
        self.service.stop_watching()
        self.service = self.start()
        self.extender = self.service.extender

    def candidates(self) -> list[str]:
        """Every node, in a new order: kube-scheduler runs its own filters on the nodes
        in parallel and lists those that pass as its workers finish, so each pod's
        filter brings the same names in another order."""
        names = list(self.names)
        self.rng.shuffle(names)
        return names

    def new_pod(self, shape: int) -> Pod:
        self.count += 1
        return self.cluster.create_pod(make_pod(f"p{self.count}", shape))

    def bind_body(self, pod: Pod, node: str) -> bytes:
        meta = pod.metadata
        return json.dumps(
            {"PodName": meta.name, "PodNamespace": meta.namespace, "PodUID": meta.uid, "Node": node}
        ).encode()

    def args(self, pod: Pod, names: list[str]) -> bytes:
        """ExtenderArgs as kube-scheduler writes them: Go's compact JSON, NodeNames last."""
        return orjson.dumps(
            {"Pod": {**pod.to_manifest(), "status": {}}, "Nodes": None, "NodeNames": names}
        )

    def binds(self, count: int) -> float:
        pods = [self.new_pod(self.rng.randrange(3)) for _ in range(count)]
        bodies = [self.bind_body(p, self.names[i % len(self.names)]) for i, p in enumerate(pods)]
        started = time.perf_counter()
        errors = sum(1 for body in bodies if json.loads(self.extender.bind(body))["Error"])
        elapsed = time.perf_counter() - started
        assert errors < count // 10, f"{errors} binds refused"
        return count / elapsed

    def in_process(self, pod: Pod) -> tuple[float, float, str | None]:
        """Wall and thread-CPU milliseconds spent in the two handlers (building the
        scheduler's bodies and reading the answers is not counted). What applied to
        the request is noted in `self.causes` (`Causes`)."""
        body = self.args(pod, self.candidates())
        causes = self.causes.start(pod, body)
        causes.enter()
        wall, cpu = time.perf_counter(), time.thread_time()
        answer = self.extender.filter(body)
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        causes.leave()
        causes.filtered(cpu * 1e3)
        passed = json.loads(answer)["NodeNames"]
        scores: list[dict[str, Any]] = []
        if len(passed) > 1:
            body = self.args(pod, passed)
            causes.prioritizing(body)
            causes.enter()
            wall2, cpu2 = time.perf_counter(), time.thread_time()
            answer = self.extender.prioritize(body)
            wall += time.perf_counter() - wall2
            cpu += time.thread_time() - cpu2
            causes.leave()
            scores = json.loads(answer)
        causes.done(cpu * 1e3)
        return wall * 1e3, cpu * 1e3, best(passed, scores)

    def stream(self, pods: int, measure: Any) -> dict[str, list[float]]:
        """Latencies of the first pod of each shape (cold) and of the stream after it,
        binding every pod placed so that one node changes per pod."""
        samples: dict[str, list[float]] = {
            "cold": [],
            "cold_cpu": [],
            "wall": [],
            "cpu": [],
            "bind_cpu": [],
        }
        for i in range(pods + len(SHAPES)):
            shape = i if i < len(SHAPES) else self.rng.randrange(len(SHAPES))
            pod = self.new_pod(shape)
            wall, cpu, node = measure(pod)
            if i < len(SHAPES):
                samples["cold"].append(wall)
                samples["cold_cpu"].append(cpu)
            else:
                samples["wall"].append(wall)
                samples["cpu"].append(cpu)
            if node is not None:
                body = self.bind_body(pod, node)
                started = time.thread_time()
                self.extender.bind(body)
                if i >= len(SHAPES):
                    samples["bind_cpu"].append((time.thread_time() - started) * 1e3)
        return samples


def best(passed: list[str], scores: list[dict[str, Any]]) -> str | None:
    if not passed:
        return None
    by_host = {s["Host"]: s["Score"] for s in scores}
    return min(passed, key=lambda n: (-by_host.get(n, 0), n))


def http_client(url: str, bodies: list[tuple[bytes, str, bytes]], results: Any) -> None:
    """kube-scheduler's side, in its own process as on a real cluster: for each pod,
    filter, prioritize (when several nodes pass), then bind the best node."""
    headers = {"Content-Type": "application/json"}
    latencies = []
    with httpx.Client(base_url=url, timeout=60) as http:
        for args, manifest_json, bind_prefix in bodies:
            started = time.perf_counter()
            passed = http.post("/filter", content=args, headers=headers).json()["NodeNames"]
            scores: list[dict[str, Any]] = []
            if len(passed) > 1:
                names = orjson.dumps(passed).decode()
                body = f'{{"Pod":{manifest_json},"Nodes":null,"NodeNames":{names}}}'
                scores = http.post("/prioritize", content=body, headers=headers).json()
            latencies.append((time.perf_counter() - started) * 1e3)
            node = best(passed, scores)
            if node is not None:
                http.post(
                    "/bind", content=bind_prefix + json.dumps(node).encode() + b"}", headers=headers
                )
    results.put(latencies)


GO_CALLER = Path(__file__).parent / "schedulercaller"


def go_scheduler(workdir: Path) -> Path | str:
    """The Go scheduler-side caller built into `workdir`; why not, when it cannot be."""
    return go_build(GO_CALLER, workdir / "schedulercaller", {"GO111MODULE": "off"})


def go_stream(
    binary: Path, url: str, names: list[str], pods: list[Pod]
) -> list[tuple[float, float]]:
    """Round trip and client JSON milliseconds per pod, from the Go caller."""
    with tempfile.TemporaryDirectory(prefix="gp-bench-sched-") as tmp:
        names_file, pods_file = Path(tmp) / "names.json", Path(tmp) / "pods.jsonl"
        names_file.write_text(json.dumps(names))
        pods_file.write_text(
            "".join(json.dumps({**p.to_manifest(), "status": {}}) + "\n" for p in pods)
        )
        done = subprocess.run(
            [str(binary), url, str(names_file), str(pods_file)],
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode != 0:
        raise RuntimeError(f"schedulercaller: {done.stdout.strip()} {done.stderr.strip()}")
    rows = [line.split() for line in done.stdout.splitlines()]
    return [(int(total) / 1e6, int(spent) / 1e6) for total, spent in rows]


class FullCollections:
    """Counts the garbage collector's full (generation 2) passes and their pauses."""

    def __init__(self) -> None:
        self.pauses: list[float] = []
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses.append((time.perf_counter() - self._started) * 1e3)

    def report(self) -> str:
        gc.callbacks.remove(self._callback)
        if not self.pauses:
            return "none"
        return f"{len(self.pauses)}, longest {max(self.pauses):.0f} ms"


def handler_seconds(bench: Bench) -> tuple[float, int]:
    """Seconds spent in the filter and prioritize handlers and how many calls,
    from the extender's own latency histogram."""
    total, calls = 0.0, 0
    for metric in bench.service.metrics.registry.collect():
        for sample in metric.samples:
            if sample.labels.get("verb") in ("filter", "prioritize"):
                if sample.name.endswith("_sum"):
                    total += sample.value
                elif sample.name.endswith("_count"):
                    calls += int(sample.value)
    return total, calls


def codec_figures(bench: Bench, repeat: int = 30) -> str:
    """Milliseconds to decode a filter body naming every node and to encode an
    answer naming every node, with json and with orjson (best of `repeat`)."""
    body = bench.args(bench.new_pod(0), bench.names)
    answer = {"NodeNames": bench.names, "FailedNodes": {}, "Error": ""}

    def best_ms(work: Any) -> float:
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            work()
            times.append((time.perf_counter() - started) * 1e3)
        return min(times)

    std = (best_ms(lambda: json.loads(body)), best_ms(lambda: json.dumps(answer).encode()))
    fast = (best_ms(lambda: orjson.loads(body)), best_ms(lambda: orjson.dumps(answer)))
    reader = ExtenderArgsReader()
    parse_first = best_ms(lambda: ExtenderArgsReader().read(body))
    reader.read(body)
    parse_again = best_ms(lambda: reader.read(body))
    return (
        f"JSON codec, {len(bench.names)} names: decode json {std[0]:.2f} ms, orjson "
        f"{fast[0]:.2f} ms; encode json {std[1]:.2f} ms, orjson {fast[1]:.2f} ms; "
        f"ExtenderArgs read, new list {parse_first:.2f} ms, list seen before "
        f"{parse_again:.2f} ms"
    )


def go_http(bench: Bench, url: str, count: int) -> list[str]:
    """kube-scheduler's side in Go: what a pod's filter and prioritize take over HTTP,
    and what that adds to the handlers' own time for the same requests."""
    with tempfile.TemporaryDirectory(prefix="gp-bench-go-") as tmp:
        binary = go_scheduler(Path(tmp))
        if isinstance(binary, str):
            return [f"HTTP loopback, Go client (as kube-scheduler): skipped, {binary}"]
        pods = [bench.new_pod(bench.rng.randrange(len(SHAPES))) for _ in range(count)]
        before = handler_seconds(bench)
        rows = go_stream(binary, url, bench.names, pods)
        total, calls = handler_seconds(bench)
        kept = captured(bench)
        floor = go_floor(binary, bench, kept, count)
    handler_ms = (total - before[0]) / len(rows) * 1e3
    trips = [trip for trip, _ in rows]
    transport = [trip - spent for trip, spent in rows]
    added = statistics.mean(trips) - handler_ms
    floor_transport = [trip - spent for trip, spent in floor]
    return [
        line("HTTP loopback, Go client (as kube-scheduler), wall clock", trips),
        line("  the same without the client's JSON marshalling and decoding", transport),
        f"  handlers' time per pod (filter+prioritize, {calls - before[1]} requests): "
        f"{handler_ms:.2f} ms mean",
        f"  HTTP adds per pod, mean: {added:.2f} ms with the client's JSON, "
        f"{statistics.mean(transport) - handler_ms:.2f} ms without (target <= 1 ms)",
        line("  floor: the same answers from a server that only sends them", floor_transport),
        f"    (without the client's JSON; {statistics.mean(floor_transport):.2f} ms mean; "
        f"bytes per pod: {floor_bytes(kept) / 1024:.0f} KiB both ways)",
    ]


def captured(bench: Bench) -> list[tuple[bytes, bytes, bytes]]:
    """For one unbound pod of each shape: the filter body and the extender's filter and
    prioritize answers, as the stream sends and gets them."""
    kept = []
    for shape in range(len(SHAPES)):
        pod = bench.new_pod(shape)
        body = bench.args(pod, bench.names)
        answer = bench.extender.filter(body)
        passed = orjson.loads(answer)["NodeNames"]
        kept.append((body, answer, bench.extender.prioritize(bench.args(pod, passed))))
    return kept


def floor_bytes(kept: list[tuple[bytes, bytes, bytes]]) -> float:
    """Mean bytes a pod's filter and prioritize carry, bodies and answers."""
    return statistics.mean(len(body) * 2 + len(f) + len(p) for body, f, p in kept)


def go_floor(
    binary: Path, bench: Bench, answers: list[tuple[bytes, bytes, bytes]], count: int
) -> list[tuple[float, float]]:
    """The Go stream against a server that does nothing but read each body and send
    the extender's answers for the pods of the stream's shapes, kept beforehand: what
    uvicorn, Starlette, loopback and Go's HTTP client cost at these sizes."""
    turn = [0]

    async def filtered(request: HttpRequest) -> Response:
        await request.body()
        turn[0] += 1
        return Response(answers[turn[0] % len(answers)][1], media_type="application/json")

    async def scored(request: HttpRequest) -> Response:
        await request.body()
        return Response(answers[turn[0] % len(answers)][2], media_type="application/json")

    async def bound(request: HttpRequest) -> Response:
        await request.body()
        return Response(b'{"Error":""}', media_type="application/json")

    routes = [
        Route(f"/{verb}", handler, methods=["POST"])
        for verb, handler in (("filter", filtered), ("prioritize", scored), ("bind", bound))
    ]
    server = HttpServer(Starlette(routes=routes)).start()
    try:
        pods = [bench.new_pod(bench.rng.randrange(len(SHAPES))) for _ in range(count)]
        return go_stream(binary, server.url, bench.names, pods)
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=400, help="pods in each measured stream")
    parser.add_argument("--binds", type=int, default=5000)
    parser.add_argument(
        "--policy", default="fgd-lookahead", help="the extender's default placement policy"
    )
    parser.add_argument(
        "--settle",
        type=int,
        default=1000,
        help="pods placed (unmeasured) after the first stream before a second one is "
        "measured, once what the policy learns has settled (0: no second stream)",
    )
    args = parser.parse_args()
    load = os.getloadavg()[0]
    print(f"machine: {os.cpu_count()} CPUs, load average {load:.1f} at start")
    started = time.perf_counter()
    bench = Bench(args.nodes, seed=1, policy=args.policy)
    gc.freeze()  # what gpushare-extender does once synced
    synced = time.perf_counter() - started
    print(f"{args.nodes} nodes synced in {synced:.1f} s, policy {args.policy}")
    print(codec_figures(bench))

    rate = bench.binds(args.binds)
    print(f"bind, in-process, 1 thread: {rate:,.0f} pods/s ({args.binds} binds)")
    # As if the extender had started on a cluster already holding these pods. The
    # in-memory API server lives in this process too, so its objects would otherwise
    # make every full collection of the garbage collector much longer than in a real
    # extender, whose API server is elsewhere.
    bench.restart()
    gc.freeze()

    print("filter+prioritize, nodeCacheCapable true, every node a candidate:")
    pauses = FullCollections()
    samples = bench.stream(args.pods, bench.in_process)
    print(line("in-process, first pod of a shape", samples["cold"]))
    print(line("in-process, first pod, thread CPU", samples["cold_cpu"]))
    print(line("in-process, stream, wall clock", samples["wall"]))
    print(line("in-process, stream, thread CPU", samples["cpu"]))
    print(line("in-process, stream, bind thread CPU", samples["bind_cpu"]))
    per_pod = statistics.mean(samples["cpu"]) + statistics.mean(samples["bind_cpu"])
    print(f"  thread CPU per pod, filter+prioritize+bind: {per_pod:.2f} ms mean")
    print(f"  (full garbage collections during the stream: {pauses.report()})")
    for text in bench.causes.report(skip=len(SHAPES), target_ms=2.0):
        print(text)
    if args.settle > 0:
        # The first stream starts with the extender: the learned workload moves several
        # times in it. A long-running extender mostly sees this second one.
        bench.stream(args.settle, bench.in_process)
        settled = bench.stream(args.pods, bench.in_process)
        print(line(f"in-process, after {args.settle} more pods, wall", settled["wall"]))
        print(line(f"in-process, after {args.settle} more pods, CPU", settled["cpu"]))

    server = HttpServer(bench.service.app()).start()
    pods = [bench.new_pod(bench.rng.randrange(len(SHAPES))) for _ in range(args.pods)]
    bodies = []
    for pod in pods:
        manifest = orjson.dumps({**pod.to_manifest(), "status": {}}).decode()
        bind = bench.bind_body(pod, "").decode()
        candidates = bench.candidates()
        bodies.append((bench.args(pod, candidates), manifest, bind[: bind.rindex('""')].encode()))
    before = handler_seconds(bench)
    assert server._thread is not None and server._thread.ident is not None
    loop_clock = time.pthread_getcpuclockid(server._thread.ident)
    loop_cpu = time.clock_gettime(loop_clock)
    results: Any = multiprocessing.Queue()
    url = server.url + bench.service.config.url_prefix
    client = multiprocessing.Process(target=http_client, args=(url, bodies, results))
    client.start()
    latencies = results.get()
    client.join()
    loop_cpu = time.clock_gettime(loop_clock) - loop_cpu
    go_figures = go_http(bench, url, args.pods)
    server.stop()
    print(line("HTTP loopback, stream, wall clock", latencies))
    added_p50 = statistics.median(latencies) - statistics.median(samples["wall"])
    added_p99 = percentile(latencies, 0.99) - percentile(samples["wall"], 0.99)
    print(f"  HTTP minus in-process: p50 {added_p50:+.2f} ms, p99 {added_p99:+.2f} ms")
    (total, calls), (total_before, calls_before) = handler_seconds(bench), before
    mean = (total - total_before) / max(calls - calls_before, 1) * 1e3
    print(f"  (server side, per filter or prioritize request: {mean:.2f} ms mean in the handler)")
    per_pod = loop_cpu / len(pods) * 1e3
    print(
        f"  server event-loop thread CPU per pod (filter, prioritize, bind's dispatch): "
        f"{per_pod:.2f} ms mean, against {statistics.mean(samples['cpu']):.2f} ms in-process"
    )
    for text in go_figures:
        print(text)
    bench.service.stop_watching()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"load average {os.getloadavg()[0]:.1f} at the end; peak RSS {peak:.0f} MiB")


if __name__ == "__main__":
    main()
