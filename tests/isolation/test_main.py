"""`gpushare-isolation` as the DaemonSet starts it: flags, start-up errors, a real run."""

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from gpushare import environment
from gpushare.isolation.main import main
from tests.isolation.fakes import CONTAINERD_ID, add_process, systemd_path

FLAGS = [
    "--node-name",
    "--backend",
    "--mock-gpus",
    "--control-dir",
    "--proc-root",
    "--cgroup-root",
    "--metrics-port",
    "--memory-action",
    "--backstop-slack-per-process-mib",
    "--backstop-slack-max-mib",
    "--log-level",
]


def test_help_explains_every_flag_of_the_contract(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    for flag in FLAGS:
        assert flag in out
    for default in ["/run/gpushare/cgpu", "/proc", "/sys/fs/cgroup", "9402", "kill", "512", "2048"]:
        assert default in out
    for env in ["NODE_NAME", "GPUSHARE_BACKEND", "GPUSHARE_MOCK_GPUS", "GPUSHARE_CONTROL_DIR"]:
        assert env in out


def test_mock_without_a_layout_says_so(tmp_path, capsys):
    args = ["--node-name", "n", "--backend", "mock", "--metrics-port", "0"]
    with pytest.raises(SystemExit) as exited:
        main([*args, "--control-dir", str(tmp_path)])
    assert exited.value.code == 2
    assert "--backend mock needs --mock-gpus" in capsys.readouterr().err


def test_a_bad_layout_is_named(tmp_path, capsys):
    args = ["--node-name", "n", "--backend", "mock", "--mock-gpus", "2xbig", "--metrics-port", "0"]
    with pytest.raises(SystemExit) as exited:
        main([*args, "--control-dir", str(tmp_path)])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--mock-gpus" in err and "2xbig" in err


def test_without_nvml_the_agent_says_how_to_run(tmp_path, caplog):
    pytest.importorskip("pynvml")
    try:
        import pynvml

        pynvml.nvmlInit()
        pytest.skip("NVML works on this machine")
    except pynvml.NVMLError:
        pass
    args = ["--node-name", "n", "--backend", "nvml", "--control-dir", str(tmp_path)]
    args += ["--metrics-port", "0"]
    assert main(args) == 1  # no GPUs to read: a run that cannot start
    assert "NVML is not available" in caplog.text and "--backend mock" in caplog.text


@pytest.mark.parametrize(
    ("flag", "value", "reason"),
    [
        ("--max-inst", "30", "max_inst must be in 1..25"),
        ("--prio-ratio", "5", "prio_ratio must be in 20..99"),
        ("--default-policy", "7", "policy must be one of"),
        ("--slice-ms", "0", "--slice-ms must be at least 1"),
        ("--memory-action", "ignore", "invalid choice"),
        ("--backstop-slack-per-process-mib", "-1", "must be at least 0"),
        ("--backstop-slack-max-mib", "-5", "must be at least 0"),
    ],
)
def test_bad_settings_are_refused_at_start(capsys, flag, value, reason):
    with pytest.raises(SystemExit) as exited:
        main(["--node-name", "n", "--backend", "mock", "--mock-gpus", "1x16GiB", flag, value])
    assert exited.value.code == 2
    assert reason in capsys.readouterr().err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(path: Path, seconds: float = 15) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear in {seconds}s")
        time.sleep(0.05)


def test_the_agent_runs_on_mock_gpus_with_pods_found_in_proc(tmp_path):
    """What kind runs: mock GPUs, and the processes that carry the contract as containers."""
    proc = tmp_path / "proc"
    env = {
        environment.MEM_CONTAINER: "3",
        environment.MEM_IDX: "1",
        environment.MEM_DEV: "16",
        environment.CORE_PERCENTAGE: "40",
        environment.POD: "default/gputest",
        environment.CONTAINER: "gputest",
    }
    add_process(proc, 1234, f"0::{systemd_path(CONTAINERD_ID)}\n", env)
    control = tmp_path / "cgpu"
    port = free_port()
    command = [
        *(sys.executable, "-m", "gpushare.isolation.main", "--backend", "mock"),
        *("--mock-gpus", "2x16GiB", "--node-name", "kind-worker"),
        *("--control-dir", str(control), "--proc-root", str(proc)),
        *("--metrics-port", str(port), "--slice-ms", "50"),
    ]
    agent = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(control / "1" / CONTAINERD_ID / "limit")
        assert (control / "1" / "policy").read_text() == "3\n"
        assert (control / "1" / CONTAINERD_ID / "pod").read_text() == "default/gputest\n"
        assert (control / "1" / CONTAINERD_ID / "memsize").read_text() == f"{3 << 30}\n"
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
        assert 'gpushare_isolation_gpu_policy{gpu="1",node="kind-worker"} 3.0' in metrics
        assert "gpushare_isolation_memory_cap_bytes" in metrics
        smi = subprocess.run(
            [sys.executable, "-m", "gpushare.isolation.smi", "--control-dir", str(control)],
            capture_output=True,
            text=True,
            check=True,
        )
        assert "default/gputest" in smi.stdout and "40.0%" in smi.stdout
    finally:
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=15)
    assert agent.returncode == 0, err
    [summary] = [line for line in err.splitlines() if "node=kind-worker" in line]
    assert "backend=mock gpus=0:16GiB,1:16GiB" in summary
    assert f"control-dir={control}" in summary and "memory-action=kill" in summary
    assert "backstop-slack=512MiB/process,2048MiB-max" in summary
    assert "SIGTERM" in err


def test_console_scripts_are_installed():
    bin_dir = Path(sys.executable).parent
    for script in ["gpushare-isolation", "cgpu-smi"]:
        assert os.access(bin_dir / script, os.X_OK), script
