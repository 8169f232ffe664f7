"""`cgpu-smi` against a control tree, as an operator runs it."""

import json
import subprocess
import sys

import pytest

from gpushare.isolation import smi
from gpushare.isolation.backends.mock import MemoryStep
from gpushare.isolation.backends.port import GIB
from gpushare.isolation.control import ControlTree
from gpushare.isolation.policy import Policy
from gpushare.standins.scenario import Workload
from tests.isolation.rig import rig
from tests.isolation.test_control import CID, content


def test_text_lists_each_gpu_and_container(tmp_path, capsys):
    ControlTree(tmp_path).publish(content())
    assert smi.main(["--control-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "gpushare-isolation 9.9" in out
    assert "GPU 0  Tesla-T4  GPU-1  16.00 GiB  policy 2 (weight-preemptive)" in out
    assert "free_weight 14" in out
    [row] = [line for line in out.splitlines() if CID[:12] in line]
    assert row.split() == [
        CID[:12],
        "default/a",
        "main",
        "2",
        "-",
        "33.3%",
        "66.7%",
        "3.00",
        "/",
        "4.00",
        "0",
    ]


def test_json_carries_the_same_figures(tmp_path, capsys):
    ControlTree(tmp_path).publish(content())
    assert smi.main(["--control-dir", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    [gpu] = report["gpus"]
    assert gpu["policy"] == 2 and gpu["policy_name"] == "weight-preemptive"
    assert gpu["memory_total_bytes"] == 16 * GIB
    [container] = gpu["containers"]
    assert container["id"] == CID
    assert container["pod"] == "default/a"
    assert container["utilization_percent"] == 33.3
    assert container["compute_limit_percent"] == 66.7
    assert container["memory_used_bytes"] == 3 * GIB
    assert container["memory_allocated_bytes"] == 4 * GIB
    assert container["memory_free_bytes"] == GIB
    assert container["processes"] == [
        {"pid": 4000, "memory_bytes": GIB},
        {"pid": 4001, "memory_bytes": 2 * GIB},
    ]


def test_the_control_dir_comes_from_the_environment(tmp_path):
    ControlTree(tmp_path).publish(content())
    result = subprocess.run(
        [sys.executable, "-m", "gpushare.isolation.smi", "--json"],
        capture_output=True,
        text=True,
        env={"GPUSHARE_CONTROL_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["control_dir"] == str(tmp_path)


def test_a_missing_tree_says_what_to_do(tmp_path, capsys):
    assert smi.main(["--control-dir", str(tmp_path / "none")]) == 1
    err = capsys.readouterr().err
    assert f"--control-dir {tmp_path / 'none'}: does not exist" in err
    assert "is gpushare-isolation running" in err


def test_a_plain_cgpu_tree_without_gpushare_files_still_lists_containers(tmp_path, capsys):
    ControlTree(tmp_path).publish(content(policy=Policy.NATIVE))
    for extra in ["pod", "container", "util", "limit", "violations"]:
        (tmp_path / "0" / CID / extra).unlink()
    for extra in ["uuid", "model", "mem_total", "util"]:
        (tmp_path / "0" / extra).unlink()
    assert smi.main(["--control-dir", str(tmp_path), "--json"]) == 0
    [container] = json.loads(capsys.readouterr().out)["gpus"][0]["containers"]
    assert container["pod"] == "-"
    assert container["compute_limit_percent"] is None
    assert container["memory_used_bytes"] == 3 * GIB


def test_help_explains_the_flags(capsys):
    result = subprocess.run(
        [sys.executable, "-m", "gpushare.isolation.smi", "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0
    assert "--control-dir" in result.stdout and "--json" in result.stdout
    assert "GPUSHARE_CONTROL_DIR" in result.stdout


def test_smi_shows_what_the_running_agent_enforces(tmp_path, capsys):
    r = rig(
        tmp_path,
        [
            Workload("a", 4, weight=1, memory=(MemoryStep(0, GIB),)),
            Workload("b", 4, weight=2),
            Workload("leaky", 2, memory=(MemoryStep(1.0, 3 * GIB),)),
        ],
        default_policy=Policy.WEIGHTED,
    )
    r.agent.run(duration_s=8)
    assert smi.main(["--control-dir", str(r.root), "--json"]) == 0
    [gpu] = json.loads(capsys.readouterr().out)["gpus"]
    rows = {c["pod"]: c for c in gpu["containers"]}
    assert rows["default/a"]["utilization_percent"] == pytest.approx(33.3, abs=3)
    assert rows["default/b"]["utilization_percent"] == pytest.approx(66.7, abs=3)
    assert rows["default/a"]["compute_limit_percent"] == 33.3
    assert rows["default/a"]["memory_used_bytes"] == GIB
    assert rows["default/leaky"]["cap_violations"] == 1
    assert rows["default/leaky"]["memory_used_bytes"] == 0
