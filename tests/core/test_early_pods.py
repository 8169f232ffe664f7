"""A learning policy packs until its learned workload predicts the pods (issue 40, item 4):
a workload learned from a few pods, or still the prior, is a poor guide to the next one."""

import pytest

from gpushare.placement.bestfit import BestFitPolicy
from gpushare.placement.fgd import GUIDE_WINDOW
from gpushare.placement.fit import Placement, PlacementPolicy, evaluate, to_allocation
from gpushare.placement.lookahead import LookaheadFgdPolicy
from gpushare.placement.policies import DEFAULT_PLACEMENT, POLICIES, BinpackPolicy
from gpushare.state import NodeState
from tests.builders import T0, node_state, request

T4S_AND_A10 = "2x16GiB:T4,1x24GiB:A10"


def created_one_after_another(policy: PlacementPolicy, sizes: list[int]) -> list[object]:
    """Each pod observed (the extender's filter) and then placed, as pods come; the GPUs
    each pod got, or the rule that refused it."""
    state = node_state(T4S_AND_A10)
    return [arrive(state, policy, request(mem=mem), f"p{i}") for i, mem in enumerate(sizes)]


def arrive(state: NodeState, policy: PlacementPolicy, req, key: str) -> object:
    policy.observe(req)
    result = evaluate(state.view(), req, policy)
    if not isinstance(result, Placement):
        return result.rule
    state.add(key, to_allocation(req, result.assignment, state.inventory, T0))
    return result.assignment.gpus


@pytest.mark.parametrize("policy", [POLICIES[DEFAULT_PLACEMENT](), BinpackPolicy()])
def test_pods_of_10_10_and_20_gib_all_fit_two_t4s_and_an_a10(policy):
    # Betting on the prior, the look-ahead put the second 10 GiB pod on the A10 (14 GiB
    # left, room for another 10) and the 20 GiB pod fit no GPU. Packed: T4, T4, A10.
    assert created_one_after_another(policy, [10, 10, 20]) == [((0,),), ((1,),), ((2,),)]


def test_until_the_learned_workload_predicts_the_pods_the_policy_packs():
    policy = LookaheadFgdPolicy()
    assert policy.packing
    packer = BestFitPolicy()
    state, packed = node_state(T4S_AND_A10), node_state(T4S_AND_A10)
    for i, mem in enumerate([10, 4, 6]):
        req = request(mem=mem)
        ours = arrive(state, policy, req, f"p{i}")
        assert ours == arrive(packed, packer, req, f"p{i}")
    # The prior's shapes are fractions of a GPU, never a pod's own: nothing was predicted.
    assert policy.packing


def test_once_half_the_recent_pods_were_predicted_the_look_ahead_decides():
    policy = LookaheadFgdPolicy()
    epoch = policy.epoch
    # The learned workload is first re-derived at 8 pods; the 10 GiB pods after it are
    # predicted, and by pod 8 + GUIDE_WINDOW / 2 half of the window was.
    guided_from = 8 + GUIDE_WINDOW // 2
    for _ in range(guided_from - 1):
        policy.observe(request(mem=10))
    assert policy.packing
    policy.observe(request(mem=10))
    assert not policy.packing and policy.epoch > epoch
    # Now the look-ahead decides: a 10 GiB pod goes to the A10, whose 14 GiB left keep room
    # for another, not to a T4 whose 6 GiB left no pod of the workload uses; packing takes
    # the T4.
    empty = node_state(T4S_AND_A10).view()
    ours, packed = (evaluate(empty, request(mem=10), p) for p in (policy, BestFitPolicy()))
    assert isinstance(ours, Placement) and isinstance(packed, Placement)
    assert (ours.assignment.gpus, packed.assignment.gpus) == (((2,),), ((0,),))


def test_after_the_workload_shifts_the_policy_packs_until_it_learned_the_new_pods():
    policy = LookaheadFgdPolicy()
    for _ in range(300):
        policy.observe(request(mem=10))
    assert not policy.packing
    # 3 GiB pods, which the learned workload does not hold: once more than half of the
    # window was not predicted, it packs again.
    unpredicted = GUIDE_WINDOW // 2 + 1
    for _ in range(unpredicted - 1):
        policy.observe(request(mem=3))
    assert not policy.packing
    epoch = policy.epoch
    policy.observe(request(mem=3))
    assert policy.packing and policy.epoch == epoch + 1
    # Re-derived at 400 pods the workload holds them; predicted again, the look-ahead is back.
    for _ in range(400 + GUIDE_WINDOW // 2 - 300 - unpredicted):
        policy.observe(request(mem=3))
    assert not policy.packing


def test_a_policy_told_its_workload_never_packs():
    policy = LookaheadFgdPolicy(POLICIES[DEFAULT_PLACEMENT]().workload)  # type: ignore[attr-defined]
    assert not policy.packing
    for _ in range(GUIDE_WINDOW):
        policy.observe(request(mem=3))
    assert not policy.packing and policy.epoch == 0
