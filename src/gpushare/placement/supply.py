"""What the cluster's nodes can hold: for a pod shape, how many of the nodes with GPUs
enough for it could take it (its CPU, the GPU models it accepts).

A learned workload weighs a few sightings of a multi-GPU shape by it
(`LearnedWorkload`, `RARE_DISCOUNT`): a shape most big nodes can take is discounted,
one that only a few nodes can take is not. The owner of a policy (the extender's
answer engine, the simulator) tells it the nodes (`PlacementPolicy.node_seen`); the
policy's own evaluations are no census, since the extender evaluates nodes in the same
state once for all of them.
"""

from dataclasses import dataclass

from gpushare.inventory import NodeGpus
from gpushare.memo import BoundedMemo
from gpushare.placement.workload import TaskShape

SHARES_LIMIT = 4096
"""Shares kept between node changes. The shapes are the pods' (a tenant picks its CPU
request, so each pod may bring a new one): unbounded, the cache would grow with them."""


@dataclass(frozen=True, slots=True)
class NodeSupply:
    """What a node could hold when empty: its GPUs' models, its CPU where tracked."""

    models: tuple[str, ...]
    """One per GPU, sorted."""
    cpu_total: int | None

    @classmethod
    def of(cls, node: NodeGpus) -> "NodeSupply":
        return cls(tuple(sorted(g.model for g in node.gpus)), node.cpu_milli)

    def takes(self, shape: TaskShape) -> bool:
        """Whether the node, empty, could take a pod of the shape."""
        cpu, capacity = shape.cpu_milli, self.cpu_total
        if cpu is not None and capacity is not None and cpu > capacity:
            return False
        spec = shape.gpu_spec
        accepted = self.models if spec is None else [m for m in self.models if m in spec]
        return len(accepted) >= shape.gpus


class Supply:
    """The nodes a policy was told of, and per shape the share of those with GPUs
    enough for it that could take it."""

    def __init__(self) -> None:
        self._nodes: dict[str, NodeSupply] = {}
        self._shares: BoundedMemo[TaskShape, float] = BoundedMemo(SHARES_LIMIT)

    def __len__(self) -> int:
        return len(self._nodes)

    def seen(self, node: NodeGpus) -> None:
        supply = NodeSupply.of(node)
        if self._nodes.get(node.node) != supply:
            self._nodes[node.node] = supply
            self._shares.clear()

    def gone(self, name: str) -> None:
        if self._nodes.pop(name, None) is not None:
            self._shares.clear()

    def share(self, shape: TaskShape) -> float:
        """Of the nodes with at least the shape's GPUs, the share that could take it;
        1 while no node that big is known (nothing says the shape is scarce)."""
        known = self._shares.get(shape)
        if known is not None:
            return known
        sized = [n for n in self._nodes.values() if len(n.models) >= shape.gpus]
        share = sum(1 for n in sized if n.takes(shape)) / len(sized) if sized else 1.0
        return self._shares.put(shape, share)
