"""The arrival process (docs/placement.md#arrival-process): workload inflation and tie-break ranks.

For a seed: the trace's pods in name order, shuffled; then pods drawn uniformly
with replacement from the trace, appended, until the first draw that would take
the requested GPU above `inflation` x capacity. Then a random permutation of the
nodes (in name order) gives each node its rank: among nodes of equal score the
lowest rank wins, for the whole run (what the paper simulator's "%04d-" renaming
and lexicographic tie-break amount to).
"""

import random
from dataclasses import dataclass

from gpushare.simulator.trace import Trace, TracePod

INFLATION = 1.3
DEFAULT_SEEDS = tuple(range(42, 52))


@dataclass(frozen=True, slots=True)
class Arrivals:
    seed: int
    pods: tuple[TracePod, ...]
    """In arrival order."""
    rank: tuple[int, ...]
    """Tie-break rank of each node (by the node's position in the trace)."""


def arrivals(trace: Trace, seed: int, inflation: float = INFLATION) -> Arrivals:
    if trace.requested <= 0:
        raise ValueError("the trace's pods request no GPU, so inflation by GPU cannot stop")
    rng = random.Random(seed)
    shuffled = list(trace.pods)
    rng.shuffle(shuffled)
    limit = inflation * trace.capacity
    pods: list[TracePod] = []
    total = 0
    # The trace itself counts against the limit too, so a small cluster fed a large
    # trace (a --nodes subset) stops in the same way.
    for pod in shuffled:
        if total + pod.gpu_total > limit:
            return _ranked(trace, seed, rng, pods)
        pods.append(pod)
        total += pod.gpu_total
    while True:
        pod = trace.pods[rng.randrange(len(trace.pods))]
        if total + pod.gpu_total > limit:
            return _ranked(trace, seed, rng, pods)
        pods.append(pod)
        total += pod.gpu_total


def _ranked(trace: Trace, seed: int, rng: random.Random, pods: list[TracePod]) -> Arrivals:
    rank = list(range(len(trace.nodes)))
    rng.shuffle(rank)
    return Arrivals(seed=seed, pods=tuple(pods), rank=tuple(rank))
