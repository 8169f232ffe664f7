"""The control tree: cGPU's procfs layout, operator writes accepted or refused."""

import logging
import subprocess
import threading

import pytest

from gpushare.isolation.agent import REFRESH_S
from gpushare.isolation.backends.port import GIB
from gpushare.isolation.control import ControlTree
from gpushare.isolation.policy import Policy
from gpushare.isolation.treecodec import (
    ContainerEntry,
    GpuEntry,
    ProcessMemory,
    TreeContent,
    encode,
)
from gpushare.standins.scenario import Workload
from tests.isolation.rig import NODE, SLICE, rig

CID = "c" * 64


def content(policy: Policy = Policy.WEIGHTED, weight: int = 2, containers: bool = True):
    entry = ContainerEntry(
        id=CID,
        pod="default/a",
        name="main",
        memsize=4 * GIB,
        processes=(ProcessMemory(4000, GIB), ProcessMemory(4001, 2 * GIB)),
        weight=weight,
        highprio=False,
        util=33.34,
        limit=66.67,
        violations=0,
    )
    gpu = GpuEntry(
        index=0,
        uuid="GPU-1",
        model="Tesla-T4",
        mem_bytes=16 * GIB,
        policy=policy,
        max_inst=16,
        prio_ratio=50,
        free_weight=14,
        major=195,
        util=33.34,
        containers=(entry,) if containers else (),
    )
    return TreeContent("gpushare-isolation 9.9", 0, (gpu,))


def test_the_tree_mirrors_cgpu_procfs():
    files = encode(content())
    for name in ["version", "default_memsize", "inst_ctl"]:
        assert name in files
    for name in ["policy", "max_inst", "prio_ratio", "free_weight", "major"]:
        assert f"0/{name}" in files
    for name in ["id", "memsize", "meminfo", "weight", "highprio"]:
        assert f"0/{CID}/{name}" in files
    assert files["0/policy"] == "2\n"
    assert files[f"0/{CID}/meminfo"] == (
        f"Free: {GIB}\nPID: 4000 Mem: {GIB}\nPID: 4001 Mem: {2 * GIB}\n"
    )
    assert files[f"0/{CID}/memsize"] == f"{4 * GIB}\n"
    assert files[f"0/{CID}/limit"] == "66.7\n"
    assert files["inst_ctl"] == f"0 {CID}\n"


def test_publish_writes_files_and_removes_gone_containers(tmp_path):
    tree = ControlTree(tmp_path / "cgpu")
    tree.publish(content())
    assert (tmp_path / "cgpu" / "0" / CID / "weight").read_text() == "2\n"
    tree.publish(content(containers=False))
    assert not (tmp_path / "cgpu" / "0" / CID).exists()
    assert (tmp_path / "cgpu" / "0" / "policy").read_text() == "2\n"
    assert not list((tmp_path / "cgpu").rglob(".*.tmp"))


def test_a_shell_write_is_found_by_content(tmp_path):
    tree = ControlTree(tmp_path)
    tree.publish(content())
    subprocess.run(["sh", "-c", f"echo 1 > {tmp_path}/0/policy"], check=True)
    [write] = tree.poll()
    assert (write.path, write.gpu, write.container, write.name) == ("0/policy", 0, None, "policy")
    assert write.raw == "1\n"
    assert tree.poll() == []


def test_a_container_write_names_its_container(tmp_path):
    tree = ControlTree(tmp_path)
    tree.publish(content())
    (tmp_path / "0" / CID / "weight").write_text("4")
    [write] = tree.poll()
    assert (write.gpu, write.container, write.name, write.raw) == (0, CID, "weight", "4")


def test_a_write_to_a_read_only_file_is_found_too(tmp_path):
    tree = ControlTree(tmp_path)
    tree.publish(content())
    (tmp_path / "0" / "free_weight").write_text("25\n")
    [write] = tree.poll()
    assert write.name == "free_weight"
    tree.publish(content())
    assert (tmp_path / "0" / "free_weight").read_text() == "14\n"


def test_an_empty_file_gets_one_poll_to_fill(tmp_path):
    tree = ControlTree(tmp_path)
    tree.publish(content())
    (tmp_path / "0" / "policy").write_text("")
    assert tree.poll() == []
    [write] = tree.poll()
    assert write.raw == ""


def test_readers_never_see_a_partial_file(tmp_path):
    tree = ControlTree(tmp_path)
    tree.publish(content(weight=1))
    seen: set[str] = set()
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            seen.add((tmp_path / "0" / CID / "weight").read_text())

    reader = threading.Thread(target=read)
    reader.start()
    for i in range(400):
        tree.publish(content(weight=10 + i % 2))
    done.set()
    reader.join()
    assert seen <= {"1\n", "10\n", "11\n"}


def test_a_deleted_file_is_recreated_not_taken_as_a_write(tmp_path):
    tree = ControlTree(tmp_path)
    tree.publish(content())
    (tmp_path / "0" / "policy").unlink()
    assert tree.poll() == []
    tree.publish(content())
    assert (tmp_path / "0" / "policy").read_text() == "2\n"


@pytest.mark.parametrize(
    ("path", "text", "setting", "expected"),
    [
        ("0/policy", "2\n", "policy", "2"),
        ("0/policy", " 4 \n", "policy", "4"),
        ("0/max_inst", "20\n", "max_inst", "20"),
        ("0/prio_ratio", "75\n", "prio_ratio", "75"),
    ],
)
def test_valid_gpu_writes_take_effect(tmp_path, path, text, setting, expected):
    r = rig(tmp_path, [Workload("a", 2)])
    r.agent.tick()
    r.write(path, text)
    r.agent.tick()
    assert r.read(path) == f"{expected}\n"
    settings = r.agent.settings(0)
    values = {"policy": int(settings.policy), "max_inst": settings.max_inst}
    values["prio_ratio"] = settings.prio_ratio
    assert str(values[setting]) == expected


@pytest.mark.parametrize(
    ("path", "text", "reason"),
    [
        ("0/policy", "9\n", "policy must be one of"),
        ("0/policy", "two\n", "policy must be a whole number"),
        ("0/max_inst", "26\n", "max_inst must be in 1..25"),
        ("0/max_inst", "0\n", "max_inst must be in 1..25"),
        ("0/prio_ratio", "10\n", "prio_ratio must be in 20..99"),
        ("0/free_weight", "3\n", "free_weight is read-only"),
        ("0/major", "1\n", "major is read-only"),
        ("version", "x\n", "version is read-only"),
    ],
)
def test_invalid_gpu_writes_are_refused_and_the_old_value_restored(
    tmp_path, caplog, path, text, reason
):
    r = rig(tmp_path, [Workload("a", 2)])
    r.agent.tick()
    old = r.read(path)
    r.write(path, text)
    with caplog.at_level(logging.WARNING, logger="gpushare.isolation"):
        # Settings are read every slice; read-only files are checked once a second.
        r.agent.run(duration_s=REFRESH_S + SLICE)
    assert r.read(path) == old
    assert reason in caplog.text
    assert "the old value stays" in caplog.text
    refused = r.agent.metrics.registry.get_sample_value(
        "gpushare_isolation_control_writes_refused_total",
        {"node": NODE, "file": path.split("/")[-1]},
    )
    assert refused == 1.0


def test_weight_and_highprio_writes_take_effect(tmp_path):
    r = rig(tmp_path, [Workload("a", 2), Workload("b", 2)])
    r.agent.tick()
    r.write(f"{r.container_dir('a')}/weight", "5\n")
    r.write(f"{r.container_dir('b')}/highprio", "1\n")
    r.agent.tick()
    assert r.read(f"{r.container_dir('a')}/weight") == "5\n"
    assert r.read(f"{r.container_dir('b')}/highprio") == "1\n"
    assert r.read("0/free_weight") == "10\n"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("0\n", "weight must be in 1..16"),
        ("17\n", "weight must be in 1..16"),
        ("16\n", "needs more than the 15 units"),
        ("heavy\n", "weight must be a whole number"),
    ],
)
def test_invalid_weight_writes_are_refused(tmp_path, caplog, text, reason):
    r = rig(tmp_path, [Workload("a", 2), Workload("b", 2)])
    r.agent.tick()
    path = f"{r.container_dir('a')}/weight"
    r.write(path, text)
    with caplog.at_level(logging.WARNING, logger="gpushare.isolation"):
        r.agent.tick()
    assert r.read(path) == "1\n"
    assert reason in caplog.text


def test_highprio_takes_only_zero_or_one(tmp_path, caplog):
    r = rig(tmp_path, [Workload("a", 2)])
    r.agent.tick()
    path = f"{r.container_dir('a')}/highprio"
    r.write(path, "2\n")
    with caplog.at_level(logging.WARNING, logger="gpushare.isolation"):
        r.agent.tick()
    assert r.read(path) == "0\n"
    assert "highprio must be 0 or 1" in caplog.text


def test_max_inst_cannot_drop_below_the_weight_in_use(tmp_path, caplog):
    r = rig(tmp_path, [Workload("a", 2, weight=3), Workload("b", 2, weight=2)])
    r.agent.tick()
    r.write("0/max_inst", "4\n")
    with caplog.at_level(logging.WARNING, logger="gpushare.isolation"):
        r.agent.tick()
    assert r.read("0/max_inst") == "16\n"
    assert "below the 5 weight units" in caplog.text
    r.write("0/max_inst", "5\n")
    r.agent.tick()
    assert r.read("0/max_inst") == "5\n"
    assert r.read("0/free_weight") == "0\n"


def test_read_only_container_files_are_restored(tmp_path, caplog):
    r = rig(tmp_path, [Workload("a", 2)])
    r.agent.tick()
    path = f"{r.container_dir('a')}/memsize"
    old = r.read(path)
    r.write(path, "1\n")
    with caplog.at_level(logging.WARNING, logger="gpushare.isolation"):
        r.agent.run(duration_s=REFRESH_S + SLICE)
    assert r.read(path) == old
    assert "memsize is read-only" in caplog.text
