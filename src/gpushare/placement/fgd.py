"""FGD: fragmentation gradient descent (Weng et al., USENIX ATC'23), and the base of
the policies that judge a placement by the fragmentation it leaves.

FGD places a pod where the node's fragmentation F (fragmentation.py) grows least:
score = floor(100 * sigmoid(-dF / 1000)). A pod of one shared slice tries every
GPU it fits on and keeps the best (ties: lowest index); other pods take the
least-sufficient GPUs. The target workload is fixed (the simulator gives it the
trace's, as the paper did) or learned online from the pods the extender is asked
about, starting from a prior. A learned workload guides the choice of a slice's GPU
only once it predicts the pods that come (`GUIDE_WINDOW`); until then the slice takes
the fullest GPU it fits on, as packing does.
"""

import math
from abc import abstractmethod
from collections import deque
from collections.abc import Callable
from typing import ClassVar, Self

from gpushare.inventory import NodeGpus
from gpushare.placement.fit import (
    Assignment,
    Placement,
    PlacementPolicy,
    search,
    slice_assignment,
    slice_candidates,
)
from gpushare.placement.fragmentation import (
    Device,
    Fragmentation,
    cpu_after,
    device_left,
    devices,
    devices_after,
    models,
)
from gpushare.placement.supply import Supply
from gpushare.placement.workload import COVERAGE, LearnedWorkload, TaskShape, Workload
from gpushare.request import PodRequest
from gpushare.state import GpuView, NodeView

Waste = Callable[[frozenset[str], int | None, list[Device]], float]
"""A node's waste from its GPU models, CPU left and GPUs (WorkloadAwarePolicy.waste)."""

GUIDE_WINDOW = 32
"""A learned workload guides which GPU of a node a slice takes once it predicted at
least half of the last this many pods (a pod is predicted when its shape was one of the
workload's typical shapes as it came). Until then a learning policy packs: a slice takes
the fullest GPU it fits on, as binpack and bestfit do, and only the node is scored
against the workload. A workload learned from a few pods, or still the prior, is a poor
guide: betting on it, the look-ahead put a second 10 GiB pod on a 24 GiB GPU beside two
16 GiB ones to keep 14 GiB for a third, and the 20 GiB pod that came next fit nowhere
(issue 40), where packing places all three. The same count catches a shift: pods in
shapes the learned workload does not hold are not predicted, and the policy packs until
it has learned them. In a steady workload about 95% of pods are predicted (`COVERAGE`);
on the openb trace and its mixes it packs 28-55 of the first 57 pods, none after.
Scoring the nodes as bestfit does while packing cost 0.15-0.2 point of unallocated GPU
on the default trace and the sharing mixes (seed 42, docs/placement.md)."""


class WorkloadAwarePolicy(PlacementPolicy):
    """A policy that scores a placement by the node it leaves behind, judged against
    a target workload. Construct with a workload distribution to fix it (the policy
    keeps its most popular shapes, `coverage` of it); without one the policy learns
    it from observe() (the extender's case), packing slices until what it learned
    predicts the pods (`GUIDE_WINDOW`)."""

    coverage: ClassVar[float] = COVERAGE
    nameless = True

    def __init__(self, workload: Workload | None = None) -> None:
        self.supply = Supply()
        """The cluster's nodes as told (`node_seen`): what a learned workload's rare
        multi-GPU shapes are weighed by (workload.RARE_DISCOUNT)."""
        self._learner = LearnedWorkload(share=self.supply.share) if workload is None else None
        self._predicted: deque[bool] = deque(maxlen=GUIDE_WINDOW)
        self.packing = self._learner is not None
        """Whether a slice takes the fullest GPU it fits on (`GUIDE_WINDOW`): a learning
        policy's until its learned workload predicts the pods."""
        self._use(workload if workload is not None else self._learner.current)  # type: ignore[union-attr]

    def with_workload(self, workload: Workload) -> Self:
        """A fresh policy of the same kind with a fixed target workload."""
        return type(self)(workload=workload)

    def learning(self) -> Self:
        """A fresh policy of the same kind that learns the workload from its prior."""
        return type(self)()

    @property
    def workload(self) -> Workload:
        return self.fragmentation.workload

    @property
    def learns(self) -> bool:
        return self._learner is not None

    def target(self, distribution: Workload) -> Workload:
        """The target workload judged against, from the distribution of pod shapes."""
        return distribution.typical_part(self.coverage)

    def _use(self, distribution: Workload) -> None:
        self.fragmentation = Fragmentation(self.target(distribution))
        self._typical = frozenset(shape for shape, _ in self.fragmentation.workload.tasks)

    def observe(self, request: PodRequest) -> None:
        if self._learner is None:
            return
        shape = TaskShape.of(request)
        self._predicted.append(shape in self._typical)
        changed = self._learner.observe(shape)
        if changed:
            self._use(self._learner.current)
        packing = 2 * sum(self._predicted) < GUIDE_WINDOW
        if changed or packing != self.packing:
            self.packing = packing
            self.epoch += 1

    def node_seen(self, node: NodeGpus) -> None:
        if self._learner is not None:
            self.supply.seen(node)

    def node_gone(self, name: str) -> None:
        self.supply.gone(name)

    def gpu_key(self, gpu: GpuView, mem_after: int, core_after: int) -> tuple[int, ...]:
        # Least-sufficient GPUs first: the fullest that still fits.
        return (mem_after, core_after, gpu.index)

    def place(self, view: NodeView, request: PodRequest) -> Placement | None:
        # Packing, a slice is placed as a pod of several GPUs is: the least-sufficient GPU.
        candidates = None if self.packing else slice_candidates(view, request)
        if candidates is None:
            assignment = search(view, request, self.gpu_key)
            if assignment is None:
                return None
            return Placement(assignment, self.score(view, request, assignment))
        if not candidates:
            return None
        node_models = models(view)
        before = devices(view)
        waste = self.judge(view)
        baseline = waste(node_models, view.cpu_free, before)
        position = {g.index: pos for pos, g in enumerate(view.gpus)}
        cpu = cpu_after(view, request.cpu_milli)
        best: tuple[float, GpuView] | None = None
        tried: set[Device] = set()
        for gpu, mem_after, core_after in candidates:
            pos = position[gpu.index]
            if before[pos] in tried:  # a GPU like one tried already scores the same
                continue
            tried.add(before[pos])
            after = list(before)
            after[pos] = device_left(gpu, mem_after, core_after)
            value = self.rate(view, waste(node_models, cpu, after) - baseline)
            if best is None or value > best[0]:
                best = (value, gpu)
        assert best is not None
        return Placement(slice_assignment(request, best[1]), best[0])

    def score(self, view: NodeView, request: PodRequest, assignment: Assignment) -> float:
        node_models = models(view)
        cpu = cpu_after(view, request.cpu_milli)
        waste = self.judge(view)
        growth = waste(node_models, cpu, devices_after(view, assignment)) - waste(
            node_models, view.cpu_free, devices(view)
        )
        return self.rate(view, growth)

    def judge(self, view: NodeView) -> Waste:
        """The waste a placement on this node is judged by, before and after alike:
        `waste`, unless a policy judges some nodes otherwise."""
        return self.waste

    @abstractmethod
    def waste(self, models: frozenset[str], cpu_free: int | None, gpus: list[Device]) -> float:
        """How much free GPU (milli-GPU) a node in this state leaves to waste, as the
        policy reckons it against its target workload."""

    @abstractmethod
    def rate(self, view: NodeView, growth: float) -> float:
        """Score (0..100, higher is better) of placing the pod on the node, given the
        growth of its waste."""


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def fgd_score(growth: float) -> int:
    """FGD's node score: floor(100 * sigmoid(-growth / 1000)), 0..99."""
    return math.floor(100 * sigmoid(-growth / 1000))


class FgdPolicy(WorkloadAwarePolicy):
    name = "fgd"

    def waste(self, models: frozenset[str], cpu_free: int | None, gpus: list[Device]) -> float:
        return self.fragmentation.of(models, cpu_free, gpus)

    def rate(self, view: NodeView, growth: float) -> float:
        return float(fgd_score(growth))
