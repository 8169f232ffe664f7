"""The demo's admission stage: bound pods get their environment from Allocate."""

from gpushare import annotation
from gpushare.cli.demo.admission import admit_bound_pods, render
from gpushare.cli.demo.extender import ExtenderStage
from gpushare.cli.main import main
from gpushare.cluster.memory import MemoryCluster, gpu_node
from gpushare.environment import MEM_CONTAINER, NVIDIA_VISIBLE_DEVICES
from gpushare.inventory import parse_layout
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
    assert "gpu-node-2 default/two-containers container warm-cache (init):" in out
    assert "gpu-node-2 default/multi-gpu-split container trainer:" in out
    assert "ALIYUN_COM_GPU_MEM_CONTAINER=4,4" in out
    assert "GPUSHARE_GPU_CORE_PERCENTAGE=30" in out
