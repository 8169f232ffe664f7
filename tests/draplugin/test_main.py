"""gpushare-dra-plugin's command line: what it refuses before it serves anything."""

import logging
import threading

from gpushare.cluster.memory import MemoryCluster
from gpushare.draplugin.main import build_parser, run
from gpushare.resources import GPU_MEM, RESOURCE


def _args(tmp, *extra):
    return build_parser().parse_args(
        [
            "--node-name=n1",
            "--backend=mock",
            "--mock-gpus=1x16GiB",
            f"--kubelet-root={tmp}",
            f"--cdi-dir={tmp / 'cdi'}",
            f"--state-dir={tmp / 'state'}",
            "--metrics-port=0",
            *extra,
        ]
    )


def test_it_refuses_to_start_beside_the_device_plugin(short_tmp, caplog):
    plugins = short_tmp / "device-plugins"
    plugins.mkdir()
    (plugins / RESOURCE[GPU_MEM].socket).touch()
    store = MemoryCluster()
    with caplog.at_level(logging.ERROR):
        assert run(_args(short_tmp), store, store, threading.Event()) == 1
    assert "the gpushare device plugin serves this node" in caplog.text
    assert store.list_resource_slices() == []
    assert not (short_tmp / "plugins_registry").exists()


def test_a_mock_backend_without_gpus_is_refused_naming_the_flag(short_tmp, caplog):
    store = MemoryCluster()
    args = _args(short_tmp)
    args.mock_gpus = ""
    with caplog.at_level(logging.ERROR):
        assert run(args, store, store, threading.Event()) == 1
    assert "--backend mock needs --mock-gpus" in caplog.text
