"""Fake device IDs and which of them to prefer."""

from gpushare.deviceplugin.devices import (
    MAX_ID_LENGTH,
    DeviceCatalog,
    DeviceId,
    gpu_key,
    parse_device_id,
    preferred_ids,
)
from gpushare.inventory import Gpu, parse_layout
from gpushare.resources import GPU_CORE, GPU_COUNT, GPU_MEM


def test_ids_name_their_gpu_and_stay_within_63_characters():
    catalog = DeviceCatalog(parse_layout("8x141GiB", "a-rather-long-node-name.example.com"))
    for resource in (GPU_MEM, GPU_CORE, GPU_COUNT):
        for device in catalog.devices(resource):
            assert len(device.id) <= MAX_ID_LENGTH
            gpu = catalog.gpu_of(device.id)
            assert gpu is not None and gpu.index == device.gpu_index
            assert device.id.startswith(gpu.uuid)


def test_one_id_per_gib_per_gpu_and_per_percent_for_gpus_of_different_sizes():
    catalog = DeviceCatalog(parse_layout("2x16GiB,1x80GiB", "n"))
    assert len(catalog.devices(GPU_MEM)) == 112
    assert len(catalog.devices(GPU_COUNT)) == 3
    assert len(catalog.devices(GPU_CORE)) == 300
    assert len({d.id for d in catalog.devices(GPU_MEM)}) == 112


def test_ids_round_trip():
    device = DeviceId("GPU-1234", GPU_CORE, 42)
    assert str(device) == "GPU-1234-core-42"
    assert parse_device_id(str(device)) == device
    assert parse_device_id("something-else") is None


def test_long_or_odd_uuids_are_replaced_by_a_digest():
    odd = "MIG-GPU-8a1f3e22-4d5c-11ee-be56-0242ac120002/1/0"
    key = gpu_key(odd)
    assert key.startswith("gpu-") and len(key) == 20
    catalog = DeviceCatalog((Gpu(0, odd, 10),))
    device = catalog.devices(GPU_MEM)[9]
    assert len(device.id) <= MAX_ID_LENGTH
    assert catalog.gpu_of(device.id).uuid == odd


def test_unhealthy_gpus_mark_their_devices():
    gpus = (Gpu(0, "GPU-a", 2), Gpu(1, "GPU-b", 2, healthy=False))
    health = {d.id: d.healthy for d in DeviceCatalog(gpus).devices(GPU_MEM)}
    assert health == {
        "GPU-a-mem-0": True,
        "GPU-a-mem-1": True,
        "GPU-b-mem-0": False,
        "GPU-b-mem-1": False,
    }


def test_preference_keeps_what_must_be_included_and_fills_from_the_wanted_gpus():
    catalog = DeviceCatalog((Gpu(0, "GPU-a", 8), Gpu(1, "GPU-b", 8)))
    available = [f"GPU-{g}-mem-{n}" for g in "ab" for n in range(8)][::-1]

    picked = preferred_ids(catalog, [(1, 3)], available, ["GPU-a-mem-7"], size=4)

    assert picked == ["GPU-a-mem-7", "GPU-b-mem-0", "GPU-b-mem-1", "GPU-b-mem-2"]


def test_preference_counts_included_ids_towards_their_gpu_and_never_exceeds_the_size():
    catalog = DeviceCatalog((Gpu(0, "GPU-a", 8), Gpu(1, "GPU-b", 8)))
    available = [f"GPU-{g}-mem-{n}" for g in "ab" for n in range(8)]

    assert preferred_ids(catalog, [(0, 2), (1, 2)], available, ["GPU-b-mem-5"], size=4) == [
        "GPU-b-mem-5",
        "GPU-a-mem-0",
        "GPU-a-mem-1",
        "GPU-b-mem-0",
    ]
    assert preferred_ids(catalog, [(0, 8)], available, [], size=3) == [
        "GPU-a-mem-0",
        "GPU-a-mem-1",
        "GPU-a-mem-2",
    ]
    assert preferred_ids(catalog, [(0, 2)], ["GPU-b-mem-0"], [], size=2) == []
