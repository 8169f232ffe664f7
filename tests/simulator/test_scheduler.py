"""The node choice: best score, ties to the lowest rank, nodes re-evaluated only when
they change, and all of them again when the policy learns something."""

from gpushare.placement.fit import to_allocation
from gpushare.placement.policies import BinpackPolicy
from gpushare.simulator.scheduler import Scheduler
from tests.builders import T0, node_state, request


class Counting(BinpackPolicy):
    name = "counting"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def place(self, view, req):
        self.calls.append(view.name)
        return super().place(view, req)


def nodes(count: int, layout: str = "2x16GiB"):
    return [node_state(layout, node=f"n{i}") for i in range(count)]


def bind(scheduler: Scheduler, states, req) -> int:
    choice = scheduler.choose(req)
    assert choice is not None
    node, placement = choice
    states[node].add(
        f"p{len(states[node].pods)}",
        to_allocation(req, placement.assignment, states[node].inventory, T0),
    )
    scheduler.changed(node)
    return node


def test_equal_scores_go_to_the_lowest_rank_every_time():
    states = nodes(3)
    scheduler = Scheduler(states, [2, 0, 1], BinpackPolicy())
    assert bind(scheduler, states, request(mem=1)) == 1
    # Binpack now prefers node 1 (fuller); once it is full the next is rank 1: node 2.
    assert bind(scheduler, states, request(mem=15)) == 1
    assert bind(scheduler, states, request(mem=16)) == 1
    assert bind(scheduler, states, request(mem=4)) == 2


def test_a_better_score_beats_a_lower_rank():
    states = nodes(2)
    scheduler = Scheduler(states, [0, 1], BinpackPolicy())
    states[1].add(
        "x",
        to_allocation(request(mem=8), _place(states[1], request(mem=8)), states[1].inventory, T0),
    )
    scheduler.changed(1)
    assert bind(scheduler, states, request(mem=2)) == 1  # binpack: the fuller node


def test_only_changed_nodes_are_evaluated_again():
    states = nodes(4)
    policy = Counting()
    scheduler = Scheduler(states, [0, 1, 2, 3], policy)
    bind(scheduler, states, request(mem=4))
    assert len(policy.calls) == 4
    bind(scheduler, states, request(mem=4))
    assert policy.calls[4:] == ["n0"]  # the node that took the first pod
    bind(scheduler, states, request(mem=2))  # a new shape: every node once
    assert len(policy.calls) == 9


def test_a_node_that_cannot_take_a_shape_is_not_asked_again():
    states = nodes(2, layout="1x16GiB")
    policy = Counting()
    scheduler = Scheduler(states, [0, 1], policy)
    bind(scheduler, states, request(mem=10))
    calls = len(policy.calls)
    bind(scheduler, states, request(mem=10))  # node 0 has 6 GiB left: no longer fits
    assert bind(scheduler, states, request(mem=4)) == 0
    assert scheduler.choose(request(mem=10)) is None
    assert policy.calls[calls:].count("n0") == 2  # re-checked once after each change


def test_a_new_policy_epoch_re_evaluates_every_node():
    states = nodes(3)
    policy = Counting()
    scheduler = Scheduler(states, [0, 1, 2], policy)
    scheduler.choose(request(mem=4))
    scheduler.choose(request(mem=4))
    assert len(policy.calls) == 3
    policy.epoch += 1
    scheduler.choose(request(mem=4))
    assert len(policy.calls) == 6


def test_no_node_fitting_gives_none():
    states = nodes(2, layout="1x16GiB")
    assert Scheduler(states, [0, 1], BinpackPolicy()).choose(request(mem=20)) is None


def _place(state, req):
    choice = Scheduler([state], [0], BinpackPolicy()).choose(req)
    assert choice is not None
    return choice[1].assignment
