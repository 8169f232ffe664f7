"""The mock backend: GPUs from a layout (--mock-gpus; a file it names is read by
gpushare.nodeflags) or the demo's nodes."""

import hashlib
import re
import threading

import pytest

from gpushare.gpunode.backends.mock import MockBackend
from gpushare.inventory import parse_layout
from tests.deviceplugin.rig import eventually


def test_a_layout_describes_the_gpus_with_the_uuids_the_cluster_side_uses():
    found = MockBackend.from_layout("2x16GiB:T4,1x80GiB:A100", "kind-worker").discover()

    assert [p.gpu for p in found] == list(parse_layout("2x16GiB:T4,1x80GiB:A100", "kind-worker"))
    assert [p.minor for p in found] == [0, 1, 2]


def test_a_bad_layout_names_the_format():
    with pytest.raises(ValueError, match=r"COUNTxSIZEGiB\[:MODEL\]"):
        MockBackend.from_layout("lots", "n")


def test_a_layout_item_without_a_count_is_one_gpu_of_that_size():
    assert [(g.index, g.mem, g.model) for g in parse_layout("16GiB,2x8GiB:T4", "n")] == [
        (0, 16, "Mock-GPU"),
        (1, 8, "T4"),
        (2, 8, "T4"),
    ]


@pytest.mark.parametrize("layout", ["0x16GiB", "2x0GiB", "0x0GiB"])
def test_a_layout_item_of_no_gpus_or_no_memory_is_refused_by_name(layout):
    with pytest.raises(ValueError) as refused:
        parse_layout(f"1x8GiB,{layout}", "n")
    assert str(refused.value) == f"GPU layout item {layout!r} needs a count and size of at least 1"


def test_a_layout_of_one_gib_gpus_is_fine():
    assert [g.mem for g in parse_layout("2x1GiB", "n")] == [1, 1]


def test_an_empty_layout_says_what_to_give():
    with pytest.raises(ValueError) as refused:
        parse_layout(" , ", "n")
    assert str(refused.value) == "GPU layout is empty; give at least one GPU, e.g. 1x16GiB"


def test_mock_uuids_look_like_nvidia_ones_and_differ_per_node_and_gpu():
    uuids = [g.uuid for node in ("n1", "n2") for g in parse_layout("2x16GiB", node)]
    assert len(set(uuids)) == 4
    hex_ = "[0-9a-f]"
    pattern = rf"GPU-{hex_}{{8}}-{hex_}{{4}}-{hex_}{{4}}-{hex_}{{4}}-{hex_}{{12}}"
    assert all(re.fullmatch(pattern, uuid) for uuid in uuids), uuids
    # Stable: a restart sees the same GPUs (the sha1 of "node/index", in NVIDIA's groups).
    digest = hashlib.sha1(b"n1/0").hexdigest()
    assert uuids[0] == "-".join(
        ["GPU", digest[:8], digest[8:12], digest[12:16], digest[16:20], digest[20:32]]
    )


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
