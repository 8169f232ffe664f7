"""The extender's side of a GPU pod, as kube-scheduler drives it, per verb.

`gpushare-extender` runs as in production, a process of its own (its `main`: uvicorn,
the `kubernetes` client, the pod and node watches, the webhook over TLS), against an
API-server stand-in (tests/kubecluster/apiserver.py over a MemoryCluster) that
answers every write (the Binding, the GpuAllocated event the extender posts after
bind answers, patches) after `--latency-ms`, the order of a real API server's write
to etcd. Nodes are
`--nodes` of 4 x 16 GiB (cgpu).

Each of `--pods` pods (one container asking 1-4 GiB of aliyun.com/gpu-mem at
random) goes through the webhook (/mutate, /validate, as the API server calls them
at creation), is created (the extender's watch sees it), then filter (every node
name in a new order, nodeCacheCapable) and prioritize (the nodes that passed) one
after another, as kube-scheduler's one scheduling thread calls them; the bind goes
to a pool of `--binds-in-flight` threads, as kube-scheduler binds asynchronously,
so binds overlap the next pods' filter and prioritize. Every `--node-update-every`
pods a node's annotations change (a watch event the extender applies).

Printed: p50/p99 in ms of each verb as the caller waits for it (HTTP included), the
extender's own bind time from its histogram, and the extender process's CPU
(utime+stime) per pod over the stream. `--check` compares bind's p50 with
RECORDED_BIND_P50_MS: above ALLOWED_FACTOR times it plus ALLOWED_SLACK_MS exits 1.

Run: .venv/bin/python bench/bind_bench.py [--nodes 300] [--pods 300] [--latency-ms 5]
"""

import argparse
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from gpushare.cluster.memory import MemoryCluster, gpu_node
from gpushare.inventory import parse_layout
from gpushare.objects import Pod
from tests.extender.tls import self_signed
from tests.kubecluster.apiserver import ApiServer

PREFIX = "/gpushare-scheduler"
RECORDED_BIND_P50_MS = 11.0
"""bind's p50 as kube-scheduler waits for it, the default run (docs/extender.md): one
write of 5 ms (the Binding; the GpuAllocated event is posted after bind answers) and
~5 ms of the extender's own (20 ms while the event was posted inside bind)."""
ALLOWED_FACTOR = 3.0
ALLOWED_SLACK_MS = 10.0
"""--check fails above 3 x 11 + 10 = 43 ms: one more write on bind's path stays under
it, a 40 ms stall per API call (what Nagle's algorithm on the stand-in cost) does not."""
WRITES = {"POST", "PATCH", "PUT", "DELETE"}
NODE_GIB = 4 * 16


class SlowWrites(ApiServer):
    """The stand-in, answering each write after `latency` seconds (in its own thread,
    as the API server waits for etcd without holding anything else up)."""

    def __init__(self, cluster: MemoryCluster, latency: float) -> None:
        super().__init__(cluster)
        self.latency = latency

    def handle(self, method: str, path: str, query: dict[str, list[str]], body: Any):
        if method in WRITES:
            time.sleep(self.latency)
        self.requests.clear()  # its record of requests would only grow here
        return super().handle(method, path, query, body)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pod_manifest(name: str, gib: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "bench", "uid": f"uid-{name}"},
        "spec": {
            "schedulerName": "gpushare-scheduler",
            "containers": [
                {"name": "c", "resources": {"limits": {"aliyun.com/gpu-mem": str(gib)}}}
            ],
        },
        "status": {},
    }


def review(pod: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": pod["metadata"]["uid"],
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "bench",
            "operation": "CREATE",
            "userInfo": {"username": "bench"},
            "object": pod,
            "dryRun": False,
        },
    }


@contextmanager
def extender(
    api: ApiServer, workdir: Path, src: Path | None
) -> Iterator[tuple[subprocess.Popen[bytes], dict]]:
    """gpushare-extender as a process of its own, from `src` when given (another
    commit's src/ to compare with); yields it and its URLs once ready."""
    cert, key = self_signed(workdir)
    ports = {"verbs": free_port(), "ops": free_port(), "webhook": free_port()}
    args = [
        sys.executable, "-m", "gpushare.extender.main",
        "--kubeconfig", str(api.write_kubeconfig(workdir / "kubeconfig")),
        "--host", "127.0.0.1", "--port", str(ports["verbs"]),
        "--ops-port", str(ports["ops"]), "--webhook-port", str(ports["webhook"]),
        "--tls-cert-file", str(cert), "--tls-key-file", str(key), "--log-level", "warning",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(src)} if src else None
    process = subprocess.Popen(args, env=env)
    urls = {
        "verbs": f"http://127.0.0.1:{ports['verbs']}{PREFIX}",
        "ops": f"http://127.0.0.1:{ports['ops']}",
        "webhook": f"https://127.0.0.1:{ports['webhook']}",
        "cert": cert,
    }
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the extender did not become ready (exit {process.poll()})")
            try:
                if httpx.get(urls["ops"] + "/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        yield process, urls
    finally:
        process.terminate()
        process.wait(10)


class Driver:
    """kube-scheduler's side: one thread for filter and prioritize, a pool for binds."""

    def __init__(self, cluster: MemoryCluster, urls: dict, binds_in_flight: int, seed: int):
        self.cluster = cluster
        self.rng = random.Random(seed)
        self.names = sorted(node.name for node in cluster.list_nodes().items)
        limits = httpx.Limits(max_keepalive_connections=binds_in_flight + 2)
        self.verbs = httpx.Client(base_url=urls["verbs"], limits=limits, timeout=30)
        self.webhook = httpx.Client(base_url=urls["webhook"], verify=str(urls["cert"]))
        self.binder = ThreadPoolExecutor(binds_in_flight)
        self.times: dict[str, list[float]] = {v: [] for v in ("webhook", "filter", "prioritize")}
        self.bind_times: list[float] = []
        self.errors: list[str] = []
        self.refused: list[str] = []
        self.assumed = dict.fromkeys(self.names, 0)
        """GiB of aliyun.com/gpu-mem per node, binds in flight included: kube-scheduler's
        NodeResourcesFit leaves out a node whose allocatable they fill."""
        self._lock = threading.Lock()

    def close(self) -> None:
        self.binder.shutdown(wait=True)
        self.verbs.close()
        self.webhook.close()

    def _timed(self, what: str, client: httpx.Client, path: str, body: Any) -> Any:
        started = time.perf_counter()
        response = client.post(path, json=body)
        self.times[what].append((time.perf_counter() - started) * 1e3)
        if response.status_code != 200:
            raise SystemExit(f"{path}: {response.status_code} {response.text}")
        return response.json()

    def schedule(self, index: int) -> Future[None] | None:
        gib = self.rng.randint(1, 4)
        manifest = pod_manifest(f"p{index}", gib)
        for step in ("/mutate", "/validate"):
            answer = self._timed("webhook", self.webhook, step, review(manifest))
            assert answer["response"]["allowed"], answer
        self.cluster.create_pod(Pod.model_validate(manifest))
        with self._lock:
            names = [n for n in self.names if self.assumed[n] + gib <= NODE_GIB]
        self.rng.shuffle(names)  # kube-scheduler's parallel filter lists them as they finish
        args = {"Pod": manifest, "Nodes": None, "NodeNames": names}
        passed = self._timed("filter", self.verbs, "/filter", args)["NodeNames"]
        if not passed:
            self.errors.append(f"p{index}: no node passed")
            return None
        args["NodeNames"] = passed
        scores = self._timed("prioritize", self.verbs, "/prioritize", args)
        top = max(s["Score"] for s in scores)
        best = self.rng.choice([s["Host"] for s in scores if s["Score"] == top])
        with self._lock:
            self.assumed[best] += gib
        meta = manifest["metadata"]
        bind = {"PodName": meta["name"], "PodNamespace": "bench", "PodUID": meta["uid"]}
        return self.binder.submit(self._bind, {**bind, "Node": best}, gib)

    def _bind(self, body: dict[str, str], gib: int) -> None:
        started = time.perf_counter()
        response = self.verbs.post("/bind", json=body)
        self.bind_times.append((time.perf_counter() - started) * 1e3)
        if response.status_code != 200:
            self.errors.append(f"bind {body['PodName']}: {response.status_code} {response.text}")
        elif response.json()["Error"]:  # another GPU of the node filled meanwhile
            self.refused.append(f"bind {body['PodName']}: {response.json()['Error']}")
            with self._lock:
                self.assumed[body["Node"]] -= gib

    def touch_node(self) -> None:
        name = self.rng.choice(self.names)
        self.cluster.patch_node_annotations(name, {"bench/heartbeat": str(time.time())})


def bind_histogram(ops_url: str) -> tuple[float, int]:
    """The extender's own bind time, summed in seconds, and its count (/metrics)."""
    text = httpx.get(ops_url + "/metrics").text
    figures = {}
    for line in text.splitlines():
        for part in ("_sum", "_count"):
            if line.startswith(f"gpushare_extender_request_duration_seconds{part}") and (
                'verb="bind"' in line
            ):
                figures[part] = float(line.rsplit(" ", 1)[1])
    return figures.get("_sum", 0.0), int(figures.get("_count", 0))


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(args: argparse.Namespace) -> int:
    cluster = MemoryCluster()
    gpus = parse_layout("4x16GiB")
    for i in range(args.nodes):
        cluster.add_node(gpu_node(f"node-{i:04d}", gpus))
    api = SlowWrites(cluster, args.latency_ms / 1e3)
    with (
        tempfile.TemporaryDirectory() as tmp,
        extender(api, Path(tmp), args.extender_src) as (process, urls),
    ):
        driver = Driver(cluster, urls, args.binds_in_flight, args.seed)
        for i in range(args.warmup):  # the first pod of each shape evaluates every node
            driver.schedule(-1 - i)
        driver.binder.submit(lambda: None).result()
        driver.close()
        driver = Driver(cluster, urls, args.binds_in_flight, args.seed + 1)
        histogram_before = bind_histogram(urls["ops"])
        cpu_before, started = cpu_seconds(process.pid), time.perf_counter()
        binds = []
        for i in range(args.pods):
            binds.append(driver.schedule(i))
            if args.node_update_every and i % args.node_update_every == 0:
                driver.touch_node()
        driver.close()
        elapsed = time.perf_counter() - started
        cpu = cpu_seconds(process.pid) - cpu_before
        histogram = [
            a - b for a, b in zip(bind_histogram(urls["ops"]), histogram_before, strict=True)
        ]
    api.close()
    if driver.errors:
        print("\n".join(driver.errors[:10]), file=sys.stderr)
        return 1
    print(
        f"{args.nodes} nodes of 4x16GiB, {args.pods} GPU pods of 1-4 GiB, API writes "
        f"answered after {args.latency_ms:g} ms, {args.binds_in_flight} binds in flight, "
        f"a node update every {args.node_update_every} pods: {args.pods / elapsed:.1f} pods/s, "
        f"{len(driver.refused)} binds refused (a GPU filled between prioritize and bind)"
    )
    for what, samples in {**driver.times, "bind": driver.bind_times}.items():
        print(f"{what:<11} p50 {pct(samples, 0.5):7.2f} ms  p99 {pct(samples, 0.99):7.2f} ms")
    bind_p50 = pct(driver.bind_times, 0.5)
    print(f"bind in the extender (its histogram), mean {histogram[0] / histogram[1] * 1e3:.2f} ms")
    print(f"extender CPU per pod {cpu / args.pods * 1e3:.2f} ms")
    limit = RECORDED_BIND_P50_MS * ALLOWED_FACTOR + ALLOWED_SLACK_MS
    verdict = "PASS" if bind_p50 <= limit else "FAIL"
    print(
        f"bind p50 {bind_p50:.2f} ms against recorded {RECORDED_BIND_P50_MS} ms "
        f"(limit {limit:g} ms) {verdict}"
    )
    return 1 if args.check and verdict == "FAIL" else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nodes", type=int, default=300, help="nodes of 4 x 16 GiB")
    parser.add_argument("--pods", type=int, default=300, help="GPU pods measured")
    parser.add_argument("--warmup", type=int, default=8, help="pods scheduled before measuring")
    parser.add_argument(
        "--latency-ms", type=float, default=5.0, help="how long the API server takes per write"
    )
    parser.add_argument("--binds-in-flight", type=int, default=4, help="binds at once, at most")
    parser.add_argument("--node-update-every", type=int, default=10, help="pods per node update")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--extender-src", type=Path, help="run the extender from this src/ (another commit's)"
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when bind's p50 is far above its record"
    )
    return run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
