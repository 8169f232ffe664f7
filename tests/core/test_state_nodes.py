"""One node's running totals: what placement sees after pods come and go."""

from gpushare.placement import Placement, evaluate, to_allocation
from gpushare.policies import BinpackPolicy
from tests.builders import T0, node_state, request


def placed(state, mem: int):
    req = request(mem=mem)
    result = evaluate(state.view(), req, BinpackPolicy())
    assert isinstance(result, Placement)
    return to_allocation(req, result.assignment, state.inventory, T0)


def test_a_pod_added_again_is_charged_once():
    state = node_state("1x16GiB")
    allocation = placed(state, 4)
    state.add("default/a", allocation)
    state.add("default/a", allocation)  # the same pod seen again
    assert state.used(0) == (4, 0, 1)
    assert state.view().gpus[0].mem_free == 12
    state.remove("default/a")
    assert state.used(0) == (0, 0, 0) and state.view().gpus[0].mem_free == 16
