"""Core placement speed: how long one pod takes to evaluate on one node.

Prints evaluate() per node-pod pair for the common shapes, on nodes that
already carry pods, so regressions in the hot path show up as numbers; then what
learning the workload costs per pod (`LearnedWorkload.observe`, the extender's filter
calls it once a pod) when every pod comes in a shape of its own, as tenants can make
them: time per pod, shapes kept and peak memory (bounded by `workload.SHAPES_LIMIT`).
Run: .venv/bin/python bench/core_bench.py
"""

import statistics
import time
import tracemalloc
from datetime import UTC, datetime

from gpushare.inventory import NodeGpus, parse_layout
from gpushare.labels import NodeMode
from gpushare.objects import Pod
from gpushare.placement.fit import Placement, evaluate, to_allocation
from gpushare.placement.policies import BinpackPolicy
from gpushare.placement.supply import Supply
from gpushare.placement.workload import SHAPES_LIMIT, LearnedWorkload, TaskShape
from gpushare.request import PodRequest, parse_pod_request
from gpushare.state import NodeState

SHAPES = {
    "2GiB": {"aliyun.com/gpu-mem": "2"},
    "2GiB+30%": {"aliyun.com/gpu-mem": "2", "aliyun.com/gpu-core.percentage": "30"},
    "whole GPU": {"aliyun.com/gpu-count": "1"},
}


def request_of(limits: dict[str, str], labels: dict[str, str] | None = None) -> PodRequest:
    pod = Pod.model_validate(
        {
            "metadata": {"name": "bench", "labels": labels or {}},
            "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
        }
    )
    request = parse_pod_request(pod)
    assert request is not None
    return request


def loaded_node(mode: NodeMode) -> NodeState:
    """A node holding 40 pods of the job type its mode takes (no mixing refusals)."""
    inventory = NodeGpus("bench", mode, parse_layout("8x80GiB", "bench"))
    state = NodeState(inventory)
    filler_limits = {"aliyun.com/gpu-mem": "3"}
    if mode is NodeMode.CORE_MEM:
        filler_limits["aliyun.com/gpu-core.percentage"] = "10"
    filler = request_of(filler_limits)
    for i in range(40):
        result = evaluate(state.view(), filler, BinpackPolicy())
        assert isinstance(result, Placement)
        allocation = to_allocation(filler, result.assignment, inventory, datetime.now(UTC))
        state.add(f"default/filler-{i}", allocation)
    return state


def main() -> None:
    policy = BinpackPolicy()
    print("evaluate() on an 8x80GiB node holding 40 pods (microseconds per call)")
    for label, limits in SHAPES.items():
        mode = NodeMode.CORE_MEM if "core" in str(limits) else NodeMode.CGPU
        view = loaded_node(mode).view()
        request = request_of(limits)
        assert isinstance(evaluate(view, request, policy), Placement), label
        samples = []
        for _ in range(2000):
            start = time.perf_counter()
            evaluate(view, request, policy)
            samples.append((time.perf_counter() - start) * 1e6)
        samples.sort()
        print(
            f"  {label:<10} p50 {statistics.median(samples):6.1f} us"
            f"   p99 {samples[int(len(samples) * 0.99)]:6.1f} us"
        )
    learning_new_shapes()


def learning_new_shapes(streams: tuple[int, ...] = (10_000, 50_000)) -> None:
    print(f"learning the workload, every pod a new shape (at most {SHAPES_LIMIT} kept)")
    for pods in streams:
        learner = LearnedWorkload(share=Supply().share)
        tracemalloc.start()
        start = time.perf_counter()
        for i in range(pods):
            learner.observe(TaskShape(gpus=1, mem=4, cpu_milli=1000 + i))
        took = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(
            f"  {pods:>6} pods  {took / pods * 1e6:6.1f} us/pod  {learner.shapes} shapes kept"
            f"  peak {peak / 2**20:.1f} MiB"
        )


if __name__ == "__main__":
    main()
