"""The settings store on its own: the rules a control-tree write must pass, and what is
kept for the next run."""

import logging

import pytest

from gpushare.isolation.policy import Policy
from gpushare.isolation.settings import SettingsStore
from gpushare.isolation.treecodec import control_write
from tests.isolation.parts import Saved, observed


def store(saved: Saved | None = None, policy: Policy | None = None) -> SettingsStore:
    return SettingsStore(
        [0, 1], saved or Saved(), default_policy=policy, max_inst=16, prio_ratio=50
    )


def test_weight_units_go_in_arrival_order_while_they_last():
    s = SettingsStore([0], Saved(), default_policy=None, max_inst=4, prio_ratio=50)
    for key, weight in [("a", 3), ("b", 2), ("c", 1)]:
        s.join(0, observed(key, weight=weight))
    assert s.grants(0) == {"a": 3, "b": 1, "c": 0}
    assert s.free_weight(0) == 0


def test_a_container_with_isolation_off_holds_no_weight():
    s = store()
    s.join(0, observed("a", weight=3, disabled=True))
    assert s.grants(0) == {}
    assert s.free_weight(0) == 16


def test_the_policy_follows_the_containers_until_one_is_written():
    s = store()
    assert s.settings(0).policy is Policy.NATIVE
    s.join(0, observed("a", core=(30,)))
    assert s.settings(0).policy is Policy.FIXED
    assert s.apply(control_write("0/policy", "1\n"))
    assert s.settings(0).policy is Policy.PREEMPTIVE
    assert s.settings(1).policy is Policy.NATIVE


def test_the_policy_that_follows_the_containers_is_logged_once_per_change(caplog):
    s = store()
    with caplog.at_level(logging.INFO, logger="gpushare.isolation"):
        s.settings(0)
        s.settings(0)
        s.join(0, observed("a", core=(30,)))
        s.settings(0)
        s.settings(0)
    assert caplog.messages == [
        "GPU 0 runs policy 5 (native): no container carries a compute percentage",
        "GPU 0 runs policy 3 (fixed): its containers carry a compute percentage",
    ]


def test_an_accepted_write_is_saved_and_a_refused_one_is_not(caplog):
    saved = Saved()
    s = store(saved)
    s.join(0, observed("a"))
    with caplog.at_level(logging.INFO, logger="gpushare.isolation"):
        assert s.apply(control_write("0/a/weight", " 4 \n"))
        assert not s.apply(control_write("0/prio_ratio", "10\n"))
    assert saved.settings == {"0/a/weight": "4"}
    assert s.grants(0) == {"a": 4}
    assert "control tree: container a on GPU 0: weight 4" in caplog.text
    assert "refused write '10' to 0/prio_ratio: prio_ratio must be in 20..99" in caplog.text


@pytest.mark.parametrize(
    ("path", "text", "reason"),
    [
        (
            "0/free_weight",
            "3",
            "free_weight is read-only; the settings are policy, max_inst and prio_ratio "
            "per GPU, weight and highprio per container",
        ),
        ("2/policy", "1", "there is no GPU 2 on this node"),
        ("0/z/weight", "1", "container z is not on GPU 0"),
        ("0/off/weight", "2", "isolation is off for container off"),
        ("0/a/weight", "15", "needs more than the 14 units container a can hold"),
        ("0/max_inst", "2", "max_inst 2 is below the 3 weight units"),
        ("0/a/highprio", "yes", "highprio must be a whole number"),
    ],
)
def test_a_write_breaking_a_rule_changes_nothing(caplog, path, text, reason):
    s = store(policy=Policy.WEIGHTED)
    s.join(0, observed("a"))
    s.join(0, observed("b", weight=2))
    s.join(0, observed("off", disabled=True))
    before = (s.settings(0), s.grants(0))
    with caplog.at_level(logging.WARNING, logger="gpushare.isolation"):
        assert not s.apply(control_write(path, text))
    assert reason in caplog.text
    assert (s.settings(0), s.grants(0)) == before


def test_a_container_may_take_every_unit_still_free():
    s = store()
    s.join(0, observed("a"))
    s.join(0, observed("b", weight=2))
    assert s.apply(control_write("0/a/weight", "14"))
    assert s.grants(0) == {"a": 14, "b": 2}
    assert s.free_weight(0) == 0


def test_the_log_names_a_container_by_its_short_id(caplog):
    full = "3f9a1c2e7b4d" + "0" * 52
    off = "9e8d7c6b5a4f" + "1" * 52
    s = store()
    s.join(0, observed(full))
    s.join(0, observed("b", weight=10))
    s.join(0, observed(off, disabled=True))
    with caplog.at_level(logging.INFO, logger="gpushare.isolation"):
        assert s.apply(control_write(f"0/{full}/weight", "3"))
        assert s.apply(control_write(f"0/{full}/highprio", "1"))
        assert not s.apply(control_write(f"0/{full}/weight", "9"))
        assert not s.apply(control_write(f"1/{full}/weight", "1"))
        assert not s.apply(control_write(f"0/{off}/highprio", "1"))
    assert caplog.messages == [
        "control tree: container 3f9a1c2e7b4d on GPU 0: weight 3",
        "control tree: container 3f9a1c2e7b4d on GPU 0: highprio 1",
        f"refused write '9' to 0/{full}/weight: weight 9 needs more than the 6 units "
        "container 3f9a1c2e7b4d can hold on GPU 0 (free_weight 3); the old value stays",
        f"refused write '1' to 1/{full}/weight: container 3f9a1c2e7b4d is not on GPU 1; "
        "the old value stays",
        f"refused write '1' to 0/{off}/highprio: isolation is off for container 9e8d7c6b5a4f "
        "(CGPU_DISABLE); it is not scheduled; the old value stays",
    ]


def test_saved_settings_come_back_gpu_ones_at_once_and_a_containers_when_it_joins():
    saved = Saved({"0/policy": "2", "0/a/weight": "5", "0/a/highprio": "1"})
    s = store(saved)
    assert s.settings(0).policy is Policy.WEIGHTED
    s.join(0, observed("a"))
    assert s.grants(0) == {"a": 5}
    assert s.containers(0)["a"].high_priority


def test_a_setting_kept_from_an_earlier_run_is_logged_as_such(caplog):
    with caplog.at_level(logging.INFO, logger="gpushare.isolation"):
        store(Saved({"0/policy": "2"}))
    assert caplog.messages == [
        "control tree: GPU 0: policy 2 (weight-preemptive) (kept from an earlier run)"
    ]


def test_a_saved_setting_the_rules_now_refuse_is_dropped(caplog):
    saved = Saved({"0/max_inst": "30", "0/policy": "2"})
    with caplog.at_level(logging.WARNING, logger="gpushare.isolation"):
        s = store(saved)
    assert caplog.messages == [
        "setting 0/max_inst from an earlier run dropped: max_inst must be in 1..25; got 30"
    ]
    assert saved.settings == {"0/policy": "2"}
    assert s.settings(0).max_inst == 16


def test_a_container_that_leaves_frees_its_weight_and_its_saved_settings():
    saved = Saved()
    s = store(saved)
    s.join(0, observed("a", gpus=(0, 1), mem_gib=(2, 2), core=(0, 0)))
    s.join(1, observed("a", gpus=(0, 1), mem_gib=(2, 2), core=(0, 0)))
    assert s.apply(control_write("1/a/weight", "3"))
    s.leave("a")
    assert s.grants(0) == {} and s.grants(1) == {}
    assert saved.settings == {}


def test_a_container_on_one_gpu_of_several_leaves_cleanly():
    saved = Saved()
    s = store(saved)
    s.join(1, observed("a", gpus=(1,)))
    s.join(1, observed("b", gpus=(1,)))
    assert s.apply(control_write("1/a/weight", "3"))
    s.leave("a")
    assert list(s.containers(1)) == ["b"]
    assert s.free_weight(1) == 15
    assert saved.settings == {}
