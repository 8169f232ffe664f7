"""The simulator's model of kube-scheduler (gpushare.simulator.kubescheduler): how many
nodes it looks at and where it starts, how its score plugins and the extender's 0..10
score add up, ties at random, and what that does to packing (issue 40, item 3)."""

import random
from collections import Counter

import pytest

from gpushare.placement.policies import POLICIES
from gpushare.resources import GPU_MEM
from gpushare.simulator.kubescheduler import (
    CHART,
    CHART_BEFORE,
    KubeScheduler,
    KubeSchedulerConfig,
    Strategy,
    balanced_score,
    fit_score,
    nodes_to_find,
    per_node,
    relative,
)
from gpushare.simulator.run import PolicyChoice, simulate
from gpushare.simulator.trace import Trace, TraceNode, TracePod
from gpushare.state import NodeState


@pytest.mark.parametrize(
    ("percentage", "nodes", "found"),
    [
        (0, 50, 50),  # below 100 nodes: every node
        (0, 99, 99),
        (0, 100, 50 * 100 // 100),  # adaptive: 50 - 100 // 125 = 50%
        (0, 1000, 420),  # 50 - 8 = 42%
        (0, 5000, 500),  # 50 - 40 = 10%
        (0, 6000, 300),  # 50 - 48 = 2%, raised to the 5% floor
        (100, 5000, 5000),
        (10, 500, 100),  # 50 nodes, raised to the floor of 100
        (30, 1000, 300),
    ],
)
def test_kube_scheduler_looks_for_as_many_nodes_as_its_sample_rule_says(percentage, nodes, found):
    assert nodes_to_find(percentage, nodes) == max(min(found, nodes), min(nodes, 100))


def test_resource_scores_are_kube_schedulers_integer_formulas():
    assert fit_score(Strategy.LEAST_ALLOCATED, 250, 1000) == 75
    assert fit_score(Strategy.MOST_ALLOCATED, 250, 1000) == 25
    assert fit_score(Strategy.LEAST_ALLOCATED, 333, 1000) == 66  # floored, as in Go
    assert fit_score(Strategy.MOST_ALLOCATED, 1500, 1000) == 100
    assert fit_score(Strategy.LEAST_ALLOCATED, 1500, 1000) == 0
    assert fit_score(Strategy.MOST_ALLOCATED, 5, 0) == 0
    assert balanced_score([0.5, 0.5]) == 100
    assert balanced_score([1.0, 0.0]) == 50  # standard deviation 0.5
    assert balanced_score([0.2, 0.6]) == 80


def node(name: str, gpus: int = 4, cpu: int = 64_000, model: str = "T4") -> TraceNode:
    return TraceNode(name, cpu_milli=cpu, memory_mib=256 * 1024, gpus=gpus, model=model)


def pod(name: str, milli: int = 250, gpus: int = 1, cpu: int = 1000) -> TracePod:
    return TracePod(name, cpu, 4096, num_gpu=gpus if milli else 0, gpu_milli=milli, gpu_spec=None)


class FirstCandidateWins:
    """An extender that scores the first node it is sent 10 and the others 0."""

    def __call__(self, scores):
        return [10] + [0] * (len(scores) - 1)


def scheduler(nodes, config, extender_scores=None, policy="binpack", seed=1):
    states = [NodeState(n.inventory()) for n in nodes]
    kwargs = {} if extender_scores is None else {"extender_scores": extender_scores}
    made = KubeScheduler(
        nodes, states, range(len(nodes)), POLICIES[policy](), config, seed, **kwargs
    )
    return made, states


def test_the_sample_starts_where_the_last_search_stopped():
    nodes = [node(f"n{i:03d}") for i in range(300)]
    kube, _ = scheduler(nodes, KubeSchedulerConfig(percentage_of_nodes_to_score=10),
                        FirstCandidateWins())  # fmt: skip
    request = pod("p").request()
    # 10% of 300 is below the floor: 100 nodes a search, the next starting after them.
    firsts = [kube.choose(request, pod("p"))[0] for _ in range(4)]
    assert firsts == [0, 100, 200, 0]


def test_nodes_its_own_filters_refuse_do_not_count_toward_the_sample():
    nodes = [node(f"n{i:03d}", cpu=500 if i % 2 else 64_000) for i in range(300)]
    kube, _ = scheduler(nodes, KubeSchedulerConfig(percentage_of_nodes_to_score=10),
                        FirstCandidateWins())  # fmt: skip
    picks = [kube.choose(pod("p").request(), pod("p"))[0] for _ in range(3)]
    # 100 feasible nodes are the even ones among 199 looked at; the next search starts there.
    assert picks == [0, 200, 100]


def test_a_gpu_model_the_pod_does_not_name_is_refused_before_the_extender():
    nodes = [node("a", model="G2"), node("b", model="T4")]
    kube, _ = scheduler(nodes, CHART, FirstCandidateWins())
    pinned = TracePod("p", 1000, 4096, 1, 500, frozenset({"T4"}))
    assert kube.choose(pinned.request(), pinned)[0] == 1


def test_equal_totals_are_broken_at_random_not_by_node_order():
    nodes = [node(f"n{i}") for i in range(5)]
    config = KubeSchedulerConfig(percentage_of_nodes_to_score=100, fit_weight=0, balanced_weight=0)
    kube, _ = scheduler(nodes, config)
    picks = Counter(kube.choose(pod("p").request(), pod("p"))[0] for _ in range(500))
    assert set(picks) == set(range(5)) and min(picks.values()) > 50


def test_least_allocated_sends_a_pod_to_the_emptier_node_most_allocated_to_the_fuller():
    nodes = [node("empty"), node("used")]
    for config, expected in ((CHART_BEFORE, 0), (CHART, 1)):
        kube, _ = scheduler(nodes, config, lambda scores: [5] * len(scores))
        kube.placed(1, pod("running", milli=500))
        assert kube.choose(pod("p").request(), pod("p"))[0] == expected, config


def test_gpu_memory_is_scored_only_for_pods_that_ask_for_it():
    # Node 0 runs CPU, node 1 runs GPU memory. A CPU-only pod under MostAllocated with GPU
    # memory weighed heavily still goes by CPU and memory alone: to node 0.
    nodes = [node("cpu-busy"), node("gpu-busy")]
    config = KubeSchedulerConfig(
        percentage_of_nodes_to_score=100,
        strategy=Strategy.MOST_ALLOCATED,
        resources=(("cpu", 1), ("memory", 1), (GPU_MEM, 50)),
        balanced_weight=0,
    )
    kube, _ = scheduler(nodes, config, lambda scores: [5] * len(scores))
    kube.placed(0, pod("cpu-hog", milli=0, cpu=32_000))
    kube.placed(1, pod("gpu-hog", milli=1000, gpus=4, cpu=100))
    cpu_only = pod("c", milli=0)
    assert kube.choose(cpu_only.request(), cpu_only)[0] == 0
    assert kube.choose(pod("g").request(), pod("g"))[0] == 1


def test_a_higher_extender_score_outweighs_every_plugin_at_weight_20():
    nodes = [node("emptiest"), node("preferred")]
    kube, _ = scheduler(nodes, CHART_BEFORE, lambda scores: [4, 5])
    kube.placed(1, pod("running", milli=1000, gpus=4, cpu=60_000))
    assert kube.choose(pod("p").request(), pod("p"))[0] == 1


def small_pods_cluster(nodes: int = 100, pods: int = 400, seed: int = 7) -> Trace:
    """Issue 40's real cluster, scaled down: nodes of 4 x 16 GiB, pods of 1-4 GiB."""
    rng = random.Random(seed)
    sizes = [1000 * gib // 16 for gib in (1, 2, 3, 4)]
    return Trace(
        tuple(node(f"node-{i:03d}") for i in range(nodes)),
        tuple(pod(f"pod-{i:04d}", milli=rng.choice(sizes)) for i in range(pods)),
    )


def occupancy(trace: Trace, policy: str, config: KubeSchedulerConfig) -> tuple[float, float]:
    """Nodes and GPUs in use once the pods have arrived (about 8% of the GPUs)."""
    inflation = trace.requested / trace.capacity
    result = simulate(trace, PolicyChoice.parse(policy), seed=42, inflation=inflation, kube=config)
    last = result.bins[max(result.bins)]
    assert sum(result.failed.values()) == 0
    return last.occupied_nodes, last.used_gpus


def test_through_kube_schedulers_defaults_the_default_policy_spreads_small_pods():
    trace = small_pods_cluster()
    spread_nodes, spread_gpus = occupancy(trace, "fgd-lookahead@learned", CHART_BEFORE)
    packed_nodes, packed_gpus = occupancy(trace, "binpack", CHART)
    assert spread_nodes > 3 * packed_nodes and spread_gpus > 1.5 * packed_gpus


def test_through_the_charts_scheduler_binpack_packs_to_the_minimum():
    trace = small_pods_cluster()
    nodes, gpus = occupancy(trace, "binpack", CHART)
    least_gpus = -(-trace.requested // 1000)
    assert gpus <= 1.05 * least_gpus and nodes <= 1.05 * least_gpus / 4 + 1


@pytest.mark.parametrize("policy", ["fgd-lookahead@learned", "fgd"])
def test_through_the_charts_scheduler_the_policy_chooses_and_small_pods_stay_packed(policy):
    """Relative extender scores keep the policy's own choice (the paper's scheduler makes
    the same), and kube-scheduler no longer spreads: about a fifth more GPUs than binpack
    at this load (FGD leaves each GPU room for a typical next pod), where the chart
    before issue 40 used every node."""
    trace = small_pods_cluster()
    nodes, gpus = occupancy(trace, policy, CHART)
    binpack_nodes, binpack_gpus = occupancy(trace, "binpack", CHART)
    before_nodes, before_gpus = occupancy(trace, policy, CHART_BEFORE)
    assert before_gpus > 1.3 * gpus
    assert nodes <= 1.3 * binpack_nodes and gpus <= 1.3 * binpack_gpus
    assert before_nodes > 2.5 * nodes
    inflation = trace.requested / trace.capacity
    paper = simulate(trace, PolicyChoice.parse(policy), seed=42, inflation=inflation)
    last = paper.bins[max(paper.bins)]
    assert (last.occupied_nodes, last.used_gpus) == (nodes, gpus)


def test_the_extender_scores_relative_to_the_best_candidate_unless_told_the_old_way():
    assert relative([73.5, 72.0, 61.0]) == [10, 8, 0]
    assert per_node([73.5, 72.0, 61.0]) == [7, 7, 6]
    assert CHART.relative_scores and not CHART_BEFORE.relative_scores


def test_a_configuration_says_what_it_models():
    assert CHART.describe() == (
        "100% node sample, NodeResourcesFit MostAllocated (cpu 1, memory 1, "
        "aliyun.com/gpu-mem 3), extender weight 20 with scores relative to the best"
    )
    assert KubeSchedulerConfig().describe().startswith("adaptive node sample, ")
    assert "each on its own" in CHART_BEFORE.describe()
