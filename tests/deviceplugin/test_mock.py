"""The mock backend: GPUs from a layout, a file or the demo's nodes."""

import threading

import pytest

from gpushare.deviceplugin.mock import MockBackend
from gpushare.inventory import parse_layout
from tests.deviceplugin.rig import eventually


def test_a_layout_file_describes_the_gpus_with_the_uuids_the_cluster_side_uses(tmp_path):
    layout = tmp_path / "gpus"
    layout.write_text("2x16GiB:T4,1x80GiB:A100\n")

    found = MockBackend.from_layout(str(layout), "kind-worker").discover()

    assert [p.gpu for p in found] == list(parse_layout("2x16GiB:T4,1x80GiB:A100", "kind-worker"))
    assert [p.minor for p in found] == [0, 1, 2]


def test_a_bad_layout_names_the_format():
    with pytest.raises(ValueError, match=r"COUNTxSIZEGiB\[:MODEL\]"):
        MockBackend.from_layout("lots", "n")


def test_flipping_an_unknown_gpu_is_refused():
    with pytest.raises(ValueError, match="no GPU 5"):
        MockBackend.from_layout("1x8GiB", "n").set_healthy(5, False)


def test_watchers_hear_each_change_once():
    backend = MockBackend.from_layout("2x8GiB", "n", poll_interval=0.01)
    heard = []
    stop = threading.Event()
    watcher = threading.Thread(target=backend.watch_health, args=(heard.append, stop))
    watcher.start()
    try:
        assert eventually(lambda: len(heard) == 2)  # the state at start, one per GPU
        backend.set_healthy(1, False)
        backend.set_healthy(1, False)
        backend.set_healthy(1, True)
    finally:
        stop.set()
        watcher.join(5)

    assert [(c.index, c.healthy) for c in heard[2:]] == [(1, False), (1, True)]
    assert backend.discover()[1].gpu.healthy is not False
