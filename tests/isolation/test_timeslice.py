"""The pure time-slice scheduler on a simulated clock: each policy keeps its promise."""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.isolation.clock import SimulatedClock
from gpushare.isolation.policy import GpuSettings, Policy
from gpushare.isolation.timeslice import (
    SliceKind,
    Tenant,
    TimeSliceScheduler,
    promised_shares,
)

SLICE = 0.1


def simulate(
    gpu: GpuSettings,
    tenants: Sequence[Tenant],
    seconds: float = 60.0,
    *,
    intensity: Mapping[str, float] | None = None,
    step: Callable[[int], float] | None = None,
) -> dict[str, float]:
    """Fraction of the time each tenant computed. Tenants that run together split the
    GPU by intensity (how hard each one pushes it), as the mock GPU does."""
    clock = SimulatedClock()
    scheduler = TimeSliceScheduler(SLICE, clock.now)
    used = {t.id: 0.0 for t in tenants}
    tick = 0
    while clock.now() < seconds - 1e-9:
        current = [replace(t, used_s=used[t.id]) for t in tenants]
        decided = scheduler.next_slice(gpu, current)
        length = step(tick) if step else SLICE
        runners = [t for t in current if t.id in decided.runs and t.active]
        total = sum((intensity or {}).get(t.id, 1.0) for t in runners)
        for t in runners:
            used[t.id] += length * (intensity or {}).get(t.id, 1.0) / total
        clock.advance(length)
        tick += 1
    return {key: value / clock.now() for key, value in used.items()}


def owners(gpu: GpuSettings, tenants: Sequence[Tenant], slices: int) -> list[str | None]:
    clock = SimulatedClock()
    scheduler = TimeSliceScheduler(SLICE, clock.now)
    sequence = []
    for _ in range(slices):
        sequence.append(scheduler.next_slice(gpu, tenants).owner)
        clock.advance(SLICE)
    return sequence


def owners_under(plan: Sequence[tuple[GpuSettings, Sequence[Tenant]]]) -> list[str | None]:
    """Whose turn each slice is while the GPU's settings and containers go through `plan`,
    one entry per slice."""
    clock = SimulatedClock()
    scheduler = TimeSliceScheduler(SLICE, clock.now)
    sequence = []
    for gpu, tenants in plan:
        sequence.append(scheduler.next_slice(gpu, tenants).owner)
        clock.advance(SLICE)
    return sequence


def test_fair_share_gives_each_container_one_slot_of_max_inst_used_or_not():
    gpu = GpuSettings(Policy.FAIR_SHARE, max_inst=4)
    tenants = [Tenant("a"), Tenant("b"), Tenant("c", active=False)]
    shares = simulate(gpu, tenants)
    assert shares["a"] == pytest.approx(0.25, abs=0.01)
    assert shares["b"] == pytest.approx(0.25, abs=0.01)
    assert shares["c"] == 0.0
    sequence = owners(gpu, tenants, 40)
    # c's slot is kept for it although it has no work; the empty slot stays idle too.
    assert sequence.count("c") == 10
    assert sequence.count(None) == 10


def test_fair_share_idle_container_stays_frozen_outside_its_slot():
    gpu = GpuSettings(Policy.FAIR_SHARE, max_inst=2)
    clock = SimulatedClock()
    scheduler = TimeSliceScheduler(SLICE, clock.now)
    decided = [scheduler.next_slice(gpu, [Tenant("a"), Tenant("b", active=False)])]
    clock.advance(SLICE)
    decided.append(scheduler.next_slice(gpu, [Tenant("a"), Tenant("b", active=False)]))
    assert {d.runs for d in decided} == {frozenset({"a"}), frozenset({"b"})}


def test_preemptive_skips_idle_containers_and_splits_among_those_with_work():
    gpu = GpuSettings(Policy.PREEMPTIVE, max_inst=4)
    shares = simulate(gpu, [Tenant("a"), Tenant("b"), Tenant("c", active=False)])
    assert shares["a"] == pytest.approx(0.5, abs=0.01)
    assert shares["b"] == pytest.approx(0.5, abs=0.01)
    assert owners(gpu, [Tenant("a"), Tenant("b")], 6) == ["a", "b"] * 3


def test_a_container_that_gets_work_takes_turns_at_once_with_no_banked_time():
    gpu = GpuSettings(Policy.PREEMPTIVE)
    a, b = Tenant("a"), Tenant("b")
    plan = [[a, replace(b, active=False)]] * 3 + [[a, b]] * 6
    sequence = owners_under([(gpu, tenants) for tenants in plan])
    assert sequence == ["a", "a", "a", "b", "a", "b", "a", "b", "a"]


def test_preemptive_leaves_idle_containers_thawed_so_their_new_work_is_seen():
    clock = SimulatedClock()
    scheduler = TimeSliceScheduler(SLICE, clock.now)
    decided = scheduler.next_slice(
        GpuSettings(Policy.PREEMPTIVE), [Tenant("a"), Tenant("b", active=False)]
    )
    assert (decided.kind, decided.owner) == (SliceKind.TURN, "a")
    assert decided.runs == {"a", "b"}


def test_with_nobody_having_work_the_slice_is_idle_and_everyone_stays_thawed():
    clock = SimulatedClock()
    scheduler = TimeSliceScheduler(SLICE, clock.now)
    tenants = [Tenant("a", active=False), Tenant("b", active=False)]
    decided = scheduler.next_slice(GpuSettings(Policy.PREEMPTIVE), tenants)
    assert (decided.kind, decided.owner, decided.runs) == (SliceKind.IDLE, None, {"a", "b"})


def test_an_unheld_fixed_slot_is_an_idle_slice_with_everyone_frozen():
    clock = SimulatedClock()
    scheduler = TimeSliceScheduler(SLICE, clock.now)
    gpu = GpuSettings(Policy.FIXED)
    tenants = [Tenant("a", core_percent=50)]
    first = scheduler.next_slice(gpu, tenants)
    clock.advance(SLICE)
    second = scheduler.next_slice(gpu, tenants)
    assert (first.kind, first.owner) == (SliceKind.TURN, "a")
    assert (second.kind, second.owner, second.runs) == (SliceKind.IDLE, None, frozenset())


def test_weights_one_to_two_give_one_to_two_compute_in_merged_turns():
    gpu = GpuSettings(Policy.WEIGHTED)
    tenants = [Tenant("a", weight=1), Tenant("b", weight=2)]
    shares = simulate(gpu, tenants, seconds=10)
    assert shares["a"] == pytest.approx(1 / 3, abs=0.03)
    assert shares["b"] == pytest.approx(2 / 3, abs=0.03)
    # b's two slices come as one turn: the GPU switches twice per round, not three times.
    assert owners(gpu, tenants, 9) == ["a", "b", "b"] * 3


def test_weight_based_turns_last_weight_slices_and_other_policies_take_one_slice_turns():
    tenants = [Tenant("a", weight=2), Tenant("b", weight=2)]
    assert owners(GpuSettings(Policy.WEIGHTED), tenants, 8) == ["a", "a", "b", "b"] * 2
    assert owners(GpuSettings(Policy.PREEMPTIVE), tenants, 8) == ["a", "b"] * 4


def test_the_next_turn_goes_to_whoever_is_furthest_behind_its_share():
    tenants = [Tenant("a", core_percent=20), Tenant("b", core_percent=50)]
    sequence = owners(GpuSettings(Policy.FIXED), tenants, 10)
    assert sequence == ["a", "b", None, "b", None, "b", "a", "b", None, "b"]


def test_a_container_back_from_idle_waits_behind_one_still_owed_time():
    gpu = GpuSettings(Policy.WEIGHTED)
    a, b = Tenant("a", weight=1), Tenant("b", weight=3)
    plan = [[a, b]] + [[replace(a, active=False), b]] * 3 + [[a, b]] * 4
    sequence = owners_under([(gpu, tenants) for tenants in plan])
    # b was owed a quarter of the first slice: its next turn of three comes first.
    assert sequence == ["a", "b", "b", "b", "b", "b", "b", "a"]


def test_ties_go_round_robin():
    tenants = [Tenant("a"), Tenant("b"), Tenant("c")]
    assert owners(GpuSettings(Policy.PREEMPTIVE), tenants, 6) == ["a", "b", "c"] * 2


def test_a_turn_with_half_a_slice_or_less_left_ends_when_the_loop_wakes_late():
    clock = SimulatedClock()
    scheduler = TimeSliceScheduler(1.0, clock.now)
    gpu = GpuSettings(Policy.WEIGHTED)
    tenants = [Tenant("a", weight=2), Tenant("b", weight=2)]
    sequence = []
    for late in (1.5, 1.5, 1.0, 1.0):
        sequence.append(scheduler.next_slice(gpu, tenants).owner)
        clock.advance(late)
    # Each turn of two slices had half a slice left after a wake-up half a slice late.
    assert sequence == ["a", "b", "a", "a"]


def test_weighted_turns_skip_idle_containers():
    gpu = GpuSettings(Policy.WEIGHTED)
    shares = simulate(gpu, [Tenant("a", weight=1), Tenant("b", weight=3, active=False)])
    assert shares["a"] == pytest.approx(1.0)


def test_fixed_percentages_hold_and_the_remainder_stays_idle():
    gpu = GpuSettings(Policy.FIXED)
    tenants = [Tenant("a", core_percent=30), Tenant("b", core_percent=50)]
    shares = simulate(gpu, tenants)
    assert shares["a"] == pytest.approx(0.30, abs=0.01)
    assert shares["b"] == pytest.approx(0.50, abs=0.01)


def test_fixed_gives_a_container_without_a_percentage_its_weight_of_max_inst():
    gpu = GpuSettings(Policy.FIXED, max_inst=4)
    tenants = [Tenant("pct", core_percent=30), Tenant("w", weight=2)]
    assert promised_shares(gpu, tenants) == pytest.approx({"pct": 0.30, "w": 0.5}, abs=1e-9)


def test_fixed_does_not_hand_an_idle_containers_percentage_to_others():
    gpu = GpuSettings(Policy.FIXED)
    tenants = [Tenant("a", core_percent=30, active=False), Tenant("b", core_percent=50)]
    assert simulate(gpu, tenants)["b"] == pytest.approx(0.50, abs=0.01)


def test_fixed_scales_down_percentages_that_add_past_the_gpu():
    gpu = GpuSettings(Policy.FIXED)
    tenants = [Tenant("a", core_percent=80), Tenant("b", core_percent=80)]
    shares = simulate(gpu, tenants)
    assert shares["a"] == pytest.approx(0.5, abs=0.01)
    assert shares["b"] == pytest.approx(0.5, abs=0.01)


def test_soft_evens_out_a_greedy_container_that_native_lets_dominate():
    tenants = [Tenant("greedy"), Tenant("light")]
    intensity = {"greedy": 3.0, "light": 1.0}
    native = simulate(GpuSettings(Policy.NATIVE), tenants, intensity=intensity)
    assert native["greedy"] == pytest.approx(0.75, abs=0.01)
    soft = simulate(GpuSettings(Policy.SOFT), tenants, intensity=intensity)
    assert soft["greedy"] == pytest.approx(0.5, abs=0.03)
    assert soft["light"] == pytest.approx(0.5, abs=0.03)


def test_soft_lets_a_container_overrun_while_no_other_is_waiting():
    tenants = [Tenant("a"), Tenant("b", active=False)]
    assert simulate(GpuSettings(Policy.SOFT), tenants)["a"] == pytest.approx(1.0)


def test_soft_runs_containers_together_when_shares_are_even():
    clock = SimulatedClock()
    scheduler = TimeSliceScheduler(SLICE, clock.now)
    decided = scheduler.next_slice(GpuSettings(Policy.SOFT), [Tenant("a"), Tenant("b")])
    assert decided.kind is SliceKind.SHARED
    assert decided.runs == {"a", "b"}


def soft_runs_after(history: Sequence[Mapping[str, float]], **tuning: float) -> frozenset[str]:
    """Who the soft policy lets run in the slice after `history`: each slice's GPU-seconds
    used so far, per container (all have work)."""
    clock = SimulatedClock()
    scheduler = TimeSliceScheduler(SLICE, clock.now, **tuning)
    gpu = GpuSettings(Policy.SOFT)
    for used in history:
        decided = scheduler.next_slice(gpu, [Tenant(key, used_s=u) for key, u in used.items()])
        clock.advance(SLICE)
    return decided.runs


def soft_runs(
    before: Mapping[str, float], after: Mapping[str, float], **tuning: float
) -> frozenset[str]:
    """Who the soft policy lets run once each container's GPU-seconds went from `before`
    to `after` over the scheduler's window (10 slices)."""
    return soft_runs_after([before] * 10 + [after], **tuning)


@pytest.mark.parametrize(("slices_ago", "held_back"), [(10, {"a"}), (11, set())])
def test_soft_remembers_the_last_ten_slices(slices_ago, held_back):
    # a ran alone for one slice, then a and b shared the GPU evenly.
    history = [{"a": 0.0, "b": 0.0}, {"a": 0.1, "b": 0.0}]
    history += [{"a": 0.1 + 0.05 * k, "b": 0.05 * k} for k in range(1, slices_ago)]
    assert soft_runs_after(history) == {"a", "b"} - held_back


def test_soft_holds_back_only_those_above_their_share_while_another_is_below_it():
    # The GPU was half busy over the window: a used 37% of that, c 33% (within 2 points
    # of its third), b 30% (below it).
    runs = soft_runs({"a": 0, "b": 0, "c": 0}, {"a": 0.185, "b": 0.15, "c": 0.165})
    assert runs == {"b", "c"}


def test_soft_holds_nobody_back_while_nobody_is_short_by_more_than_the_tolerance():
    runs = soft_runs({"a": 0, "b": 0, "c": 0}, {"a": 0.18, "b": 0.16, "c": 0.16})
    assert runs == {"a", "b", "c"}


def test_soft_judges_the_recent_window_not_what_a_container_used_before():
    runs = soft_runs({"old": 100.0, "new": 0.0}, {"old": 100.25, "new": 0.25})
    assert runs == {"old", "new"}


@pytest.mark.parametrize(
    "after",
    [
        # a is short of its quarter by exactly the tolerance: not short enough to hold b back.
        {"a": 0.0625, "b": 0.25, "c": 0.09375, "d": 0.09375},
        # a is over its quarter by exactly the tolerance while b is short: a still runs.
        {"a": 0.1875, "b": 0.03125, "c": 0.140625, "d": 0.140625},
    ],
)
def test_soft_counts_a_share_at_the_edge_of_the_tolerance_as_within_it(after):
    # A tolerance of 1/8 around the fair quarter, so the edges are exact in binary.
    before = dict.fromkeys(after, 0.0)
    assert soft_runs(before, after, soft_tolerance=0.125) == {"a", "b", "c", "d"}


def test_native_never_freezes_anyone():
    clock = SimulatedClock()
    scheduler = TimeSliceScheduler(SLICE, clock.now)
    tenants = [Tenant("a", weight=0), Tenant("b", high_priority=True), Tenant("c")]
    decided = scheduler.next_slice(GpuSettings(Policy.NATIVE), tenants)
    assert decided.kind is SliceKind.NATIVE
    assert decided.runs == {"a", "b", "c"}
    assert promised_shares(GpuSettings(Policy.NATIVE), tenants) == {"a": None, "b": None, "c": None}


@pytest.mark.parametrize("policy", [p for p in Policy if p.slices_time])
def test_a_container_without_weight_gets_no_compute(policy):
    tenants = [Tenant("a", core_percent=50), Tenant("starved", weight=0, core_percent=50)]
    shares = simulate(GpuSettings(policy), tenants, seconds=5)
    assert shares["starved"] == 0.0
    assert promised_shares(GpuSettings(policy), tenants)["starved"] == 0.0
    resting = [*tenants, Tenant("resting", weight=0, core_percent=50, active=False)]
    assert promised_shares(GpuSettings(policy), resting)["resting"] == 0.0


def test_high_priority_preempts_up_to_prio_ratio_while_it_has_work():
    gpu = GpuSettings(Policy.PREEMPTIVE, prio_ratio=40)
    tenants = [Tenant("hp", high_priority=True), Tenant("a"), Tenant("b")]
    shares = simulate(gpu, tenants)
    # To within a slice over the minute.
    assert shares["hp"] == pytest.approx(0.40, abs=0.002)
    assert shares["a"] == pytest.approx(0.30, abs=0.002)
    assert shares["b"] == pytest.approx(0.30, abs=0.002)


def test_high_priority_takes_the_very_next_slice_when_work_arrives():
    gpu = GpuSettings(Policy.PREEMPTIVE, prio_ratio=20)
    assert owners(gpu, [Tenant("hp", high_priority=True), Tenant("a")], 1) == ["hp"]


def test_idle_high_priority_takes_nothing():
    gpu = GpuSettings(Policy.PREEMPTIVE, prio_ratio=90)
    tenants = [Tenant("hp", high_priority=True, active=False), Tenant("a"), Tenant("b")]
    shares = simulate(gpu, tenants)
    assert shares["a"] == pytest.approx(0.5, abs=0.01)
    assert shares["b"] == pytest.approx(0.5, abs=0.01)


def test_high_priority_alone_gets_the_whole_gpu_on_a_work_conserving_policy():
    gpu = GpuSettings(Policy.PREEMPTIVE, prio_ratio=30)
    tenants = [Tenant("hp", high_priority=True), Tenant("a", active=False)]
    assert simulate(gpu, tenants)["hp"] == pytest.approx(1.0)


def test_time_high_priority_takes_while_the_others_are_idle_is_not_owed_back():
    gpu = GpuSettings(Policy.PREEMPTIVE, prio_ratio=50)
    hp, a = Tenant("hp", high_priority=True), Tenant("a")
    resting = replace(a, active=False)
    plan = [[hp, a], [hp, resting], [hp, resting], [hp, a], [hp, a], [hp, a]]
    # Half each: a takes the first slice after its pause, then they alternate again.
    sequence = owners_under([(gpu, tenants) for tenants in plan])
    assert sequence == ["hp", "hp", "hp", "a", "hp", "a"]


def test_high_priority_containers_take_weight_long_turns_under_the_weight_based_policy():
    tenants = [
        Tenant("x", weight=2, high_priority=True),
        Tenant("y", weight=2, high_priority=True),
    ]
    assert owners(GpuSettings(Policy.WEIGHTED), tenants, 8) == ["x", "x", "y", "y"] * 2


def test_high_priority_on_fixed_slots_gets_exactly_prio_ratio():
    gpu = GpuSettings(Policy.FIXED, prio_ratio=30)
    tenants = [Tenant("hp", high_priority=True), Tenant("a", core_percent=50)]
    shares = simulate(gpu, tenants)
    assert shares["hp"] == pytest.approx(0.30, abs=0.01)
    assert shares["a"] == pytest.approx(0.35, abs=0.01)


def test_max_inst_bounds_the_fair_share_slots():
    gpu = GpuSettings(Policy.FAIR_SHARE, max_inst=2)
    shares = simulate(gpu, [Tenant("a"), Tenant("b"), Tenant("late")])
    assert shares == pytest.approx({"a": 0.5, "b": 0.5, "late": 0.0}, abs=0.01)


def test_a_policy_change_takes_effect_on_the_next_slice():
    clock = SimulatedClock()
    scheduler = TimeSliceScheduler(SLICE, clock.now)
    tenants = [Tenant("a"), Tenant("b")]
    assert scheduler.next_slice(GpuSettings(Policy.PREEMPTIVE), tenants).runs == {"a"}
    clock.advance(SLICE)
    assert scheduler.next_slice(GpuSettings(Policy.NATIVE), tenants).runs == {"a", "b"}


def test_a_policy_change_cuts_short_a_turn_of_the_old_policy():
    weighted, preemptive = GpuSettings(Policy.WEIGHTED), GpuSettings(Policy.PREEMPTIVE)
    tenants = [Tenant("a", weight=1), Tenant("b", weight=3)]
    # b's turn of three slices starts at the second; from the third, turns last one slice.
    plan = [(weighted, tenants)] * 2 + [(preemptive, tenants)] * 4
    assert owners_under(plan) == ["a", "b", "a", "b", "a", "b"]


def test_a_new_prio_ratio_gives_waiting_high_priority_work_the_next_slice():
    before, after = (GpuSettings(Policy.PREEMPTIVE, prio_ratio=r) for r in (20, 30))
    tenants = [Tenant("hp", high_priority=True), Tenant("a")]
    assert owners_under([(before, tenants)] * 3) == ["hp", "a", "a"]
    assert owners_under([(before, tenants)] * 2 + [(after, tenants)]) == ["hp", "a", "hp"]


def test_shares_hold_when_the_loop_wakes_up_late_or_early():
    gpu = GpuSettings(Policy.WEIGHTED)
    tenants = [Tenant("a", weight=1), Tenant("b", weight=3)]
    jitter = [0.07, 0.13, 0.1, 0.12, 0.08, 0.11]
    shares = simulate(gpu, tenants, step=lambda tick: jitter[tick % len(jitter)])
    assert shares["a"] == pytest.approx(0.25, abs=0.02)
    assert shares["b"] == pytest.approx(0.75, abs=0.02)


def test_the_promise_counts_an_idle_container_as_if_it_had_work():
    gpu = GpuSettings(Policy.WEIGHTED)
    tenants = [Tenant("a", weight=1), Tenant("b", weight=3, active=False)]
    assert promised_shares(gpu, tenants) == pytest.approx({"a": 1.0, "b": 0.75})


def test_the_promise_to_an_idle_container_wakes_only_that_one():
    gpu = GpuSettings(Policy.WEIGHTED)
    tenants = [
        Tenant("a", weight=1),
        Tenant("b", weight=3, active=False),
        Tenant("c", weight=4, active=False),
    ]
    assert promised_shares(gpu, tenants) == pytest.approx({"a": 1.0, "b": 0.75, "c": 0.8})


def test_slice_length_must_be_positive():
    with pytest.raises(ValueError, match="slice length"):
        TimeSliceScheduler(0)


tenant_lists = st.lists(
    st.builds(
        Tenant,
        id=st.sampled_from("abcdefgh"),
        weight=st.integers(0, 4),
        high_priority=st.booleans(),
        core_percent=st.sampled_from([0, 5, 10, 25, 30, 50]),
        active=st.booleans(),
    ),
    min_size=1,
    max_size=6,
    unique_by=lambda t: t.id,
)


@settings(max_examples=60, deadline=None)
@given(
    policy=st.sampled_from([Policy.FAIR_SHARE, Policy.PREEMPTIVE, Policy.WEIGHTED, Policy.FIXED]),
    max_inst=st.integers(1, 25),
    prio_ratio=st.integers(20, 99),
    tenants=tenant_lists,
)
def test_every_container_gets_what_its_policy_promises(policy, max_inst, prio_ratio, tenants):
    gpu = GpuSettings(policy, max_inst, prio_ratio)
    achieved = simulate(gpu, tenants, seconds=60)
    promised = promised_shares(gpu, tenants)
    for t in tenants:
        expected = promised[t.id] if t.active else 0.0
        assert expected is not None
        # Within one longest turn (4 slices) over the run, plus rounding.
        assert achieved[t.id] == pytest.approx(expected, abs=0.02), t


@settings(max_examples=40, deadline=None)
@given(policy=st.sampled_from(list(Policy)), tenants=tenant_lists)
def test_the_gpu_is_never_given_past_its_time(policy, tenants):
    achieved = simulate(GpuSettings(policy, max_inst=25), tenants, seconds=5)
    assert sum(achieved.values()) <= 1.0 + 1e-9
    assert all(share >= 0 for share in achieved.values())
