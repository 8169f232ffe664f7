"""Fit and choice: does a pod fit on a node, and on which GPUs.

The search is exact (every assignment is tried before "does not fit" is
said, within a step budget) and the policy only orders the candidates, so
every policy agrees on what fits and differs only in what it prefers.
"""

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from itertools import combinations
from typing import ClassVar

from gpushare.allocation import ContainerAllocation, GpuSlice, PodAllocation
from gpushare.errors import Refusal, Rule
from gpushare.inventory import NodeGpus
from gpushare.labels import LABEL_SCHEDULE, NodeMode
from gpushare.request import ContainerRequest, JobType, PodRequest
from gpushare.resources import GPU_CORE
from gpushare.state import GpuView, NodeView

SEARCH_BUDGET = 4096
"""Candidate combinations tried per pod and node before giving up; pods of a few
containers on 8 GPUs need far fewer."""

GpuKey = Callable[[GpuView, int, int], tuple[int, ...]]
"""Orders candidate GPUs for one container, smallest first: called with the GPU,
its memory free after the container lands there and its compute free after."""


@dataclass(frozen=True, slots=True)
class Assignment:
    gpus: tuple[tuple[int, ...], ...]
    """GPU indices per container, in the order of the request's containers."""
    added: tuple[tuple[int, int, int], ...]
    """(GPU index, memory, compute) the pod adds to each GPU it touches."""

    @property
    def added_mem(self) -> int:
        return sum(mem for _, mem, _ in self.added)


@dataclass(frozen=True, slots=True)
class Placement:
    assignment: Assignment
    score: float
    """0..100, higher is better (the scheduler framework's node-score range)."""


class PlacementPolicy(ABC):
    """Chooses GPUs within a node and scores the node. The extender and the simulator
    call the very same classes, each through objects of its own (made from the
    registry, gpushare.placement.policies): a policy that learns keeps what it learned in them."""

    name: ClassVar[str]
    nameless: ClassVar[bool] = False
    """Whether the policy judges a node by its state alone, never by its name: then
    nodes in the same state get the same placement and score, and the extender
    evaluates each distinct state once for all of them. False unless a policy says so."""
    epoch: int = 0
    """Bumped by policies that learn, whenever what they learned changes their scores,
    so cached placements made under the old knowledge are not reused."""

    def place(self, view: NodeView, request: PodRequest) -> Placement | None:
        assignment = search(view, request, self.gpu_key)
        if assignment is None:
            return None
        return Placement(assignment, self.score(view, request, assignment))

    def observe(self, request: PodRequest) -> None:
        """Learn from a pod the scheduler asks about (the extender calls this once per
        pod at filter time). Policies that adapt to the workload override it."""
        return None

    def node_seen(self, node: NodeGpus) -> None:
        """Told of a node of the cluster (what it has, not what runs on it) when it joins
        or changes, whether or not a pod is being placed. Policies that weigh what the
        cluster could hold override it."""
        return None

    def node_gone(self, name: str) -> None:
        """Told that a node left the cluster."""
        return None

    @abstractmethod
    def gpu_key(self, gpu: GpuView, mem_after: int, core_after: int) -> tuple[int, ...]: ...

    @abstractmethod
    def score(self, view: NodeView, request: PodRequest, assignment: Assignment) -> float: ...


def evaluate(view: NodeView, request: PodRequest, policy: PlacementPolicy) -> Placement | Refusal:
    """The policy's placement of the pod on the node, or why there is none."""
    refusal = check_node(view, request)
    if refusal is not None:
        return refusal
    placement = policy.place(view, request)
    return placement if placement is not None else diagnose(view, request)


def extender_score(score: float) -> int:
    """A policy score (0..100) as a 0..10 integer on its own (what the extender sent
    kube-scheduler before issue 40; the simulator's model of that release)."""
    return min(10, max(0, round(score / 10)))


def relative_score(best: float, score: float) -> int:
    """A policy score (0..100) as the extender's 0..10 integer, against the best score
    among the candidate nodes: 10 for the best, one less for each point (a step of
    FGD's score) below it, 0 from ten points down. kube-scheduler adds its own plugins'
    scores to the extender's times its weight and takes the highest: scores on their
    own (score / 10) tie every node within ten points of each other and let its
    plugins choose among them, which lost the policy's choice (issue 40); relative,
    the nodes the policy prefers are exactly those with 10."""
    return max(0, 10 - math.ceil(best - score))


def check_node(view: NodeView, request: PodRequest) -> Refusal | None:
    """Rules that hold whatever runs on the node: mode, GPU count and size, job type."""
    if view.mode is None:
        return Refusal(
            Rule.NODE_NOT_SHARED,
            f"node {view.name} does not share GPUs: label it "
            f"{LABEL_SCHEDULE}=share, cgpu or core_mem",
        )
    if request.uses_core and view.mode != NodeMode.CORE_MEM:
        return Refusal(
            Rule.NODE_MODE_NO_COMPUTE,
            f"node {view.name} is in mode {view.mode}, which does not isolate compute; "
            f"{GPU_CORE} needs a node labelled {LABEL_SCHEDULE}=core_mem",
        )
    if request.tracks_host:
        host = _check_host(view, request)
        if host is not None:
            return host
    if not request.containers:
        return None
    if view.unknown:
        return Refusal(
            Rule.UNKNOWN_ALLOCATION,
            f"node {view.name} holds pods whose GPU allocation record cannot be trusted "
            f"({', '.join(view.unknown)}), so what its GPUs have free is not known; it "
            "takes no GPU pod until their records are repaired or they are deleted",
        )
    if not view.gpus:
        return Refusal(
            Rule.TOO_FEW_GPUS,
            f"node {view.name} reports no GPUs (is the gpushare device plugin running there?)",
        )
    for container in request.containers:
        refusal = _check_size(view, container)
        if refusal is not None:
            return refusal
    mixing = _check_job_type(view, request.job_type)
    if mixing is not None:
        return mixing
    healthy = sum(1 for g in view.gpus if g.healthy)
    needed = max(c.gpus for c in request.containers)
    if healthy < needed:
        return Refusal(
            Rule.UNHEALTHY_GPUS,
            f"node {view.name} has {healthy} healthy GPUs; the pod needs {needed}",
        )
    return None


def _check_host(view: NodeView, request: PodRequest) -> Refusal | None:
    """CPU, host memory and GPU model, where both the node and the pod track them."""
    cpu, free_cpu = request.cpu_milli, view.cpu_free
    if cpu is not None and free_cpu is not None and free_cpu < cpu:
        return Refusal(
            Rule.INSUFFICIENT_CPU,
            f"the pod needs {cpu} milli-CPU; node {view.name} has {free_cpu} left",
        )
    memory, free_memory = request.memory_mib, view.memory_free
    if memory is not None and free_memory is not None and free_memory < memory:
        return Refusal(
            Rule.INSUFFICIENT_HOST_MEMORY,
            f"the pod needs {memory} MiB of host memory; node {view.name} has "
            f"{free_memory} MiB left",
        )
    spec = request.gpu_spec
    if spec is not None and request.containers and not any(g.model in spec for g in view.gpus):
        models = ", ".join(sorted({g.model for g in view.gpus})) or "none"
        return Refusal(
            Rule.GPU_MODEL,
            f"the pod accepts GPU models {', '.join(sorted(spec))}; node {view.name} has {models}",
        )
    return None


def _check_size(view: NodeView, container: ContainerRequest) -> Refusal | None:
    if container.gpus > len(view.gpus):
        return Refusal(
            Rule.TOO_FEW_GPUS,
            f"container {container.name!r} needs {container.gpus} GPUs; "
            f"node {view.name} has {len(view.gpus)}",
        )
    if container.exclusive:
        return None
    big_enough = [
        g for g in view.gpus if g.mem_total >= container.mem and g.core_total >= container.core
    ]
    if len(big_enough) < container.gpus:
        largest = max(g.mem_total for g in view.gpus)
        return Refusal(
            Rule.GPU_TOO_SMALL,
            f"container {container.name!r} needs {container.mem} GiB on each of "
            f"{container.gpus} GPU(s); the largest GPU on node {view.name} has {largest} GiB",
        )
    return None


def _check_job_type(view: NodeView, job_type: JobType) -> Refusal | None:
    if job_type is JobType.MEMORY and JobType.MEMORY_CORE in view.job_types:
        return Refusal(
            Rule.JOB_TYPE_MIXING,
            f"node {view.name} runs pods with {GPU_CORE}; pods that ask for GPU memory "
            f"only are not placed beside them",
        )
    if job_type is JobType.MEMORY_CORE and JobType.MEMORY in view.job_types:
        return Refusal(
            Rule.JOB_TYPE_MIXING,
            f"node {view.name} runs pods that ask for GPU memory only; pods with "
            f"{GPU_CORE} are not placed beside them",
        )
    return None


def search(view: NodeView, request: PodRequest, key: GpuKey) -> Assignment | None:
    """An assignment of every container to GPUs, preferring what `key` ranks first."""
    return _Search(view, request, key).run()


def slice_candidates(view: NodeView, request: PodRequest) -> list[tuple[GpuView, int, int]] | None:
    """For a pod of one shared container on one GPU, every GPU it fits on (index order)
    with the memory and compute that GPU has left after it; None for other pods.

    Policies that weigh each GPU (FGD) choose from these instead of taking the
    search's first; the fit rule is the search's own."""
    if len(request.containers) != 1:
        return None
    container = request.containers[0]
    if container.exclusive or container.gpus != 1:
        return None
    candidates = []
    for gpu in view.gpus:
        after = _alone(gpu, container, request.gpu_spec)
        if after is not None:
            candidates.append((gpu, *after))
    return candidates


def slice_assignment(request: PodRequest, gpu: GpuView) -> Assignment:
    """The assignment of a pod of one shared container to one of its slice_candidates."""
    container = request.containers[0]
    return Assignment(gpus=((gpu.index,),), added=((gpu.index, container.mem, container.core),))


def _alone(
    gpu: GpuView, container: ContainerRequest, models: frozenset[str] | None
) -> tuple[int, int] | None:
    """Memory and compute free on a GPU the pod has not touched yet if the container
    lands there, or None when it does not fit."""
    if models is not None and gpu.model not in models:
        return None
    if container.exclusive:
        return (0, 0) if gpu.whole else None
    if not gpu.usable or gpu.slots < 1:
        return None
    if container.mem > gpu.mem_free or container.core > gpu.core_free:
        return None
    return gpu.mem_free - container.mem, gpu.core_free - container.core


class _Search:
    def __init__(self, view: NodeView, request: PodRequest, key: GpuKey) -> None:
        self.gpus = view.gpus
        self.containers = request.containers
        self.models = request.gpu_spec
        self.key = key
        size = len(view.gpus)
        # The pod's own charge so far on each GPU position.
        self.run_mem = [0] * size
        self.run_core = [0] * size
        self.init_mem = [0] * size
        self.init_core = [0] * size
        self.touched = [0] * size
        self.exclusive = [False] * size
        self.chosen: list[tuple[int, ...]] = [()] * len(request.containers)
        self.budget = SEARCH_BUDGET
        # Hardest first: whole GPUs, then many GPUs, then big slices; init containers
        # last, because they can reuse what the app containers already hold.
        self.order = sorted(
            range(len(self.containers)),
            key=lambda i: (
                not self.containers[i].role.runs_with_apps,
                not self.containers[i].exclusive,
                -self.containers[i].gpus,
                -self.containers[i].mem,
                -self.containers[i].core,
            ),
        )

    def run(self) -> Assignment | None:
        if not self._place(0):
            return None
        added = []
        for pos, gpu in enumerate(self.gpus):
            if self.touched[pos]:
                added.append((gpu.index, *self._charge(pos)))
        gpus = tuple(tuple(self.gpus[p].index for p in chosen) for chosen in self.chosen)
        return Assignment(gpus=gpus, added=tuple(added))

    def _charge(self, pos: int) -> tuple[int, int]:
        if self.exclusive[pos]:
            gpu = self.gpus[pos]
            return gpu.mem_total, gpu.core_total
        return (
            max(self.run_mem[pos], self.init_mem[pos]),
            max(self.run_core[pos], self.init_core[pos]),
        )

    def _after(self, pos: int, container: ContainerRequest) -> tuple[int, int] | None:
        """Memory and compute free on the GPU if the container lands there, or None."""
        gpu = self.gpus[pos]
        if not self.touched[pos]:
            return _alone(gpu, container, self.models)
        if self.models is not None and gpu.model not in self.models:
            return None
        if container.exclusive or not gpu.usable or self.exclusive[pos]:
            return None
        if container.role.runs_with_apps:
            mem = max(self.run_mem[pos] + container.mem, self.init_mem[pos])
            core = max(self.run_core[pos] + container.core, self.init_core[pos])
        else:
            mem = max(self.run_mem[pos], self.init_mem[pos], container.mem)
            core = max(self.run_core[pos], self.init_core[pos], container.core)
        if mem > gpu.mem_free or core > gpu.core_free:
            return None
        return gpu.mem_free - mem, gpu.core_free - core

    def _apply(self, pos: int, container: ContainerRequest, sign: int) -> None:
        self.touched[pos] += sign
        if container.exclusive:
            self.exclusive[pos] = sign > 0
        elif container.role.runs_with_apps:
            self.run_mem[pos] += sign * container.mem
            self.run_core[pos] += sign * container.core
        # Init peaks are restored by the caller, which saved them.

    def _place(self, depth: int) -> bool:
        if depth == len(self.order):
            return True
        index = self.order[depth]
        container = self.containers[index]
        candidates = []
        for pos in range(len(self.gpus)):
            after = self._after(pos, container)
            if after is not None:
                candidates.append((self.key(self.gpus[pos], *after), pos))
        if len(candidates) < container.gpus:
            return False
        candidates.sort()
        ordered = [pos for _, pos in candidates]
        for combo in combinations(ordered, container.gpus):
            self.budget -= 1
            if self.budget < 0:
                return False
            saved = [(p, self.init_mem[p], self.init_core[p]) for p in combo]
            for pos in combo:
                self._apply(pos, container, +1)
                if not container.role.runs_with_apps and not container.exclusive:
                    self.init_mem[pos] = max(self.init_mem[pos], container.mem)
                    self.init_core[pos] = max(self.init_core[pos], container.core)
            self.chosen[index] = combo
            if self._place(depth + 1):
                return True
            for pos, init_mem, init_core in saved:
                self._apply(pos, container, -1)
                self.init_mem[pos], self.init_core[pos] = init_mem, init_core
        return False


def diagnose(view: NodeView, request: PodRequest) -> Refusal:
    """Why the pod has no assignment on a node that passed check_node."""
    for container in request.containers:
        refusal = _diagnose_alone(view, container)
        if refusal is not None:
            return refusal
    return Refusal(
        Rule.NO_JOINT_FIT,
        f"each container fits on node {view.name} alone, but not all together "
        f"({request.describe()})",
    )


def _diagnose_alone(view: NodeView, c: ContainerRequest) -> Refusal | None:
    where = f"container {c.name!r} needs {c.describe()}"
    if c.exclusive:
        whole = sum(1 for g in view.gpus if g.whole)
        if whole < c.gpus:
            return Refusal(
                Rule.NO_FREE_GPU,
                f"{where}; {whole} of the {len(view.gpus)} GPUs on node {view.name} "
                f"are free of other pods",
            )
        return None
    usable = [g for g in view.gpus if g.usable]
    with_mem = [g for g in usable if g.mem_free >= c.mem]
    if len(with_mem) < c.gpus:
        most = max((g.mem_free for g in usable), default=0)
        return Refusal(
            Rule.INSUFFICIENT_MEMORY,
            f"{where}; the most GPU memory free on one GPU of node {view.name} is {most} GiB",
        )
    with_core = [g for g in with_mem if g.core_free >= c.core]
    if len(with_core) < c.gpus:
        most = max(g.core_free for g in with_mem)
        return Refusal(
            Rule.INSUFFICIENT_CORE,
            f"{where}; among GPUs of node {view.name} with the memory free, the most "
            f"compute free is {most} percent",
        )
    if sum(1 for g in with_core if g.slots > 0) < c.gpus:
        return Refusal(
            Rule.PODS_PER_GPU,
            f"{where}; the GPUs of node {view.name} with room already hold the "
            f"maximum number of pods per GPU",
        )
    return None


def to_allocation(
    request: PodRequest, assignment: Assignment, inventory: NodeGpus, bound_at: datetime
) -> PodAllocation:
    """The allocation record for a pod placed by `assignment` on the node."""
    containers = []
    for container, indices in zip(request.containers, assignment.gpus, strict=True):
        slices = []
        for index in indices:
            gpu = inventory.gpu(index)
            slices.append(
                GpuSlice(
                    index=index,
                    uuid=gpu.uuid,
                    mem=gpu.mem if container.exclusive else container.mem,
                    core=gpu.core if container.exclusive else container.core,
                    gpu_mem=gpu.mem,
                )
            )
        containers.append(
            ContainerAllocation(
                name=container.name,
                role=container.role,
                index=container.index,
                gpus=tuple(slices),
                exclusive=container.exclusive,
            )
        )
    return PodAllocation(
        node=inventory.node,
        bound_at=bound_at,
        containers=tuple(containers),
        cpu_milli=request.cpu_milli,
        memory_mib=request.memory_mib,
    )
