"""The memory-cap enforcer on its own: who is killed, and how episodes are counted."""

import logging

from gpushare.isolation.backends.port import GIB
from gpushare.isolation.memory import MemoryAction, MemoryCapEnforcer
from gpushare.isolation.workload import ObservedContainer
from tests.isolation.parts import observed, process


def enforcer(action: MemoryAction = MemoryAction.KILL) -> tuple[MemoryCapEnforcer, list[int]]:
    killed: list[int] = []
    return MemoryCapEnforcer(action, killed.append), killed


def over() -> dict[str, ObservedContainer]:
    """Container a over its 2 GiB cap on GPU 0, within it on GPU 1."""
    a = observed(
        "a",
        process(10, 0, GIB),
        process(11, 0, 2 * GIB),
        process(12, 1, GIB),
        gpus=(0, 1),
        mem_gib=(2, 2),
        core=(0, 0),
    )
    return {"a": a}


def test_the_process_holding_the_most_is_killed_each_time_while_over(caplog):
    guard, killed = enforcer()
    with caplog.at_level(logging.WARNING, logger="gpushare.isolation"):
        guard.enforce(over())
        guard.enforce(over())
    assert killed == [11, 11]
    assert caplog.text.count("memory cap exceeded") == 2
    assert "holds 3.00 GiB on GPU 0, cap 2.00 GiB; killed pid 11 (holding 2.00 GiB)" in caplog.text
    assert guard.violations("a", 0) == 1 and guard.violations("a", 1) == 0


def test_report_only_kills_nothing_and_logs_an_episode_once(caplog):
    guard, killed = enforcer(MemoryAction.REPORT)
    with caplog.at_level(logging.WARNING, logger="gpushare.isolation"):
        for _ in range(3):
            guard.enforce(over())
    assert killed == []
    assert caplog.text.count("reported only") == 1


def test_going_under_the_cap_ends_the_episode_and_forgetting_resets_the_count():
    guard, _ = enforcer(MemoryAction.REPORT)
    guard.enforce(over())
    guard.enforce({"a": observed("a", process(10, 0, GIB), mem_gib=(2,))})
    guard.enforce(over())
    assert guard.violations("a", 0) == 2
    guard.forget("a")
    assert guard.violations("a", 0) == 0


def test_an_uncapped_container_is_left_alone():
    guard, killed = enforcer()
    guard.enforce({"a": observed("a", process(10, 0, 9 * GIB), disabled=True)})
    guard.enforce({"b": observed("b", process(11, 0, 9 * GIB), mem_gib=(0,))})
    assert killed == []
