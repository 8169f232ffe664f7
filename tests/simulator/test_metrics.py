"""Metrics after every pod, on traces small enough to work out by hand."""

import pytest

from gpushare.simulator.metrics import Recorder
from gpushare.simulator.run import PolicyChoice, simulate, target_workload
from gpushare.simulator.trace import PodClass
from tests.simulator.traces import tiny

TWO_ONE_GPU_NODES = [("a", 32000, 65536, 1, "T4"), ("b", 32000, 65536, 1, "T4")]


@pytest.fixture
def sharing_trace(tmp_path):
    # Three 600-milli pods on two one-GPU nodes: 90% requested; one more is drawn (120%).
    return tiny(tmp_path, TWO_ONE_GPU_NODES, [(f"p{i}", 1000, 1024, 1, 600, "") for i in range(3)])


@pytest.mark.parametrize("policy", ["binpack", "spread", "bestfit", "fgd"])
def test_every_policy_sees_the_same_known_answers_on_a_tiny_trace(sharing_trace, policy):
    result = simulate(sharing_trace, PolicyChoice.parse(policy), seed=42)
    assert result.pods == 4
    bins = result.bins
    assert sorted(bins) == [30, 60, 90, 120]
    # Placed 600, 1200, then nothing fits (400 left on each GPU).
    assert [round(bins[b].unallocated_pct, 6) for b in (30, 60, 90, 120)] == [70, 40, 40, 40]
    # The only task (600 milli) fits nowhere once a GPU holds one: all 400 left is fragment.
    assert [round(bins[b].frag_amount_pct, 6) for b in (30, 60, 90, 120)] == [20, 40, 40, 40]
    assert round(bins[30].frag_ratio_pct, 4) == round(100 * 400 / 1400, 4)
    assert round(bins[60].frag_ratio_pct, 6) == 100
    assert [bins[b].occupied_nodes for b in (30, 60, 90, 120)] == [1, 2, 2, 2]
    assert [bins[b].used_gpus for b in (30, 60, 90, 120)] == [1, 2, 2, 2]
    assert result.failed == {PodClass.SHARING: 2}
    assert result.failed_by_100 == {PodClass.SHARING: 1}


def test_whole_gpu_pods_fail_once_no_node_has_a_free_gpu(tmp_path):
    trace = tiny(
        tmp_path, TWO_ONE_GPU_NODES, [(f"w{i}", 1000, 1024, 1, 1000, "") for i in range(3)]
    )
    result = simulate(trace, PolicyChoice.parse("fgd"), seed=1, inflation=2.0)
    assert result.pods == 4  # 3000 of the trace, one draw to 4000, the next would pass it
    assert {b: round(m.unallocated_pct, 6) for b, m in result.bins.items()} == {
        50: 50,
        100: 0,
        150: 0,
        200: 0,
    }
    assert result.failed == {PodClass.GPU1: 2}
    assert result.failed_by_100 == {}


def test_cpu_only_pods_arrive_without_gpu_and_fail_on_cpu(tmp_path):
    pods = [
        ("g", 500, 1024, 1, 1000, ""),
        ("c1", 3000, 1024, 0, 0, ""),
        ("c2", 3000, 1024, 0, 0, ""),
    ]
    trace = tiny(tmp_path, [("a", 4000, 65536, 1, "T4")], pods)
    result = simulate(trace, PolicyChoice.parse("bestfit"), seed=3)
    # Draws of CPU-only pods add no GPU, so they keep coming until a GPU pod is drawn.
    # Whatever the order, one CPU-only pod and the GPU pod fit in 4000 milli-CPU.
    assert result.pods > 3
    assert result.failed == {PodClass.CPU: result.pods - 2}
    assert all(b.occupied_nodes == 1 for b in result.bins.values())


def test_the_recorder_bins_events_by_rounded_arrival():
    from gpushare.simulator.trace import TracePod

    share = TracePod("s", 1000, 1024, 1, 500, None)
    whole = TracePod("w", 1000, 1024, 1, 1000, None)
    recorder = Recorder(capacity=1000, node_frag=[0.0])
    recorder.offered(share, 0, 250.0)  # arrived 50%, placed 500, F = 250
    recorder.offered(whole, None, None)  # arrived 150%, failed
    bins = recorder.bins()
    assert (bins[50].unallocated_pct, bins[50].frag_amount_pct, bins[50].frag_ratio_pct) == (
        50.0,
        25.0,
        50.0,
    )
    assert bins[150].unallocated_pct == 50.0 and bins[150].occupied_nodes == 1
    assert recorder.failed == {PodClass.GPU1: 1} and recorder.failed_by_100 == {}


def test_the_default_trace_target_workload_has_35_shapes():
    from gpushare.simulator.trace import load
    from tests.simulator.traces import NODES_CSV, PODS_CSV

    workload = target_workload(load(NODES_CSV, PODS_CSV))
    assert len(workload.tasks) == 35  # docs/placement.md#benchmark-metrics, CPU-only pods included
    assert sum(p for _, p in workload.tasks) == pytest.approx(1.0)
    assert any(s.gpus == 0 for s, _ in workload.tasks)


def test_used_gpus_count_each_gpu_of_a_node_once_however_many_pods_share_it(tmp_path):
    # One node of 4 GPUs: two 400-milli slices pack onto one GPU under binpack, then a
    # 2-GPU pod takes two more: 1, 1, 3 GPUs used on 1 node.
    trace = tiny(
        tmp_path,
        [("a", 64000, 262144, 4, "T4")],
        [("p0", 1000, 1024, 1, 400, ""), ("p1", 1000, 1024, 1, 400, ""),
         ("p2", 1000, 1024, 2, 1000, "")],
    )  # fmt: skip
    result = simulate(trace, PolicyChoice.parse("binpack"), seed=42, inflation=0.7)
    used = [b.used_gpus for _, b in sorted(result.bins.items())]
    assert used == [1, 1, 3] and all(b.occupied_nodes == 1 for b in result.bins.values())


def test_a_learning_policy_is_told_of_every_node_before_the_first_pod(sharing_trace, monkeypatch):
    # What it weighs rare multi-GPU shapes by (placement/supply.py); the paper's scheduler
    # evaluates every node, kube-scheduler's sample need not.
    from gpushare.placement.lookahead import LookaheadFgdPolicy

    told: list[tuple[str, int | None, int]] = []
    seen = LookaheadFgdPolicy.node_seen

    def record(self, node):
        told.append((node.node, node.cpu_milli, len(node.gpus)))
        seen(self, node)

    def first_pod(self, request):
        assert len(self.supply) == 2
        monkeypatch.setattr(LookaheadFgdPolicy, "observe", observe)
        observe(self, request)

    observe = LookaheadFgdPolicy.observe
    monkeypatch.setattr(LookaheadFgdPolicy, "node_seen", record)
    monkeypatch.setattr(LookaheadFgdPolicy, "observe", first_pod)
    simulate(sharing_trace, PolicyChoice.parse("fgd-lookahead@learned"), seed=42)
    assert sorted(told) == [("a", 32000, 1), ("b", 32000, 1)]
