"""The demo's admission stage: bound pods get their environment from Allocate."""

import math
import re
import time

import pytest

from gpushare import annotation
from gpushare.cli.demo import admission
from gpushare.cli.demo.admission import admit_bound_pods, render
from gpushare.cli.demo.extender import ExtenderStage
from gpushare.cli.main import main
from gpushare.cluster.memory import MemoryCluster, gpu_node
from gpushare.deviceplugin.server import ResourceServer
from gpushare.environment import CORE_PERCENTAGE, MEM_CONTAINER, NVIDIA_VISIBLE_DEVICES
from gpushare.inventory import parse_layout
from gpushare.resources import GPU_CORE
from tests.builders import container, pod

LAYOUTS = {"a": "2x16GiB", "b": "1x24GiB"}


def test_every_bound_container_gets_the_environment_of_its_allocation():
    cluster = MemoryCluster()
    for name, layout in LAYOUTS.items():
        cluster.add_node(gpu_node(name, parse_layout(layout, name), mode="cgpu"))
    with ExtenderStage(cluster) as stage:
        for spec in (
            pod("one", mem=20),
            pod("two", containers=[container("x", 3), container("y", 5)]),
            pod("three", mem=2),
        ):
            assert "->" in stage.submit(spec)

    admitted = admit_bound_pods(cluster, LAYOUTS)

    assert sorted((e.pod, e.container) for e in admitted) == [
        ("default/one", "main"),
        ("default/three", "main"),
        ("default/two", "x"),
        ("default/two", "y"),
    ]
    for entry in admitted:
        live = cluster.get_pod("default", entry.pod.split("/")[1])
        allocated = {c.name: c for c in annotation.decode(live).containers}[entry.container]
        assert allocated.assigned
        assert entry.node == live.spec.node_name
        assert entry.env[NVIDIA_VISIBLE_DEVICES] == allocated.gpus[0].uuid
        assert entry.env[MEM_CONTAINER] == str(allocated.gpus[0].mem)
    text = render(admitted)
    assert text.count("NVIDIA_VISIBLE_DEVICES=") == 4
    assert "GPUSHARE_POD" not in text


def test_gpushare_demo_prints_the_environment_from_allocate(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out

    assert "Kubelet admission through the device plugin" in out
    # Each pod is admitted on the node the extender bound it to, whichever that is.
    for name, entry in (
        ("two-containers", "warm-cache (init)"),
        ("multi-gpu-split", "trainer"),
    ):
        node = re.search(rf"default/{name} -> (gpu-node-\d)", out)
        assert node is not None, name
        assert f"{node[1]} default/{name} container {entry}:" in out
    assert "ALIYUN_COM_GPU_MEM_CONTAINER=4,4" in out
    assert "GPUSHARE_GPU_CORE_PERCENTAGE=30" in out


def _core_mem_node_with_a_pod() -> MemoryCluster:
    cluster = MemoryCluster()
    cluster.add_node(gpu_node("a", parse_layout("1x16GiB", "a"), mode="core_mem"))
    with ExtenderStage(cluster) as stage:
        assert "->" in stage.submit(pod("sample", mem=2, core=30))
    return cluster


def _first_list_late(monkeypatch, resource: str, seconds: float) -> None:
    """The plugin's ListAndWatch of `resource` sends its first list `seconds` after
    the kubelet opens it, as on a loaded node (math.inf: never)."""
    stream = ResourceServer.stream

    def late(self, context):
        if self.resource == resource:
            until = time.monotonic() + seconds
            while context.is_active() and time.monotonic() < until:
                time.sleep(0.02)
        yield from stream(self, context)

    monkeypatch.setattr(ResourceServer, "stream", late)


def test_pods_wait_for_the_device_lists_the_plugin_sends_after_registering(monkeypatch):
    _first_list_late(monkeypatch, GPU_CORE, 0.5)

    (admitted,) = admit_bound_pods(_core_mem_node_with_a_pod(), {"a": "1x16GiB"})

    assert admitted.pod == "default/sample"
    assert admitted.env[CORE_PERCENTAGE] == "30"


def test_a_plugin_that_never_sends_its_devices_is_named(monkeypatch):
    monkeypatch.setattr(admission, "READY_TIMEOUT", 0.3)
    _first_list_late(monkeypatch, GPU_CORE, math.inf)

    with pytest.raises(RuntimeError) as failed:
        admit_bound_pods(_core_mem_node_with_a_pod(), {"a": "1x16GiB"})

    assert str(failed.value).startswith(
        f"device plugin of a did not advertise {GPU_CORE} within 0.3s"
    )
