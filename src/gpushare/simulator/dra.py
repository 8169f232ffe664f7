"""DRA mode in the simulator: kube-scheduler's DynamicResources plugin allocates the GPUs.

In DRA mode (docs/dra.md) a GPU pod asks no extended resource but a ResourceClaim
of the device class `gpu.gpushare.io`, and kube-scheduler's own structured allocator
picks the devices; what the extender can still do is score nodes. What the model
follows (DRA-INTERFACES §6, docs/dra.md#the-slice):

* Node choice: kube-scheduler's (kubescheduler.py), with the DRA plugin's Filter among
  its own filters (a node where the claim cannot be allocated is not feasible, and does
  not count toward the node sample) and no GPU term in NodeResourcesFit (the pod asks
  no extended resource, so `aliyun.com/gpu-mem` is not scored). The DRA plugin scores
  no node in 1.34-1.36.
* Devices on the chosen node: the allocator walks the pool's devices in slice order
  (our slice lists `gpu-0`, `gpu-1`, ... by index) and takes, for a request of count
  N, the first N eligible ones, distinct. A device is eligible when the claim's
  selector accepts its model and what the request consumes fits what is left of
  every capacity: `memory` and `cores` as asked (exact here: milli-GPU of the
  trace), one of the 20 `shares`; a whole-GPU request asks all 20 shares and, naming
  no memory, consumes the full memory (its requestPolicy default), so it needs an
  untouched device.

The variants (`DraMode`), all through the same kube-scheduler profile:

* `dra` (first-fit): no extender; kube-scheduler's plugins choose the node, the
  allocator the first eligible devices by index.
* `dra+score` (score): our extender's prioritize still scores the nodes it is sent
  (the policy's score of its own placement, relative to the best, times the
  extender's weight); the allocator still takes the first eligible devices by index.
* `dra+order` (order): as dra+score, but the slice lists the devices in the order the
  policy prefers for the pod at hand, so the allocator takes the policy's devices: a
  driver that rewrites its slice after every change, and an upper bound of what
  reordering can do, since a slice is written before the pod it serves is known.
* `dra+fullest` (fullest): as dra+score, the slice rewritten after every change with
  the fullest device first (ties by index): an order a driver can publish without
  knowing the next pod; the allocator then takes the fullest device that fits.

Slice writes (`DraScheduler.slice_writes`): none for dra and dra+score (consumed
capacity lives in the claims, not the slice); one per GPU pod placed for dra+order;
one per placement that changes the fullest-first order for dra+fullest. Frees would
cost as many again (the simulator has no departures).
"""

from collections.abc import Hashable, Sequence
from dataclasses import replace
from enum import StrEnum

from gpushare.dra.firstfit import DeviceLeft, devices_left, first_fit
from gpushare.placement.fit import Assignment, Placement, PlacementPolicy
from gpushare.request import PodRequest
from gpushare.simulator.kubescheduler import KubeScheduler, KubeSchedulerConfig
from gpushare.simulator.trace import TraceNode, TracePod
from gpushare.state import NodeState


class DraMode(StrEnum):
    """How the devices of a claim are chosen, and whether our extender scores nodes."""

    FIRST_FIT = "first-fit"
    SCORE = "score"
    ORDER = "order"
    FULLEST = "fullest"

    @property
    def label(self) -> str:
        return "dra" if self is DraMode.FIRST_FIT else f"dra+{self.value}"

    @property
    def scored(self) -> bool:
        """Whether our extender's prioritize scores the nodes."""
        return self is not DraMode.FIRST_FIT

    def describe(self) -> str:
        devices = {
            DraMode.FIRST_FIT: "the first eligible GPUs by index",
            DraMode.SCORE: "the first eligible GPUs by index",
            DraMode.ORDER: "the policy's GPUs (the slice reordered for each pod)",
            DraMode.FULLEST: "the fullest eligible GPUs (the slice reordered fullest first)",
        }[self]
        nodes = "kube-scheduler's plugins " + (
            "and our extender's scores" if self.scored else "alone (no extender)"
        )
        return f"{self.label}: nodes by {nodes}, devices {devices}"


def preferred_order(devices: Sequence[DeviceLeft], assignment: Assignment) -> list[int]:
    """A slice order that lists the devices of `assignment` first (in its order), then the
    others by index: what a driver publishes to have the allocator take them."""
    position = {d.index: pos for pos, d in enumerate(devices)}
    first = [position[i] for gpus in assignment.gpus for i in gpus]
    return list(dict.fromkeys([*first, *range(len(devices))]))


def fullest_order(devices: Sequence[DeviceLeft]) -> list[int]:
    """The slice order with the fullest device first (least memory, then cores left;
    ties by index): on an empty node, index order."""
    return sorted(range(len(devices)), key=lambda p: (devices[p].memory, devices[p].cores, p))


def dra_config(config: KubeSchedulerConfig, mode: DraMode) -> KubeSchedulerConfig:
    """kube-scheduler's profile as it scores in DRA mode: GPU pods ask no extended resource,
    and without our extender's scores (first-fit) its weight is 0."""
    return replace(
        config,
        gpu_extended_resource=False,
        extender_weight=config.extender_weight if mode.scored else 0,
    )


class DraScheduler(KubeScheduler):
    """kube-scheduler in DRA mode: its filters and plugins choose the node (with our
    extender's scores unless `mode` is first-fit), its allocator the devices."""

    def __init__(
        self,
        nodes: Sequence[TraceNode],
        states: Sequence[NodeState],
        order: Sequence[int],
        policy: PlacementPolicy,
        config: KubeSchedulerConfig,
        seed: int,
        mode: DraMode,
    ) -> None:
        super().__init__(nodes, states, order, policy, dra_config(config, mode), seed)
        self.mode = mode
        self._fit: dict[Hashable, dict[int, tuple[int, Assignment | None]]] = {}
        self._published = [list(range(len(s.inventory.gpus))) for s in states]
        self.slice_writes = 0

    def _passes(self, node: int, pod: TracePod, request: PodRequest) -> bool:
        # The DRA plugin's Filter is one of the framework's: a node where the claim cannot
        # be allocated is not feasible, and does not count toward the sample.
        return super()._passes(node, pod, request) and self._first_fit(node, request) is not None

    def _first_fit(self, node: int, request: PodRequest) -> Assignment | None:
        """First fit in index order, cached per shape until the node changes; a node
        that cannot take a shape never can again (nodes only fill up in a run)."""
        if not request.containers:
            return Assignment(gpus=(), added=())
        known = self._fit.setdefault(request.shape, {})
        version = self._states[node].version
        cached = known.get(node)
        if cached is not None and (cached[0] == version or cached[1] is None):
            return cached[1]
        fit = first_fit(devices_left(self._states[node]), request)
        known[node] = (version, fit)
        return fit

    def choose(self, request: PodRequest, pod: TracePod) -> tuple[int, Placement] | None:
        if not self.mode.scored:
            passed = [
                (node, Placement(fit, 0.0))
                for node in self._sample(pod, request)
                if (fit := self._first_fit(node, request)) is not None
            ]
            return self._select(passed, pod) if passed else None
        picked = super().choose(request, pod)
        if picked is None:
            return None
        node, placement = picked
        assignment = self._allocate(node, request, placement.assignment)
        return node, Placement(assignment, placement.score)

    def _allocate(self, node: int, request: PodRequest, preferred: Assignment) -> Assignment:
        """The devices the allocator gives the claim on the chosen node."""
        if self.mode is DraMode.SCORE or not request.containers:
            fit = self._first_fit(node, request)
        else:
            devices = devices_left(self._states[node])
            if self.mode is DraMode.ORDER:
                order = preferred_order(devices, preferred)
            else:
                order = self._published[node]
            fit = first_fit(devices, request, order)
        assert fit is not None, "the node passed the DRA filter"
        return fit

    def placed(self, node: int, pod: TracePod) -> None:
        super().placed(node, pod)
        if not pod.num_gpu:
            return
        if self.mode is DraMode.ORDER:
            self.slice_writes += 1  # the slice is rewritten for the next pod after every change
        elif self.mode is DraMode.FULLEST:
            order = fullest_order(devices_left(self._states[node]))
            if order != self._published[node]:
                self._published[node] = order
                self.slice_writes += 1
