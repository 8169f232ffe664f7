"""Both node components choose their GPU backend from the same flags, with the same
checks: the device plugin and the DRA driver read one node's GPUs alike."""

import os

import pytest

from gpushare.deviceplugin.main import build_parser as plugin_parser
from gpushare.draplugin.main import build_parser as driver_parser
from gpushare.gpunode.backendflags import build_backend
from gpushare.gpunode.backends.mock import MockBackend

PARSERS = {"device-plugin": plugin_parser, "dra-plugin": driver_parser}


@pytest.mark.parametrize("parser", PARSERS.values(), ids=PARSERS.keys())
def test_a_mock_backend_reads_the_layout_and_the_health_file(parser, tmp_path):
    health = tmp_path / "unhealthy"
    health.write_text("1\n")
    args = parser().parse_args(
        ["--node-name=n1", "--backend=mock", "--mock-gpus=2x16GiB", f"--mock-health-file={health}"]
    )
    backend = build_backend(args)
    assert isinstance(backend, MockBackend)
    assert [(g.gpu.mem, g.gpu.healthy) for g in backend.discover()] == [(16, True), (16, False)]


@pytest.mark.parametrize("parser", PARSERS.values(), ids=PARSERS.keys())
def test_a_health_file_that_is_not_a_regular_file_is_refused_naming_the_flag(parser, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # polled every second: a FIFO would hang the poll
    for bad in (tmp_path, fifo):
        args = parser().parse_args(
            ["--node-name=n1", "--backend=mock", "--mock-gpus=1x8GiB", f"--mock-health-file={bad}"]
        )
        with pytest.raises(ValueError, match=f"--mock-health-file {bad}: not a regular file"):
            build_backend(args)


@pytest.mark.parametrize("parser", PARSERS.values(), ids=PARSERS.keys())
def test_a_mock_backend_without_gpus_is_refused_naming_the_flag(parser):
    args = parser().parse_args(["--node-name=n1", "--backend=mock", "--mock-gpus="])
    with pytest.raises(ValueError, match="--backend mock needs --mock-gpus"):
        build_backend(args)


def test_a_health_change_a_discovery_read_first_is_still_announced(tmp_path):
    """The DRA driver rediscovers its GPUs while the health watch polls the same file:
    whichever reads the change first, the listeners hear of it (with the reason)."""
    import threading

    from gpushare.gpunode.backends.port import HealthChange

    health = tmp_path / "unhealthy"
    backend = MockBackend.from_layout("2x16GiB", "n1", health, poll_interval=0.01)
    heard: list[HealthChange] = []
    stop = threading.Event()
    watch = threading.Thread(target=backend.watch_health, args=(heard.append, stop))
    watch.start()
    try:
        health.write_text("1\n")
        assert [g.gpu.healthy for g in backend.discover()] == [True, False]  # read here first
        deadline = threading.Event()
        for _ in range(200):
            if any(not c.healthy for c in heard):
                break
            deadline.wait(0.01)
        assert [(c.index, c.healthy) for c in heard if not c.healthy] == [(1, False)]
        assert heard[-1].reason == f"listed in {health}"
    finally:
        stop.set()
        watch.join()
