"""The node choice of the paper's scheduler: the best score wins, ties to the lowest rank.

Every node is evaluated with the core's `evaluate` and the policy under test, as
the extender evaluates the nodes kube-scheduler sends it; this module only avoids
evaluating a node twice in the same state. Per request shape it keeps a heap of
(score, rank) over the nodes that fit, and re-evaluates only the nodes that
changed since the shape was last asked for. Nodes only ever fill up in a run (no
departures), so a node that cannot take a shape never can again and is dropped
for that shape. A policy that bumps its epoch (it learned something) gets every
node re-evaluated.
"""

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpushare.errors import Refusal
from gpushare.placement import Placement, PlacementPolicy, evaluate
from gpushare.request import PodRequest
from gpushare.state import NodeState

_Entry = tuple[float, int, int, int, Placement]
"""(-score, rank, node state version, node, placement): heap order is best first."""


@dataclass(slots=True)
class _ShapeIndex:
    epoch: int
    seen: int = 0
    """How much of the change log this index has taken in."""
    heap: list[_Entry] = field(default_factory=list)
    unfit: set[int] = field(default_factory=set)


class Scheduler:
    def __init__(
        self, states: Sequence[NodeState], rank: Sequence[int], policy: PlacementPolicy
    ) -> None:
        if len(states) != len(rank):
            raise ValueError("one rank per node is needed")
        self._states = states
        self._rank = rank
        self._policy = policy
        self._changes: list[int] = []
        self._shapes: dict[tuple[object, ...], _ShapeIndex] = {}
        self.evaluations = 0

    def changed(self, node: int) -> None:
        """Say that a node's state changed (a pod was added to it)."""
        self._changes.append(node)

    def choose(self, request: PodRequest) -> tuple[int, Placement] | None:
        """The node and placement the policy prefers, or None when no node fits."""
        index = self._shapes.get(request.shape)
        epoch = self._policy.epoch
        if index is None or index.epoch != epoch:
            unfit = index.unfit if index is not None else set()
            index = self._shapes[request.shape] = _ShapeIndex(epoch=epoch, unfit=unfit)
            stale: Sequence[int] | set[int] = range(len(self._states))
        else:
            stale = set(self._changes[index.seen :])
        index.seen = len(self._changes)
        for node in stale:
            if node not in index.unfit:
                self._evaluate(index, node, request)
        if len(index.heap) > 4 * len(self._states):
            self._compact(index)
        heap = index.heap
        while heap:
            _, _, version, node, placement = heap[0]
            if version == self._states[node].version:
                return node, placement
            heapq.heappop(heap)
        return None

    def _evaluate(self, index: _ShapeIndex, node: int, request: PodRequest) -> None:
        self.evaluations += 1
        state = self._states[node]
        result = evaluate(state.view(), request, self._policy)
        if isinstance(result, Refusal):
            index.unfit.add(node)
            return
        heapq.heappush(index.heap, (-result.score, self._rank[node], state.version, node, result))

    def _compact(self, index: _ShapeIndex) -> None:
        states = self._states
        index.heap = [e for e in index.heap if e[2] == states[e[3]].version]
        heapq.heapify(index.heap)
