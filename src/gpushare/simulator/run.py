"""One run: one policy, one seed, the whole arrival sequence (docs/placement.md#arrival-process).

Each pod is offered once, in arrival order: the policy observes it (as the
extender's filter does), the scheduler picks the best node, the placement is
checked against an independent ledger of what each node has left, turned into
the core's allocation record and added to the node's state. A pod no node takes
fails; nothing ever leaves.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from gpushare.placement.fgd import WorkloadAwarePolicy
from gpushare.placement.fit import Assignment, PlacementPolicy, to_allocation
from gpushare.placement.fragmentation import Fragmentation
from gpushare.placement.policies import POLICIES
from gpushare.placement.workload import COVERAGE, Workload
from gpushare.request import PodRequest
from gpushare.simulator.arrival import INFLATION, arrivals
from gpushare.simulator.dra import DraMode, DraScheduler
from gpushare.simulator.kubescheduler import CHART, KubeScheduler, KubeSchedulerConfig
from gpushare.simulator.metrics import BinMeans, Recorder
from gpushare.simulator.scheduler import Scheduler
from gpushare.simulator.trace import MILLI_PER_GPU, PodClass, Trace, TraceNode, TracePod
from gpushare.state import NodeState

BOUND_AT = datetime(2023, 7, 10, tzinfo=UTC)
"""Allocation records need a bind time; the simulator has no clock."""

TRACE = "trace"
LEARNED = "learned"


class InfeasiblePlacement(RuntimeError):
    """A policy chose a placement the node cannot hold: a bug in the policy or the core."""


@dataclass(frozen=True, slots=True)
class PolicyChoice:
    """A policy of the registry (gpushare.placement.policies.POLICIES), and for workload-aware
    ones where the target workload comes from: the trace's distribution (as the FGD
    paper) or learned online (as in the extender). Written `NAME` or `NAME@trace` /
    `NAME@learned`."""

    name: str
    learned: bool = False

    @property
    def label(self) -> str:
        return f"{self.name}@{LEARNED}" if self.learned else self.name

    @classmethod
    def parse(cls, text: str) -> "PolicyChoice":
        name, _, source = text.strip().partition("@")
        if name not in POLICIES:
            raise ValueError(f"unknown placement policy {name!r}; known: {', '.join(POLICIES)}")
        if source not in ("", TRACE, LEARNED):
            raise ValueError(f"{text!r}: the workload after @ must be {TRACE!r} or {LEARNED!r}")
        if source and not isinstance(POLICIES[name](), WorkloadAwarePolicy):
            raise ValueError(f"{text!r}: policy {name} does not use a target workload")
        return cls(name, learned=source == LEARNED)

    def policy(self, trace_distribution: Workload) -> PlacementPolicy:
        """A fresh policy object for one run, so each run starts from the same
        knowledge: for workload-aware policies, the trace's pod distribution (of which
        each keeps the part it wants) or the prior it learns from."""
        policy = POLICIES[self.name]()
        if not isinstance(policy, WorkloadAwarePolicy) or self.learned:
            return policy
        return policy.with_workload(trace_distribution)


@dataclass(frozen=True, slots=True)
class RunResult:
    policy: str
    seed: int
    pods: int
    bins: dict[int, BinMeans]
    failed: dict[PodClass, int]
    failed_by_100: dict[PodClass, int]
    evaluations: int
    epochs: int
    wall_s: float
    slice_writes: int = 0
    """ResourceSlice updates a DRA driver would make (dra.py); 0 in device-plugin mode."""


class Ledger:
    """What each node has left, kept apart from the core's state, to check every
    placement against the cluster model (docs/placement.md#benchmark-cluster-model)."""

    def __init__(self, nodes: tuple[TraceNode, ...]) -> None:
        self._nodes = nodes
        self.cpu = [n.cpu_milli for n in nodes]
        self.memory = [n.memory_mib for n in nodes]
        self.gpus = [[MILLI_PER_GPU] * n.gpus for n in nodes]

    def apply(self, node: int, pod: TracePod, assignment: Assignment) -> None:
        where = f"pod {pod.name} on node {self._nodes[node].name}"
        indices = assignment.gpus[0] if assignment.gpus else ()
        if self.cpu[node] < pod.cpu_milli or self.memory[node] < pod.memory_mib:
            raise InfeasiblePlacement(f"{where}: not enough CPU or memory left")
        if pod.gpu_spec is not None and self._nodes[node].model not in pod.gpu_spec:
            raise InfeasiblePlacement(f"{where}: GPU model not in {sorted(pod.gpu_spec)}")
        free = self.gpus[node]
        if len(set(indices)) != pod.num_gpu or any(free[i] < pod.gpu_milli for i in indices):
            raise InfeasiblePlacement(f"{where}: GPUs {indices} cannot hold {pod.gpu_milli} each")
        self.cpu[node] -= pod.cpu_milli
        self.memory[node] -= pod.memory_mib
        for i in indices:
            free[i] -= pod.gpu_milli


def distribution(trace: Trace) -> Workload:
    """Every pod shape of the trace with its share of the pods."""
    return Workload.of_requests((p.request() for p in trace.pods), coverage=1.0)


def target_workload(trace: Trace) -> Workload:
    """The trace's target workload (docs/placement.md#benchmark-metrics): the shapes
    covering 95% of its pods."""
    return distribution(trace).typical_part(COVERAGE)


Progress = Callable[[int, int], None]
"""Told (pods offered so far, pods that will arrive) before each pod and at the end."""


def simulate(
    trace: Trace,
    choice: PolicyChoice,
    seed: int,
    inflation: float = INFLATION,
    progress: Progress | None = None,
    kube: KubeSchedulerConfig | None = None,
    dra: DraMode | None = None,
) -> RunResult:
    """One run. With `kube`, kube-scheduler chooses the node as configured (the
    extender's scores one of its inputs; kubescheduler.py), else the policy's best
    node does, ties to the seeded rank (the paper's scheduler). With `dra`, GPU pods
    ask for claims and kube-scheduler's DRA allocator picks their GPUs (dra.py), through
    `kube` or, without it, the chart's profile."""
    started = time.perf_counter()
    workload = target_workload(trace)
    policy = choice.policy(distribution(trace))
    arrival = arrivals(trace, seed, inflation)
    states = [NodeState(n.inventory()) for n in trace.nodes]
    for state in states:
        policy.node_seen(state.inventory)
    ledger = Ledger(trace.nodes)
    scheduler = Scheduler(states, arrival.rank, policy)
    cluster: KubeScheduler | None = None
    if kube is not None or dra is not None:
        # kube-scheduler walks its node list in the order nodes joined: the seeded rank.
        order = sorted(range(len(states)), key=arrival.rank.__getitem__)
        config = CHART if kube is None else kube
        if dra is None:
            cluster = KubeScheduler(trace.nodes, states, order, policy, config, seed)
        else:
            cluster = DraScheduler(trace.nodes, states, order, policy, config, seed, dra)
    metric = Fragmentation(workload)
    recorder = Recorder(trace.capacity, node_frag=[metric.of_view(s.view()) for s in states])
    requests: dict[TracePod, PodRequest] = {}
    epochs = {policy.epoch}
    for number, pod in enumerate(arrival.pods):
        if progress is not None:
            progress(number, len(arrival.pods))
        request = requests.get(pod)
        if request is None:
            request = requests[pod] = pod.request()
        policy.observe(request)
        epochs.add(policy.epoch)
        picked = scheduler.choose(request) if cluster is None else cluster.choose(request, pod)
        if picked is None:
            recorder.offered(pod, None, None)
            continue
        node, placement = picked
        ledger.apply(node, pod, placement.assignment)
        state = states[node]
        allocation = to_allocation(request, placement.assignment, state.inventory, BOUND_AT)
        state.add(f"{pod.name}#{number}", allocation)
        scheduler.changed(node)
        if cluster is not None:
            cluster.placed(node, pod)
        gpus = placement.assignment.gpus[0] if placement.assignment.gpus else ()
        recorder.offered(pod, node, metric.of_view(state.view()), gpus)
    if progress is not None:
        progress(len(arrival.pods), len(arrival.pods))
    return RunResult(
        policy=choice.label,
        seed=seed,
        pods=len(arrival.pods),
        bins=recorder.bins(),
        failed=dict(recorder.failed),
        failed_by_100=dict(recorder.failed_by_100),
        evaluations=scheduler.evaluations if cluster is None else cluster.evaluations,
        epochs=len(epochs),
        wall_s=time.perf_counter() - started,
        slice_writes=cluster.slice_writes if isinstance(cluster, DraScheduler) else 0,
    )
