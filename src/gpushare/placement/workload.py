"""The target workload: the pod shapes a cluster expects, and how popular each is.

Fragmentation-aware policies (FGD and ours) judge a node by how much of its free
GPU the expected pods could not use. The simulator gives them the trace's
distribution, as the FGD paper does; the extender learns it online from the pods
it is asked about (`LearnedWorkload`, a decaying histogram with a prior).
"""

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gpushare.request import PodRequest

COVERAGE = 0.95
"""The typical shapes are the most popular ones that together cover this share of pods."""

MILLI = 1000
"""One GPU, in the fraction-of-a-GPU units fragmentation is measured in."""


@dataclass(frozen=True, slots=True)
class TaskShape:
    """One kind of pod, as fragmentation sees it.

    `mem` and `core` are per GPU, in the node's units (GiB and percent on Kubernetes
    nodes, milli-GPU in the simulator), unless `fraction` is set: then `mem` is
    milli-GPU of whatever GPU the node has (the prior's shapes, which must make
    sense on any cluster)."""

    gpus: int
    mem: int = 0
    core: int = 0
    exclusive: bool = False
    cpu_milli: int | None = None
    gpu_spec: frozenset[str] | None = None
    fraction: bool = False

    @classmethod
    def of(cls, request: PodRequest) -> "TaskShape":
        """The shape of a pod. A pod of several containers is summed up by its largest
        per-GPU slice on its widest container: close enough for judging what it leaves."""
        containers = request.containers
        if not containers:
            return cls(gpus=0, cpu_milli=request.cpu_milli, gpu_spec=request.gpu_spec)
        return cls(
            gpus=max(c.gpus for c in containers),
            mem=max(c.mem for c in containers),
            core=max(c.core for c in containers),
            exclusive=all(c.exclusive for c in containers),
            cpu_milli=request.cpu_milli,
            gpu_spec=request.gpu_spec,
        )

    @property
    def gpu_part(self) -> tuple[int, int, int, bool, bool]:
        """What decides which GPUs the shape fits on (its CPU and model aside)."""
        return (self.gpus, self.mem, self.core, self.exclusive, self.fraction)


@dataclass(frozen=True, slots=True)
class Workload:
    """Shapes with popularities that sum to 1."""

    tasks: tuple[tuple[TaskShape, float], ...]

    @classmethod
    def typical(cls, counts: Mapping[TaskShape, float], coverage: float = COVERAGE) -> "Workload":
        """The most popular shapes covering `coverage` of the weight, renormalised.

        Ties in popularity go by the shape's fields, so the result never depends on
        the order the counts were gathered in."""
        total = sum(counts.values())
        if total <= 0:
            raise ValueError("a workload needs at least one shape with a positive weight")
        ranked = sorted(counts.items(), key=lambda item: (-item[1], _order(item[0])))
        kept: list[tuple[TaskShape, float]] = []
        covered = 0.0
        for shape, weight in ranked:
            if covered >= coverage * total:
                break
            kept.append((shape, weight))
            covered += weight
        return cls(tuple((shape, weight / covered) for shape, weight in kept))

    @classmethod
    def of_requests(cls, requests: Iterable[PodRequest], coverage: float = COVERAGE) -> "Workload":
        counts: dict[TaskShape, float] = {}
        for request in requests:
            shape = TaskShape.of(request)
            counts[shape] = counts.get(shape, 0.0) + 1.0
        return cls.typical(counts, coverage)

    def typical_part(self, coverage: float = COVERAGE, wide: float | None = None) -> "Workload":
        """Its most popular shapes covering `coverage` of it, renormalised. With `wide`,
        a shape of several GPUs is kept however rare it is once its pods ask for at
        least `wide` GPUs per pod of the workload (popularity times GPUs): a coverage
        that counts pods drops an 8-GPU shape of 0.4% of the pods, yet its pods ask
        for 0.03 GPUs per pod and only whole nodes can take them."""
        part = Workload.typical(dict(self.tasks), coverage)
        if wide is None:
            return part
        kept = {shape for shape, _ in part.tasks}
        counts = {s: p for s, p in self.tasks if s in kept or (s.gpus > 1 and p * s.gpus >= wide)}
        if len(counts) == len(kept):
            return part
        return Workload.typical(counts, 1.0)  # pragma: no mutate: coverage >= 1 keeps all

    def distance(self, other: "Workload") -> float:
        """Total variation distance (0 = the same, 1 = nothing in common)."""
        mine, theirs = dict(self.tasks), dict(other.tasks)
        return 0.5 * sum(abs(mine.get(s, 0.0) - theirs.get(s, 0.0)) for s in mine | theirs)


def _order(shape: TaskShape) -> tuple[object, ...]:
    return (
        shape.gpus,
        shape.mem,
        shape.core,
        shape.exclusive,
        shape.cpu_milli or 0,
        sorted(shape.gpu_spec or ()),
        shape.fraction,
    )


PRIOR = Workload.typical(
    {
        TaskShape(gpus=1, mem=MILLI, exclusive=True, fraction=True): 40.0,
        TaskShape(gpus=2, mem=MILLI, exclusive=True, fraction=True): 2.0,
        TaskShape(gpus=4, mem=MILLI, exclusive=True, fraction=True): 2.0,
        TaskShape(gpus=8, mem=MILLI, exclusive=True, fraction=True): 2.0,
        TaskShape(gpus=1, mem=125, fraction=True): 6.0,
        TaskShape(gpus=1, mem=250, fraction=True): 12.0,
        TaskShape(gpus=1, mem=500, fraction=True): 18.0,
        TaskShape(gpus=1, mem=750, fraction=True): 18.0,
    },
    coverage=1.0,
)
"""What a cluster is assumed to run before it has seen any pod: mostly whole GPUs and
sharing pods of an eighth to three quarters of a GPU, a few multi-GPU jobs (the
openb trace's mix, rounded to fractions that mean the same on any GPU size)."""


RARE_DISCOUNT = 2.0
"""Pods taken off each multi-GPU shape's count when the workload is derived, times the
share of the nodes with GPUs enough for the shape that could take it (`share`), down
to `RARE_FLOOR` of a pod. A few sightings of a rare heavy shape otherwise decide too
much while the count is young: on a cut of the openb trace (152 nodes, about 1,000
pods a run), 5 of the first 400 pods asked for 8 GPUs (1.3%, against 0.5% over the
run); the over-estimated 8-GPU demand kept the plentiful 8-GPU nodes whole and pushed
unpinned pods onto the scarce T4 nodes their pinned pods needed (gpumodel20 8.62%
unallocated against FGD's 5.44; discounted 4.90). Scaled by the share, a shape only a
few nodes can take (8 GPUs and 120 cores: 39 of the big nodes, a share of 0.06) keeps
its weight, and those nodes stay whole for it (issue 40; docs/placement.md)."""
RARE_FLOOR = 0.2
"""A discounted shape weighs at least this many pods (never more than it counts)."""

SHAPES_LIMIT = 4096
"""Distinct pod shapes a learned workload keeps. A shape holds the pod's CPU and memory
requests, which tenants choose, so without a bound a stream of pods of new shapes grows
the histogram (a decayed shape is dropped only after 40 half-lives, 200,000 pods) and the
derivation every `check_every` pods walks all of it. Past the bound the lighter half is
forgotten. A shape forgotten so weighed at most the median, under 1/2048 of the pods
kept, where the rarest shape the default's target keeps for its GPUs is an 8-GPU one of
1/400 (`lookahead.WIDE_SHARE`); the trace's lists have 86 to 260 shapes."""

Share = Callable[[TaskShape], float]
"""Of the nodes with GPUs enough for a shape, the share that could take it
(placement.supply.Supply.share)."""


class LearnedWorkload:
    """A decaying histogram of the pods seen, starting from a prior.

    Each pod counts 1 and every count decays with `half_life` pods, so the
    distribution follows a changing workload; the prior weighs `prior_weight` pods,
    so the pods seen take over quickly. The distribution is re-derived at 8, 16, 32,
    64 pods and then every `check_every` pods, and adopted (`current`) only when it
    moved by more than `tolerance` (total variation), so that scores cached under
    it stay valid most of the time. Shapes whose weight decays to a millionth of a
    pod or less are forgotten (when the weights are rescaled: every 40 half-lives), and
    the lighter half of them once more than `SHAPES_LIMIT` are counted.
    With `share`, multi-GPU shapes are discounted as they are derived (`RARE_DISCOUNT`).
    """

    def __init__(
        self,
        prior: Workload = PRIOR,
        prior_weight: float = 10.0,
        half_life: float = 5000.0,
        check_every: int = 100,
        tolerance: float = 0.05,
        share: Share | None = None,
    ) -> None:
        self._decay = 0.5 ** (1.0 / half_life)
        self._share = share
        self._check_every = check_every
        self._tolerance = tolerance
        # Weights are stored scaled up by 1/decay^n (the n-th pod weighs `_unit`),
        # so one observation is O(1); they are rescaled before they grow large.
        self._unit = 1.0
        self._counts: dict[TaskShape, float] = {s: p * prior_weight for s, p in prior.tasks}
        self._seen = 0
        self.current = prior

    @property
    def seen(self) -> int:
        return self._seen

    def observe(self, shape: TaskShape) -> bool:
        """Count one pod; True when the typical workload changed materially."""
        self._unit /= self._decay
        count = self._counts.get(shape)
        if count is None and len(self._counts) >= SHAPES_LIMIT:
            self._forget_lighter_half()
        self._counts[shape] = (count or 0.0) + self._unit
        self._seen += 1
        if self._unit > 1e12:
            self._rescale()
        if not self._due():
            return False
        candidate = Workload.typical(self._weights(), coverage=1.0)
        if candidate.distance(self.current) <= self._tolerance:
            return False
        self.current = candidate
        return True

    def _weights(self) -> Mapping[TaskShape, float]:
        """The counts the workload is derived from: multi-GPU shapes discounted."""
        share = self._share
        if share is None:
            return self._counts
        unit = self._unit
        floor = RARE_FLOOR * unit
        return {
            shape: min(count, max(count - RARE_DISCOUNT * share(shape) * unit, floor))
            if shape.gpus > 1
            else count
            for shape, count in self._counts.items()
        }

    def _due(self) -> bool:
        """Every `check_every` pods, and at 8, 16, 32, ... pods before that: the first
        pods move the distribution most, and what is placed early stays."""
        seen = self._seen
        if seen < self._check_every:
            return seen >= 8 and seen.bit_count() == 1  # a power of two
        return seen % self._check_every == 0

    @property
    def shapes(self) -> int:
        """Distinct shapes counted now (at most `SHAPES_LIMIT`)."""
        return len(self._counts)

    def _forget_lighter_half(self) -> None:
        heaviest = sorted(self._counts.items(), key=lambda item: item[1], reverse=True)
        self._counts = dict(heaviest[: SHAPES_LIMIT // 2])

    def _rescale(self) -> None:
        unit = self._unit
        self._counts = {s: w / unit for s, w in self._counts.items() if w / unit > 1e-6}
        self._unit = 1.0
