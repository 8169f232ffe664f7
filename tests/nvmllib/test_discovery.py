"""The GPU discovery both node components share, through the real nvidia-ml-py answered
by the fake libnvidia-ml (tests/fakenvml): what it reads of each GPU, that NVML starts
once and shuts down, and what it says where NVML cannot be used."""

import threading
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from gpushare.nvmllib.discovery import GpuDiscovery, NvmlGpu, NvmlUnavailable
from tests.fakenvml import MIB, T4_BYTES, Failure, FakeDriver, FakeGpu, World, fake_driver


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[FakeDriver]:
    gpus = [
        FakeGpu("GPU-t4-0", "Tesla T4", T4_BYTES, minor=2),
        FakeGpu("GPU-a10-1", "NVIDIA A10", 22_731 * MIB, minor=0),
    ]
    with fake_driver(tmp_path, World(gpus)) as driver:
        yield driver


def test_each_gpu_is_read_by_index_with_its_uuid_model_bytes_and_minor(driver):
    found = GpuDiscovery(pynvml).discover()

    assert found == (
        NvmlGpu(0, "GPU-t4-0", "Tesla T4", T4_BYTES, minor=2, handle=None),
        NvmlGpu(1, "GPU-a10-1", "NVIDIA A10", 22_731 * MIB, minor=0, handle=None),
    )
    # The handle is NVML's own, for the calls each backend makes on the GPU.
    assert pynvml.nvmlDeviceGetUUID(found[1].handle) == "GPU-a10-1"


def test_nvml_starts_once_however_many_threads_discover_and_close_shuts_it_down(driver):
    discovery = GpuDiscovery(pynvml)
    threads = [threading.Thread(target=discovery.discover) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    discovery.discover()

    assert driver.calls("nvmlInitWithFlags") == 1
    discovery.close()
    discovery.close()
    assert driver.calls("nvmlShutdown") == 1


@pytest.mark.parametrize(
    ("error", "text"),
    [
        ("DRIVER_NOT_LOADED", "Driver Not Loaded"),
        ("LIBRARY_NOT_FOUND", "NVML Shared Library Not Found"),
    ],
)
def test_without_a_driver_discovery_says_what_to_do(driver, error, text):
    driver.world.init_error = error
    driver.write()

    with pytest.raises(NvmlUnavailable) as refused:
        GpuDiscovery(pynvml).discover()

    assert str(refused.value) == (
        f"NVML is not available ({text}); run on a node with the NVIDIA driver and its "
        "libraries mounted, or use --backend mock --mock-gpus LAYOUT"
    )


def test_a_gpu_lost_while_listing_is_reported_the_same_way(driver):
    driver.world.failures.append(Failure("nvmlDeviceGetMemoryInfo", "GPU_IS_LOST", gpu=1))
    driver.write()

    with pytest.raises(NvmlUnavailable, match=r"NVML is not available \(GPU is lost\)"):
        GpuDiscovery(pynvml).discover()
