"""gpushare-extender as an operator starts it."""

import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from gpushare.cluster.memory import MemoryCluster
from gpushare.extender.main import build_parser, config_from, main
from tests.builders import node
from tests.extender.tls import self_signed
from tests.kubecluster.apiserver import ApiServer

FLAGS = [
    "--host",
    "--port",
    "--url-prefix",
    "--webhook-port",
    "--tls-cert-file",
    "--tls-key-file",
    "--scheduler-name",
    "--extra-scheduler-names",
    "--default-placement",
    "--max-pods-per-gpu",
    "--kubeconfig",
    "--log-level",
]


def test_help_explains_every_flag():
    result = subprocess.run(
        [sys.executable, "-m", "gpushare.extender.main", "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0
    for flag in FLAGS:
        assert flag in result.stdout
    assert "binpack" in result.stdout and "spread" in result.stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tls-cert-file", "/nonexistent.crt"], "give both --tls-cert-file and --tls-key-file"),
        (["--tls-cert-file", "/no.crt", "--tls-key-file", "/no.key"], "does not exist"),
        (["--kubeconfig", "/nonexistent/kubeconfig"], "/nonexistent/kubeconfig does not exist"),
        (["--default-placement", "tetris"], "'tetris' is not a placement policy"),
        (["--max-pods-per-gpu", "0"], "at least 1"),
        (
            ["--extra-scheduler-names", "ack-co-scheduler,Volcano"],
            "--extra-scheduler-names: 'Volcano' is not a scheduler name a pod can carry "
            "(a DNS-1123 subdomain",
        ),
        (["--extra-scheduler-names", "a,,b"], "'' is not a scheduler name"),
        (["--extra-scheduler-names", "x" * 254], "at most 253 characters"),
        (
            ["--extra-scheduler-names", "default-scheduler"],
            "default-scheduler is the default scheduler's name",
        ),
        (
            ["--scheduler-name", "default-scheduler"],
            "--scheduler-name: default-scheduler is the default scheduler's name",
        ),
        (
            ["--extra-scheduler-names", "gpushare-scheduler"],
            "--extra-scheduler-names: gpushare-scheduler is named twice",
        ),
        (["--extra-scheduler-names", "a,b,a"], "a is named twice"),
    ],
)
def test_bad_flags_stop_it_with_the_reason(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "served"),
    [
        ([], ("gpushare-scheduler", "ack-co-scheduler")),
        (["--extra-scheduler-names", ""], ("gpushare-scheduler",)),
        (
            ["--scheduler-name", "gpu", "--extra-scheduler-names", " ack-co-scheduler, team.gpu "],
            ("gpu", "ack-co-scheduler", "team.gpu"),
        ),
    ],
)
def test_the_extender_serves_its_scheduler_name_and_the_extra_ones(argv, served):
    config = config_from(build_parser().parse_args(argv))
    assert config.scheduler_names == served
    assert f"schedulers {', '.join(served)}," in config.summary()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_it_starts_against_a_cluster_logs_its_configuration_and_serves(tmp_path: Path):
    memory = MemoryCluster()
    memory.add_node(node("n", "1x16GiB"))
    api = ApiServer(memory)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": api.url}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    cert, key = self_signed(tmp_path)
    port, webhook_port = free_port(), free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpushare.extender.main",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webhook-port",
            str(webhook_port),
            "--tls-cert-file",
            str(cert),
            "--tls-key-file",
            str(key),
            "--kubeconfig",
            str(kubeconfig),
            "--default-placement",
            "spread",
        ],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, process.stderr.read()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the extender did not become ready"
            time.sleep(0.1)
        inspect = httpx.get(f"http://127.0.0.1:{port}/inspect/n").json()
        assert inspect["placementPolicy"] == "spread"
        trust = ssl.create_default_context(cafile=cert)
        assert httpx.get(f"https://127.0.0.1:{webhook_port}/healthz", verify=trust).json() == {
            "status": "ok"
        }
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=20)
        api.close()
    summary = [line for line in err.splitlines() if "gpushare-extender" in line]
    assert summary, err
    assert f"http://127.0.0.1:{port}/gpushare-scheduler" in summary[0]
    assert "default placement spread" in summary[0]
    assert "schedulers gpushare-scheduler, ack-co-scheduler" in summary[0]
    assert f"https://127.0.0.1:{webhook_port}" in summary[0]
    assert process.returncode in (0, -signal.SIGTERM)  # uvicorn re-raises the signal
