"""Scale: what one device plugin hears from the API, and the extender's memory and rebuild time.

1. API events one device plugin receives per minute. Every kubelet writes its Node's
   status every 10 s, so a watch on all nodes (what each plugin held before it watched
   only its own Node) hears 6 x N node events a minute, and N plugins together N².
   The plugin now lists and watches its own Node (metadata.name field selector) and
   its node's pods (spec.nodeName) through the cluster port. Here those same port
   calls run over the in-memory cluster while one simulated minute is replayed as
   fast as it goes: 6 heartbeats per node, pod churn on the other nodes (one pod per
   10 nodes: created, bound, Running, deleting, gone) and a few pods living on the
   plugin's own node; the events each watch delivers are counted.
   Target: the plugin's count is the same at N/10 and N nodes (500 and 5,000).
2. Extender memory with N nodes of 8 GPUs (mixed sizes) and the pods bound with the
   allocation annotations the extender writes (annotation.encode of
   placement.to_allocation). In a fresh process, so that RSS is its own: the
   ExtenderService over an in-memory cluster holding those objects, synced as at
   start. VmRSS is read before the objects are built (the interpreter with gpushare
   imported), after (the in-memory API server holds the pods once, as the decoded
   listing does in a real extender while it is applied) and once synced; the growth
   in the last step is the extender's own state. Target: total RSS ≤ 1 GiB, once
   synced and at its peak (VmHWM) through part 3, which a process keeps afterwards.
3. The re-list path (after a 410 or a reconnect): SchedulerCache.replace_nodes +
   replace_pods with a fresh listing of those objects, the pod listing filtered as the
   watch cache does. Target: ≤ 10 s.
Exits 1 when a target is missed.
Run: .venv/bin/python bench/scale_bench.py [--nodes 5000] [--pods 100000] [--quick]
"""

import argparse
import gc
import multiprocessing
import os
import queue
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from gpushare import annotation
from gpushare.cluster.memory import MemoryCluster, MemoryWatch, gpu_node
from gpushare.extender.mirror import interesting
from gpushare.extender.service import ExtenderConfig, ExtenderService
from gpushare.inventory import NodeGpus, node_gpus, parse_layout
from gpushare.labels import NodeMode
from gpushare.objects import Pod
from gpushare.placement.fit import Assignment, to_allocation
from gpushare.request import PodRequest, parse_pod_request

LAYOUTS = [("cgpu", "8x16GiB"), ("cgpu", "8x24GiB"), ("core_mem", "8x40GiB"), ("share", "8x80GiB")]
GPUS_PER_NODE = 8
HEARTBEATS_PER_MINUTE = 6
CHURN_PER_NODE = 0.1
"""Pods created and gone per node per minute, on the nodes other than the plugin's."""
OWN_PODS = 3
"""Pods that come and go on the plugin's own node during the minute."""
MEMORY_TARGET_MIB = 1024
REBUILD_TARGET_S = 10.0
T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Verdict:
    figure: str
    value: str
    target: str
    passed: bool


# ----- the cluster's objects


def node_name(index: int) -> str:
    return f"node-{index:05d}"


def cluster_with_nodes(count: int) -> MemoryCluster:
    cluster = MemoryCluster()
    for i in range(count):
        mode, layout = LAYOUTS[i % len(LAYOUTS)]
        name = node_name(i)
        cluster.add_node(gpu_node(name, parse_layout(layout, name), mode=mode))
    return cluster


def make_pod(
    name: str,
    mem: int,
    core: int | None = None,
    node: str | None = None,
    annotations: dict[str, str] | None = None,
) -> Pod:
    """A pod with one container asking for `mem` GiB (and `core` percent), as
    tests/builders.py builds them."""
    limits = {"aliyun.com/gpu-mem": str(mem)}
    if core is not None:
        limits["aliyun.com/gpu-core.percentage"] = str(core)
    return Pod.model_validate(
        {
            "metadata": {
                "name": name,
                "namespace": "bench",
                "uid": f"uid-{name}",
                "annotations": annotations or {},
            },
            "spec": {
                "containers": [{"name": "main", "resources": {"limits": limits}}],
                "nodeName": node,
            },
            "status": {"phase": "Running" if node else "Pending"},
        }
    )


class BoundPods:
    """Pods spread round-robin over the nodes and their GPUs, each with the
    annotations the extender writes when it binds."""

    def __init__(self, nodes: list[NodeGpus]) -> None:
        self.nodes = nodes
        self._requests: dict[tuple[int, int | None], PodRequest] = {}

    def pod(self, index: int) -> Pod:
        inventory = self.nodes[index % len(self.nodes)]
        gpu = (index // len(self.nodes)) % GPUS_PER_NODE
        mem = 1 + index % 5  # at most 3 pods per GPU at this density: 15 GiB fits 16
        core = 20 if inventory.mode is NodeMode.CORE_MEM else None
        assignment = Assignment(((gpu,),), ((gpu, mem, core or 0),))
        allocation = to_allocation(
            self._request(mem, core), assignment, inventory, T0 + timedelta(seconds=index)
        )
        return make_pod(f"p{index:06d}", mem, core, inventory.node, annotation.encode(allocation))

    def _request(self, mem: int, core: int | None) -> PodRequest:
        shape = (mem, core)
        if shape not in self._requests:
            parsed = parse_pod_request(make_pod("shape", mem, core))
            assert parsed is not None
            self._requests[shape] = parsed
        return self._requests[shape]


# ----- 1. events at one device plugin


def heartbeat(cluster: MemoryCluster, name: str) -> None:
    """A kubelet's status update: the Node written again under a new resourceVersion."""
    cluster.add_node(cluster.get_node(name))


def pod_comes_and_goes(cluster: MemoryCluster, name: str, node: str) -> None:
    """Five writes: created, bound, Running, deletion begun, gone."""
    cluster.create_pod(make_pod(name, 2))
    cluster.bind_pod("bench", name, node)
    cluster.set_pod_phase("bench", name, "Running")
    cluster.begin_pod_deletion("bench", name)
    cluster.delete_pod("bench", name)


def delivered(watch: MemoryWatch) -> int:
    """Events the watch delivered so far (it is stopped)."""
    watch.stop()
    return sum(1 for _ in watch)


def plugin_minute(nodes: int) -> dict[str, int]:
    """One simulated minute; events at the plugin of node-00000 and at an all-nodes watch."""
    cluster = cluster_with_nodes(nodes)
    own = node_name(0)
    node_watch = cluster.watch_nodes(cluster.list_nodes(own).resource_version, own)
    pod_watch = cluster.watch_pods(cluster.list_pods(own).resource_version, own)
    all_nodes = cluster.watch_nodes(cluster.list_nodes().resource_version)
    churn = round(nodes * CHURN_PER_NODE)
    created = 0
    for beat in range(HEARTBEATS_PER_MINUTE):
        for i in range(nodes):
            heartbeat(cluster, node_name(i))
        for _ in range(churn // HEARTBEATS_PER_MINUTE):
            created += 1
            pod_comes_and_goes(cluster, f"churn-{created}", node_name(1 + created % (nodes - 1)))
        if beat < OWN_PODS:
            pod_comes_and_goes(cluster, f"own-{beat}", own)
    return {
        "own Node": delivered(node_watch),
        "own pods": delivered(pod_watch),
        "all nodes": delivered(all_nodes),
    }


def plugin_events(sizes: tuple[int, int]) -> Verdict:
    print("1. API events one device plugin receives per simulated minute")
    print(
        f"   (6 status updates per node, {CHURN_PER_NODE:g} pods/node churned on other "
        f"nodes, {OWN_PODS} pods on its own node)"
    )
    print(
        f"   {'nodes':>6}  {'own Node':>8}  {'own pods':>8}  {'plugin':>6}  {'all-nodes watch':>15}"
    )
    totals = []
    for nodes in sizes:
        started = time.perf_counter()
        counts = plugin_minute(nodes)
        total = counts["own Node"] + counts["own pods"]
        totals.append(total)
        print(
            f"   {nodes:>6}  {counts['own Node']:>8}  {counts['own pods']:>8}  {total:>6}  "
            f"{counts['all nodes']:>15,}   (replayed in {time.perf_counter() - started:.1f} s)"
        )
    same = len(set(totals)) == 1
    return Verdict(
        f"events/min, one device plugin ({sizes[0]} / {sizes[1]} nodes)",
        f"{totals[0]} / {totals[1]}",
        "same at both",
        same,
    )


# ----- 2 and 3. the extender, in a process of its own


def rss_mib(field: str = "VmRSS") -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def populated(nodes: int, pods: int) -> MemoryCluster:
    cluster = cluster_with_nodes(nodes)
    inventories = [node_gpus(node) for node in cluster.list_nodes().items]
    builder = BoundPods(inventories)
    for i in range(pods):
        cluster.create_pod(builder.pod(i))
    return cluster


def extender_figures(nodes: int, pods: int) -> dict[str, float]:
    """Runs in a fresh process: RSS at each step, sync and re-list seconds."""
    gc.collect()
    figures = {"rss before": rss_mib()}
    started = time.perf_counter()
    cluster = populated(nodes, pods)
    figures["build s"] = time.perf_counter() - started
    gc.collect()
    figures["rss objects"] = rss_mib()

    started = time.perf_counter()
    service = ExtenderService(cluster, ExtenderConfig()).start_watching()
    if not service.wait_synced(600):
        raise RuntimeError("the extender did not sync in 600 s")
    figures["sync s"] = time.perf_counter() - started
    service.stop_watching()
    gc.collect()
    figures["rss synced"] = rss_mib()
    figures["peak synced"] = rss_mib("VmHWM")
    counts = service.cache.counts()
    figures["gpus"] = counts.gpus
    placed, problems = counts.placed, counts.problems
    if placed != pods or problems:
        raise RuntimeError(f"{placed} of {pods} pods placed, {problems} objects unreadable")

    node_listing, pod_listing = cluster.list_nodes(), cluster.list_pods()
    started = time.perf_counter()
    service.cache.replace_nodes(node_listing.items)
    service.cache.replace_pods([pod for pod in pod_listing.items if interesting(pod)])
    figures["rebuild s"] = time.perf_counter() - started
    figures["rss peak"] = rss_mib("VmHWM")
    return figures


def _child(nodes: int, pods: int, results: Any) -> None:
    results.put(extender_figures(nodes, pods))


def in_fresh_process(nodes: int, pods: int) -> dict[str, float]:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    child = context.Process(target=_child, args=(nodes, pods, results))
    child.start()
    # Poll rather than block: a child that raised (its traceback is on stderr)
    # never puts a result, and the bench must fail instead of hanging.
    while True:
        try:
            figures: dict[str, float] = results.get(timeout=1.0)
            break
        except queue.Empty:
            if not child.is_alive():
                died = f"the extender figures' process died (exit {child.exitcode})"
                raise SystemExit(died) from None
    child.join()
    return figures


def extender_scale(nodes: int, pods: int) -> list[Verdict]:
    figures = in_fresh_process(nodes, pods)
    growth = figures["rss synced"] - figures["rss objects"]
    print(
        f"2. extender memory: {nodes:,} nodes, {figures['gpus']:,.0f} GPUs, "
        f"{pods:,} bound pods, every allocation read"
    )
    print(f"   RSS before the objects           {figures['rss before']:8.0f} MiB")
    print(
        f"   RSS with the objects             {figures['rss objects']:8.0f} MiB"
        f"   (built in {figures['build s']:.1f} s)"
    )
    print(
        f"   RSS with the extender synced     {figures['rss synced']:8.0f} MiB"
        f"   (synced in {figures['sync s']:.1f} s)"
    )
    print(f"   growth: the extender's state     {growth:8.0f} MiB")
    print(f"   peak RSS (VmHWM) once synced     {figures['peak synced']:8.0f} MiB")
    print(f"3. re-list: replace_nodes + replace_pods   {figures['rebuild s']:.2f} s")
    print(f"   peak RSS (VmHWM) after it        {figures['rss peak']:8.0f} MiB")
    return [
        Verdict(
            "extender RSS once synced (its state alone)",
            f"{figures['rss synced']:.0f} MiB ({growth:.0f} MiB)",
            f"<= {MEMORY_TARGET_MIB} MiB",
            figures["rss synced"] <= MEMORY_TARGET_MIB,
        ),
        Verdict(
            "extender peak RSS, through a re-list",
            f"{figures['rss peak']:.0f} MiB",
            f"<= {MEMORY_TARGET_MIB} MiB",
            figures["rss peak"] <= MEMORY_TARGET_MIB,
        ),
        Verdict(
            f"rebuild from {pods:,} pods",
            f"{figures['rebuild s']:.2f} s",
            f"<= {REBUILD_TARGET_S:g} s",
            figures["rebuild s"] <= REBUILD_TARGET_S,
        ),
    ]


def table(verdicts: list[Verdict]) -> None:
    print(f"{'figure':<50} {'value':<22} {'target':<14} result")
    for v in verdicts:
        print(f"{v.figure:<50} {v.value:<22} {v.target:<14} {'PASS' if v.passed else 'FAIL'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--nodes", type=int, default=5000, help="nodes (part 1 also runs a tenth as many)"
    )
    parser.add_argument("--pods", type=int, default=100_000, help="bound pods for parts 2 and 3")
    parser.add_argument("--quick", action="store_true", help="200 nodes, 2,000 pods: a smoke run")
    args = parser.parse_args()
    nodes, pods = (200, 2000) if args.quick else (args.nodes, args.pods)
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
    started = time.perf_counter()
    verdicts = [plugin_events((max(nodes // 10, 2), nodes))]
    verdicts += extender_scale(nodes, pods)
    print(f"run time {time.perf_counter() - started:.0f} s")
    table(verdicts)
    sys.exit(0 if all(v.passed for v in verdicts) else 1)


if __name__ == "__main__":
    main()
