"""The roster on its own: who is on which GPU, for how long, and what each did there."""

import pytest

from gpushare.isolation.roster import ContainerRoster
from tests.isolation.parts import observed, process

NOBODY: frozenset[str] = frozenset()


def roster() -> ContainerRoster:
    return ContainerRoster([0, 1], forget_after_s=30.0, util_window_s=5.0)


def test_a_container_joins_each_known_gpu_once_in_arrival_order():
    r = roster()
    a = observed("a", process(1, 0), process(2, 1), gpus=(0, 1, 7), mem_gib=(2, 2, 2))
    b = observed("b", process(3, 0))
    changes = r.update(0.0, 0.0, {"a": a, "b": b}, NOBODY)
    assert changes.joined == ((0, a), (1, a), (0, b))
    assert list(r.members(0)) == ["a", "b"]
    assert r.update(0.1, 0.1, {"a": a, "b": b}, NOBODY).joined == ()


def test_a_gone_container_is_kept_for_a_while_then_forgotten():
    r = roster()
    a = observed("a", process(1))
    r.update(0.0, 0.0, {"a": a}, NOBODY)
    assert r.update(10.0, 10.0, {}, NOBODY).gone == ()
    known = r.known("a")
    assert known is not None and not known.present
    assert r.update(30.5, 20.5, {}, NOBODY).gone == ("a",)
    assert r.known("a") is None and r.members(0) == {}


def test_activity_is_judged_only_while_thawed_and_not_in_the_first_tick():
    r = roster()
    idle = observed("a", process(1, sm=0.0))
    r.update(0.0, 0.0, {"a": idle}, NOBODY)
    assert r.members(0)["a"].active  # just joined: no slice yet, no verdict
    r.update(0.1, 0.1, {"a": idle}, frozenset({"a"}))
    assert r.members(0)["a"].active  # frozen: it could not show work
    r.update(0.2, 0.1, {"a": idle}, NOBODY)
    assert not r.members(0)["a"].active


def test_gpu_time_and_the_utilisation_shown_over_the_window():
    r = roster()
    half = observed("a", process(1, sm=50.0))
    for tick in range(101):
        r.update(tick * 0.1, 0.0 if tick == 0 else 0.1, {"a": half}, NOBODY)
    usage = r.members(0)["a"]
    assert usage.used_s == pytest.approx(5.0)
    assert usage.shown_util == 0.0  # not refreshed yet: shown at a steady pace
    r.refresh_utilisation()
    assert usage.shown_util == pytest.approx(50.0)
    assert usage.history[0][0] >= 10.0 - 5.0


def test_a_container_without_processes_on_a_gpu_uses_none_of_it():
    r = roster()
    a = observed("a", process(1, gpu=1), gpus=(0, 1), mem_gib=(2, 2))
    r.update(0.0, 0.0, {"a": a}, NOBODY)
    r.update(1.0, 1.0, {"a": a}, NOBODY)
    assert r.members(0)["a"].used_s == 0.0 and not r.members(0)["a"].active
    assert r.members(1)["a"].used_s == pytest.approx(0.5)
