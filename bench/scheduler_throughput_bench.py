"""GPU pods through the real kube-scheduler, against plain pods in the same run.

Starts the real cluster the way the tier does (tests/e2e/local.py: upstream etcd,
kube-apiserver, kube-scheduler with config/kube-scheduler-config.yaml as the chart
ships it, kube-controller-manager, a kubelet; then gpushare's RBAC, its webhooks on
loopback and gpushare-extender with the chart's scheduler ServiceAccount). With
`--scoring least-allocated` kube-scheduler's configuration is that file without its
NodeResourcesFit pluginConfig: kube-scheduler's default scoring (LeastAllocated on
CPU and memory), which spreads the pods the extender's 0..10 scores tie on (issue 40);
`--scoring chart`, the default, keeps the chart's MostAllocated with GPU memory. Then:

1. `--nodes` API-only nodes: Node objects written through the API as the device
   plugin leaves them (gpu_node: the schedule label, gpu-mem/gpu-count capacity and
   allocatable, the gpushare.io/gpus inventory; GPUs of `--node-gpus` GiB) with a
   Ready condition. No kubelet is behind them, so their pods never run: binding is
   what is measured. The kube-controller-manager's node-lifecycle controller is
   turned off (it would mark nodes without heartbeats NotReady and taint them
   mid-run); everything else is as the tier starts it.
2. Sets of `--pods` pods in the order `--order` gives (plain: no extended resource,
   so kube-scheduler binds them itself without calling the extender; gpu: one
   container asking aliyun.com/gpu-mem of 1, 2, 4 or 8 GiB in turn, or with
   `--pod-gib 1-4` of 1-4 GiB at random as bench/bind_bench.py asks, so the
   webhooks (the API server calls them at each creation, as in production), the
   extender's filter/prioritize and its bind all run), each set created by
   `--threads` threads. With `--node-update-every N`, every N pods created one
   API-only node's annotations change (a node watch event kube-scheduler and the
   extender both apply), as in bench/bind_bench.py. A set's rate is its pods over
   first create -> last bind as one watch on the namespace sees spec.nodeName.
3. CPU seconds (utime+stime from /proc/PID/stat) of kube-scheduler, the extender,
   kube-apiserver and etcd over each set, per pod; and, for gpu sets, the extender's
   own request latency by verb (its gpushare_extender_request_duration_seconds
   histogram, differenced over the set).
4. For gpu sets, the packing: the GPUs (node, index) and nodes the set's pods hold, as
   their allocation annotations say, and the fewest that could hold as much GPU
   memory (its GiB over the largest GPUs, and over a node's GiB).

kube-scheduler runs with its default client QPS/burst (clientConnection qps 50,
burst 100: the chart's config sets none), which is what caps plain pods, whose
Binding kube-scheduler writes itself; GPU pods are bound by the extender.

Target: GPU pods/s >= 0.95 x plain pods/s (the mean rate of each kind over the run);
exits 1 when missed. Also printed, not enforced: extender CPU per GPU pod <=
kube-scheduler's CPU per pod.

Run (root, under the cluster lock):
  GPUSHARE_E2E_K8S_BIN=/work/shared/k8s/v1.33.3 flock /tmp/gpushare-cluster.lock \
    .venv/bin/python bench/scheduler_throughput_bench.py [--order plain,gpu,gpu,plain] \
    [--pod-gib 1-4] [--node-update-every 10] [--default-placement fgd-lookahead] \
    [--scoring least-allocated] [--py-spy OUT.txt]

Issue 40's packing (1,000 nodes of 4 x 16 GiB, 2,000 pods of 1-4 GiB: with --seed 42
5,066 GiB, at least 317 GPUs on 80 nodes), the GPU set first, on empty nodes
(kube-scheduler scores a plain pod as 100m CPU and 200 MiB, so plain pods bound
before would make their nodes look fuller), as the chart scores and then as
kube-scheduler does by default:
  GPUSHARE_E2E_K8S_BIN=/work/shared/k8s/v1.33.3 flock /tmp/gpushare-cluster.lock \
    .venv/bin/python bench/scheduler_throughput_bench.py --nodes 1000 \
    --node-gpus 16,16,16,16 --pods 2000 --pod-gib 1-4 --order gpu,plain \
    --scoring chart    # then --scoring least-allocated; --default-placement binpack
"""

import argparse
import contextlib
import json
import math
import os
import random
import re
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml
from kubernetes import client, config
from kubernetes.watch.watch import iter_resp_lines

from gpushare import annotation
from gpushare.cluster.memory import gpu_node
from gpushare.inventory import Gpu, mock_uuid
from gpushare.objects import Pod
from tests.e2e import local as local_tier

NAMESPACE = "bench"
BENCH_LABEL = "gpushare-bench"
SCHEDULER = "gpushare-scheduler"
GPU_SIZES = "16,16,24,24"
"""Each API-only node's GPUs, GiB."""
SCORINGS = ("chart", "least-allocated")
"""kube-scheduler's NodeResourcesFit scoring: the chart's, or kube-scheduler's default."""
POD_GIB = "1,2,4,8"
"""A GPU pod's gpu-mem: these in turn ("1-4": from 1 to 4 at random)."""
TARGET_RATIO = 0.95
CLK_TCK = os.sysconf("SC_CLK_TCK")
_BUCKET = re.compile(
    r'^gpushare_extender_request_duration_seconds_(sum|count)\{verb="([^"]+)"\} (\S+)$'
)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def api_client(kubeconfig: Path, connections: int) -> client.ApiClient:
    configuration = client.Configuration()
    config.load_kube_config(str(kubeconfig), client_configuration=configuration)
    configuration.connection_pool_maxsize = connections
    return client.ApiClient(configuration)


def discard(response: Any) -> None:
    """Reads an answer we do not decode, so its connection can be reused."""
    response.drain_conn()
    response.release_conn()


def gpu_sizes(spec: str) -> tuple[int, ...]:
    """--node-gpus: each GPU's GiB, comma-separated."""
    with contextlib.suppress(ValueError):
        sizes = tuple(int(part) for part in spec.split(","))
        if min(sizes) >= 1:
            return sizes
    raise argparse.ArgumentTypeError(f'want GiB per GPU, e.g. "16,16,24,24", got {spec!r}')


def scheduler_config(scoring: str) -> dict[str, Any]:
    """The KubeSchedulerConfiguration kube-scheduler starts with: the chart's example
    (config/kube-scheduler-config.yaml, whose profiles tests/chart holds equal to the
    chart's rendering), or, for "least-allocated", the same without NodeResourcesFit's
    pluginConfig, so kube-scheduler scores nodes as it does by default."""
    if scoring not in SCORINGS:
        raise ValueError(f"scoring: want one of {', '.join(SCORINGS)}, got {scoring!r}")
    config: dict[str, Any] = yaml.safe_load(local_tier.SCHEDULER_CONFIG.read_text())
    if scoring == "least-allocated":
        for profile in config["profiles"]:
            kept = [p for p in profile.pop("pluginConfig", ()) if p["name"] != "NodeResourcesFit"]
            if kept:
                profile["pluginConfig"] = kept
    return config


def describe_scoring(config: dict[str, Any]) -> str:
    """NodeResourcesFit's scoring in the first profile, for the start line."""
    fit: dict[str, Any] = next(
        (p["args"] for p in config["profiles"][0].get("pluginConfig", ())
         if p["name"] == "NodeResourcesFit"),
        {},
    )  # fmt: skip
    strategy = fit.get("scoringStrategy")
    if strategy is None:
        return "LeastAllocated on cpu, memory (kube-scheduler's default)"
    weights = ", ".join(f"{r['name']} {r['weight']}" for r in strategy["resources"])
    return f"{strategy['type']} ({weights})"


def node_body(name: str, sizes: tuple[int, ...]) -> dict[str, Any]:
    gpus = tuple(Gpu(i, mock_uuid(name, i), mem) for i, mem in enumerate(sizes))
    body = gpu_node(name, gpus, mode="cgpu", labels={BENCH_LABEL: "1"}).to_manifest()
    body.update(apiVersion="v1", kind="Node")
    body["metadata"] = {k: v for k, v in body["metadata"].items() if v}
    status = body.setdefault("status", {})
    for key in ("capacity", "allocatable"):
        status[key].update(cpu="64", memory="512Gi", pods="250")
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status["conditions"] = [
        {"type": "Ready", "status": "True", "reason": "KubeletReady",
         "lastHeartbeatTime": now, "lastTransitionTime": now},
    ]  # fmt: skip
    return body


PodGib = Callable[[int, random.Random], int]
"""The gpu-mem of a set's n-th GPU pod."""


def pod_gib(spec: str) -> PodGib:
    """--pod-gib: "1,2,4,8" in turn, or "1-4" at random (--seed)."""
    try:
        if "-" in spec:
            low, high = (int(part) for part in spec.split("-"))
            if 1 <= low <= high:
                return lambda n, rng: rng.randint(low, high)
        else:
            sizes = tuple(int(part) for part in spec.split(","))
            if min(sizes) >= 1:
                return lambda n, rng: sizes[n % len(sizes)]
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f'want "1,2,4,8" (in turn) or "1-4" (at random), got {spec!r}')


@dataclass
class Load:
    """What a set's GPU pods ask for, and the node updates made while it is created."""

    gib: PodGib
    node_update_every: int
    """0: none."""
    nodes: list[str]
    rng: random.Random

    def touch_node(self, core: client.CoreV1Api) -> None:
        body = {"metadata": {"annotations": {"bench/heartbeat": str(time.time())}}}
        discard(core.patch_node(self.rng.choice(self.nodes), body, _preload_content=False))


def pod_body(kind: str, name: str, gib: int) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "local/pause:1"}
    if kind == "gpu":
        container["resources"] = {"limits": {"aliyun.com/gpu-mem": str(gib)}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {BENCH_LABEL: kind}},
        "spec": {
            "schedulerName": SCHEDULER,
            "nodeSelector": {BENCH_LABEL: "1"},  # not the real node: its kubelet would run them
            "containers": [container],
            "terminationGracePeriodSeconds": 0,
        },
    }


def pod_names(kind: str, index: int, count: int) -> list[str]:
    """The pods of set `index`."""
    return [f"{kind}-{index}-{n}" for n in range(count)]


def in_threads(threads: int, items: list[Any], work: Any) -> None:
    with ThreadPoolExecutor(threads) as pool:
        for _ in pool.map(work, items):
            pass


class BindWatch:
    """One watch on the namespace's pods: when each was first seen with a node."""

    def __init__(self, api: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api)
        self.bound: dict[str, float] = {}
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with contextlib.suppress(Exception):  # the cluster went down at the end
            self._watch()

    def _watch(self) -> None:
        version = self.core.list_namespaced_pod(NAMESPACE, limit=1).metadata.resource_version
        while True:
            response = self.core.list_namespaced_pod(
                NAMESPACE, watch=True, resource_version=version, timeout_seconds=3600,
                allow_watch_bookmarks=True, _preload_content=False,
            )  # fmt: skip
            for line in iter_resp_lines(response):
                event = json.loads(line)
                obj = event.get("object") or {}
                version = obj.get("metadata", {}).get("resourceVersion", version)
                node = (obj.get("spec") or {}).get("nodeName")
                name = obj.get("metadata", {}).get("name")
                if node and name and name not in self.bound:
                    with self._cond:
                        self.bound[name] = time.monotonic()
                        self._cond.notify_all()

    def wait_for(self, names: list[str], timeout: float) -> list[str]:
        """The names still unbound after `timeout` (empty once all are bound)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                missing = [n for n in names if n not in self.bound]
                left = deadline - time.monotonic()
                if not missing or left <= 0:
                    return missing
                self._cond.wait(min(left, 1.0))


@dataclass
class SetResult:
    kind: str
    pods: int
    created_s: float
    bound_s: float
    cpu: dict[str, float]
    latency: dict[str, tuple[float, float]] = field(default_factory=dict)
    """verb -> (requests, mean seconds)"""
    cycle: dict[str, tuple[float, float]] = field(default_factory=dict)
    """kube-scheduler's own histograms: what -> (observations, mean seconds)"""

    @property
    def rate(self) -> float:
        return self.pods / self.bound_s

    def line(self) -> str:
        cpu = ", ".join(f"{who} {1000 * s / self.pods:.2f}" for who, s in self.cpu.items())
        return (
            f"{self.kind:5} {self.pods} pods: {self.rate:6.1f} pods/s bound "
            f"(created in {self.created_s:.1f} s = {self.pods / self.created_s:.0f}/s, "
            f"last bound at {self.bound_s:.1f} s); CPU ms/pod: {cpu}"
        )


def extender_latency(ops_port: int) -> dict[str, tuple[float, float]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{ops_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    sums: dict[str, list[float]] = {}
    for line in text.splitlines():
        match = _BUCKET.match(line)
        if match:
            which, verb, value = match.groups()
            sums.setdefault(verb, [0.0, 0.0])[0 if which == "count" else 1] = float(value)
    return {verb: (c, s) for verb, (c, s) in sums.items()}


_SCHED_METRIC = re.compile(
    r"^scheduler_(scheduling_attempt_duration_seconds|framework_extension_point_duration_seconds"
    r")_(sum|count)\{([^}]*)\} (\S+)$"
)


def scheduler_histograms(token: str) -> dict[str, tuple[float, float]]:
    """kube-scheduler's scheduling-cycle histograms: the whole attempt (its scheduling
    cycle, extender calls included) and each extension point of its framework, summed
    over profiles; what -> (count, sum)."""
    request = urllib.request.Request(
        "https://127.0.0.1:10259/metrics", headers={"Authorization": f"Bearer {token}"}
    )
    context = ssl._create_unverified_context()  # its self-signed serving certificate
    with urllib.request.urlopen(request, timeout=10, context=context) as r:
        text = r.read().decode()
    out: dict[str, list[float]] = {}
    for line in text.splitlines():
        match = _SCHED_METRIC.match(line)
        if not match:
            continue
        _, which, labels, value = match.groups()
        point = re.search(r'extension_point="([^"]+)"', labels)
        status = re.search(r'(?:status|result)="([^"]+)"', labels)
        if status and status.group(1) not in ("Success", "scheduled"):
            continue
        what = f"ext:{point.group(1)}" if point else "attempt"
        pair = out.setdefault(what, [0.0, 0.0])
        pair[0 if which == "count" else 1] += float(value)
    return {what: (c, s) for what, (c, s) in out.items()}


def _delta(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
) -> dict[str, tuple[float, float]]:
    """what -> (observations, mean) over the interval."""
    out = {}
    for what, (c, s) in after.items():
        c0, s0 = before.get(what, (0.0, 0.0))
        if c > c0:
            out[what] = (c - c0, (s - s0) / (c - c0))
    return out


def run_set(
    kind: str, index: int, count: int, threads: int, api: client.ApiClient, watch: BindWatch,
    pids: dict[str, int], ops_port: int, token: str, load: Load,
) -> SetResult:  # fmt: skip
    core = client.CoreV1Api(api)
    names = pod_names(kind, index, count)
    bodies = [pod_body(kind, name, load.gib(n, load.rng)) for n, name in enumerate(names)]
    cpu_before = {who: cpu_seconds(pid) for who, pid in pids.items()}
    latency_before = extender_latency(ops_port)
    cycle_before = scheduler_histograms(token)

    def create(numbered: tuple[int, dict[str, Any]]) -> None:
        n, body = numbered
        discard(core.create_namespaced_pod(NAMESPACE, body, _preload_content=False))
        if load.node_update_every and n % load.node_update_every == 0:
            load.touch_node(core)

    started = time.monotonic()
    in_threads(threads, list(enumerate(bodies)), create)
    created = time.monotonic() - started
    missing = watch.wait_for(names, timeout=600)
    if missing:
        raise SystemExit(f"{len(missing)} {kind} pods not bound in 600 s, e.g. {missing[:3]}")
    bound = max(watch.bound[n] for n in names) - started
    cpu = {who: cpu_seconds(pid) - cpu_before[who] for who, pid in pids.items()}
    latency = _delta(latency_before, extender_latency(ops_port))
    cycle = _delta(cycle_before, scheduler_histograms(token))
    return SetResult(kind, count, created, bound, cpu, latency, cycle)


@dataclass(frozen=True)
class Packing:
    gpus: int
    nodes: int
    fewest_gpus: int
    fewest_nodes: int

    def line(self) -> str:
        return (
            f"packing: {self.gpus} GPUs on {self.nodes} nodes "
            f"(minimum {self.fewest_gpus} GPUs, {self.fewest_nodes} nodes)"
        )


def packing(pods: list[dict[str, Any]], sizes: tuple[int, ...], nodes: int) -> Packing:
    """The GPUs (node, index) and nodes that bound pods hold, as their allocation
    annotations say; and the fewest GPUs and nodes of `nodes` nodes of GPUs of `sizes`
    GiB that could hold as much GPU memory."""
    held: set[tuple[str, int]] = set()
    gib = 0
    for manifest in pods:
        pod = Pod.model_validate(manifest)
        allocation = annotation.decode(pod)
        if allocation is None:
            raise ValueError(f"pod {pod.key} is bound but has no allocation annotation")
        for gpu in (s for c in allocation.containers for s in c.gpus):
            held.add((allocation.node, gpu.index))
            gib += gpu.mem
    nodes_held = len({node for node, _ in held})
    return Packing(
        len(held), nodes_held, fewest_gpus(gib, sizes, nodes), math.ceil(gib / sum(sizes))
    )


def fewest_gpus(gib: int, sizes: tuple[int, ...], nodes: int) -> int:
    """The fewest GPUs of `nodes` nodes of GPUs of `sizes` GiB that add up to `gib`:
    the largest first."""
    count = 0
    for size in sorted(sizes, reverse=True):  # each size: one GPU on every node
        taken = min(nodes, max(0, math.ceil(gib / size)))
        count, gib = count + taken, gib - taken * size
    return count


def bound_pods(core: client.CoreV1Api, names: list[str]) -> list[dict[str, Any]]:
    """These pods as the API server holds them (raw JSON, as Pod reads it)."""
    response: Any = core.list_namespaced_pod(  # unread: an HTTP response
        NAMESPACE, label_selector=f"{BENCH_LABEL}=gpu", _preload_content=False
    )
    wanted = set(names)
    items: list[dict[str, Any]] = json.loads(response.data)["items"]
    return [pod for pod in items if pod["metadata"]["name"] in wanted]


def recorded_pid(state: Path, name: str) -> int:
    return int((state / f"{name}.pid").read_text())


@dataclass
class BenchCluster(local_tier.LocalCluster):
    """The tier's cluster; the extender started with the placement asked for."""

    extender_extra: tuple[str, ...] = ()

    def start_extender(self) -> None:
        assert self.extender is not None
        if self.extender_extra and self.extender_extra[0] not in self.extender.args:
            self.extender.args += list(self.extender_extra)
        super().start_extender()


def bench_cluster(
    state: Path, bins: local_tier.Binaries, extender_extra: tuple[str, ...], scoring: str
) -> BenchCluster:
    """The cluster, its kube-scheduler configured by scheduler_config(scoring)."""
    path = state / "bench-scheduler-config.yaml"  # up.sh renders it to scheduler-config.yaml
    state.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(scheduler_config(scoring), sort_keys=False))
    return BenchCluster(
        kubeconfig=state / "kubeconfig", state=state, bins=bins,
        extender_extra=extender_extra, scheduler_config=path,
    )  # fmt: skip


@contextlib.contextmanager
def profiled(pid: int, out: Path | None) -> Iterator[None]:
    """py-spy record on the extender while the caller's block runs: only the thread
    holding the GIL is sampled, so the profile says where the process's Python time
    goes (its threads take turns on one GIL)."""
    if out is None:
        yield
        return
    spy = subprocess.Popen(
        [str(Path(sys.executable).parent / "py-spy"), "record", "-p", str(pid),
         "-o", str(out), "-f", "raw", "-r", "200", "--threads", "--gil", "--nonblocking"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    time.sleep(1)
    try:
        yield
    finally:
        spy.send_signal(2)
        spy.wait(60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--nodes", type=int, default=1000, help="API-only nodes (default: %(default)s)"
    )
    parser.add_argument(
        "--node-gpus", type=gpu_sizes, default=GPU_SIZES,
        help="each node's GPUs, GiB, comma-separated (default: %(default)s; issue 40: "
        "16,16,16,16)",
    )  # fmt: skip
    parser.add_argument("--pods", type=int, default=2000, help="pods per set")
    parser.add_argument("--threads", type=int, default=8, help="creating threads per set")
    parser.add_argument(
        "--order", default="plain,gpu,gpu,plain",
        help="the sets, in order, comma-separated: plain or gpu (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--pod-gib", type=pod_gib, default=POD_GIB,
        help='a GPU pod\'s gpu-mem: "1,2,4,8" in turn, or "1-4" at random as bind_bench.py '
        "asks (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--node-update-every", type=int, default=0,
        help="pods created per node update (an annotation patched; 0, the default: none; "
        "bind_bench.py makes one every 10)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=42, help="for --pod-gib 1-4 and node updates")
    parser.add_argument(
        "--default-placement", default=None,
        help="passed to gpushare-extender (default: the extender's own default)",
    )  # fmt: skip
    parser.add_argument(
        "--scoring", choices=SCORINGS, default="chart",
        help="kube-scheduler's NodeResourcesFit scoring: the chart's (MostAllocated with GPU "
        "memory, config/kube-scheduler-config.yaml) or kube-scheduler's default "
        "(LeastAllocated; no pluginConfig) (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--py-spy", type=Path, default=None,
        help="record the extender with py-spy during the gpu sets (raw folded stacks)",
    )  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    args = parser.parse_args()
    for flag in ("nodes", "pods", "threads"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag}: want at least 1, got {getattr(args, flag)}")
    if args.node_update_every < 0:
        parser.error(f"--node-update-every: want 0 or more, got {args.node_update_every}")
    order = [k.strip() for k in args.order.split(",") if k.strip()]
    bad = [k for k in order if k not in ("plain", "gpu")]
    if bad or not order or "gpu" not in order or "plain" not in order:
        parser.error(f"--order: want a list of plain and gpu with both kinds, got {args.order!r}")
        return 2

    sources = local_tier.sources() or [Path("/work/shared/k8s/v1.33.3")]
    reason = local_tier.missing_prerequisites(sources[0])
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    root = Path(os.environ.get("GPUSHARE_E2E_STATE_ROOT", "/tmp"))
    bins = local_tier.binaries(sources[0], root)
    state = root / f"gpushare-bench-{bins.version}"
    os.environ["KCM_EXTRA_ARGS"] = "--controllers=*,-node-lifecycle-controller"
    # Only lets the bench read kube-scheduler's /metrics (it has no authentication
    # kubeconfig, so every request is anonymous); nothing of its scheduling changes.
    os.environ["SCHED_EXTRA_ARGS"] = (
        "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics"
    )
    extra = ("--default-placement", args.default_placement) if args.default_placement else ()
    cluster = bench_cluster(state, bins, extra, args.scoring)
    started = time.monotonic()
    cluster.up()
    try:
        print(
            f"cluster {bins.version} up in {time.monotonic() - started:.0f} s; extender "
            f"{' '.join(extra) or '(default placement)'}; {os.cpu_count()} CPUs, "
            f"load {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        print(
            f"kube-scheduler scoring {args.scoring}: "
            f"{describe_scoring(scheduler_config(args.scoring))}; nodes of "
            f"{'+'.join(map(str, args.node_gpus))} GiB GPUs",
            flush=True,
        )
        assert cluster.extender is not None and cluster.extender.process is not None
        pids = {
            "kube-scheduler": recorded_pid(state, "scheduler"),
            "extender": cluster.extender.process.pid,
            "apiserver": recorded_pid(state, "apiserver"),
            "etcd": recorded_pid(state, "etcd"),
        }
        api = api_client(cluster.kubeconfig, connections=args.threads + 4)
        token = yaml.safe_load(cluster.kubeconfig.read_text())["users"][0]["user"]["token"]
        core = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": NAMESPACE}})
        t = time.monotonic()
        nodes = [f"bench-{n:05d}" for n in range(args.nodes)]
        in_threads(
            args.threads,
            [node_body(name, args.node_gpus) for name in nodes],
            lambda body: discard(core.create_node(body, _preload_content=False)),
        )
        print(f"{args.nodes} nodes created in {time.monotonic() - t:.1f} s", flush=True)
        time.sleep(5)  # the scheduler's and the extender's informers see them
        watch = BindWatch(api)
        time.sleep(1)
        load = Load(args.pod_gib, args.node_update_every, nodes, random.Random(args.seed))
        results = []
        for index, kind in enumerate(order):
            spy = _profile_path(args.py_spy, index) if kind == "gpu" else None
            with profiled(pids["extender"], spy):
                result = run_set(
                    kind, index, args.pods, args.threads, api, watch, pids,
                    local_tier.EXTENDER_OPS_PORT, token, load,
                )  # fmt: skip
            results.append(result)
            print(result.line(), flush=True)
            for what, (n, mean) in sorted(result.cycle.items()):
                print(f"      kube-scheduler {what:22} {n:6.0f} x, mean {1000 * mean:6.2f} ms")
            for verb, (n, mean) in sorted(result.latency.items()):
                print(f"      extender {verb:28} {n:6.0f} x, mean {1000 * mean:6.2f} ms")
            if kind == "gpu":
                pods = bound_pods(core, pod_names(kind, index, args.pods))
                print(f"      {packing(pods, args.node_gpus, args.nodes).line()}", flush=True)
            time.sleep(2)
        return report(results)
    finally:
        if args.keep:
            print(f"cluster left running: KUBECONFIG={cluster.kubeconfig}")
        else:
            cluster.down()


def _profile_path(base: Path | None, index: int) -> Path | None:
    if base is None:
        return None
    return base.with_name(f"{base.stem}-set{index}{base.suffix}")


def report(results: list[SetResult]) -> int:
    def mean_rate(kind: str) -> float:
        sets = [r for r in results if r.kind == kind]
        return sum(r.pods for r in sets) / sum(r.bound_s for r in sets)

    def per_pod(kind: str, who: str) -> float:
        sets = [r for r in results if r.kind == kind]
        return 1000 * sum(r.cpu[who] for r in sets) / sum(r.pods for r in sets)

    plain, gpu = mean_rate("plain"), mean_rate("gpu")
    ratio = gpu / plain
    extender, scheduler = per_pod("gpu", "extender"), per_pod("gpu", "kube-scheduler")
    print(
        f"\nplain {plain:.1f} pods/s, gpu {gpu:.1f} pods/s: ratio {ratio:.2f} "
        f"(target >= {TARGET_RATIO}) {'OK' if ratio >= TARGET_RATIO else 'MISSED'}"
    )
    print(
        f"gpu sets: extender {extender:.2f} CPU ms/pod vs kube-scheduler {scheduler:.2f} "
        f"(plain sets: kube-scheduler {per_pod('plain', 'kube-scheduler'):.2f}) "
        f"{'OK' if extender <= scheduler else 'MISSED'}"
    )
    return 0 if ratio >= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
