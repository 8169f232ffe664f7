"""Which pods to evict from a node so that a pod of higher priority fits there.

kube-scheduler picks victims by the node's sum of each resource, which knows
nothing of GPUs: two 8 GiB pods on different GPUs free 16 GiB of the node and no
16 GiB slice. `choose_victims` picks, among the pods the caller says may go, the
cheapest set whose removal makes the pod fit by the very evaluation filter uses
(`placement.evaluate`: memory and compute per GPU, pods per GPU, job types,
whole GPUs, M GPUs at once).

Cheapest is, in order: the lowest highest priority among the victims, the fewest
victims, the smallest sum of their priorities, the least GPU memory they hold.
The same order as the scheduler's own choice between nodes, less the PDB
violations, which only the scheduler can count.

Cost: a pod of one container (every pod but those with init containers or
several GPU containers) is solved GPU by GPU: per GPU, a branch and bound over
that GPU's pods (at most 20 by default; `COVER_BUDGET` steps, then a greedy
choice) for the cheapest pods that free what the pod needs there, and one
`evaluate` to confirm the M cheapest GPUs. This is exact for a pod on one GPU,
and for M GPUs when no candidate spans several GPUs. Otherwise the cheapest sets
are tried with `evaluate`, smallest first, at most `SEARCH_BUDGET` of them, after
one `evaluate` per pod for the scheduler's own method (evict every eligible pod,
then spare them one by one, most important first), which stands when the budget
runs out.
"""

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from itertools import accumulate, combinations
from math import comb

from gpushare.allocation import PodAllocation
from gpushare.placement.fit import Placement, PlacementPolicy, evaluate
from gpushare.request import ContainerRequest, JobType, PodRequest
from gpushare.state import NodeState

COVER_BUDGET = 20_000
"""Branch-and-bound steps per GPU for a one-GPU pod before taking a greedy choice."""
SEARCH_BUDGET = 128
"""Sets tried with `evaluate` per node, for pods not solved GPU by GPU."""
_COMBINATIONS_LIMIT = 5_000
"""Sets of one size listed at most at once; a larger list ends the exact search."""
_NO_VICTIM = -(2**31) - 1
"""Below every pod priority (an int32): the highest priority of an empty set."""


@dataclass(frozen=True, order=True, slots=True)
class EvictionCost:
    """Compared field by field, in this order: smaller is cheaper."""

    highest: int
    """The highest priority among the victims."""
    count: int
    priority_sum: int
    mem: int
    """GPU memory the victims hold on the node, in the node's units."""

    def within_level(self) -> tuple[int, int, int]:
        """The order among sets of one priority level: the highest priority left out."""
        return self.count, self.priority_sum, self.mem


@dataclass(frozen=True, slots=True)
class Eviction:
    pods: tuple[str, ...]
    """Pod keys to evict, sorted."""
    cost: EvictionCost
    keeps_offered: bool = False
    """True when the caller's offered set should stand unchanged: it already makes
    room and is no dearer than ours, or the pod fits without evicting anything of
    ours (what is short on the node is something else; `pods` is then empty)."""


@dataclass(frozen=True, slots=True)
class _Candidate:
    key: str
    priority: int
    charges: dict[int, tuple[int, int]]
    """Memory and compute it holds on each GPU it touches."""

    @property
    def mem(self) -> int:
        return sum(mem for mem, _ in self.charges.values())


def choose_victims(
    state: NodeState,
    request: PodRequest,
    policy: PlacementPolicy,
    priorities: Mapping[str, int],
    offered: Collection[str] = (),
    leaving: Collection[str] = (),
) -> Eviction | None:
    """The cheapest set of pods to evict from the node so that the pod fits, or None
    when it does not fit even with every eligible pod evicted.

    `priorities` names the pods that may be evicted (the caller keeps only those of
    lower priority than the pod) with their priorities; `offered` is the scheduler's
    choice; `leaving` are pods already on their way out: counted as gone, never
    chosen.
    """
    trial = _Trial(state, request, policy, leaving)
    pods = trial.state.pods
    candidates = sorted(
        (
            _Candidate(key, priorities[key], pods[key].charges())
            for key in pods
            if key in priorities
        ),
        key=lambda c: (c.priority, c.mem, c.key),
    )
    if trial.fits():
        return Eviction((), _cost(()), keeps_offered=True)
    if not trial.fits_with_only(key for key in pods if key not in priorities):
        return None
    best = _search(trial, candidates)
    ours = Eviction(tuple(sorted(c.key for c in best)), _cost(best))
    by_key = {c.key: c for c in candidates}
    theirs = [key for key in offered if key in pods]
    if theirs and all(key in by_key for key in theirs):
        cost = _cost(by_key[key] for key in theirs)
        if cost <= ours.cost and trial.fits(theirs):
            return Eviction(tuple(sorted(theirs)), cost, keeps_offered=True)
    return ours


def _cost(victims: Iterable[_Candidate]) -> EvictionCost:
    chosen = list(victims)
    priorities = [c.priority for c in chosen]
    return EvictionCost(
        max(priorities, default=_NO_VICTIM),
        len(chosen),
        sum(priorities),
        sum(c.mem for c in chosen),
    )


class _Trial:
    """The node as it will be once `leaving` is gone, with pods taken off and put
    back, asked whether the pod fits by placement's own evaluation."""

    def __init__(
        self,
        state: NodeState,
        request: PodRequest,
        policy: PlacementPolicy,
        leaving: Collection[str],
    ) -> None:
        self.state = NodeState(state.inventory)
        for key, allocation in state.pods.items():
            if key not in leaving:
                self.state.add(key, allocation)
        self.request = request
        self.policy = policy
        self.taken: dict[str, PodAllocation] = {}

    def take(self, keys: Iterable[str]) -> None:
        for key in keys:
            allocation = self.state.remove(key)
            if allocation is not None:
                self.taken[key] = allocation

    def put_back(self, keys: Iterable[str]) -> None:
        for key in keys:
            allocation = self.taken.pop(key, None)
            if allocation is not None:
                self.state.add(key, allocation)

    def fits_with_only(self, staying: Iterable[str]) -> bool:
        """Whether the pod fits with only `staying` left on the node."""
        alone = NodeState(self.state.inventory)
        for key in staying:
            alone.add(key, self.state.pods[key])
        return isinstance(evaluate(alone.view(), self.request, self.policy), Placement)

    def fits(self, removed: Iterable[str] = ()) -> bool:
        """Whether the pod fits with `removed` taken off too (they are put back)."""
        removed = [key for key in removed if key in self.state.pods]
        self.take(removed)
        try:
            return isinstance(evaluate(self.state.view(), self.request, self.policy), Placement)
        finally:
            self.put_back(removed)


def _search(trial: _Trial, candidates: list[_Candidate]) -> list[_Candidate]:
    """The cheapest victims; the caller knows that evicting every candidate makes room.

    A pod of one container is solved GPU by GPU, exactly when it needs one GPU or
    every candidate sits on one GPU (the GPUs' choices then add up). Otherwise,
    sets of the lowest sufficient priority level's pods, smallest and cheapest
    first, are checked with `evaluate` up to SEARCH_BUDGET of them (a set that
    frees less memory than the pod needs is not tried); out of budget, the per-GPU
    answer or the scheduler's method stands."""
    container = _one_container(trial.request)
    upper = _per_gpu(trial, container, candidates) if container is not None else None
    one_gpu_each = container is not None and container.gpus == 1
    if upper is not None and (one_gpu_each or all(len(c.charges) == 1 for c in candidates)):
        return upper
    level, pool = _lowest_level(trial, candidates)
    if upper is None or _cost(upper).highest > level:
        upper = _reprieve(trial, pool)
    short = trial.request.total_mem - trial.state.view().mem_free
    budget = SEARCH_BUDGET
    for size in range(1, len(upper) + 1):
        if comb(len(pool), size) > _COMBINATIONS_LIMIT:
            break
        sets = [
            victims
            for victims in combinations(pool, size)
            if any(c.priority == level for c in victims) and sum(c.mem for c in victims) >= short
        ]
        for victims in sorted(sets, key=_cost):
            budget -= 1
            if budget < 0:
                return upper
            if trial.fits(c.key for c in victims):
                return list(victims)  # no dearer than `upper`, which is among the sets
    return upper


def _lowest_level(trial: _Trial, candidates: list[_Candidate]) -> tuple[int, list[_Candidate]]:
    """The lowest priority whose pods and those below, all evicted, make room; and
    those pods. Any set that makes room holds one of that priority or more."""
    pool: list[_Candidate] = []
    for level in sorted({c.priority for c in candidates}):
        more = [c for c in candidates if c.priority == level]
        trial.take(c.key for c in more)
        pool += more
        if trial.fits():
            break
    trial.put_back(c.key for c in pool)
    return level, pool


def _reprieve(trial: _Trial, pool: list[_Candidate]) -> list[_Candidate]:
    """What kube-scheduler does: evict the whole pool, then spare each pod whose
    staying still leaves room, the most important first; among pods of one priority
    the smallest first, which spares the most of them (fewer victims is cheaper)."""
    victims = list(pool)
    trial.take(c.key for c in pool)
    for spared in sorted(pool, key=lambda c: (-c.priority, c.mem, c.key)):
        trial.put_back([spared.key])
        if trial.fits():
            victims = [c for c in victims if c is not spared]
        else:
            trial.take([spared.key])
    trial.put_back(c.key for c in victims)
    return victims


def _one_container(request: PodRequest) -> ContainerRequest | None:
    """The container of a pod that asks for GPUs in one container only, else None."""
    if request.tracks_host or len(request.containers) != 1:
        return None
    return request.containers[0]


def _mixes(pod: JobType, other: JobType) -> bool:
    """Job types that may not share a node (placement's job-type rule)."""
    return {pod, other} == {JobType.MEMORY, JobType.MEMORY_CORE}


@dataclass(frozen=True, slots=True)
class _Item:
    """A candidate as one GPU sees it: what evicting it frees there."""

    candidate: _Candidate
    mem: int
    core: int


@dataclass(frozen=True, slots=True)
class _Need:
    mem: int
    core: int
    count: int
    """Pods that must leave the GPU: for a place under the pods-per-GPU limit, or all
    of them for a whole GPU."""

    def met_by(self, items: list[_Item]) -> bool:
        return (
            sum(i.mem for i in items) >= self.mem
            and sum(i.core for i in items) >= self.core
            and len(items) >= self.count
        )


def _per_gpu(
    trial: _Trial, container: ContainerRequest, candidates: list[_Candidate]
) -> list[_Candidate] | None:
    """For a pod of one container on M GPUs: the pods of the other job type (they
    must go wherever the pod lands), plus, on each of the M GPUs whose own choice is
    cheapest, the cheapest of its pods that free what the container needs there
    (memory, compute and a place, or the whole GPU), at the lowest priority level
    where M GPUs can be freed. None when `evaluate` does not confirm it."""
    state = trial.state
    by_key = {c.key: c for c in candidates}
    forced = [c for c in candidates if _mixes(trial.request.job_type, state.pods[c.key].job_type)]
    forced_keys = {c.key for c in forced}
    floor = max((c.priority for c in forced), default=_NO_VICTIM)
    gpus: list[tuple[list[_Item], _Need]] = []
    for gpu in state.inventory.gpus:
        if not gpu.healthy or gpu.mem < container.mem or gpu.core < container.core:
            continue
        mem, core, count = state.used(gpu.index)
        items = []
        for key in sorted(state.pods_on(gpu.index)):
            if key in forced_keys:
                freed_mem, freed_core = by_key[key].charges[gpu.index]
                mem, core, count = mem - freed_mem, core - freed_core, count - 1
            elif key in by_key:
                items.append(_Item(by_key[key], *by_key[key].charges[gpu.index]))
        if container.exclusive:
            need = _Need(0, 0, count)
        else:
            need = _Need(
                mem=container.mem - (gpu.mem - mem),
                core=container.core - (gpu.core - core),
                count=count - state.inventory.max_pods_per_gpu + 1,
            )
        gpus.append((items, need))
    for level in sorted({max(c.priority, floor) for c in candidates}):
        pools = [
            ([i for i in items if i.candidate.priority <= level], need) for items, need in gpus
        ]
        freeable = [(pool, need) for pool, need in pools if need.met_by(pool)]
        if len(freeable) < container.gpus:
            continue
        covers = [_CoverSearch(pool, need).run() for pool, need in freeable]
        # Stable: ties go to the lowest index.
        covers.sort(key=lambda cover: _cost(cover).within_level())
        chosen = {c.key: c for c in forced}
        for cover in covers[: container.gpus]:
            chosen.update((c.key, c) for c in cover)
        victims = list(chosen.values())
        return victims if trial.fits(c.key for c in victims) else None
    return None


class _CoverSearch:
    """Fewest items meeting the need, then least (priority sum, memory): sizes in
    increasing order, each searched by branch and bound over the items sorted by
    priority, pruned by what the rest could still free and at least cost."""

    def __init__(self, pool: list[_Item], need: _Need) -> None:
        self.items = sorted(
            pool, key=lambda i: (i.candidate.priority, i.candidate.mem, i.candidate.key)
        )
        self.need = need
        self.budget = COVER_BUDGET
        items, n = self.items, len(self.items)
        self.priority_sums = _sums([i.candidate.priority for i in items])
        # Per suffix start, prefix sums of its largest frees and of its smallest memory.
        self.most_mem = [_sums(sorted((i.mem for i in items[s:]), reverse=True)) for s in range(n)]
        self.most_core = [
            _sums(sorted((i.core for i in items[s:]), reverse=True)) for s in range(n)
        ]
        self.least_mem = [_sums(sorted(i.candidate.mem for i in items[s:])) for s in range(n)]
        self.best: list[_Item] | None = None
        self.best_key = (0, 0)  # pragma: no mutate: read only once self.best is set

    def run(self) -> list[_Candidate]:
        """The cheapest cover; the caller knows that all the items meet the need."""
        need = self.need
        mems = _sums(sorted((i.mem for i in self.items), reverse=True))
        cores = _sums(sorted((i.core for i in self.items), reverse=True))
        smallest = max(
            need.count,
            next(k for k, freed in enumerate(mems) if freed >= need.mem),
            next(k for k, freed in enumerate(cores) if freed >= need.core),
        )
        for size in range(smallest, len(self.items) + 1):
            self._step(0, size, [], 0, 0, 0, 0)
            if self.best is not None:
                return [i.candidate for i in self.best]
            if self.budget < 0:
                break
        return [i.candidate for i in self._greedy()]

    def _step(
        self, start: int, left: int, chosen: list[_Item], prio: int, mem: int, gmem: int, gcore: int
    ) -> None:
        """Extends `chosen` by `left` more items from `start` on (prio and mem: the cost
        so far; gmem and gcore: what it frees on the GPU)."""
        self.budget -= 1
        if self.budget < 0:
            return
        if left == 0:
            if (
                gmem >= self.need.mem
                and gcore >= self.need.core
                and (self.best is None or (prio, mem) < self.best_key)
            ):
                self.best, self.best_key = list(chosen), (prio, mem)
            return
        if len(self.items) - start < left:
            return
        if (
            gmem + self.most_mem[start][left] < self.need.mem
            or gcore + self.most_core[start][left] < self.need.core
        ):
            return
        at_least = (
            prio + self.priority_sums[start + left] - self.priority_sums[start],
            mem + self.least_mem[start][left],
        )
        if self.best is not None and at_least >= self.best_key:
            return
        item = self.items[start]
        chosen.append(item)
        self._step(
            start + 1,
            left - 1,
            chosen,
            prio + item.candidate.priority,
            mem + item.candidate.mem,
            gmem + item.mem,
            gcore + item.core,
        )
        chosen.pop()
        self._step(start + 1, left, chosen, prio, mem, gmem, gcore)

    def _greedy(self) -> list[_Item]:
        """Out of budget: cheapest first until the need is met, then spare what is not
        needed, dearest first."""
        chosen: list[_Item] = []
        for item in self.items:
            if self.need.met_by(chosen):
                break
            chosen.append(item)
        for item in reversed(list(chosen)):
            rest = [i for i in chosen if i is not item]
            if self.need.met_by(rest):
                chosen = rest
        return chosen


def _sums(values: list[int]) -> list[int]:
    """Prefix sums: entry k is the sum of the first k values."""
    return list(accumulate(values, initial=0))
