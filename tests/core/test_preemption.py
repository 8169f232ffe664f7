"""Which pods preemption evicts: the cheapest set that makes the pod fit by the
placement rules, checked against every subset on random nodes."""

from itertools import combinations
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpushare.inventory import Gpu, NodeGpus
from gpushare.labels import NodeMode
from gpushare.placement import preemption
from gpushare.placement.fit import Assignment, Placement, evaluate, to_allocation
from gpushare.placement.policies import BinpackPolicy
from gpushare.placement.preemption import EvictionCost, choose_victims
from gpushare.request import PodRequest
from gpushare.state import NodeState
from tests.builders import T0, container, node_state, request

BINPACK = BinpackPolicy()
NO_VICTIM = -(2**31) - 1
"""The highest priority of no victims: below every pod priority (an int32)."""


def put(state: NodeState, name: str, gpu: int | tuple[int, ...], mem: int = 0, core: int = 0):
    """A pod of `mem` GiB (+ `core`%) on each of the given GPUs, or whole GPUs (mem 0)."""
    gpus = (gpu,) if isinstance(gpu, int) else gpu
    if mem:
        labels = {"aliyun.com/gpu-count": str(len(gpus))} if len(gpus) > 1 else None
        req = request(mem=mem * len(gpus), core=core or None, labels=labels)
    else:
        req = request(count=len(gpus))
    slices = tuple((i, mem, core) for i in gpus)
    allocation = to_allocation(req, Assignment((gpus,), slices), state.inventory, T0)
    state.add(name, allocation)


def fits_without(state: NodeState, req: PodRequest, removed) -> bool:
    trial = NodeState(state.inventory)
    for key, allocation in state.pods.items():
        if key not in removed:
            trial.add(key, allocation)
    return isinstance(evaluate(trial.view(), req, BINPACK), Placement)


def victims(state, req, priorities, **kwargs):
    eviction = choose_victims(state, req, BINPACK, priorities, **kwargs)
    return None if eviction is None else set(eviction.pods)


def test_two_pods_of_one_gpu_not_one_pod_of_each():
    state = node_state("2x16GiB,1x24GiB")
    for name, gpu in (("a", 0), ("b", 0), ("c", 1), ("d", 1), ("e", 2), ("f", 2), ("g", 2)):
        put(state, name, gpu, 8)
    req = request(mem=16)
    chosen = victims(state, req, dict.fromkeys("abcdefg", 0))
    assert chosen == {"a", "b"}  # every GPU costs two pods alike; ties go to the first
    assert fits_without(state, req, chosen)
    # On one GPU too: of two pods alike, the first goes.
    state = node_state("1x16GiB")
    put(state, "a", 0, 8)
    put(state, "b", 0, 8)
    assert victims(state, request(mem=8), {"a": 0, "b": 0}) == {"a"}


def test_the_lowest_highest_priority_wins_over_fewer_victims():
    state = node_state("2x16GiB")
    put(state, "low1", 0, 8)
    put(state, "low2", 0, 8)
    put(state, "mid", 1, 16)
    assert victims(state, request(mem=16), {"low1": 1, "low2": 1, "mid": 2}) == {"low1", "low2"}


def test_then_fewer_victims_then_a_smaller_priority_sum_then_less_memory():
    state = node_state("3x16GiB")
    put(state, "a", 0, 8)
    put(state, "b", 0, 8)
    put(state, "c", 1, 16)
    put(state, "d", 2, 16)
    assert victims(state, request(mem=16), {"a": 2, "b": -5, "c": 3, "d": 2}) == {"d"}
    state = node_state("1x16GiB,1x24GiB")
    put(state, "p", 0, 8)
    put(state, "q", 0, 8)
    put(state, "r", 1, 12)
    put(state, "s", 1, 12)
    assert victims(state, request(mem=16), {"p": 1, "q": 1, "r": 0, "s": 1}) == {"r", "s"}
    state = node_state("2x24GiB")
    put(state, "small", 0, 20)
    put(state, "big", 1, 24)
    assert victims(state, request(mem=16), {"small": 1, "big": 1}) == {"small"}


def test_pods_that_may_not_go_are_never_chosen():
    state = node_state("1x16GiB")
    put(state, "same-priority", 0, 8)
    put(state, "low", 0, 8)
    assert victims(state, request(mem=16), {"low": 0}) is None
    assert victims(state, request(mem=8), {"low": 0}) == {"low"}


def test_compute_must_be_freed_as_well_as_memory():
    state = node_state("1x16GiB", mode=NodeMode.CORE_MEM)
    put(state, "mem-heavy", 0, 8, 30)
    put(state, "core-heavy", 0, 4, 60)
    req = request(mem=8, core=50)
    assert victims(state, req, {"mem-heavy": 0, "core-heavy": 1}) == {"core-heavy"}


def test_a_pod_freeing_exactly_the_compute_needed_is_enough():
    # 70% asked. GPU 0 has 10% free: core-heavy frees the 60% missing, exactly. GPU 1 has
    # 30% free: both of its pods would have to go.
    state = node_state("2x16GiB", mode=NodeMode.CORE_MEM)
    put(state, "core-heavy", 0, 4, 60)
    put(state, "stays", 0, 4, 30)
    put(state, "c1", 1, 4, 35)
    put(state, "c2", 1, 4, 35)
    req = request(mem=4, core=70)
    assert victims(state, req, {"core-heavy": 0, "c1": 0, "c2": 0}) == {"core-heavy"}


def test_a_place_on_a_full_gpu_is_freed_by_the_cheapest_pod():
    state = node_state("1x16GiB", max_pods_per_gpu=2)
    put(state, "a", 0, 2)
    put(state, "b", 0, 1)
    assert victims(state, request(mem=4), {"a": 0, "b": 0}) == {"b"}


def test_pods_of_the_other_job_type_all_go():
    state = node_state("2x16GiB", mode=NodeMode.CORE_MEM)
    put(state, "m1", 0, 4)
    put(state, "m2", 1, 4)
    assert victims(state, request(mem=4, core=20), {"m1": 0, "m2": 0}) == {"m1", "m2"}
    assert victims(state, request(mem=4, core=20), {"m1": 0}) is None


def test_whole_gpus_and_multi_gpu_pods():
    state = node_state("3x16GiB")
    put(state, "a", 0, 8)
    put(state, "b", 0, 8)
    put(state, "c", 1, 4)
    put(state, "d", 2, 12)
    priorities = {"a": 1, "b": 1, "c": 0, "d": 2}
    assert victims(state, request(count=1), priorities) == {"c"}
    split = request(mem=24, labels={"aliyun.com/gpu-count": "2"})  # 12 GiB on two GPUs
    assert victims(state, split, priorities) == {"a", "b"}
    assert victims(state, request(count=3), priorities) == {"a", "b", "c", "d"}


def test_pods_being_deleted_count_as_gone_and_are_never_chosen():
    state = node_state("2x16GiB")
    put(state, "deleting", 0, 8)
    put(state, "a", 0, 8)
    put(state, "c", 1, 4)
    put(state, "d", 1, 4)
    priorities = {"deleting": 0, "a": 0, "c": 0, "d": 0}
    assert victims(state, request(mem=16), priorities) == {"c", "d"}
    assert victims(state, request(mem=16), priorities, leaving={"deleting"}) == {"a"}
    kept = choose_victims(state, request(mem=8), BINPACK, priorities, leaving={"deleting"})
    assert kept is not None and kept.keeps_offered and kept.pods == ()
    assert kept.cost == EvictionCost(NO_VICTIM, 0, 0, 0)  # cheaper than evicting any pod


def test_the_offered_set_stands_when_it_makes_room_and_is_no_dearer():
    state = node_state("2x16GiB")
    put(state, "a", 0, 8)
    put(state, "b", 0, 8)
    put(state, "c", 1, 8)
    put(state, "d", 1, 8)
    priorities = dict.fromkeys("abcd", 0)
    kept = choose_victims(state, request(mem=16), BINPACK, priorities, offered=["c", "d", "x"])
    assert kept is not None and kept.keeps_offered and kept.pods == ("c", "d")
    assert kept.cost == EvictionCost(highest=0, count=2, priority_sum=0, mem=16)
    across = choose_victims(state, request(mem=16), BINPACK, priorities, offered=["a", "c"])
    assert across is not None and not across.keeps_offered and across.pods == ("a", "b")
    state.remove("d")
    dearer = choose_victims(state, request(mem=16), BINPACK, priorities, offered=["a", "b"])
    assert dearer is not None and not dearer.keeps_offered and dearer.pods == ("c",)


def test_out_of_budget_the_choice_still_makes_room():
    state = node_state("2x16GiB")
    for i in range(8):
        put(state, f"p{i}", i % 2, 3)
    priorities = {f"p{i}": i for i in range(8)}
    for req in (request(mem=12), request(mem=16, labels={"aliyun.com/gpu-count": "2"})):
        with (
            mock.patch.object(preemption, "COVER_BUDGET", 1),
            mock.patch.object(preemption, "SEARCH_BUDGET", 0),
        ):
            chosen = victims(state, req, priorities)
        assert chosen is not None and fits_without(state, req, chosen)


def big_filler_and_six_small(layout: str = "1x16GiB") -> tuple[NodeState, dict[str, int]]:
    """GPU 0 full: `big` (6 GiB) and `filler` (4 GiB) of priority 1, and six pods s1-s6
    of 1 GiB of priority 0: 10 GiB there take a pod of priority 1, and at best two."""
    state = node_state(layout)
    put(state, "big", 0, 6)
    put(state, "filler", 0, 4)
    for i in range(1, 7):
        put(state, f"s{i}", 0, 1)
    return state, {"big": 1, "filler": 1} | {f"s{i}": 0 for i in range(1, 7)}


TWO_CONTAINERS = request(containers=[container("a", mem=5), container("b", mem=5)])


def test_two_pods_that_free_a_gpu_rather_than_five_small_ones():
    state, priorities = big_filler_and_six_small()
    assert victims(state, request(mem=10), priorities) == {"big", "filler"}
    assert victims(state, TWO_CONTAINERS, priorities) == {"big", "filler"}  # sets tried
    # Solved GPU by GPU, a pod of one container needs no set tried at all.
    with mock.patch.object(preemption, "SEARCH_BUDGET", 0):
        assert victims(state, request(mem=10), priorities) == {"big", "filler"}


def test_one_pod_that_makes_room_for_two_containers_goes_alone():
    state = node_state("1x16GiB")
    put(state, "ten", 0, 10)
    put(state, "a", 0, 3)
    put(state, "b", 0, 3)
    assert victims(state, TWO_CONTAINERS, dict.fromkeys(["ten", "a", "b"], 0)) == {"ten"}


def test_out_of_budget_a_pod_of_two_containers_gets_the_schedulers_own_choice():
    # kube-scheduler's method: evict all eight, then spare the most important first and,
    # of one priority, the smallest first: filler (12 GiB left free), not big (6), s1
    # (11) and s2 (10), none of s3-s6 (9).
    state, priorities = big_filler_and_six_small()
    with mock.patch.object(preemption, "SEARCH_BUDGET", 0):
        eviction = choose_victims(state, TWO_CONTAINERS, BINPACK, priorities)
    assert eviction is not None and eviction.pods == ("big", "s3", "s4", "s5", "s6")
    assert eviction.cost == EvictionCost(highest=1, count=5, priority_sum=1, mem=10)


def test_at_most_search_budget_sets_are_tried_then_the_schedulers_choice_stands():
    # GPU 0 as above; GPU 1 holds `u` (9 GiB, priority 1) beside 7 GiB that stay. The
    # cheapest sets freeing 10 GiB, u with one of s1-s6, leave 9 GiB on GPU 1 and 1 on
    # GPU 0: no room for two 5 GiB containers. The 7th set tried, big and filler, is.
    state, priorities = big_filler_and_six_small("2x16GiB")
    put(state, "stays", 1, 7)
    put(state, "u", 1, 9)
    priorities["u"] = 1
    for budget, chosen in (
        (7, {"big", "filler"}),
        # Out of budget: evict all nine, spare filler, big (6 GiB free on GPU 0, 9 on
        # GPU 1: a container on each), not u, s1, none of s2-s6.
        (6, {"u", "s2", "s3", "s4", "s5", "s6"}),
    ):
        with mock.patch.object(preemption, "SEARCH_BUDGET", budget):
            assert victims(state, TWO_CONTAINERS, priorities) == chosen


def test_on_a_gpu_of_many_small_pods_the_choice_still_makes_room_at_least_cost():
    # 16 pods of 1 GiB: too many sets of 6 or more to list, so kube-scheduler's method
    # stands; it is as cheap as any: all 8 of priority 0, 2 of priority 1.
    state = node_state("1x16GiB")
    priorities = {}
    for i in range(16):
        put(state, f"p{i:02}", 0, 1)
        priorities[f"p{i:02}"] = i // 8
    eviction = choose_victims(state, TWO_CONTAINERS, BINPACK, priorities)
    assert eviction is not None and fits_without(state, TWO_CONTAINERS, set(eviction.pods))
    assert eviction.cost == EvictionCost(highest=1, count=10, priority_sum=2, mem=10)


def test_out_of_its_step_budget_a_gpu_takes_the_cheapest_pods_then_spares_what_it_can():
    # A full 24 GiB GPU: s1-s4 (1 GiB, priority 0); filler (4 GiB), big and huge (8 GiB)
    # of priority 1; 10 GiB needed. Cheapest first: s1-s4, filler, big (16 GiB: enough,
    # huge is spared); then, dearest first, filler (12 GiB without it), s4 (11) and s3
    # (10) can stay: s1, s2 and big go.
    state = node_state("1x24GiB")
    for i in range(1, 5):
        put(state, f"s{i}", 0, 1)
    put(state, "filler", 0, 4)
    put(state, "big", 0, 8)
    put(state, "huge", 0, 8)
    priorities = {"filler": 1, "big": 1, "huge": 1} | {f"s{i}": 0 for i in range(1, 5)}
    assert victims(state, request(mem=10), priorities) == {"big", "filler"}
    with mock.patch.object(preemption, "COVER_BUDGET", 1):
        assert victims(state, request(mem=10), priorities) == {"s1", "s2", "big"}


# ----- against every subset, on random nodes

KINDS = ["memory", "compute", "split", "whole"]


@st.composite
def nodes_and_requests(draw):
    mode = draw(st.sampled_from([NodeMode.CGPU, NodeMode.CORE_MEM]))
    sizes = draw(st.lists(st.sampled_from([8, 16, 24]), min_size=1, max_size=3))
    gpus = tuple(Gpu(index=i, uuid=f"GPU-{i}", mem=size) for i, size in enumerate(sizes))
    inventory = NodeGpus("n", mode, gpus, draw(st.sampled_from([2, 20])))
    state = NodeState(inventory)
    job = draw(st.sampled_from(["memory", "compute"] if mode is NodeMode.CORE_MEM else ["memory"]))
    priorities = {}
    for i in range(draw(st.integers(1, 9))):
        kind = draw(st.sampled_from([job, job, "split", "whole"]))
        req = _request(draw, kind, len(gpus))
        placed = evaluate(state.view(), req, BINPACK)
        if isinstance(placed, Placement):
            state.add(f"p{i}", to_allocation(req, placed.assignment, inventory, T0))
            priorities[f"p{i}"] = draw(st.integers(0, 3))
    kinds = KINDS if mode is NodeMode.CORE_MEM else [k for k in KINDS if k != "compute"]
    req = _request(draw, draw(st.sampled_from(kinds)), len(gpus))
    preemptor = draw(st.integers(0, 4))
    eligible = {key: p for key, p in priorities.items() if p < preemptor}
    return state, req, eligible


def _request(draw, kind: str, gpus: int) -> PodRequest:
    mem = draw(st.sampled_from([2, 4, 8, 12, 16]))
    if kind == "compute":
        return request(mem=mem, core=draw(st.sampled_from([10, 30, 50, 100])))
    if kind == "split" and gpus > 1:
        ways = draw(st.integers(2, gpus))
        return request(mem=mem * ways, labels={"aliyun.com/gpu-count": str(ways)})
    if kind == "whole":
        return request(count=draw(st.integers(1, gpus)))
    return request(mem=mem)


def cheapest_by_brute_force(state, req, eligible) -> EvictionCost | None:
    pods = state.pods
    best = None
    for size in range(len(eligible) + 1):
        for chosen in combinations(sorted(eligible), size):
            if fits_without(state, req, set(chosen)):
                cost = EvictionCost(
                    max((eligible[k] for k in chosen), default=NO_VICTIM),
                    size,
                    sum(eligible[k] for k in chosen),
                    sum(m for k in chosen for m, _ in pods[k].charges().values()),
                )
                best = cost if best is None else min(best, cost)
    return best


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=nodes_and_requests())
def test_the_choice_is_the_cheapest_of_every_subset(case):
    state, req, eligible = case
    with mock.patch.object(preemption, "SEARCH_BUDGET", 10**6):
        eviction = choose_victims(state, req, BINPACK, eligible)
    best = cheapest_by_brute_force(state, req, eligible)
    if best is None:
        assert eviction is None
        return
    assert eviction is not None
    if best.count == 0:
        assert eviction.keeps_offered and eviction.pods == ()
        return
    assert set(eviction.pods) <= set(eligible)
    assert fits_without(state, req, set(eviction.pods))
    assert eviction.cost == best


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=nodes_and_requests())
def test_solved_gpu_by_gpu_the_choice_is_the_cheapest_without_trying_sets(case):
    # One container on one GPU, or on M GPUs when no pod that may go spans several: the
    # GPUs' own choices are exact, with no budget left for trying sets of pods.
    state, req, eligible = case
    (container,) = req.containers
    if container.gpus > 1 and any(len(state.pods[k].charges()) > 1 for k in eligible):
        return
    with mock.patch.object(preemption, "SEARCH_BUDGET", 0):
        eviction = choose_victims(state, req, BINPACK, eligible)
    best = cheapest_by_brute_force(state, req, eligible)
    if best is None or best.count == 0:
        assert (eviction is None) == (best is None)
        return
    assert eviction is not None and fits_without(state, req, set(eviction.pods))
    assert eviction.cost == best
