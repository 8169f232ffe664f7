"""One record per resource: every table the device plugin keeps is derived from it, and
one grammar reads every quantity of ours."""

import pytest

from gpushare.allocation import GpuSlice
from gpushare.deviceplugin.admission import _requests
from gpushare.deviceplugin.devices import DeviceId, parse_device_id, units
from gpushare.deviceplugin.registration import SOCKET_NAMES
from gpushare.inventory import Gpu
from gpushare.labels import NodeMode
from gpushare.objects import Container, PodSpec, ResourceRequirements
from gpushare.resources import GPU_CORE, GPU_COUNT, GPU_MEM, RESOURCE, RESOURCES, parse_quantity


@pytest.mark.parametrize(
    ("text", "expected"),
    [("3", 3), (" 3 ", 3), ("+3", 3), ("0", 0), ("007", 7)],
)
def test_a_quantity_is_a_whole_number_of_units(text, expected):
    assert parse_quantity(text) == expected


@pytest.mark.parametrize("text", ["", " ", "3.0", "-1", "1Gi", "3e2", "²", "٣", "3 4", "++3"])
def test_anything_else_is_not_a_quantity(text):
    assert parse_quantity(text) is None


def test_each_resource_counts_its_units_on_a_gpu_and_on_a_slice():
    gpu = Gpu(0, "GPU-a", mem=16, core=100)
    held = GpuSlice(index=0, memGiB=3, corePercent=30, gpuMemGiB=16)
    assert [r.units(gpu) for r in RESOURCES] == [16, 1, 100]
    assert [r.units(held) for r in RESOURCES] == [3, 1, 30]
    assert units(GPU_MEM, gpu) == 16
    with pytest.raises(ValueError, match=r"nvidia\.com/gpu is not a gpushare resource"):
        units("nvidia.com/gpu", gpu)


def test_device_ids_sockets_and_advertising_follow_the_records():
    for r in RESOURCES:
        device = DeviceId("GPU-a", r.name, 2)
        assert str(device) == f"GPU-a-{r.device_kind}-2"
        assert parse_device_id(str(device)) == device
    assert SOCKET_NAMES == {
        GPU_MEM: "gpushare-mem.sock",
        GPU_COUNT: "gpushare-count.sock",
        GPU_CORE: "gpushare-core.sock",
    }
    assert NodeMode.CORE_MEM.advertised_resources == (GPU_MEM, GPU_COUNT, GPU_CORE)
    assert NodeMode.CGPU.advertised_resources == (GPU_MEM, GPU_COUNT)
    assert [r.name for r in RESOURCES if r.needs_compute_isolation] == [GPU_CORE]


def test_the_kubelets_count_for_a_container_is_its_whole_number_limit():
    limits = {GPU_MEM: "3", GPU_CORE: "²", GPU_COUNT: "0", "cpu": "1"}
    assert RESOURCE[GPU_MEM].requested(limits) == 3
    assert RESOURCE[GPU_CORE].requested(limits) == 0  # not a number: no count, no crash
    container = Container(name="c", resources=ResourceRequirements(limits=limits))
    assert _requests(container) == {GPU_MEM: 3}


def test_a_container_is_found_by_index_else_by_name():
    app = [Container(name="a"), Container(name="b")]
    init = [Container(name="setup")]
    spec = PodSpec(containers=app, init_containers=init)
    assert spec.container(1) is app[1]
    assert spec.container(1, "b") is app[1]
    assert spec.container(0, "b") is app[1]  # the spec was edited since the index was taken
    assert spec.container(0, "setup", init=True) is init[0]
    assert spec.container(5) is None
    assert spec.container(0, "gone") is None
