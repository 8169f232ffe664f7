"""The flags both node binaries share: one meaning and one default in
gpushare-device-plugin and gpushare-isolation, except the metrics port, each
binary's own because both listen in the node pod's network namespace."""

import argparse
from collections.abc import Callable

import pytest

from gpushare.deviceplugin import main as plugin
from gpushare.inventory import MemoryRounding
from gpushare.isolation import main as agent

SHARED_ENV = (
    "NODE_NAME",
    "GPUSHARE_BACKEND",
    "GPUSHARE_MOCK_GPUS",
    "GPUSHARE_GPU_MEMORY_ROUNDING",
)
BINARIES: dict[str, tuple[Callable[[], argparse.ArgumentParser], int]] = {
    "gpushare-device-plugin": (plugin.build_parser, 9401),
    "gpushare-isolation": (agent.build_parser, 9402),
}


@pytest.fixture(autouse=True)
def bare_environment(monkeypatch):
    for name in SHARED_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(params=BINARIES, ids=BINARIES)
def binary(request) -> tuple[Callable[[], argparse.ArgumentParser], int]:
    return BINARIES[request.param]


def test_without_flags_or_environment_both_take_the_same_defaults(binary):
    build_parser, metrics_port = binary

    args = build_parser().parse_args([])

    assert (args.node_name, args.backend, args.mock_gpus) == ("", "nvml", "")
    assert (args.gpu_memory_rounding, args.log_level) == (MemoryRounding.UP, "info")
    assert args.metrics_port == metrics_port


def test_the_environment_sets_the_same_flags_in_both(binary, monkeypatch):
    monkeypatch.setenv("NODE_NAME", "gpu-7")
    monkeypatch.setenv("GPUSHARE_BACKEND", "mock")
    monkeypatch.setenv("GPUSHARE_MOCK_GPUS", "2x16GiB")
    monkeypatch.setenv("GPUSHARE_GPU_MEMORY_ROUNDING", "down")

    args = binary[0]().parse_args([])

    assert (args.node_name, args.backend, args.mock_gpus) == ("gpu-7", "mock", "2x16GiB")
    assert args.gpu_memory_rounding is MemoryRounding.DOWN


def test_an_empty_variable_counts_as_unset(binary, monkeypatch):
    monkeypatch.setenv("GPUSHARE_BACKEND", "")
    monkeypatch.setenv("GPUSHARE_GPU_MEMORY_ROUNDING", "")

    args = binary[0]().parse_args([])

    assert (args.backend, args.gpu_memory_rounding) == ("nvml", MemoryRounding.UP)


def test_a_layout_file_is_read_as_the_layout(binary, tmp_path, monkeypatch):
    """A ConfigMap mounted as a file; the flag or its variable may name it."""
    layout = tmp_path / "gpus"
    layout.write_text("2x16GiB:T4,1x80GiB:A100\n")

    flagged = binary[0]().parse_args([f"--mock-gpus={layout}"])
    monkeypatch.setenv("GPUSHARE_MOCK_GPUS", str(layout))
    from_env = binary[0]().parse_args([])

    assert flagged.mock_gpus == from_env.mock_gpus == "2x16GiB:T4,1x80GiB:A100"


@pytest.mark.parametrize("port", ["-1", "65536"])
def test_a_metrics_port_out_of_range_is_refused(binary, capsys, port):
    with pytest.raises(SystemExit) as exited:
        binary[0]().parse_args([f"--metrics-port={port}"])

    assert exited.value.code == 2
    assert f"--metrics-port: must be 0..65535, got {port}" in capsys.readouterr().err


@pytest.mark.parametrize("main", [plugin.main, agent.main], ids=BINARIES)
def test_both_refuse_to_start_without_a_node_name(main, capsys):
    """The plugin follows its Node, and the mock GPUs' UUIDs come from the name: a
    guessed one (the hostname) may differ from the Kubernetes name."""
    with pytest.raises(SystemExit) as exited:
        main(["--backend", "mock", "--mock-gpus", "1x16GiB"])

    assert exited.value.code == 2
    assert "--node-name (or env NODE_NAME) is required" in capsys.readouterr().err
