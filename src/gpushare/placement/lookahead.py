"""fgd-lookahead: FGD that looks past the next pod, and fills nodes already in use.

FGD (fgd.py) scores a placement by how much the node's fragmentation F grows: the
free GPU the next pod of the target workload could not use. Three things it does not
see cost GPUs in the openb replay (docs/placement.md#the-benchmark), and this policy adds them:

* What the next pod will make of the leftover. F judges a GPU left with 350 of 1000
  free by which tasks do not fit in 350; it does not see that a popular 320 task
  would then leave 30, while 190 left beside an 810 task stays waste for good.
  `Fragmentation.expected_next` is F after one more pod drawn from the workload
  lands where it leaves F lowest; the waste counts its change from F, weighted by
  `next_weight`, on nodes that already run pods (an empty node is judged by F).
* CPU that runs out before the GPUs do. F asks whether one more pod of each kind
  fits; a node with four free GPUs and CPU for one more pod looks fine to it, yet
  three of those GPUs will never be used. `Fragmentation.stranded` counts, per task
  of the workload, the GPU its copies could fill beyond what the CPU left can feed.
  Its growth is added to F's, weighted by `cpu_weight`.
* Tasks pinned to other GPU models. FGD's F counts all of a node's free GPU as
  fragment for them; that term only shrinks as the node fills, most on the scarce
  models' nodes, so FGD steers unpinned pods onto the nodes pinned pods need (on the
  gpuspec33 mix it left more GPUs unallocated than binpack). Here F leaves them out
  (`other_models = False`; docs/placement.md#workload-mixes).
* Which of equally good nodes to use. Scores stay FGD's integer steps (coarse steps
  make the scheduler fill the same nodes first, which measured far better than
  finer scores); among equal steps a node whose GPUs already hold pods wins over
  one whose GPUs are all free, so whole nodes stay free for multi-GPU pods.

On Kubernetes nodes CPU is not tracked (the kube-scheduler checks it), so the
stranding term is 0 and the policy is FGD with the look-ahead and the occupied-node
preference; GPU amounts are fractions of a GPU either way, so GiB and milli-GPU
nodes compare.
"""

from typing import ClassVar

from gpushare.placement.fgd import WorkloadAwarePolicy, fgd_score
from gpushare.placement.fragmentation import Device
from gpushare.state import NodeView

OCCUPIED_BONUS = 0.5
"""Added to the integer score of a node already running pods: wins ties, never a step."""


class LookaheadFgdPolicy(WorkloadAwarePolicy):
    name = "fgd-lookahead"
    other_models = False  # see the module docstring: tasks pinned to other models
    cpu_weight: ClassVar[float] = 0.15
    """Weight of stranded-GPU growth against F's growth (0.1-0.25 measured best)."""

    next_weight: ClassVar[float] = 0.5
    """Weight of the expected change of F from the next pod. Up to 2.5 all measured
    better than 0 on the openb replay, 2 best, 3 or more collapse; but from about 1
    a slice would rather open a fresh GPU than complete a half-used one (two half
    GPUs have a high F that the next pod is expected to lower, which then looks like
    progress). 0.5 keeps the plain cases right."""

    def waste(self, models: frozenset[str], cpu_free: int | None, gpus: list[Device]) -> float:
        frag = self.fragmentation
        now = frag.of(models, cpu_free, gpus) + self.cpu_weight * frag.stranded(cpu_free, gpus)
        if all(d[3] or not d[0] for d in gpus):
            # A node without pods is judged by F alone. Scores compare changes, and the
            # next pod would fragment an empty node: counting that would make opening
            # one look cheap, and whole nodes are what multi-GPU pods need (measured:
            # fewer of them failed, and fewer GPUs were left unallocated).
            return now
        after_next = frag.expected_next(models, cpu_free, gpus)
        return now + self.next_weight * (after_next - frag.of(models, cpu_free, gpus))

    def rate(self, view: NodeView, growth: float) -> float:
        return fgd_score(growth) + (OCCUPIED_BONUS if occupied(view) else 0.0)


def occupied(view: NodeView) -> bool:
    """A GPU of the node holds a pod. (Counting CPU-only pods too measured no better.)"""
    return any(not g.whole for g in view.gpus if g.healthy)
