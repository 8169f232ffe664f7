"""The nvml backend on a real GPU. Skipped where NVML or a GPU is missing."""

import os
import threading
from datetime import UTC, datetime

import pytest

from gpushare import annotation
from gpushare.cluster.memory import MemoryCluster, gpu_node
from gpushare.deviceplugin.plugin import DevicePlugin, PluginConfig
from gpushare.environment import NVIDIA_VISIBLE_DEVICES
from gpushare.gpunode.backends.nvml import NvmlBackend
from gpushare.inventory import node_gpus
from gpushare.placement.fit import Assignment, to_allocation
from gpushare.request import parse_pod_request
from gpushare.resources import GPU_COUNT, GPU_MEM
from gpushare.standins.kubelet import KubeletStandIn
from tests.builders import pod
from tests.deviceplugin.rig import WAIT

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def backend() -> NvmlBackend:
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as err:
        pytest.skip(f"NVML unavailable ({err}): needs an NVIDIA GPU and its driver")
    if count == 0:
        pytest.skip("NVML found no GPU on this machine")
    return NvmlBackend(pynvml)


def test_discovers_index_uuid_memory_model_and_minor_number(backend):
    found = backend.discover()

    assert [g.gpu.index for g in found] == list(range(len(found)))
    for physical in found:
        assert physical.gpu.uuid.startswith(("GPU-", "MIG-"))
        assert physical.gpu.mem > 0
        assert physical.gpu.model
        assert os.path.exists(f"/dev/nvidia{physical.minor}")


def test_device_nodes_are_the_control_devices_and_each_gpu(backend):
    found = backend.discover()

    nodes = backend.device_nodes(found[:1])

    paths = [n.container_path for n in nodes]
    assert "/dev/nvidiactl" in paths
    assert f"/dev/nvidia{found[0].minor}" in paths
    assert all(os.path.exists(n.host_path) and n.permissions == "rw" for n in nodes)


def test_the_health_watch_runs_and_stops_without_reporting_a_healthy_gpu(backend):
    changes = []
    stop = threading.Event()
    watcher = threading.Thread(target=backend.watch_health, args=(changes.append, stop))
    watcher.start()
    stop.wait(2.5)
    stop.set()
    watcher.join(5)

    assert not watcher.is_alive()
    assert [c for c in changes if not c.healthy] == []


def test_allocate_on_a_real_gpu_answers_its_uuid_and_device_files(backend, short_tmp):
    found = backend.discover()
    cluster = MemoryCluster()
    cluster.add_node(gpu_node("gpu", tuple(g.gpu for g in found), mode="cgpu"))
    created = cluster.create_pod(pod("cuda", mem=1))
    allocation = to_allocation(
        parse_pod_request(created),
        Assignment(((0,),), ()),
        node_gpus(cluster.get_node("gpu")),
        datetime.now(UTC),
    )
    cluster.bind_pod("default", "cuda", "gpu", created.metadata.uid, annotation.encode(allocation))
    kubelet = KubeletStandIn(short_tmp / "dp")
    plugin = DevicePlugin(PluginConfig("gpu", short_tmp / "dp", None), backend, cluster)
    kubelet.start()
    plugin.start()
    try:
        assert kubelet.wait_for(lambda: kubelet.registered() == {GPU_MEM, GPU_COUNT}, WAIT)
        assert kubelet.wait_for(lambda: kubelet.capacity(GPU_MEM)[0] > 0, WAIT)
        [main] = kubelet.admit(cluster.get_pod("default", "cuda"))
    finally:
        plugin.stop()
        kubelet.stop()

    assert main.envs[NVIDIA_VISIBLE_DEVICES] == found[0].gpu.uuid
    paths = {d.container_path for d in main.devices}
    assert {"/dev/nvidiactl", f"/dev/nvidia{found[0].minor}"} <= paths
