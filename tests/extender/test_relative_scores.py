"""prioritize scores each candidate against the best one (`relative_score`): 10 for
the best, one less per point of the policy's score below it, 0 ten points down and
where the pod does not fit. kube-scheduler adds its own plugins' scores to ours, so
only the nodes our policy prefers may carry the top Score (issue 40).

The policy here scores a node 40 + the GiB its GPUs hold with the pod, so that each
GiB a node holds is one point."""

import pytest

from gpushare.extender.answertable import AnswerTable
from gpushare.placement.fit import Assignment, PlacementPolicy
from gpushare.placement.policies import POLICIES
from gpushare.request import PodRequest
from gpushare.state import GpuView, NodeView
from tests.builders import node, pod

SPARES = [f"spare-{i:03d}" for i in range(140)]


class HeldMemory(PlacementPolicy):
    """Binpack, with scores to count on: 40 + the GiB held on the node with the pod,
    plus `bonus` on nodes of that many GPUs."""

    name = "held-memory"
    nameless = True

    def __init__(self) -> None:
        self.bonus: dict[int, float] = {}

    def gpu_key(self, gpu: GpuView, mem_after: int, core_after: int) -> tuple[int, ...]:
        return (mem_after,)

    def score(self, view: NodeView, request: PodRequest, assignment: Assignment) -> float:
        held = sum(gpu.mem_total - gpu.mem_free for gpu in view.gpus)
        return 40.0 + held + assignment.added_mem + self.bonus.get(len(view.gpus), 0.0)


@pytest.fixture
def policy() -> HeldMemory:
    return HeldMemory()


@pytest.fixture
def held(cluster, scheduler_for, policy):
    """Nodes of 1x16GiB holding 12, 11, 3, 2 and 16 GiB: a 1 GiB pod scores 53, 52,
    44 and 43 on the first four and does not fit on `full`. Beside them 140 spares,
    empty (41) but the last, which holds 10 GiB (51): with them a list is two blocks
    of answers (`answertable._BLOCK`), and one node that changes is patched in, not
    answered afresh with the others."""
    for name in ("best", "next", "low", "far", "full", *SPARES):
        cluster.add_node(node(name, "1x16GiB"))
    s = scheduler_for(
        default_placement=policy.name, policies={**POLICIES, policy.name: lambda: policy}
    )
    placed = (("best", 12), ("next", 11), ("low", 3), ("far", 2), ("full", 16), (SPARES[-1], 10))
    for name, mem in placed:
        assert s.bind(s.submit(pod(f"on-{name}", mem=mem)), name) == ""
    return s


@pytest.fixture
def looked_up(monkeypatch) -> list[list[str]]:
    """The candidate lists prioritize looked up node by node (its long way)."""
    lists: list[list[str]] = []
    answers = AnswerTable.answers

    def spy(self, names, evaluation):  # type: ignore[no-untyped-def]
        lists.append(list(names))
        return answers(self, names, evaluation)

    monkeypatch.setattr(AnswerTable, "answers", spy)
    return lists


def filter_then_prioritize(s, name: str, looked_up: list[list[str]]) -> dict[str, int]:
    """A 1 GiB pod through filter, then prioritize of the nodes filter passed (its
    short way: made from filter's answer, no node looked up); the spares' Scores
    apart from the last one's, which must be 0."""
    asking = s.submit(pod(name, mem=1))
    passed = s.filter(asking)["NodeNames"]
    looked_up.clear()
    scores = s.prioritize(asking, passed)
    assert looked_up == [] and list(scores) == passed
    assert all(scores.pop(spare) == 0 for spare in SPARES[:-1] if spare in scores)
    return scores


def test_the_best_candidate_scores_10_and_each_point_below_it_one_less(held, looked_up):
    scores = filter_then_prioritize(held, "asking", looked_up)
    assert scores == {"best": 10, "next": 9, "low": 1, "far": 0, SPARES[-1]: 8}


def test_a_candidate_list_other_than_filters_is_scored_against_its_own_best(held, looked_up):
    asking = held.submit(pod("asking", mem=1))
    held.filter(asking)
    looked_up.clear()
    scores = held.prioritize(asking, ["next", "low", "far", "full", "ghost"])
    assert looked_up  # the long way: not filter's list
    assert scores == {"next": 10, "low": 2, "far": 1, "full": 0, "ghost": 0}


def test_after_a_bind_the_scores_follow_the_new_best(held, looked_up):
    assert filter_then_prioritize(held, "first", looked_up)["best"] == 10
    # `next` now holds 13 GiB: it is the best (54), `best` one point below, `low` ten,
    # and the last spare, in the other block, three.
    assert held.bind(held.submit(pod("more-on-next", mem=2)), "next") == ""
    after = filter_then_prioritize(held, "second", looked_up)
    assert after == {"best": 9, "next": 10, "low": 0, "far": 0, SPARES[-1]: 7}
    # `low` gains a point (45) under the same best: its Score moves, nothing else.
    assert held.bind(held.submit(pod("more-on-low", mem=1)), "low") == ""
    again = filter_then_prioritize(held, "third", looked_up)
    assert again == {"best": 9, "next": 10, "low": 1, "far": 0, SPARES[-1]: 7}


def test_a_learned_workload_that_moves_the_scores_moves_the_priorities(
    cluster, scheduler_for, policy, looked_up
):
    """Moves that change a state's score by two points (50 to 52: 5 either way on a
    score of its own), then make it the best."""
    cluster.add_node(node("one", "1x16GiB"))
    cluster.add_node(node("two", "2x16GiB"))
    s = scheduler_for(
        default_placement=policy.name, policies={**POLICIES, policy.name: lambda: policy}
    )
    assert s.bind(s.submit(pod("on-one", mem=12)), "one") == ""
    assert s.bind(s.submit(pod("on-two", mem=9)), "two") == ""
    assert filter_then_prioritize(s, "before", looked_up) == {"one": 10, "two": 7}
    policy.bonus[2] = 2.0
    policy.epoch += 1
    assert filter_then_prioritize(s, "moved", looked_up) == {"one": 10, "two": 9}
    policy.bonus[2] = 4.0
    policy.epoch += 1
    assert filter_then_prioritize(s, "moved-again", looked_up) == {"one": 9, "two": 10}
