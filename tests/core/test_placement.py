"""Fit and choice of GPUs for a pod on one node, and the reasons when it does not fit."""

import pytest

from gpushare.allocation import PodAllocation
from gpushare.errors import Refusal, Rule
from gpushare.labels import NodeMode
from gpushare.placement.fit import (
    Placement,
    evaluate,
    extender_score,
    to_allocation,
)
from gpushare.placement.policies import BinpackPolicy, SpreadPolicy
from gpushare.request import PodRequest
from gpushare.state import NodeState
from tests.builders import T0, container, node_state, request
from tests.core.test_preemption import put

BINPACK = BinpackPolicy()
SPREAD = SpreadPolicy()


def place(state: NodeState, req: PodRequest, name: str, policy=BINPACK) -> PodAllocation:
    result = evaluate(state.view(), req, policy)
    assert isinstance(result, Placement), result
    allocation = to_allocation(req, result.assignment, state.inventory, T0)
    state.add(f"default/{name}", allocation)
    return allocation


def refusal(state: NodeState, req: PodRequest, policy=BINPACK) -> Refusal:
    result = evaluate(state.view(), req, policy)
    assert isinstance(result, Refusal), f"expected a refusal, got {result}"
    return result


def test_binpack_fills_the_fullest_gpu_that_fits():
    state = node_state("3x16GiB")
    place(state, request(mem=4), "a")  # GPU 0 (all equal: lowest index)
    place(state, request(mem=2), "b")
    assert state.used(0)[0] == 6
    # 11 GiB does not fit on GPU 0 (10 free), so the next fullest, GPU 1.
    assert place(state, request(mem=11), "c").gpu_indices == (1,)
    assert place(state, request(mem=4), "d").gpu_indices == (1,)  # 5 free on 1, 10 on 0


def test_spread_picks_the_emptiest_gpu():
    state = node_state("3x16GiB")
    assert place(state, request(mem=4), "a", SPREAD).gpu_indices == (0,)
    assert place(state, request(mem=4), "b", SPREAD).gpu_indices == (1,)
    assert place(state, request(mem=4), "c", SPREAD).gpu_indices == (2,)
    assert place(state, request(mem=1), "d", SPREAD).gpu_indices == (0,)


def test_gpus_of_different_sizes_are_used_by_their_own_size():
    state = node_state("1x16GiB,1x80GiB")
    assert place(state, request(mem=40), "big").gpu_indices == (1,)
    assert place(state, request(mem=16), "fits-small").gpu_indices == (0,)


def test_node_scores_follow_the_policy():
    state = node_state("2x16GiB")
    place(state, request(mem=8), "a")
    view = state.view()
    req = request(mem=8)
    packed = evaluate(view, req, BINPACK)
    spread = evaluate(view, req, SPREAD)
    assert isinstance(packed, Placement) and isinstance(spread, Placement)
    assert extender_score(packed.score) == 5  # 16 of 32 GiB used after
    assert extender_score(spread.score) == 5
    empty = node_state("2x16GiB").view()
    fresh = evaluate(empty, req, BINPACK)
    assert isinstance(fresh, Placement)
    assert fresh.score < packed.score  # binpack prefers the node already in use


def test_a_slice_larger_than_any_gpu_is_unresolvable():
    found = refusal(node_state("2x16GiB"), request(mem=20))
    assert found.rule is Rule.GPU_TOO_SMALL
    assert not found.rule.resolvable
    assert "largest GPU on node n1 has 16 GiB" in found.message


def test_not_enough_free_memory_now_is_resolvable():
    state = node_state("1x16GiB")
    place(state, request(mem=10), "a")
    found = refusal(state, request(mem=8))
    assert found.rule is Rule.INSUFFICIENT_MEMORY and found.rule.resolvable
    assert "6 GiB" in found.message


def test_compute_never_goes_past_100_percent():
    state = node_state("1x16GiB", mode=NodeMode.CORE_MEM)
    place(state, request(mem=1, core=60), "a")
    place(state, request(mem=1, core=40), "b")
    assert state.used(0)[1] == 100
    assert refusal(state, request(mem=1, core=5)).rule is Rule.INSUFFICIENT_CORE


def test_the_compute_of_every_container_of_a_pod_on_one_gpu_adds_up():
    # 80 percent free: three containers of 30 need 90 there.
    state = node_state("1x16GiB", mode=NodeMode.CORE_MEM)
    place(state, request(mem=1, core=20), "a")
    trio = request(containers=[container(name, mem=1, core=30) for name in ("x", "y", "z")])
    assert refusal(state, trio).rule is Rule.NO_JOINT_FIT
    duo = request(containers=[container(name, mem=1, core=40) for name in ("x", "y")])
    place(state, duo, "duo")
    assert state.used(0)[1] == 100


def test_compute_is_written_percent_in_words():
    """kube-scheduler reads refusal reasons as printf formats: a '%' would be mangled."""
    state = node_state("1x16GiB", mode=NodeMode.CORE_MEM)
    place(state, request(mem=1, core=100), "a")
    found = refusal(state, request(mem=2, core=10))
    assert found.message == (
        "container 'main' needs 2 GiB + 10 percent compute on one GPU; among GPUs of "
        "node n1 with the memory free, the most compute free is 0 percent"
    )
    assert "%" not in str(found)


def test_compute_needs_a_core_mem_node():
    found = refusal(node_state("1x16GiB", mode=NodeMode.CGPU), request(mem=1, core=30))
    assert found.rule is Rule.NODE_MODE_NO_COMPUTE
    assert "core_mem" in found.message


def test_unlabelled_nodes_are_not_ours():
    assert refusal(node_state(mode=None), request(mem=1)).rule is Rule.NODE_NOT_SHARED


def test_at_most_20_pods_per_gpu():
    state = node_state("1x80GiB")
    for i in range(20):
        place(state, request(mem=1), f"p{i}")
    assert refusal(state, request(mem=1)).rule is Rule.PODS_PER_GPU


def test_the_pods_per_gpu_limit_is_configurable():
    state = node_state("1x80GiB", max_pods_per_gpu=2)
    place(state, request(mem=1), "a")
    place(state, request(mem=1), "b")
    assert refusal(state, request(mem=1)).rule is Rule.PODS_PER_GPU


def test_memory_only_and_compute_pods_are_not_mixed_on_a_node():
    state = node_state("2x16GiB", mode=NodeMode.CORE_MEM)
    place(state, request(mem=2, core=30), "compute")
    found = refusal(state, request(mem=2))
    assert found.rule is Rule.JOB_TYPE_MIXING
    other = node_state("2x16GiB", mode=NodeMode.CORE_MEM)
    place(other, request(mem=2), "memory-only")
    assert refusal(other, request(mem=2, core=30)).rule is Rule.JOB_TYPE_MIXING


def test_exclusive_gpus_are_not_shared():
    state = node_state("2x16GiB")
    place(state, request(count=1), "whole")
    # The remaining GPU takes a slice; the exclusive one takes nothing.
    assert place(state, request(mem=1), "slice").gpu_indices == (1,)
    assert refusal(state, request(mem=16)).rule is Rule.INSUFFICIENT_MEMORY
    assert refusal(state, request(count=1)).rule is Rule.NO_FREE_GPU


def test_exclusive_needs_gpus_free_of_any_pod():
    state = node_state("2x16GiB")
    place(state, request(mem=1), "small")
    found = refusal(state, request(count=2))
    assert found.rule is Rule.NO_FREE_GPU
    assert "1 of the 2 GPUs" in found.message


def test_multi_gpu_split_lands_on_distinct_gpus_of_one_node():
    state = node_state("4x16GiB")
    allocation = place(state, request(mem=8, labels={"aliyun.com/gpu-count": "4"}), "split")
    assert allocation.gpu_indices == (0, 1, 2, 3)
    assert all(s.mem == 2 for s in allocation.containers[0].gpus)


def test_multi_gpu_split_needs_enough_gpus():
    found = refusal(node_state("2x16GiB"), request(mem=8, labels={"aliyun.com/gpu-count": "4"}))
    assert found.rule is Rule.TOO_FEW_GPUS


def test_unhealthy_gpus_are_not_used():
    state = node_state("2x16GiB", unhealthy=(0,))
    assert place(state, request(mem=4), "a").gpu_indices == (1,)
    found = refusal(node_state("2x16GiB", unhealthy=(0, 1)), request(mem=4))
    assert found.rule is Rule.UNHEALTHY_GPUS


def test_containers_of_one_pod_are_placed_together():
    state = node_state("2x16GiB")
    req = request(containers=[container("a", mem=10), container("b", mem=10)])
    allocation = place(state, req, "pair")
    assert {c.name: c.gpus[0].index for c in allocation.containers} == {"a": 0, "b": 1}


def test_the_search_finds_a_joint_fit_greedy_choice_would_miss():
    # Binpack alone would put the 6 on GPU 0 (fullest that fits) and strand the 9.
    state = node_state("2x16GiB")
    place(state, request(mem=7), "seven")  # GPU 0 has 9 free, GPU 1 has 16
    req = request(
        containers=[container("nine", mem=9), container("six", mem=6), container("ten", mem=10)]
    )
    allocation = place(state, req, "three")
    placed = {c.name: c.gpus[0].index for c in allocation.containers}
    assert placed["nine"] == 0 and {placed["six"], placed["ten"]} == {1}


@pytest.mark.parametrize(
    ("layout", "containers"),
    [
        ("1x16GiB", [container("a", mem=10), container("b", mem=10)]),
        # Each exactly as much as the node has: still "together" that fails.
        ("1x16GiB", [container("a", mem=16), container("b", mem=8)]),
        ("2x16GiB", [container("a", count=2), container("b", mem=8)]),
    ],
)
def test_containers_that_fit_alone_but_not_together(layout, containers):
    state = node_state(layout)
    found = refusal(state, request(containers=containers))
    assert found.rule is Rule.NO_JOINT_FIT
    assert found.message.startswith("each container fits on node n1 alone, but not all together (")


def test_an_init_container_joins_its_app_on_a_gpu_where_its_memory_is_reused():
    # GPU 0 has 14 GiB free, GPU 1 has 10. The 12 GiB app takes GPU 0; there the 6 GiB
    # init container costs nothing more (max(12, 6)), on GPU 1 it would hold 6 more.
    state = node_state("2x16GiB")
    put(state, "x", 0, mem=2)
    put(state, "y", 1, mem=6)
    req = request(containers=[container("app", mem=12)], init_containers=[container("init", mem=6)])
    place(state, req, "with-init")
    assert (state.used(0)[0], state.used(1)[0]) == (14, 6)


def test_init_container_memory_is_reused_by_the_app_containers():
    state = node_state("1x16GiB")
    req = request(
        containers=[container("app", mem=8)],
        init_containers=[container("init", mem=6)],
    )
    place(state, req, "with-init")
    assert state.used(0)[0] == 8  # max(init 6, app 8), not 14


def test_init_container_larger_than_the_apps_sets_the_charge():
    state = node_state("1x16GiB")
    req = request(
        containers=[container("app", mem=2)],
        init_containers=[container("init", mem=12)],
    )
    place(state, req, "big-init")
    assert state.used(0)[0] == 12
    assert refusal(state, request(mem=5)).rule is Rule.INSUFFICIENT_MEMORY


def test_sidecars_add_to_the_app_containers():
    state = node_state("1x16GiB")
    req = request(
        containers=[container("app", mem=8)],
        init_containers=[container("sidecar", mem=6, restart_policy="Always")],
    )
    place(state, req, "with-sidecar")
    assert state.used(0)[0] == 14


def test_removing_a_pod_frees_its_gpus():
    state = node_state("1x16GiB", mode=NodeMode.CORE_MEM)
    place(state, request(mem=10, core=50), "a")
    state.remove("default/a")
    assert state.used(0) == (0, 0, 0)
    place(state, request(mem=16), "memory-only-now-allowed")


def test_binpack_scores_the_fullest_node_best_and_every_node_explains_a_refusal():
    full = node_state("1x16GiB", node="full")
    place(full, request(mem=12), "x")
    small = node_state("1x8GiB", node="small")
    empty = node_state("1x16GiB", node="empty")
    views = [full.view(), small.view(), empty.view()]
    scores = {v.name: evaluate(v, request(mem=4), BINPACK) for v in views}
    assert all(isinstance(s, Placement) for s in scores.values()), scores
    assert max(scores, key=lambda n: scores[n].score) == "full"  # type: ignore[union-attr]
    refusals = {v.name: evaluate(v, request(mem=20), BINPACK) for v in views}
    assert {n: r.rule for n, r in refusals.items()} == {  # type: ignore[union-attr]
        "full": Rule.GPU_TOO_SMALL,
        "small": Rule.GPU_TOO_SMALL,
        "empty": Rule.GPU_TOO_SMALL,
    }
