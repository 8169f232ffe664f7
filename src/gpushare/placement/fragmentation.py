"""GPU fragmentation of a node against a target workload (Weng et al., ATC'23).

For a node with free GPU amounts g_i (milli-GPU: the free fraction of each GPU),
and a task t of the workload, f(t) is the free GPU the task could not use: the
sum of g_i over the GPUs too full for it when it fits on the node, all of it
(G = sum g_i) when it does not fit at all (too few GPUs with room, too little
CPU, wrong GPU model) or needs no GPU. F = sum_t p_t f(t).

Amounts are fractions of a GPU so nodes in GiB (Kubernetes) and in milli-GPU (the
simulator) are judged alike; whether a task fits is decided in the node's own
units. F depends only on the node's free resources, so it is memoised on them.
"""

from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpushare.memo import BoundedMemo
from gpushare.placement.fit import Assignment
from gpushare.placement.workload import MILLI, Workload
from gpushare.state import GpuView, NodeView

Device = tuple[int, int, int, bool, bool]
"""A GPU as fragmentation sees it: (free milli-GPU, memory free, compute free,
whole, open). `whole`: free of pods (exclusive tasks need it); `open`: may take
one more sharing pod."""

STRANDED_MAX_GPUS = 1
"""Stranding counts the copies of single-GPU tasks only. A multi-GPU task's copies are
whole blocks of a node, which F already judges; counting them too made the policy
break up whole nodes (measured on the multigpu50 mix, docs/placement.md#workload-mixes)."""
MEMO_LIMIT = 500_000
"""Entries each memo keeps, the oldest going first (bounds the extender's memory)."""


def free_milli(mem_free: int, core_free: int, mem_total: int, core_total: int) -> int:
    """The free fraction of a GPU in milli-GPU: the scarcer of memory and compute."""
    if mem_total <= 0:
        return 0
    free = MILLI * mem_free // mem_total
    if core_total > 0:
        free = min(free, MILLI * core_free // core_total)
    return max(free, 0)


_CLOSED: Device = (0, 0, 0, False, False)


def device(gpu: GpuView) -> Device:
    if not gpu.usable:
        return _CLOSED
    mem_free, core_free = gpu.mem_free, gpu.core_free
    # Inlined free_milli: this runs for every GPU of every node evaluated.
    mem_total, core_total = gpu.mem_total, gpu.core_total
    if mem_total <= 0:
        free = 0
    elif core_total > 0 and core_free * mem_total < mem_free * core_total:
        free = MILLI * core_free // core_total
    else:
        free = MILLI * mem_free // mem_total
    return (max(free, 0), mem_free, core_free, gpu.whole, gpu.slots > 0)


def device_left(gpu: GpuView, mem_free: int, core_free: int) -> Device:
    """The GPU once one more pod lands there, leaving (mem_free, core_free)."""
    if mem_free <= 0 or not gpu.usable:
        return (0, 0, 0, False, False)
    return (
        free_milli(mem_free, core_free, gpu.mem_total, gpu.core_total),
        mem_free,
        core_free,
        False,
        gpu.slots > 1,
    )


def devices(view: NodeView) -> list[Device]:
    return [device(g) for g in view.gpus]


def devices_after(view: NodeView, assignment: Assignment) -> list[Device]:
    added = {index: (mem, core) for index, mem, core in assignment.added}
    result = []
    for gpu in view.gpus:
        charge = added.get(gpu.index)
        if charge is None:
            result.append(device(gpu))
        else:
            result.append(device_left(gpu, gpu.mem_free - charge[0], gpu.core_free - charge[1]))
    return result


def cpu_after(view: NodeView, cpu_milli: int | None) -> int | None:
    if view.cpu_free is None:
        return None
    return view.cpu_free - (cpu_milli or 0)


def models(view: NodeView) -> frozenset[str]:
    return frozenset(g.model for g in view.gpus)


_GpuPart = tuple[int, int, int, bool, bool]
"""(gpus, mem, core, exclusive, fraction): the fields of _Group a GPU test reads."""
_Member = tuple[float, int | None, frozenset[str] | None]
"""(popularity, CPU, accepted models) of one task."""


@dataclass(frozen=True, slots=True)
class _Group:
    """Tasks that fit on the same GPUs: one GPU test serves all of them."""

    gpus: int
    mem: int
    core: int
    exclusive: bool
    fraction: bool
    members: tuple[_Member, ...]
    """(popularity, CPU, accepted models) of each task of the group."""

    def copies(self, devices: Sequence[Device]) -> tuple[int, float]:
        """How many copies of the task (a single-GPU one) the GPUs hold at once, and the
        milli-GPU each takes (averaged over the GPUs that would hold them)."""
        fitting = [d for d in devices if self.fits(d)]
        if not fitting:
            return 0, 0.0  # pragma: no mutate: no copy fits: what one would take never counts
        if self.exclusive:
            return len(fitting), float(MILLI)
        count, amount = 0, 0.0
        for d in fitting:  # a GPU the task fits on holds at least one copy
            n = d[0] // self.mem if self.fraction else d[1] // self.mem
            if self.core and not self.fraction:
                n = min(n, d[2] // self.core)
            count += n
            amount += n * self._slice(d)
        return count, amount / count

    def _slice(self, d: Device) -> float:
        """milli-GPU one slice of the task takes on a GPU it fits on (which then has
        memory free: sharing tasks ask for some)."""
        if self.fraction:
            return float(self.mem)
        return self.mem * d[0] / d[1]

    def after_one(self, d: Device) -> Device:
        """The GPU once one slice of the task (a single-GPU sharing task) lands on it,
        a GPU it fits on (so with some of what the task asks for free: sharing tasks
        ask for memory). Amounts shrink in proportion (a Device carries no totals);
        whether the GPU still takes a pod after this one is taken to be whether
        memory is left."""
        free, mem, core = d[0], d[1], d[2]
        if self.fraction:
            free_left = free - self.mem
            mem_left = mem * free_left // free
            core_left = core * free_left // free
        else:
            mem_left, core_left = mem - self.mem, core - self.core
            free_left = free * mem_left // mem
            if self.core:
                free_left = min(free_left, free * core_left // core)
        if mem_left <= 0:
            return _CLOSED
        return (max(free_left, 0), mem_left, max(core_left, 0), False, True)

    def fits(self, d: Device) -> bool:
        if self.exclusive:
            return d[3]
        if not d[4]:
            return False
        if self.fraction:
            return d[0] >= self.mem
        return d[1] >= self.mem and d[2] >= self.core


class Fragmentation:
    """F of nodes for one target workload. Not thread-safe (the memo); the extender
    serialises placement, and each simulator run has its own."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        grouped: dict[_GpuPart, list[_Member]] = {}
        self._gpu_free_weight = 0.0
        for shape, p in workload.tasks:
            if shape.gpus == 0:
                self._gpu_free_weight += p  # needs no GPU: all free GPU is fragment
                continue
            grouped.setdefault(shape.gpu_part, []).append((p, shape.cpu_milli, shape.gpu_spec))
        self._groups = tuple(
            _Group(*part, members=tuple(members)) for part, members in grouped.items()
        )
        self._strand_groups = tuple(g for g in self._groups if g.gpus <= STRANDED_MAX_GPUS)
        self._cpu_steps = sorted(
            {s.cpu_milli for s, _ in workload.tasks if s.cpu_milli is not None and s.gpus}
        )
        # expected_next depends on the CPU left only through which tasks fit and, after
        # each, which CPU step F sees: these are the thresholds that matter.
        task_cpus = {s.cpu_milli or 0 for s, _ in workload.tasks if s.gpus}
        self._next_steps = sorted(
            task_cpus | {c + step for c in task_cpus for step in self._cpu_steps}
        )
        self._memo: BoundedMemo[tuple[object, ...], float] = BoundedMemo(MEMO_LIMIT)
        self._copies: BoundedMemo[tuple[Device, ...], tuple[tuple[int, float], ...]] = BoundedMemo(
            MEMO_LIMIT
        )
        self._stranded: BoundedMemo[tuple[int, tuple[Device, ...]], float] = BoundedMemo(MEMO_LIMIT)
        self._next: BoundedMemo[tuple[object, ...], float] = BoundedMemo(MEMO_LIMIT)

    def of_view(self, view: NodeView) -> float:
        return self.of(models(view), view.cpu_free, devices(view))

    def of(self, models: frozenset[str], cpu_free: int | None, devices: Iterable[Device]) -> float:
        """F of a node with these GPU models, CPU left (None: not tracked) and GPUs."""
        # Only which CPU requests of the workload still fit matters, not the exact amount.
        cpu_step = None if cpu_free is None else bisect_right(self._cpu_steps, cpu_free)
        ordered = tuple(sorted(devices))
        key = (models, cpu_step, ordered)
        value = self._memo.get(key)
        if value is None:
            value = self._compute(models, cpu_free, ordered)
            self._memo.put(key, value)
        return value

    def stranded(self, cpu_free: int | None, devices: Iterable[Device]) -> float:
        """Free GPU the CPU left cannot feed: sum over single-GPU tasks t of p_t times the
        milli-GPU of the copies of t the GPUs could hold beyond the floor(cpu / cpu_t) the
        CPU can run. It looks past the next pod: a node whose CPU runs out before its GPUs
        do strands them, though each task alone still fits. 0 where CPU is not tracked."""
        if cpu_free is None:
            return 0.0
        ordered = tuple(sorted(devices))
        key = (cpu_free, ordered)
        value = self._stranded.get(key)
        if value is not None:
            return value
        copies = self._copies.get(ordered)
        if copies is None:
            copies = tuple(g.copies(ordered) for g in self._strand_groups)
            self._copies.put(ordered, copies)
        total = 0.0
        for group, (count, each) in zip(self._strand_groups, copies, strict=True):
            for p, cpu, _ in group.members:
                if cpu:
                    total += p * max(count - cpu_free // cpu, 0) * each
        self._stranded.put(key, total)
        return total

    def expected_next(
        self, models: frozenset[str], cpu_free: int | None, devices: Iterable[Device]
    ) -> float:
        """F after one more pod, drawn from the workload, lands on the node: the mean over
        tasks t (weighted p_t) of F once t is placed where it leaves F lowest, or of F
        as it is where t does not fit. A placement that leaves room the next pods will
        likely fill scores better than one whose leftovers wait for rare shapes.
        Pods without GPUs and multi-GPU sharing pods (rare) count as not changing F."""
        cpu_step = None if cpu_free is None else bisect_right(self._next_steps, cpu_free)
        ordered = tuple(sorted(devices))
        key = (models, cpu_step, ordered)
        value = self._next.get(key)
        if value is not None:
            return value
        base = self.of(models, cpu_free, ordered)
        total = self._gpu_free_weight * base
        for group in self._groups:
            afters = self._afters(group, ordered)
            for p, cpu, spec in group.members:
                fits = (
                    bool(afters)
                    and (cpu is None or cpu_free is None or cpu_free >= cpu)
                    and (spec is None or models <= spec)
                )
                if not fits:
                    total += p * base
                    continue
                cpu_left = None if cpu_free is None else cpu_free - (cpu or 0)
                total += p * min(self.of(models, cpu_left, after) for after in afters)
        self._next.put(key, total)
        return total

    def _afters(self, group: _Group, ordered: tuple[Device, ...]) -> list[list[Device]]:
        """The node's GPUs after each distinct way one copy of the task could land: none
        where it cannot, nor for multi-GPU sharing tasks (not modelled)."""
        if group.exclusive:
            whole = [i for i, d in enumerate(ordered) if d[3]]
            if len(whole) < group.gpus:
                return []
            after = list(ordered)
            for i in whole[: group.gpus]:  # whole GPUs of a node are alike
                after[i] = _CLOSED
            return [after]
        if group.gpus != 1:
            return []
        afters = []
        tried: set[Device] = set()
        for i, d in enumerate(ordered):
            if d in tried or not group.fits(d):
                continue
            tried.add(d)
            after = list(ordered)
            after[i] = group.after_one(d)
            afters.append(after)
        return afters

    def _compute(
        self, models: frozenset[str], cpu_free: int | None, devices: Sequence[Device]
    ) -> float:
        total = sum(d[0] for d in devices)
        if total == 0:
            return 0.0
        frag = self._gpu_free_weight * total
        for group in self._groups:
            fitting = 0
            unusable = 0
            for d in devices:
                if group.fits(d):
                    fitting += 1
                else:
                    unusable += d[0]
            gpu_fits = fitting >= group.gpus
            for p, cpu, spec in group.members:
                fits = (
                    gpu_fits
                    and (cpu is None or cpu_free is None or cpu_free >= cpu)
                    and (spec is None or models <= spec)
                )
                frag += p * (unusable if fits else total)
        return frag
