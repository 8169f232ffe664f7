"""Every command-line tool, run as its console script would be, answers bad input with one
line naming what is wrong, status 2 for a bad flag and 1 for a run that cannot go on, and
no traceback; a FIFO where a file belongs is refused, not waited on; --version answers."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpushare.commandline import package_version

MODULES = {
    "gpushare": "gpushare.cli.main",
    "kubectl inspect cgpu": "gpushare.cli.inspect",
    "gpushare-device-plugin": "gpushare.deviceplugin.main",
    "gpushare-extender": "gpushare.extender.main",
    "gpushare-isolation": "gpushare.isolation.main",
    "cgpu-smi": "gpushare.isolation.smi",
}
NODE = ["--node-name", "n", "--metrics-port", "0", "--interposer-dir", ""]


def run(prog: str, *argv: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(home), "KUBECONFIG": ""}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    command = [sys.executable, "-m", MODULES[prog], *argv]
    # The timeout fails a test whose tool waits on a FIFO instead of refusing it.
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)


@pytest.fixture
def bad(tmp_path: Path) -> Path:
    """One of each bad input, by name."""
    (tmp_path / "text").write_text("hello\n")
    (tmp_path / "empty").write_text("")
    (tmp_path / "binary").write_bytes(b"\xff\xfe\x00bad")
    (tmp_path / "badyaml").write_text("apiVersion: v1\nclusters: [\n")
    (tmp_path / "adir").mkdir()
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    (tmp_path / "home").mkdir()
    return tmp_path


KUBECONFIG_CASES = [
    ("text", " is not a kubeconfig"),
    ("empty", ": is empty"),
    ("binary", ": is not UTF-8 text"),
    ("badyaml", ": line 3, column 1: not valid YAML"),
    ("adir", ": is a directory, not a file"),
    ("fifo", ": is a FIFO, not a file"),
    ("dangling", ": is a link to"),
    ("missing", ": does not exist"),
]
KUBE_CLIS = [
    ("kubectl inspect cgpu", []),
    ("gpushare", ["uninstall-cleanup"]),
    ("gpushare-device-plugin", [*NODE, "--backend", "mock", "--mock-gpus", "1x16GiB"]),
    ("gpushare-extender", []),
]


@pytest.mark.parametrize(("name", "reason"), KUBECONFIG_CASES)
@pytest.mark.parametrize(("prog", "argv"), KUBE_CLIS)
def test_a_bad_kubeconfig_is_named_with_the_reason(bad, prog, argv, name, reason):
    result = run(prog, *argv, "--kubeconfig", str(bad / name), home=bad / "home")
    assert result.returncode == 1, result.stderr
    assert f"the kubeconfig {bad / name}{reason}" in result.stderr
    assert "--kubeconfig FILE" in result.stderr  # what to do
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(("prog", "argv"), KUBE_CLIS)
def test_no_kubeconfig_and_no_cluster_says_what_was_tried(bad, prog, argv):
    result = run(prog, *argv, home=bad / "home")
    assert result.returncode == 1, result.stderr
    assert "cannot find the Kubernetes API: no Kubernetes API configuration" in result.stderr
    assert "in-cluster service account" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("adir", "is a directory, not a file"),
        ("fifo", "is a FIFO, not a file"),
        ("binary", "is not UTF-8 text"),
        ("empty", "is empty"),
    ],
)
def test_a_bad_mock_gpus_file_is_a_bad_flag(bad, name, reason):
    for prog in ("gpushare-device-plugin", "gpushare-isolation"):
        result = run(prog, *NODE, "--backend", "mock", "--mock-gpus", str(bad / name),
                     home=bad / "home")  # fmt: skip
        assert result.returncode == 2, result.stderr
        assert f"argument --mock-gpus: file {bad / name}: {reason}" in result.stderr
        assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--tls-cert-file", "{dir}/adir", "--tls-key-file", "{dir}/text"],
            "--tls-cert-file {dir}/adir: is a directory",
        ),
        (
            ["--tls-cert-file", "{dir}/text", "--tls-key-file", "{dir}/fifo"],
            "--tls-key-file {dir}/fifo: is a FIFO",
        ),
        (
            ["--tls-cert-file", "{dir}/missing", "--tls-key-file", "{dir}/text"],
            "{dir}/missing: does not exist",
        ),
        (
            ["--tls-cert-file", "{dir}/text", "--tls-key-file", "{dir}/text"],
            "not a PEM certificate and its private key",
        ),
    ],
)
def test_the_extender_names_a_tls_file_it_cannot_use(bad, flags, message):
    argv = [f.format(dir=bad) for f in flags]
    result = run("gpushare-extender", *argv, home=bad / "home")
    assert result.returncode == 1, result.stderr
    assert message.format(dir=bad) in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("text", "is a file, not a directory"),
        ("fifo", "is a FIFO, not a directory"),
        ("dangling", "is a link to"),
        ("missing", "does not exist"),
    ],
)
def test_cgpu_smi_names_a_control_dir_that_is_no_directory(bad, name, reason):
    result = run("cgpu-smi", "--control-dir", str(bad / name), home=bad / "home")
    assert result.returncode == 1, result.stderr
    assert f"--control-dir {bad / name}: {reason}" in result.stderr
    assert "is gpushare-isolation running" in result.stderr
    assert "Traceback" not in result.stderr


def test_cgpu_smi_on_a_directory_of_fifos_and_sockets_says_there_is_no_tree(bad):
    """The issue: `--control-dir /tmp` failed with ENXIO on a socket and hung on a FIFO."""
    import socket

    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(bad / "sock"))
        (bad / "version").symlink_to(bad / "fifo")  # even a FIFO named like a tree file
        result = run("cgpu-smi", "--control-dir", str(bad), home=bad / "home")
    assert result.returncode == 1, result.stderr
    assert f"no control tree at {bad}" in result.stderr
    assert "Traceback" not in result.stderr


def test_gpushare_isolation_names_the_host_trees_it_cannot_use(bad):
    base = [*NODE, "--backend", "mock", "--mock-gpus", "1x16GiB"]
    result = run("gpushare-isolation", *base, "--proc-root", str(bad / "missing"),
                 home=bad / "home")  # fmt: skip
    assert result.returncode == 1
    assert f"--proc-root {bad / 'missing'}: does not exist" in result.stderr
    result = run("gpushare-isolation", *base, "--control-dir", str(bad / "text"),
                 home=bad / "home")  # fmt: skip
    assert result.returncode == 1
    assert f"--control-dir {bad / 'text'}: exists and is not a directory" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("kind: Pod\nmetadata: {name: [\n", "line 3, column 1: not valid YAML"),
        ("- a list\n", "document 1 is not a Kubernetes object"),
        ("kind: Pod\nmetadata: 5\n", "not a valid pod: metadata"),
        (b"\xff\xfe", "is not UTF-8 text"),
    ],
)
def test_gpushare_demo_names_the_example_file_it_cannot_read(bad, content, reason):
    examples = bad / "examples"
    examples.mkdir()
    path = examples / "bad.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    result = run("gpushare", "demo", "--examples", str(examples), home=bad / "home")
    assert result.returncode == 1, result.stderr
    assert f"gpushare demo: --examples file {path}: {reason}" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("fifo", "is a FIFO"),
        ("adir", "is a directory"),
        ("binary", "is not UTF-8"),
        ("empty", "is empty"),
    ],
)
def test_gpushare_simulate_names_the_trace_file_it_cannot_read(bad, name, reason):
    result = run("gpushare", "simulate", "--nodes", str(bad / name), "--no-progress",
                 home=bad / "home")  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert f"{bad / name}: {reason}" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("prog", sorted(MODULES))
def test_every_cli_prints_its_name_and_version(prog, tmp_path):
    result = run(prog, "--version", home=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{prog} {package_version()}"
