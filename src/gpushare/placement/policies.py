"""The placement policies the extender chooses from, by name.

binpack fills the fullest GPU that fits (fewer GPUs touched, more whole GPUs left);
spread picks the emptiest (less interference between pods). The fragmentation-aware
policies live in their own modules: bestfit (the FGD paper's packing baseline), fgd
(the paper's policy) and fgd-lookahead (ours: FGD plus CPU look-ahead and a preference
for nodes in use; it leaves fewer GPUs unallocated, see docs/placement.md).
"""

from collections.abc import Callable, Mapping
from types import MappingProxyType

from gpushare.placement.bestfit import BestFitPolicy
from gpushare.placement.fgd import FgdPolicy
from gpushare.placement.fit import Assignment, PlacementPolicy
from gpushare.placement.lookahead import LookaheadFgdPolicy
from gpushare.request import PodRequest
from gpushare.state import GpuView, NodeView


def _free_after(view: NodeView, assignment: Assignment) -> float:
    total = view.mem_total
    if total <= 0:
        return 0.0
    return max(view.mem_free - assignment.added_mem, 0) / total


class BinpackPolicy(PlacementPolicy):
    name = "binpack"
    nameless = True

    def gpu_key(self, gpu: GpuView, mem_after: int, core_after: int) -> tuple[int, ...]:
        return (mem_after, core_after, gpu.index)

    def score(self, view: NodeView, request: PodRequest, assignment: Assignment) -> float:
        return 100.0 * (1.0 - _free_after(view, assignment))


class SpreadPolicy(PlacementPolicy):
    name = "spread"
    nameless = True

    def gpu_key(self, gpu: GpuView, mem_after: int, core_after: int) -> tuple[int, ...]:
        return (-mem_after, -core_after, gpu.index)

    def score(self, view: NodeView, request: PodRequest, assignment: Assignment) -> float:
        return 100.0 * _free_after(view, assignment)


PolicyFactory = Callable[[], PlacementPolicy]
"""Makes a fresh policy object: policies that learn keep what they learned in it."""

POLICIES: Mapping[str, PolicyFactory] = MappingProxyType(
    {
        BinpackPolicy.name: BinpackPolicy,
        SpreadPolicy.name: SpreadPolicy,
        BestFitPolicy.name: BestFitPolicy,
        FgdPolicy.name: FgdPolicy,
        LookaheadFgdPolicy.name: LookaheadFgdPolicy,
    }
)
"""Every placement policy by name, as the factory of its objects. Read-only: each
user (an extender, a simulator run) makes its own objects with `build`, so what a
policy learns belongs to that user alone; tests pass their own registry."""

OUR_POLICY = LookaheadFgdPolicy.name
"""The fragmentation-aware policy this project recommends (and `gpushare simulate` runs first)."""

DEFAULT_PLACEMENT = OUR_POLICY
"""The extender's policy where neither a pod annotation nor a node label names one: it
leaves no more GPUs unallocated than FGD on every measured workload mix (fewer on all
but one) and costs about what binpack costs per pod (docs/placement.md)."""


def build(registry: Mapping[str, PolicyFactory] = POLICIES) -> dict[str, PlacementPolicy]:
    """A fresh object of every policy of the registry, by name."""
    return {name: factory() for name, factory in registry.items()}
