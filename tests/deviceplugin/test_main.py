"""`gpushare-device-plugin` as an operator starts it."""

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from gpushare.cluster.memory import MemoryCluster, gpu_node
from gpushare.deviceplugin.main import build_parser, main, run
from gpushare.inventory import parse_layout
from gpushare.resources import GPU_COUNT, GPU_MEM
from gpushare.standins.kubelet import KubeletStandIn
from tests.deviceplugin.rig import WAIT, eventually

FLAGS = (
    "--node-name",
    "--backend",
    "--mock-gpus",
    "--device-plugin-dir",
    "--pod-resources-socket",
    "--kubeconfig",
    "--metrics-port",
    "--log-level",
    "--allocate-timeout",
)

FAKE_KUBECLUSTER = """
from gpushare.cluster.memory import MemoryCluster, gpu_node
from gpushare.inventory import parse_layout


class KubeCluster:
    @classmethod
    def from_config(cls, kubeconfig):
        cluster = MemoryCluster()
        cluster.add_node(gpu_node("n1", parse_layout("1x8GiB", "n1")))
        return cluster
"""

RUN_WITH_FAKE_KUBECLUSTER = """
import runpy

import gpushare.kubecluster

gpushare.kubecluster.KubeCluster = KubeCluster  # the plugin's watches stay the real ones
runpy.run_module("gpushare.deviceplugin.main", run_name="__main__", alter_sys=True)
"""


def test_help_explains_every_flag(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--help"])

    assert exited.value.code == 0
    text = capsys.readouterr().out
    for flag in FLAGS:
        assert flag in text
    assert "NODE_NAME" in text and "GPUSHARE_MOCK_GPUS" in text


def test_the_console_script_is_declared():
    [script] = entry_points(group="console_scripts", name="gpushare-device-plugin")
    assert script.value == "gpushare.deviceplugin.main:main"


def test_flags_default_to_the_environment(monkeypatch):
    monkeypatch.setenv("NODE_NAME", "gpu-7")
    monkeypatch.setenv("GPUSHARE_BACKEND", "mock")
    monkeypatch.setenv("GPUSHARE_MOCK_GPUS", "2x16GiB")
    monkeypatch.setenv("KUBECONFIG", "/etc/kube/config")

    args = build_parser().parse_args([])

    assert (args.node_name, args.backend, args.mock_gpus) == ("gpu-7", "mock", "2x16GiB")
    assert args.kubeconfig == "/etc/kube/config"
    assert args.device_plugin_dir == Path("/var/lib/kubelet/device-plugins")
    assert args.pod_resources_socket == Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    assert (args.metrics_port, args.log_level) == (9401, "info")


def test_a_missing_node_name_is_refused_naming_the_flag(monkeypatch, capsys):
    monkeypatch.delenv("NODE_NAME", raising=False)

    with pytest.raises(SystemExit) as exited:
        main(["--backend", "mock"])

    assert exited.value.code == 2
    assert "--node-name (or env NODE_NAME) is required" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["--backend", "mock"], "--backend mock needs --mock-gpus"),
        (["--backend", "mock", "--mock-gpus", "two big ones"], "COUNTxSIZEGiB"),
        (["--allocate-timeout", "0"], "--allocate-timeout must be above 0, got 0"),
    ],
)
def test_unusable_settings_stop_the_start_with_a_reason(argv, reason, short_tmp, caplog):
    args = build_parser().parse_args(["--node-name", "n1", *argv])
    with caplog.at_level(logging.ERROR):
        assert run(args, MemoryCluster(), threading.Event()) == 1
    assert reason in caplog.text


def test_a_device_plugin_dir_too_long_for_a_socket_is_refused(short_tmp, caplog):
    too_long = short_tmp / ("d" * 100)
    args = build_parser().parse_args(
        ["--node-name=n1", "--backend=mock", "--mock-gpus=1x8", f"--device-plugin-dir={too_long}"]
    )
    with caplog.at_level(logging.ERROR):
        assert run(args, MemoryCluster(), threading.Event()) == 1
    assert "use a shorter --device-plugin-dir" in caplog.text


def test_without_nvml_the_nvml_backend_says_so(short_tmp, caplog):
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pytest.skip("NVML works on this machine; the missing-NVML path cannot be shown")
    args = build_parser().parse_args(["--node-name", "n1", "--backend", "nvml"])
    with caplog.at_level(logging.ERROR):
        assert run(args, MemoryCluster(), threading.Event()) == 1
    assert "NVML is not available" in caplog.text
    assert "--backend mock" in caplog.text


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=WAIT) as page:
        return page.read().decode()


def _registered(metrics: str) -> list[str]:
    prefix = "gpushare_device_plugin_registered_resources{"
    lines = metrics.splitlines()
    return [line for line in lines if line.startswith(prefix) and line.endswith(" 1.0")]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_run_logs_its_configuration_and_serves_metrics(short_tmp, caplog):
    cluster = MemoryCluster()
    cluster.add_node(gpu_node("n1", parse_layout("2x16GiB", "n1"), mode="cgpu"))
    kubelet = KubeletStandIn(short_tmp / "dp")
    kubelet.start()
    port = _free_port()
    args = build_parser().parse_args(
        [
            "--node-name=n1",
            "--backend=mock",
            "--mock-gpus=2x16GiB",
            f"--device-plugin-dir={short_tmp / 'dp'}",
            f"--pod-resources-socket={short_tmp / 'pr.sock'}",
            f"--metrics-port={port}",
        ]
    )
    stop = threading.Event()
    runner = threading.Thread(target=run, args=(args, cluster, stop))
    try:
        with caplog.at_level(logging.INFO, logger="gpushare.deviceplugin"):
            runner.start()
            assert kubelet.wait_for(lambda: kubelet.registered() == {GPU_MEM, GPU_COUNT}, WAIT)
            # The plugin counts a registration once the kubelet's answer is back.
            assert eventually(lambda: len(_registered(_metrics(port))) == 2)
            metrics = _metrics(port)
    finally:
        stop.set()
        runner.join(WAIT)
        kubelet.stop()

    [summary] = [r.message for r in caplog.records if "starting:" in r.message]
    assert "node=n1 backend=mock gpus=[0:Mock-GPU 16GiB, 1:Mock-GPU 16GiB]" in summary
    assert f"metrics-port={port}" in summary
    assert "allocate-timeout=10s" in summary
    for name in (
        "gpushare_device_plugin_allocate_total",
        "gpushare_device_plugin_allocation_failures_total",
        "gpushare_device_plugin_match_latency_seconds",
        "gpushare_device_plugin_registrations_total",
        "gpushare_gpu_memory_allocated_gib",
        "gpushare_gpu_healthy",
    ):
        assert f"# HELP {name} " in metrics
    assert _registered(metrics) == [
        f'gpushare_device_plugin_registered_resources{{node="n1",resource="{r}"}} 1.0'
        for r in (GPU_MEM, GPU_COUNT)
    ]


def test_a_busy_metrics_port_is_reported(short_tmp, caplog):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = build_parser().parse_args(
            [
                "--node-name=n1",
                "--backend=mock",
                "--mock-gpus=1x8GiB",
                f"--device-plugin-dir={short_tmp / 'dp'}",
                f"--metrics-port={port}",
            ]
        )
        with caplog.at_level(logging.ERROR):
            assert run(args, MemoryCluster(), threading.Event()) == 1
    assert f"cannot serve metrics on port {port}" in caplog.text


def test_the_process_registers_and_stops_cleanly_on_sigterm(short_tmp):
    # The plugin's own main module, run as a process, over an in-memory cluster.
    runner = short_tmp / "run_plugin.py"
    runner.write_text(FAKE_KUBECLUSTER + RUN_WITH_FAKE_KUBECLUSTER)
    kubelet = KubeletStandIn(short_tmp / "dp")
    kubelet.start()
    env = {**os.environ, "NODE_NAME": "n1"}
    process = subprocess.Popen(
        [
            sys.executable,
            str(runner),
            "--backend=mock",
            "--mock-gpus=1x8GiB",
            f"--device-plugin-dir={short_tmp / 'dp'}",
            f"--pod-resources-socket={short_tmp / 'pr.sock'}",
            "--metrics-port=0",
        ],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        registered = kubelet.wait_for(lambda: kubelet.registered() == {GPU_MEM, GPU_COUNT}, 20)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
        kubelet.stop()

    assert registered, stderr
    assert process.returncode == 0, stderr
    assert "gpushare-device-plugin starting: node=n1 backend=mock" in stderr


def test_once_synced_the_start_up_objects_leave_the_collectors_full_passes(
    short_tmp, monkeypatch, caplog
):
    cluster = MemoryCluster()
    cluster.add_node(gpu_node("n1", parse_layout("1x8GiB", "n1")))
    frozen = threading.Event()
    monkeypatch.setattr("gpushare.deviceplugin.main.gc.freeze", frozen.set)
    args = build_parser().parse_args(
        [
            "--node-name=n1",
            "--backend=mock",
            "--mock-gpus=1x8GiB",
            f"--device-plugin-dir={short_tmp / 'dp'}",
            "--metrics-port=0",
        ]
    )
    stop = threading.Event()
    with caplog.at_level(logging.INFO, logger="gpushare.deviceplugin"):
        runner = threading.Thread(target=run, args=(args, cluster, stop))
        runner.start()
        try:
            assert frozen.wait(WAIT)
            # Said right after the freeze, on the plugin's thread.
            assert eventually(lambda: "synced: node and pods listed" in caplog.text)
        finally:
            stop.set()
            runner.join(WAIT)
