"""gpushare-extender as an operator starts it."""

import contextlib
import ipaddress
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from gpushare.cluster.memory import MemoryCluster
from gpushare.extender.main import build_parser, config_from, main
from gpushare.extender.service import ExtenderConfig
from tests.builders import node
from tests.extender.tls import self_signed
from tests.kubecluster.apiserver import ApiServer

FLAGS = [
    "--scheduler-address",
    "--host",
    "--ops-port",
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


def test_without_flags_the_extender_runs_the_default_configuration():
    assert config_from(build_parser().parse_args([])) == ExtenderConfig()


def help_by_flag() -> dict[str, str]:
    """Each option's entry of --help (flag, metavar, help), by flag, on one line (with
    COLUMNS wide enough that no word is broken at a hyphen)."""
    options = build_parser().format_help().split("\noptions:\n")[1]
    entries = [" ".join(entry.split()) for entry in re.split(r"\n  (?=-)", "\n" + options)]
    return {entry.split()[0].rstrip(","): entry for entry in entries if entry}


def test_help_gives_each_default_the_configuration_has(monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")
    defaults = ExtenderConfig()
    said = help_by_flag()
    for flag, value in {
        "--scheduler-address": defaults.scheduler_address,
        "--port": defaults.port,
        "--url-prefix": defaults.url_prefix,
        "--host": defaults.host,
        "--ops-port": defaults.ops_port,
        "--webhook-port": defaults.webhook_port,
        "--scheduler-name": defaults.scheduler_name,
        "--extra-scheduler-names": ",".join(defaults.extra_scheduler_names),
        "--default-placement": defaults.default_placement,
        "--max-pods-per-gpu": defaults.max_pods_per_gpu,
    }.items():
        assert f"(default {value}" in said[flag], flag


def test_a_bad_default_placement_is_said_before_the_api_server_is_looked_for(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--default-placement", "tetris", "--kubeconfig", "/nonexistent/kubeconfig"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--default-placement 'tetris' is not a placement policy; known: bestfit" in err
    assert "Kubernetes API" not in err  # what a missing kubeconfig would say


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tls-cert-file", "/nonexistent.crt"], "give both --tls-cert-file and --tls-key-file"),
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
        (["--ops-port", "39999"], "each listener needs its own port, got --port=39999 --ops"),
    ],
)
def test_bad_flags_stop_it_with_the_reason(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:  # argparse's way: usage line, status 2
        main(argv)
    assert exited.value.code == 2
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


@contextlib.contextmanager
def running_extender(tmp_path: Path, *flags: str) -> Iterator[tuple[dict[str, int], list[str]]]:
    """gpushare-extender as main() starts it, over a test API server, with its own free
    ports; yields the ports by flag and, once it has stopped, its log lines."""
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
    ports = {flag: free_port() for flag in ("--port", "--ops-port", "--webhook-port")}
    process = subprocess.Popen(
        [sys.executable, "-m", "gpushare.extender.main"]
        + [str(arg) for item in ports.items() for arg in item]
        + ["--tls-cert-file", str(cert), "--tls-key-file", str(key)]
        + ["--kubeconfig", str(kubeconfig), *flags],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    log: list[str] = []
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, process.stderr.read()
            try:
                url = f"http://127.0.0.1:{ports['--ops-port']}/readyz"
                if httpx.get(url).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the extender did not become ready"
            time.sleep(0.1)
        yield ports, log
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=20)
        api.close()
        log.extend(err.splitlines())
    assert process.returncode in (0, -signal.SIGTERM)  # uvicorn re-raises the signal


def test_it_starts_against_a_cluster_logs_its_configuration_and_serves(tmp_path: Path):
    cert = tmp_path / "tls.crt"
    flags = ("--host", "127.0.0.1", "--default-placement", "spread")
    with running_extender(tmp_path, *flags) as (ports, log):
        port, ops, webhook_port = ports["--port"], ports["--ops-port"], ports["--webhook-port"]
        inspect = httpx.get(f"http://127.0.0.1:{ops}/inspect/n").json()
        assert inspect["placementPolicy"] == "spread"
        trust = ssl.create_default_context(cafile=cert)
        assert httpx.get(f"https://127.0.0.1:{webhook_port}/healthz", verify=trust).json() == {
            "status": "ok"
        }
        verb = f"http://127.0.0.1:{port}/gpushare-scheduler/bind"
        bind = httpx.post(verb, json={"PodName": "ghost", "PodNamespace": "d", "Node": "n"})
        assert bind.status_code == 200 and bind.json()["Error"]  # served: a pod nobody has
        # Each listener serves its own endpoints only.
        assert httpx.get(f"http://127.0.0.1:{port}/metrics").status_code == 404
        assert httpx.post(f"http://127.0.0.1:{ops}/gpushare-scheduler/bind").status_code == 404
    summary = [line for line in log if "gpushare-extender" in line]
    assert summary, log
    assert f"http://127.0.0.1:{port}/gpushare-scheduler" in summary[0]
    assert f"http://127.0.0.1:{ops}/healthz" in summary[0]
    assert "default placement spread" in summary[0]
    assert "schedulers gpushare-scheduler, ack-co-scheduler" in summary[0]
    assert f"https://127.0.0.1:{webhook_port}" in summary[0]


def non_loopback_address() -> str | None:
    """An IPv4 address of this machine other than loopback: the source address of a
    route out (a UDP connect sends nothing), or one the host name resolves to."""
    candidates = []
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # TEST-NET-1: only the route is looked up
        candidates.append(s.getsockname()[0])
    with contextlib.suppress(OSError):
        candidates += socket.gethostbyname_ex(socket.gethostname())[2]
    return next((a for a in candidates if not ipaddress.ip_address(a).is_loopback), None)


def test_the_scheduler_verbs_are_unreachable_from_outside_the_pod(tmp_path: Path):
    address = non_loopback_address()
    if address is None:
        pytest.skip("this machine has no address but loopback to connect to")
    with running_extender(tmp_path) as (ports, _):  # the defaults, as the chart runs it
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((address, ports["--port"]), timeout=5).close()
        # ...while what a Service and the API server reach is on every address.
        assert httpx.get(f"http://{address}:{ports['--ops-port']}/healthz").status_code == 200
        socket.create_connection((address, ports["--webhook-port"]), timeout=5).close()
        bind = f"http://127.0.0.1:{ports['--port']}/gpushare-scheduler/bind"
        assert httpx.post(bind, json={}).status_code == 400  # loopback still reaches them
