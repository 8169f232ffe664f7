"""Freezing and thawing on fake cgroup trees; signals recorded, never sent."""

from gpushare.isolation.backends.cgroupfs import FreezeMethod, Freezer
from gpushare.isolation.backends.procfs import CgroupRef, ProcessTable
from tests.isolation.fakes import CONTAINERD_ID, POD_UID, Signals, add_cgroup, add_process

V2_PATH = f"/kubepods/burstable/pod{POD_UID}/{CONTAINERD_ID}"


def ref(unified: str | None = V2_PATH, freezer: str | None = None) -> CgroupRef:
    return CgroupRef(CONTAINERD_ID, POD_UID, "containerd", unified, freezer)


def test_cgroup_v2_freeze_and_thaw(tmp_path):
    directory = add_cgroup(tmp_path, V2_PATH, [10, 11])
    signals = Signals()
    freezer = Freezer(tmp_path, ProcessTable(tmp_path / "proc"), signals)
    assert freezer.set_frozen(ref(), [10], True) is FreezeMethod.CGROUP_V2
    assert (directory / "cgroup.freeze").read_text() == "1"
    assert freezer.set_frozen(ref(), [10], False) is FreezeMethod.CGROUP_V2
    assert (directory / "cgroup.freeze").read_text() == "0"
    assert signals.sent == []


def test_a_path_from_another_cgroup_namespace_is_found_by_container_id(tmp_path):
    # Inside its own cgroup namespace the agent reads paths like /../../kubepods/...
    directory = add_cgroup(tmp_path, f"kubepods.slice/cri-containerd-{CONTAINERD_ID}.scope", [])
    freezer = Freezer(tmp_path, ProcessTable(tmp_path / "proc"), Signals())
    assert freezer.set_frozen(ref("/../../x"), [], True) is FreezeMethod.CGROUP_V2
    assert (directory / "cgroup.freeze").read_text() == "1"


def test_cgroup_v1_freezer(tmp_path):
    v1 = tmp_path / "freezer" / V2_PATH.lstrip("/")
    v1.mkdir(parents=True)
    (v1 / "freezer.state").write_text("THAWED\n")
    freezer = Freezer(tmp_path, ProcessTable(tmp_path / "proc"), Signals())
    assert freezer.set_frozen(ref(None, V2_PATH), [], True) is FreezeMethod.CGROUP_V1
    assert (v1 / "freezer.state").read_text() == "FROZEN"
    freezer.set_frozen(ref(None, V2_PATH), [], False)
    assert (v1 / "freezer.state").read_text() == "THAWED"


def test_without_a_freezable_cgroup_every_process_of_the_container_is_stopped(tmp_path):
    add_cgroup(tmp_path / "cg", V2_PATH, [10, 11, 12], freeze=False)
    signals = Signals()
    freezer = Freezer(tmp_path / "cg", ProcessTable(tmp_path / "proc"), signals)
    assert freezer.set_frozen(ref(), [10], True) is FreezeMethod.SIGNAL
    assert signals.sent == [(10, "SIGSTOP"), (11, "SIGSTOP"), (12, "SIGSTOP")]
    freezer.set_frozen(ref(), [10], False)
    assert signals.sent[3:] == [(10, "SIGCONT"), (11, "SIGCONT"), (12, "SIGCONT")]


def test_without_a_cgroup_dir_the_processes_are_found_in_proc(tmp_path):
    proc = tmp_path / "proc"
    add_process(proc, 10, f"0::{V2_PATH}\n")
    add_process(proc, 20, f"0::{V2_PATH}\n")
    add_process(proc, 30, "0::/user.slice\n")
    signals = Signals()
    freezer = Freezer(tmp_path / "no-cgroups", ProcessTable(proc), signals)
    assert freezer.set_frozen(ref(), [], True) is FreezeMethod.SIGNAL
    assert signals.sent == [(10, "SIGSTOP"), (20, "SIGSTOP")]


def test_a_process_outside_any_container_is_stopped_by_itself(tmp_path):
    signals = Signals()
    freezer = Freezer(tmp_path, ProcessTable(tmp_path / "proc"), signals)
    assert freezer.set_frozen(None, [42], True) is FreezeMethod.SIGNAL
    assert signals.sent == [(42, "SIGSTOP")]


def test_a_process_gone_meanwhile_is_skipped(tmp_path):
    def gone(pid: int, signum: int) -> None:
        raise ProcessLookupError(pid)

    freezer = Freezer(tmp_path, ProcessTable(tmp_path / "proc"), gone)
    assert freezer.set_frozen(None, [42], True) is FreezeMethod.SIGNAL
