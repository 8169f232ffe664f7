"""The agent end to end on the mock backend and a simulated clock."""

import logging

import pytest

from gpushare.isolation.agent import IsolationAgent
from gpushare.isolation.backends.mock import Demand, MemoryStep, MockContainer
from gpushare.isolation.backends.port import GIB
from gpushare.isolation.control import ControlTree
from gpushare.isolation.memory import MemoryAction
from gpushare.isolation.policy import Policy
from gpushare.labels import NodeMode
from gpushare.standins.scenario import Workload, place
from tests.isolation.rig import NODE, SLICE, container_labels, rig


def test_weights_one_to_two_get_one_to_two_of_the_compute(tmp_path):
    r = rig(
        tmp_path,
        [Workload("a", 4, weight=1), Workload("b", 4, weight=2)],
        default_policy=Policy.WEIGHTED,
    )
    shares = r.shares(["a", "b"], seconds=10)
    assert shares["a"] == pytest.approx(1 / 3, abs=0.03)
    assert shares["b"] == pytest.approx(2 / 3, abs=0.03)


def test_weights_written_to_the_tree_change_the_shares(tmp_path):
    r = rig(tmp_path, [Workload("a", 4), Workload("b", 4)], default_policy=Policy.WEIGHTED)
    assert r.shares(["a", "b"], seconds=5) == pytest.approx({"a": 0.5, "b": 0.5}, abs=0.03)
    r.write(f"{r.container_dir('b')}/weight", "3\n")
    assert r.shares(["a", "b"], seconds=10) == pytest.approx({"a": 0.25, "b": 0.75}, abs=0.03)
    assert r.read(f"{r.container_dir('b')}/weight") == "3\n"


def test_a_policy_write_switches_behaviour_within_one_slice(tmp_path):
    r = rig(
        tmp_path,
        [Workload("greedy", 4, intensity=3.0), Workload("light", 4, intensity=1.0)],
    )
    # No compute percentage on this GPU: it starts native, where the greedy one dominates.
    native = r.shares(["greedy", "light"], seconds=5)
    assert native["greedy"] == pytest.approx(0.75, abs=0.02)
    r.write("0/policy", "1\n")
    r.agent.tick()
    # The very next slice is a turn: one of the two is frozen.
    assert len(r.backend.frozen) == 1
    preemptive = r.shares(["greedy", "light"], seconds=10)
    assert preemptive == pytest.approx({"greedy": 0.5, "light": 0.5}, abs=0.03)
    assert r.read("0/policy") == "1\n"


def test_fixed_percentages_on_a_core_mem_node_hold_and_leave_the_rest_idle(tmp_path):
    r = rig(
        tmp_path,
        [Workload("infer", 2, core=30), Workload("train", 4, core=50)],
        mode=NodeMode.CORE_MEM,
    )
    shares = r.shares(["infer", "train"], seconds=10)
    assert r.read("0/policy") == "3\n"
    assert shares == pytest.approx({"infer": 0.30, "train": 0.50}, abs=0.03)
    assert r.read(f"{r.container_dir('infer')}/limit") == "30.0\n"


def test_high_priority_container_takes_prio_ratio_while_it_has_work(tmp_path):
    r = rig(
        tmp_path,
        [
            Workload("online", 2, high_priority=True, demand=Demand(busy_s=5, idle_s=5)),
            Workload("batch-1", 4),
            Workload("batch-2", 4),
        ],
        default_policy=Policy.PREEMPTIVE,
        prio_ratio=40,
    )
    busy = r.shares(["online", "batch-1", "batch-2"], seconds=5)
    assert busy == pytest.approx({"online": 0.40, "batch-1": 0.30, "batch-2": 0.30}, abs=0.03)
    idle = r.shares(["online", "batch-1", "batch-2"], seconds=5)
    assert idle["online"] == pytest.approx(0.0, abs=0.03)
    assert idle["batch-1"] == pytest.approx(0.5, abs=0.03)


def test_a_container_left_without_weight_gets_no_compute(tmp_path):
    r = rig(
        tmp_path,
        [Workload("big", 4, weight=2), Workload("late", 4, weight=1)],
        default_policy=Policy.PREEMPTIVE,
        max_inst=2,
    )
    shares = r.shares(["big", "late"], seconds=3)
    assert shares["late"] == 0.0
    assert shares["big"] == pytest.approx(1.0, abs=0.01)
    assert r.read("0/free_weight") == "0\n"
    assert r.read(f"{r.container_dir('late')}/weight") == "0\n"


def test_an_allocation_past_the_cap_is_acted_on_within_one_poll(tmp_path, caplog):
    over_at = 1.05
    r = rig(
        tmp_path,
        [
            Workload("ok", 4, memory=(MemoryStep(0, 3 * GIB),)),
            Workload("leaky", 2, memory=(MemoryStep(0, GIB), MemoryStep(over_at, 3 * GIB))),
        ],
    )
    with caplog.at_level(logging.WARNING, logger="gpushare.isolation"):
        r.agent.run(duration_s=3)
    [kill] = r.backend.kills
    assert kill.container_id == r.key("leaky")
    assert kill.mem_bytes == 3 * GIB
    assert 0 <= kill.at - over_at <= SLICE
    assert "memory cap exceeded" in caplog.text and "killed pid" in caplog.text
    assert r.read(f"{r.container_dir('leaky')}/violations") == "1\n"
    violations = r.agent.metrics.registry.get_sample_value(
        "gpushare_isolation_memory_cap_violations_total",
        {**container_labels(r, "leaky"), "action": "kill"},
    )
    assert violations == 1.0


def test_report_only_logs_and_counts_once_per_episode(tmp_path, caplog):
    r = rig(
        tmp_path,
        [Workload("leaky", 2, memory=(MemoryStep(0.5, 3 * GIB),))],
        memory_action=MemoryAction.REPORT,
    )
    with caplog.at_level(logging.WARNING, logger="gpushare.isolation"):
        r.agent.run(duration_s=2)
    assert r.backend.kills == []
    assert caplog.text.count("memory cap exceeded") == 1
    assert "reported only" in caplog.text
    assert r.read(f"{r.container_dir('leaky')}/violations") == "1\n"


def test_memory_in_the_tree_follows_the_processes(tmp_path):
    r = rig(tmp_path, [Workload("a", 4, memory=(MemoryStep(0, 3 * GIB),))])
    r.agent.tick()
    [pid] = r.backend.pids(r.key("a"))
    assert r.read(f"{r.container_dir('a')}/meminfo") == f"Free: {GIB}\nPID: {pid} Mem: {3 * GIB}\n"
    assert r.read(f"{r.container_dir('a')}/memsize") == f"{4 * GIB}\n"


def test_a_container_with_isolation_off_is_never_frozen_nor_capped(tmp_path):
    node = place([Workload("free", 2)], mode=NodeMode.CGPU)
    base = node.containers[0]
    disabled = MockContainer(
        "d" * 64,
        {**base.environ, "CGPU_DISABLE": "true", "GPUSHARE_POD": "default/unlimited"},
        memory=(MemoryStep(0, 8 * GIB),),
    )
    r = rig(tmp_path, [Workload("a", 2)], extra=[disabled], default_policy=Policy.PREEMPTIVE)
    r.agent.run(duration_s=2)
    assert r.backend.kills == []
    # Never frozen: it shares the GPU natively with the one scheduled container all along.
    assert r.backend.used_s("d" * 64, 0) == pytest.approx(1.0, abs=0.05)
    assert r.read(f"0/{'d' * 64}/limit") == "none\n"
    assert r.read(f"0/{'d' * 64}/weight") == "0\n"
    assert "d" * 64 not in r.backend.frozen


def test_an_idle_container_under_preemptive_is_probed_and_rejoins(tmp_path):
    r = rig(
        tmp_path,
        [Workload("steady", 4), Workload("bursty", 4, demand=Demand(busy_s=2, idle_s=2))],
        default_policy=Policy.PREEMPTIVE,
    )
    busy = r.shares(["steady", "bursty"], seconds=2)
    # The turn in which bursty is first seen idle is lost: one slice (0.05 of 2 s) per change.
    idle = r.shares(["steady", "bursty"], seconds=2)
    assert busy == pytest.approx({"steady": 0.5, "bursty": 0.5}, abs=0.06)
    assert idle["steady"] == pytest.approx(1.0, abs=0.06)
    again = r.shares(["steady", "bursty"], seconds=2)
    assert again["bursty"] == pytest.approx(0.5, abs=0.06)


def test_stopping_thaws_every_container(tmp_path):
    r = rig(tmp_path, [Workload("a", 2), Workload("b", 2)], default_policy=Policy.PREEMPTIVE)
    r.agent.tick()
    assert r.backend.frozen
    r.agent.run(duration_s=0.3)
    assert r.backend.frozen == frozenset()


def test_a_gone_container_keeps_its_entry_for_a_while_then_frees_its_weight(tmp_path):
    r = rig(tmp_path, [Workload("a", 2, weight=3)], default_policy=Policy.WEIGHTED)
    r.agent.tick()
    assert r.read("0/free_weight") == "13\n"
    r.backend.remove(r.key("a"))
    r.agent.run(duration_s=5)
    assert (r.root / r.container_dir("a")).is_dir()
    r.agent.run(duration_s=30)
    assert not (r.root / r.container_dir("a")).exists()
    assert r.read("0/free_weight") == "16\n"


def test_metrics_cover_memory_utilisation_throttling_and_policy(tmp_path):
    r = rig(
        tmp_path,
        [Workload("a", 4, memory=(MemoryStep(0, GIB),)), Workload("b", 4)],
        default_policy=Policy.PREEMPTIVE,
    )
    r.agent.run(duration_s=6)
    registry = r.agent.metrics.registry
    labels = container_labels(r, "a")
    assert registry.get_sample_value("gpushare_isolation_memory_used_bytes", labels) == GIB
    assert registry.get_sample_value("gpushare_isolation_memory_cap_bytes", labels) == 4 * GIB
    assert registry.get_sample_value(
        "gpushare_isolation_utilization_percent", labels
    ) == pytest.approx(50, abs=3)
    throttled = registry.get_sample_value("gpushare_isolation_throttled_seconds_total", labels)
    assert throttled == pytest.approx(3.0, abs=0.3)
    # Frozen, not under the interposer: the time held back is the time frozen.
    assert registry.get_sample_value("gpushare_isolation_held_seconds_total", labels) == (
        pytest.approx(throttled)
    )
    assert (
        registry.get_sample_value("gpushare_isolation_gpu_policy", {"node": NODE, "gpu": "0"}) == 1
    )


def test_settings_written_to_the_tree_survive_an_agent_restart(tmp_path, caplog):
    r = rig(tmp_path, [Workload("a", 4), Workload("b", 4)])
    r.agent.tick()
    r.write("0/policy", "2\n")
    r.write(f"{r.container_dir('b')}/weight", "3\n")
    r.agent.tick()
    restarted = IsolationAgent(r.backend, ControlTree(r.root), r.clock, r.agent.config)
    with caplog.at_level(logging.INFO, logger="gpushare.isolation"):
        restarted.tick()
    assert "kept from an earlier run" in caplog.text
    assert restarted.settings(0).policy is Policy.WEIGHTED
    assert r.read(f"{r.container_dir('b')}/weight") == "3\n"
    assert r.read("0/free_weight") == "12\n"


@pytest.mark.parametrize("message", ["GPU has fallen off the bus", ""])
def test_a_failing_tick_thaws_everyone_and_the_agent_carries_on(tmp_path, caplog, message):
    r = rig(tmp_path, [Workload("a", 2), Workload("b", 2)], default_policy=Policy.PREEMPTIVE)
    r.agent.tick()
    assert r.backend.frozen
    real_observe = r.backend.observe
    failures = iter([RuntimeError(message)] * 3)  # an error may say nothing at all

    healthy = []

    def flaky():
        healthy.append(gpu_sample(r, "gpushare_isolation_gpu_healthy"))
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return real_observe()

    r.backend.observe = flaky
    frozen_seen = []
    real_hold = r.backend.hold

    def hold(frozen):
        frozen_seen.append(frozen)
        real_hold(frozen)

    r.backend.hold = hold
    with caplog.at_level(logging.INFO, logger="gpushare.isolation"):
        r.agent.run(duration_s=0.6)
    assert frozen_seen[:3] == [frozenset()] * 3
    assert any(frozen_seen[3:])
    assert caplog.text.count("tick failed") == 1
    assert "ticks work again" in caplog.text
    # The agent could not see its GPU while the ticks failed, and says so.
    assert healthy[:5] == [1, 0, 0, 0, 1]
    assert gpu_sample(r, "gpushare_isolation_gpu_healthy") == 1


def gpu_sample(r, name: str) -> float | None:
    return r.agent.metrics.registry.get_sample_value(name, {"node": NODE, "gpu": "0"})


def test_per_gpu_metrics_show_its_memory_utilisation_and_policy(tmp_path):
    r = rig(
        tmp_path,
        [
            Workload("a", 4, memory=(MemoryStep(0, GIB),)),
            Workload("b", 4, memory=(MemoryStep(0, 2 * GIB),)),
        ],
        default_policy=Policy.PREEMPTIVE,
    )
    r.agent.run(duration_s=6)
    assert gpu_sample(r, "gpushare_isolation_gpu_memory_used_bytes") == 3 * GIB
    assert gpu_sample(r, "gpushare_isolation_gpu_memory_total_bytes") == 16 * GIB
    assert gpu_sample(r, "gpushare_isolation_gpu_utilization_percent") == pytest.approx(100, abs=5)
    assert gpu_sample(r, "gpushare_isolation_gpu_policy") == Policy.PREEMPTIVE
    node = {"node": NODE}
    assert (
        r.agent.metrics.registry.get_sample_value("gpushare_isolation_slice_seconds", node) == SLICE
    )


def test_a_tick_that_starts_over_a_slice_late_is_counted(tmp_path):
    r = rig(tmp_path, [Workload("a", 4)])
    real_observe = r.backend.observe
    calls = []

    def counted():
        calls.append(None)
        if len(calls) == 2:
            r.clock.advance(2.5 * SLICE)  # the second tick takes two and a half slices
        return real_observe()

    r.backend.observe = counted
    r.agent.run(duration_s=1)
    late = r.agent.metrics.registry.get_sample_value(
        "gpushare_isolation_late_ticks_total", {"node": NODE}
    )
    assert late == 1


def test_a_container_on_two_gpus_runs_only_when_both_let_it(tmp_path):
    node = place([Workload("a", 2)], layout="2x16GiB", mode=NodeMode.CGPU)
    split = MockContainer(
        "5" * 64,
        {
            **node.containers[0].environ,
            "ALIYUN_COM_GPU_MEM_IDX": "0,1",
            "ALIYUN_COM_GPU_MEM_CONTAINER": "2,2",
            "ALIYUN_COM_GPU_MEM_DEV": "16,16",
            "GPUSHARE_POD": "default/split",
        },
    )
    r = rig(
        tmp_path,
        [Workload("a", 2)],
        layout="2x16GiB",
        extra=[split],
        default_policy=Policy.PREEMPTIVE,
    )
    r.agent.run(duration_s=10)
    # Alone on GPU 1, but frozen whenever it is a's turn on GPU 0: half the time on both.
    assert r.backend.used_s("5" * 64, 1) / 10 == pytest.approx(0.5, abs=0.03)
    assert r.backend.used_s("5" * 64, 0) / 10 == pytest.approx(0.5, abs=0.03)
