"""The node choice of the paper's scheduler: the best score wins, ties to the lowest rank.

Every node is evaluated with the core's `evaluate` and the policy under test, as
the extender evaluates the nodes kube-scheduler sends it. Which nodes need it
again is the core's ShapeCache's to say, as in the extender: per request shape a
table of each node's placement, forgotten when the node changes and thrown away
whole when the policy bumps its epoch (it learned something). Beside the table,
a heap of (score, rank) over the nodes that fit picks the best. Nodes only ever
fill up in a run (no departures), so a node that cannot take a shape never can
again and is not evaluated for that shape again, whatever the epoch.
"""

import heapq
from collections.abc import Hashable, Sequence

from gpushare.errors import Refusal
from gpushare.placement.fit import Placement, PlacementPolicy, evaluate
from gpushare.request import PodRequest
from gpushare.shapecache import ShapeCache, ShapeTable
from gpushare.state import NodeState

_Entry = tuple[float, int, int, int, Placement]
"""(-score, rank, node state version, node, placement): heap order is best first."""


class _ShapeTable(ShapeTable[int, Placement]):
    """The placements of one shape on the nodes that take it, best first in `heap`."""

    def __init__(self, position: int, epochs: Hashable) -> None:
        super().__init__(position, epochs)
        self.filled = False
        """Whether every node has been evaluated once (then only `stale` ones again)."""
        self.heap: list[_Entry] = []


class Scheduler:
    def __init__(
        self, states: Sequence[NodeState], rank: Sequence[int], policy: PlacementPolicy
    ) -> None:
        if len(states) != len(rank):
            raise ValueError("one rank per node is needed")
        self._states = states
        self._rank = rank
        self._policy = policy
        self._fits: ShapeCache[_ShapeTable] = ShapeCache(_ShapeTable)
        self._unfit: dict[tuple[object, ...], set[int]] = {}
        """Per shape, the nodes that cannot take it (in any epoch: fit is the policy's
        to order, not to decide)."""
        self.evaluations = 0

    def changed(self, node: int) -> None:
        """Say that a node's state changed (a pod was added to it)."""
        self._fits.changed(node)

    def choose(self, request: PodRequest) -> tuple[int, Placement] | None:
        """The node and placement the policy prefers, or None when no node fits."""
        table = self._fits.table(request.shape, self._policy.epoch)
        unfit = self._unfit.setdefault(request.shape, set())
        stale: Sequence[int] | set[int] = table.stale
        if not table.filled:
            table.filled = True
            stale = range(len(self._states))
        for node in stale:
            if node not in unfit:
                self._evaluate(table, unfit, node, request)
        table.stale.clear()
        if len(table.heap) > 4 * len(self._states):
            self._compact(table)
        heap = table.heap
        while heap:
            _, _, version, node, placement = heap[0]
            if version == self._states[node].version:
                return node, placement
            heapq.heappop(heap)
        return None

    def _evaluate(
        self, table: _ShapeTable, unfit: set[int], node: int, request: PodRequest
    ) -> None:
        self.evaluations += 1
        state = self._states[node]
        result = evaluate(state.view(), request, self._policy)
        if isinstance(result, Refusal):
            unfit.add(node)
            return
        table.results[node] = result
        heapq.heappush(table.heap, (-result.score, self._rank[node], state.version, node, result))

    def _compact(self, table: _ShapeTable) -> None:
        states = self._states
        table.heap = [e for e in table.heap if e[2] == states[e[3]].version]
        heapq.heapify(table.heap)
