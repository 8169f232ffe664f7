"""Processes mapped to pods and containers through fake /proc trees."""

import pytest

from gpushare import environment
from gpushare.isolation.backends.procfs import ProcessTable, parse_cgroup, parse_environ
from tests.isolation.fakes import CONTAINERD_ID, CRIO_ID, POD_UID, add_process, systemd_path


@pytest.mark.parametrize(
    ("text", "runtime"),
    [
        (f"0::{systemd_path(CONTAINERD_ID)}\n", "containerd"),
        (f"0::{systemd_path(CONTAINERD_ID, 'crio-')}\n", "cri-o"),
        (f"0::{systemd_path(CONTAINERD_ID, 'docker-')}\n", "docker"),
        (f"0::/kubepods/burstable/pod{POD_UID}/{CONTAINERD_ID}\n", ""),
        (f"0::/kubepods/pod{POD_UID}/{CONTAINERD_ID}\n", ""),
        (
            f"12:freezer:/kubepods/besteffort/pod{POD_UID}/{CONTAINERD_ID}\n"
            f"11:cpu,cpuacct:/kubepods/besteffort/pod{POD_UID}/{CONTAINERD_ID}\n"
            f"1:name=systemd:/kubepods/besteffort/pod{POD_UID}/{CONTAINERD_ID}\n",
            "",
        ),
    ],
)
def test_container_and_pod_come_from_the_cgroup_path(text, runtime):
    ref = parse_cgroup(text)
    assert ref is not None
    assert ref.container_id == CONTAINERD_ID
    assert ref.pod_uid == POD_UID
    assert ref.runtime == runtime


def test_v2_and_v1_paths_are_both_kept():
    text = (
        f"12:freezer:/kubepods/pod{POD_UID}/{CONTAINERD_ID}\n"
        f"0::/kubepods/pod{POD_UID}/{CONTAINERD_ID}\n"
    )
    ref = parse_cgroup(text)
    assert ref is not None
    assert ref.unified == f"/kubepods/pod{POD_UID}/{CONTAINERD_ID}"
    assert ref.freezer == f"/kubepods/pod{POD_UID}/{CONTAINERD_ID}"


def test_plain_docker_cgroups_name_the_container():
    ref = parse_cgroup(f"0::/docker/{CONTAINERD_ID}\n")
    assert ref is not None
    assert (ref.container_id, ref.runtime, ref.pod_uid) == (CONTAINERD_ID, "docker", "")


@pytest.mark.parametrize(
    "text",
    [
        "0::/user.slice/user-0.slice/session-3.scope\n",
        "0::/\n",
        f"0::/system.slice/crio-conmon-{CRIO_ID}.scope\n",
        "garbage\n",
        "",
    ],
)
def test_processes_outside_containers_have_none(text):
    assert parse_cgroup(text) is None


def test_environ_is_split_on_nul():
    assert parse_environ(b"A=1\0B=x=y\0\0EMPTY=\0junk\0") == {"A": "1", "B": "x=y", "EMPTY": ""}


def test_the_table_reads_a_proc_tree_mounted_anywhere(tmp_path):
    proc = tmp_path / "host-proc"
    env = {environment.MEM_CONTAINER: "4", environment.POD: "ml/train"}
    add_process(proc, 100, f"0::{systemd_path(CONTAINERD_ID)}\n", env)
    add_process(proc, 101, f"0::{systemd_path(CONTAINERD_ID)}\n", {"PATH": "/bin"})
    add_process(proc, 200, "0::/user.slice\n", {"PATH": "/bin"})
    (proc / "self").mkdir()
    table = ProcessTable(proc)
    assert table.pids() == [100, 101, 200]
    assert table.environ(100) == env
    ref = table.cgroup(100)
    assert ref is not None and ref.container_id == CONTAINERD_ID
    assert table.cgroup(200) is None
    assert table.pids_of(CONTAINERD_ID) == [100, 101]
    [contract] = table.contract_processes()
    assert contract.pid == 100 and contract.environ == env


def test_a_process_that_exits_reads_as_none(tmp_path):
    table = ProcessTable(tmp_path)
    assert table.environ(999) is None
    assert table.cgroup(999) is None


def test_the_device_major_comes_from_proc_devices(tmp_path):
    (tmp_path / "devices").write_text(
        "Character devices:\n  1 mem\n195 nvidia-frontend\n508 nvidia-uvm\n"
    )
    assert ProcessTable(tmp_path).device_major() == 195
    (tmp_path / "devices").write_text("Character devices:\n  1 mem\n")
    assert ProcessTable(tmp_path).device_major(default=195) == 195
