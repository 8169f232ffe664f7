"""The arrival process: shuffled trace, inflation to 130% by draws with replacement,
and the seeded node rank that breaks ties."""

import random

import pytest

from gpushare.simulator.arrival import arrivals
from tests.simulator.traces import tiny

NODES = [("n1", 64000, 262144, 2, "T4"), ("n2", 64000, 262144, 2, "T4"), ("n3", 1, 1, 1, "P100")]
PODS = [
    ("a", 1000, 1024, 1, 1000, ""),
    ("b", 1000, 1024, 1, 500, ""),
    ("c", 1000, 1024, 0, 0, ""),
    ("d", 1000, 1024, 2, 1000, ""),
    ("e", 1000, 1024, 1, 250, ""),
]


@pytest.fixture
def trace(tmp_path):
    return tiny(tmp_path, NODES, PODS)  # 5000 milli of capacity, 3750 requested


def test_the_same_seed_gives_the_same_arrivals_and_ranks(trace):
    assert arrivals(trace, 42) == arrivals(trace, 42)
    assert arrivals(trace, 42).pods != arrivals(trace, 43).pods


def test_the_whole_trace_arrives_first_in_a_seeded_shuffle(trace):
    first = arrivals(trace, 7).pods[: len(PODS)]
    assert sorted(p.name for p in first) == sorted(p[0] for p in PODS)
    expected = list(trace.pods)
    random.Random(7).shuffle(expected)
    assert list(first) == expected


def test_draws_stop_at_the_first_that_would_pass_130_percent(trace):
    seed = 11
    result = arrivals(trace, seed)
    limit = 1.3 * trace.capacity
    assert sum(p.gpu_total for p in result.pods) <= limit
    # Replay the generator: the draw after the last one taken would have crossed the limit.
    rng = random.Random(seed)
    rng.shuffle(list(trace.pods))
    total = trace.requested
    for taken in result.pods[len(PODS) :]:
        draw = trace.pods[rng.randrange(len(trace.pods))]
        assert draw == taken
        total += draw.gpu_total
    refused = trace.pods[rng.randrange(len(trace.pods))]
    assert total + refused.gpu_total > limit


def test_a_trace_larger_than_the_limit_is_cut_by_the_same_rule(tmp_path):
    small = tiny(tmp_path, [("n1", 1, 1, 1, "T4")], [(f"p{i}", 1, 1, 1, 500, "") for i in range(9)])
    result = arrivals(small, 42)
    assert [p.gpu_total for p in result.pods] == [500, 500]  # a third would make 1500 > 1300


def test_ranks_are_a_seeded_permutation_of_the_nodes(trace):
    ranks = [arrivals(trace, seed).rank for seed in range(42, 52)]
    assert all(sorted(r) == [0, 1, 2] for r in ranks)
    assert len(set(ranks)) > 1


def test_a_trace_asking_for_no_gpu_cannot_be_inflated(tmp_path):
    cpu_only = tiny(tmp_path, [("n1", 1, 1, 1, "T4")], [("p", 1, 1, 0, 0, "")])
    with pytest.raises(ValueError, match="request no GPU"):
        arrivals(cpu_only, 42)
