"""The fake libnvidia-ml itself, through pynvml: the calls no backend makes yet, the rules
of its world file, and what it does without one."""

import ctypes
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from tests.fakenvml import (
    DOUBLE_BIT_ECC,
    Event,
    Failure,
    FakeDriver,
    FakeGpu,
    FakeProcess,
    World,
    fake_driver,
    fake_nvml_or_skip,
    nvml_env,
)


@pytest.fixture
def driver(tmp_path) -> Iterator[FakeDriver]:
    gpu = FakeGpu(
        "GPU-f",
        "NVIDIA A10",
        22_731 << 20,
        utilization=37,
        retired_pages=(2, 1),
        ecc_errors=(5, 1),
        processes=[FakeProcess(1, 1 << 30)],  # PID 1 runs everywhere
    )
    with fake_driver(tmp_path, World([gpu], driver_version="535.183.01")) as driver:
        pynvml.nvmlInit()
        yield driver


def test_system_memory_utilisation_and_ecc_counters(driver):
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)

    assert pynvml.nvmlSystemGetDriverVersion() == "535.183.01"
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    assert (memory.total, memory.used, memory.free) == (
        22_731 << 20,
        1 << 30,
        (22_731 << 20) - (1 << 30),
    )
    assert pynvml.nvmlDeviceGetUtilizationRates(handle).gpu == 37
    assert len(pynvml.nvmlDeviceGetRetiredPages(handle, 0)) == 2
    assert len(pynvml.nvmlDeviceGetRetiredPages_v2(handle, 1)) == 1
    assert pynvml.nvmlDeviceGetTotalEccErrors(handle, 0, 1) == 5
    assert pynvml.nvmlDeviceGetTotalEccErrors(handle, 1, 0) == 1
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByUUID("GPU-none")


def test_failures_apply_to_their_function_and_gpu(driver):
    driver.world.gpus.append(FakeGpu("GPU-g"))
    driver.world.failures.append(Failure("nvmlDeviceGetUUID", "GPU_IS_LOST", gpu=1))
    driver.write()

    assert pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0)) == "GPU-f"
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(1))


def test_an_event_is_delivered_once_to_every_set_registered_for_it(driver):
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    sets = [pynvml.nvmlEventSetCreate() for _ in range(2)]
    for events in sets:
        pynvml.nvmlDeviceRegisterEvents(handle, DOUBLE_BIT_ECC, events)
    driver.world.events += [Event.xid(0, 79), Event.double_bit_ecc(0)]  # XIDs not asked for
    driver.write()

    for events in sets:
        data = pynvml.nvmlEventSetWait_v2(events, 1000)
        assert (data.eventType, pynvml.nvmlDeviceGetUUID(data.device)) == (DOUBLE_BIT_ECC, "GPU-f")
        with pytest.raises(pynvml.NVMLError_Timeout):
            pynvml.nvmlEventSetWait_v2(events, 0)
        pynvml.nvmlEventSetFree(events)


def test_calls_before_init_and_after_shutdown_are_uninitialised(driver):
    pynvml.nvmlShutdown()

    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()


def test_the_older_init_entry_point_works_too(driver):
    assert pynvml.nvmlLib.nvmlInit_v2() == pynvml.NVML_SUCCESS


def test_without_a_world_nvml_init_says_the_driver_is_not_loaded(tmp_path: Path):
    env = nvml_env(fake_nvml_or_skip(), tmp_path / "missing")
    result = subprocess.run(
        [sys.executable, "-c", "import pynvml; pynvml.nvmlInit()"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode != 0
    assert "NVMLError_DriverNotLoaded" in result.stderr
    assert f"FAKE_NVML_CONFIG names no readable file: {tmp_path / 'missing'}" in result.stderr


def test_a_malformed_world_line_is_named_on_stderr(tmp_path: Path):
    world = tmp_path / "world"
    world.write_text("gpu total=1 name=no uuid\nprocess pid=1\nwarp 9\n")
    program = "import pynvml; pynvml.nvmlInit(); print(pynvml.nvmlDeviceGetCount())"
    result = subprocess.run(
        [sys.executable, "-c", program],
        env=nvml_env(fake_nvml_or_skip(), world),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.stdout == "0\n"
    assert f"fakenvml: {world}:1: a gpu needs uuid=" in result.stderr
    assert f"fakenvml: {world}:2: needs gpu=<index below 16>" in result.stderr
    assert f"fakenvml: {world}:3: unknown record warp" in result.stderr


def test_structure_sizes_match_pynvml():
    """The C layouts are nvml.h's; pynvml's ctypes declare the same sizes."""
    assert ctypes.sizeof(pynvml.c_nvmlProcessInfo_v3_t) == 24
    assert ctypes.sizeof(pynvml.c_nvmlProcessUtilizationSample_t) == 32
    assert ctypes.sizeof(pynvml.c_nvmlEventData_t) == 32
    assert ctypes.sizeof(pynvml.c_nvmlMemory_t) == 24
