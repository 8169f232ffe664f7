"""kube-scheduler's side of a placement, for the simulator.

docs/placement.md#the-kube-scheduler-model has what it shows.

On Kubernetes the extender does not choose the node: kube-scheduler does, from the
nodes its own filters pass, sampled by `percentageOfNodesToScore`, by the sum of its
score plugins and the extender's 0..10 score times the extender's weight times 10.
The paper's scheduler (scheduler.py) takes the policy's best node, ties to a fixed
rank; this model takes what kube-scheduler would, so that a policy's figures are
what a cluster gets. What it follows (kube-scheduler's pkg/scheduler/schedule_one.go
and framework/plugins/noderesources; docs/placement.md#the-kube-scheduler-model):

* Sample: `numFeasibleNodesToFind`: every node below 100 nodes or at 100%; else the
  percentage (0: adaptive, 50 - nodes / 125, at least 5) of the nodes, at least 100.
  The search starts where the last one stopped (`nextStartNodeIndex`) and goes round
  the node list until it has that many nodes its own filters pass; the start moves on
  by the nodes it looked at. The extender filters only those.
* Its own filters: CPU and memory left (NodeResourcesFit) and the GPU model
  (a node selector or affinity on Kubernetes). GPU capacity is the extender's alone
  (`ignoredByScheduler`).
* Scores, each 0..100 times its weight (both weights 1 by default):
  NodeResourcesFit (`LeastAllocated` by default, or `MostAllocated`) over its
  resources' weighted mean, each (allocatable - requested) * 100 / allocatable, or
  requested * 100 / allocatable, requested counting this pod, an extended resource
  skipped for a pod that does not ask for it; NodeResourcesBalancedAllocation,
  (1 - standard deviation of the requested fractions of CPU and memory) * 100. The
  other default plugins score every node alike for these pods (no taints, affinity,
  images or owning workloads) and are left out.
* The extender's prioritize score (0..10: relative to the best candidate since
  issue 40, `relative_score`; the score on its own, `extender_score`, before) times
  weight times 10; the highest sum wins, ties at random (seeded).

GPU memory stands for the extended resource `aliyun.com/gpu-mem` here: milli-GPU
requested per node, each GPU 1000.
"""

import random
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from gpushare.errors import Refusal
from gpushare.placement.fit import (
    Placement,
    PlacementPolicy,
    evaluate,
    extender_score,
    relative_score,
)
from gpushare.request import PodRequest
from gpushare.resources import GPU_MEM
from gpushare.simulator.trace import MILLI_PER_GPU, TraceNode, TracePod
from gpushare.state import NodeState

MAX_NODE_SCORE = 100
MAX_EXTENDER_PRIORITY = 10
MIN_FEASIBLE_NODES = 100
MIN_FEASIBLE_PERCENT = 5
BASE_PERCENT = 50
ADAPTIVE_NODES_PER_PERCENT = 125

CPU = "cpu"
MEMORY = "memory"


class Strategy(StrEnum):
    LEAST_ALLOCATED = "LeastAllocated"
    MOST_ALLOCATED = "MostAllocated"


@dataclass(frozen=True, slots=True)
class KubeSchedulerConfig:
    """The parts of a KubeSchedulerConfiguration that decide which node a pod gets."""

    percentage_of_nodes_to_score: int = 0
    """0: kube-scheduler's adaptive sample; 100: every node."""
    extender_weight: int = 20
    strategy: Strategy = Strategy.LEAST_ALLOCATED
    resources: tuple[tuple[str, int], ...] = ((CPU, 1), (MEMORY, 1))
    """NodeResourcesFit's scoring resources and their weights."""
    fit_weight: int = 1
    balanced_weight: int = 1
    """0 when the profile disables NodeResourcesBalancedAllocation."""
    relative_scores: bool = True
    """How the extender scores the candidates: relative to the best (since issue 40) or
    each on its own (round(score / 10), before)."""
    gpu_extended_resource: bool = True
    """Whether GPU pods ask for `aliyun.com/gpu-mem` (device-plugin mode), so that
    NodeResourcesFit scores it; in DRA mode they ask for a claim instead (dra.py)."""

    def describe(self) -> str:
        sample = self.percentage_of_nodes_to_score
        resources = ", ".join(
            f"{name} {weight}"
            for name, weight in self.resources
            if name != GPU_MEM or self.gpu_extended_resource
        )
        extender = (
            f"extender weight {self.extender_weight} with scores "
            f"{'relative to the best' if self.relative_scores else 'each on its own'}"
            if self.extender_weight
            else "no extender"
        )
        return (
            f"{'adaptive' if sample <= 0 else f'{sample}%'} node sample, NodeResourcesFit "
            f"{self.strategy} ({resources}), {extender}"
        )


STOCK = KubeSchedulerConfig()
"""kube-scheduler as it comes (adaptive sample, LeastAllocated), with the extender at
weight 20."""

CHART_BEFORE = KubeSchedulerConfig(percentage_of_nodes_to_score=100, relative_scores=False)
"""The chart's scheduler and extender before issue 40: every node scored, the default
plugins, extender scores each on its own."""

CHART = KubeSchedulerConfig(
    percentage_of_nodes_to_score=100,
    strategy=Strategy.MOST_ALLOCATED,
    resources=((CPU, 1), (MEMORY, 1), (GPU_MEM, 3)),
)
"""The chart's scheduler profile (helm/gpushare/templates/scheduler-config.yaml): every
node scored, NodeResourcesFit `MostAllocated` with GPU memory weighed 3, so that among
nodes the extender scores alike the fuller one wins. Kept equal to the chart by a test."""

PROFILES: dict[str, KubeSchedulerConfig] = {
    "stock": STOCK,
    "chart-before": CHART_BEFORE,
    "chart": CHART,
}
"""The configurations `gpushare simulate --kube-scheduler` names."""


def nodes_to_find(percentage: int, nodes: int) -> int:
    """How many feasible nodes kube-scheduler looks for before it stops filtering."""
    if nodes < MIN_FEASIBLE_NODES or percentage >= 100:
        return nodes
    if percentage <= 0:
        percentage = max(BASE_PERCENT - nodes // ADAPTIVE_NODES_PER_PERCENT, MIN_FEASIBLE_PERCENT)
    return max(nodes * percentage // 100, MIN_FEASIBLE_NODES)


def fit_score(strategy: Strategy, requested: int, allocatable: int) -> int:
    """One resource's NodeResourcesFit score, 0..100 (requested counts the pod)."""
    if allocatable <= 0:
        return 0
    if strategy is Strategy.MOST_ALLOCATED:
        return min(requested, allocatable) * MAX_NODE_SCORE // allocatable
    if requested > allocatable:
        return 0
    return (allocatable - requested) * MAX_NODE_SCORE // allocatable


def balanced_score(fractions: Sequence[float]) -> int:
    """NodeResourcesBalancedAllocation: 100 when the resources are equally used."""
    capped = [min(f, 1.0) for f in fractions]
    mean = sum(capped) / len(capped)
    std = (sum((f - mean) ** 2 for f in capped) / len(capped)) ** 0.5
    return int((1 - std) * MAX_NODE_SCORE)


ExtenderScores = Callable[[Sequence[float]], Sequence[int]]
"""The extender's 0..10 scores of the candidates, from the policy's scores (0..100)."""


def per_node(scores: Sequence[float]) -> list[int]:
    return [extender_score(s) for s in scores]


def relative(scores: Sequence[float]) -> list[int]:
    best = max(scores)
    return [relative_score(best, s) for s in scores]


class KubeScheduler:
    """Chooses nodes as kube-scheduler with the extender would, told each placed pod
    (`placed`)."""

    def __init__(
        self,
        nodes: Sequence[TraceNode],
        states: Sequence[NodeState],
        order: Sequence[int],
        policy: PlacementPolicy,
        config: KubeSchedulerConfig,
        seed: int,
        extender_scores: ExtenderScores | None = None,
    ) -> None:
        if len(states) != len(nodes) or sorted(order) != list(range(len(nodes))):
            raise ValueError("one state per node and an order of all nodes are needed")
        self._nodes = nodes
        self._states = states
        self._order = order
        self._policy = policy
        self._config = config
        self._rng = random.Random(f"kube-scheduler:{seed}")
        if extender_scores is None:
            extender_scores = relative if config.relative_scores else per_node
        self._extender_scores = extender_scores
        self._cpu = [0] * len(nodes)
        self._memory = [0] * len(nodes)
        self._gpu = [0] * len(nodes)
        self._answers: dict[Hashable, dict[int, tuple[int, Placement | Refusal]]] = {}
        self._next_start = 0
        self.evaluations = 0

    def placed(self, node: int, pod: TracePod) -> None:
        """Counts the pod's requests on the node (its answers are kept by the node state's
        version, so nothing else needs telling)."""
        self._cpu[node] += pod.cpu_milli
        self._memory[node] += pod.memory_mib
        self._gpu[node] += pod.gpu_total

    def choose(self, request: PodRequest, pod: TracePod) -> tuple[int, Placement] | None:
        candidates = self._sample(pod, request)
        answers = self._answers.setdefault((request.shape, self._policy.epoch), {})
        passed: list[tuple[int, Placement]] = []
        for node in candidates:
            version = self._states[node].version
            known = answers.get(node)
            if known is None or known[0] != version:
                self.evaluations += 1
                known = answers[node] = (
                    version,
                    evaluate(self._states[node].view(), request, self._policy),
                )
            if isinstance(known[1], Placement):
                passed.append((node, known[1]))
        if not passed:
            return None
        return self._select(passed, pod)

    def _sample(self, pod: TracePod, request: PodRequest) -> list[int]:
        """The nodes kube-scheduler's own filters pass, as many as it looks for."""
        total = len(self._order)
        wanted = nodes_to_find(self._config.percentage_of_nodes_to_score, total)
        found: list[int] = []
        looked = 0
        while looked < total and len(found) < wanted:
            node = self._order[(self._next_start + looked) % total]
            looked += 1
            if self._passes(node, pod, request):
                found.append(node)
        self._next_start = (self._next_start + looked) % total
        return found

    def _passes(self, node: int, pod: TracePod, request: PodRequest) -> bool:
        """Whether kube-scheduler's own filters pass the node (the request is for filters
        that read the pod's devices: DRA's, dra.py)."""
        n = self._nodes[node]
        if pod.gpu_spec is not None and n.model not in pod.gpu_spec:
            return False
        return (
            self._cpu[node] + pod.cpu_milli <= n.cpu_milli
            and self._memory[node] + pod.memory_mib <= n.memory_mib
        )

    def _select(self, passed: list[tuple[int, Placement]], pod: TracePod) -> tuple[int, Placement]:
        config = self._config
        scale = config.extender_weight * (MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY)
        extender = self._extender_scores([p.score for _, p in passed])
        best_extender = max(extender)
        # Plugins add at most this much: a node whose extender score is further below
        # the best cannot win, and is not scored.
        reach = MAX_NODE_SCORE * (config.fit_weight + config.balanced_weight)
        best_total = -1
        chosen: tuple[int, Placement] = passed[0]
        ties = 0
        for (node, placement), score in zip(passed, extender, strict=True):
            if (best_extender - score) * scale > reach:
                continue
            total = score * scale + self._plugins(node, pod)
            if total > best_total:
                best_total, chosen, ties = total, (node, placement), 1
            elif total == best_total:
                ties += 1
                if self._rng.randrange(ties) == 0:  # selectHost: uniform among the best
                    chosen = (node, placement)
        return chosen

    def _plugins(self, node: int, pod: TracePod) -> int:
        config = self._config
        n = self._nodes[node]
        used = {
            CPU: (self._cpu[node] + pod.cpu_milli, n.cpu_milli, pod.cpu_milli),
            MEMORY: (self._memory[node] + pod.memory_mib, n.memory_mib, pod.memory_mib),
            GPU_MEM: (self._gpu[node] + pod.gpu_total, n.gpus * MILLI_PER_GPU, pod.gpu_total),
        }
        score = weights = 0
        for resource, weight in config.resources:
            requested, allocatable, asked = used[resource]
            if resource == GPU_MEM and not (asked and config.gpu_extended_resource):
                continue  # an extended resource the pod does not request is not scored
            if allocatable <= 0:
                continue
            score += fit_score(config.strategy, requested, allocatable) * weight
            weights += weight
        total = config.fit_weight * (score // weights if weights else 0)
        if config.balanced_weight:
            fractions = [used[r][0] / used[r][1] for r in (CPU, MEMORY) if used[r][1] > 0]
            if fractions:
                total += config.balanced_weight * balanced_score(fractions)
        return total
