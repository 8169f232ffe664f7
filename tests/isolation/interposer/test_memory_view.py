"""cuMemGetInfo and NVML show the container its share: total = min(cap, physical),
used = what the container holds, free = the rest and never below zero."""

import time
from pathlib import Path

from gpushare.isolation.interposer.region import Region
from tests.fakecuda import CUDA_PRELUDE, GIB, MIB, Container, uuid
from tests.fakenvml import FakeGpu, World, fake_nvml_or_skip, write_world


def info(lines: list[dict[str, str]], op: str = "info") -> tuple[str, int, int]:
    (line,) = [line for line in lines if line["op"] == op]
    return line["rc"], int(line["total"]), int(line["free"])


def test_cuda_reports_the_cap_as_total_and_the_containers_use(container: Container) -> None:
    lines = container.probe("link", "init", "0", "alloc", "mem", str(256 * MIB), "info", "info_v1")

    assert info(lines) == ("0", GIB, 768 * MIB)
    assert info(lines, "info_v1") == ("0", GIB, 768 * MIB)


def test_a_cap_above_the_device_reports_the_device(container: Container) -> None:
    container.caps = "3"
    container.devices = ((uuid(0), 2 * GIB),)
    lines = container.probe("dlsym", "init", "0", "alloc", "mem", str(512 * MIB), "info")

    assert info(lines) == ("0", 2 * GIB, 1536 * MIB)


HOLDER = (
    CUDA_PRELUDE
    + """
import sys, time
print(alloc(int(sys.argv[1]))[0], flush=True)
time.sleep(60)
"""
)


def test_free_is_zero_not_wrapped_when_the_container_uses_more_than_the_device_shows(
    container: Container,
) -> None:
    # Each fake process has its own 2 GiB device; the region counts both processes' use,
    # 3 GiB under a 3 GiB cap, more than the 2 GiB total this process is shown.
    container.caps = "3"
    container.devices = ((uuid(0), 2 * GIB),)
    holder = container.start_python(HOLDER, str(1536 * MIB))
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "0"
        lines = container.probe("link", "init", "0", "alloc", "mem", str(1536 * MIB), "info")
    finally:
        holder.kill()
        holder.wait()

    assert info(lines) == ("0", 2 * GIB, 0)


WATCHER = (
    CUDA_PRELUDE
    + """
import sys
free, total = ctypes.c_size_t(), ctypes.c_size_t()
for _ in sys.stdin:
    check(cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)))
    print(free.value, flush=True)
"""
)


def test_a_killed_processs_memory_shows_free_again_within_the_reap_interval(
    container: Container,
) -> None:
    holder = container.start_python(HOLDER, str(512 * MIB))
    watcher = container.start_python(WATCHER)
    assert holder.stdout is not None and watcher.stdin is not None and watcher.stdout is not None

    def free_now() -> int:
        watcher.stdin.write("\n")
        watcher.stdin.flush()
        return int(watcher.stdout.readline())

    try:
        assert holder.stdout.readline().strip() == "0"
        assert free_now() == 512 * MIB
        holder.kill()  # no destructor runs: its slot keeps the 512 MiB until reaped
        holder.wait()
        killed = time.monotonic()
        while free_now() != GIB and time.monotonic() - killed < 5:
            time.sleep(0.01)
        took = time.monotonic() - killed
        assert container.region is not None
        with Region.open(container.region) as region:
            dead = region.dead()  # the watcher reaped the holder's slot, not only hid it
    finally:
        holder.kill()
        watcher.kill()
        watcher.wait()

    assert took < 1.0  # 100 ms in the library; the rest is slack for a slow host
    assert dead == []


def test_null_arguments_are_invalid_values_not_crashes(container: Container) -> None:
    assert info(container.probe("getproc", "init", "0", "info_null"), "info_null")[0] == "1"
    container.region = None
    assert info(container.probe("link", "init", "0", "info_null"), "info_null")[0] == "1"


NVML = (
    CUDA_PRELUDE
    + """
import sys
from ctypes import byref, c_uint, c_ulonglong, c_void_p, sizeof
class Memory(ctypes.Structure):
    _fields_ = [("total", c_ulonglong), ("free", c_ulonglong), ("used", c_ulonglong)]
class MemoryV2(ctypes.Structure):
    _fields_ = [("version", c_uint), ("total", c_ulonglong), ("reserved", c_ulonglong),
                ("free", c_ulonglong), ("used", c_ulonglong)]
check(alloc(int(sys.argv[1]))[0])
loaded = ctypes.CDLL("libnvidia-ml.so.1")   # dlopen + dlsym, as pynvml
linked = ctypes.CDLL(None)                  # the process's global scope, as a direct link
check(loaded.nvmlInit_v2())
count = c_uint()
check(loaded.nvmlDeviceGetCount_v2(byref(count)))
for index in range(count.value):
    handle = c_void_p()
    check(loaded.nvmlDeviceGetHandleByIndex_v2(index, byref(handle)))
    first, second = Memory(), MemoryV2(version=(2 << 24) | sizeof(MemoryV2))
    check(loaded.nvmlDeviceGetMemoryInfo(handle, byref(first)))
    check(linked.nvmlDeviceGetMemoryInfo_v2(handle, byref(second)))
    print(index, first.total, first.used, first.free,
          second.total, second.reserved, second.used, second.free)
print("null", loaded.nvmlDeviceGetMemoryInfo(handle, None),
      linked.nvmlDeviceGetMemoryInfo_v2(handle, None))
"""
)


def nvml_container(
    container: Container, tmp_path: Path, nvml_order: list[str], reserved: int = 0
) -> Container:
    """The container's processes also find the fake libnvidia-ml, answering for GPUs in
    `nvml_order` (8 GiB each, `reserved` of it kept by the driver)."""
    library = fake_nvml_or_skip()
    world = tmp_path / "nvml-world"
    gpus = [FakeGpu(u, total_bytes=8 * GIB, reserved_bytes=reserved) for u in nvml_order]
    write_world(world, World(gpus))
    container.extra = {
        "FAKE_NVML_CONFIG": str(world),
        "LD_LIBRARY_PATH": f"{container.built.directory}:{library.parent}",
    }
    return container


def test_nvml_shows_each_gpu_its_cap_and_the_containers_use(
    container: Container, tmp_path: Path
) -> None:
    # CUDA numbers the GPUs uuid(1), uuid(2); NVML the other way round: matched by UUID.
    container.devices = ((uuid(1), 8 * GIB), (uuid(2), 8 * GIB))
    container.caps = "1,2"
    nvml_container(container, tmp_path, [uuid(2), uuid(1)])

    out = container.python(NVML, str(256 * MIB)).stdout.splitlines()

    assert out == [
        f"0 {2 * GIB} 0 {2 * GIB} {2 * GIB} 0 0 {2 * GIB}",
        f"1 {GIB} {256 * MIB} {768 * MIB} {GIB} 0 {256 * MIB} {768 * MIB}",
        "null 2 2",
    ]


def test_nvml_is_untouched_without_a_region(container: Container, tmp_path: Path) -> None:
    container.region = None
    nvml_container(container, tmp_path, [uuid(0)])

    out = container.python(NVML, str(256 * MIB)).stdout.splitlines()

    assert out[0] == f"0 {8 * GIB} 0 {8 * GIB} {8 * GIB} 0 0 {8 * GIB}"


def test_nvml_v2_adds_up_under_the_cap_with_what_the_driver_reserves(
    container: Container, tmp_path: Path
) -> None:
    # 300 MiB reserved by the driver, 300 MiB held by the container, a 1 GiB cap:
    # total = reserved + used + free, as the driver's own numbers are.
    nvml_container(container, tmp_path, [uuid(0)], reserved=300 * MIB)

    out = container.python(NVML, str(300 * MIB)).stdout.splitlines()

    v1_total, v1_used, v1_free, total, reserved, used, free = map(int, out[0].split()[1:])
    assert (v1_total, v1_used, v1_free) == (GIB, 300 * MIB, 724 * MIB)  # as before
    assert (total, reserved, used, free) == (GIB, 300 * MIB, 300 * MIB, 424 * MIB)
    assert reserved + used + free == total


def test_nvml_v2_never_goes_negative_when_the_reserve_outgrows_the_cap(
    container: Container, tmp_path: Path
) -> None:
    nvml_container(container, tmp_path, [uuid(0)], reserved=2 * GIB)

    out = container.python(NVML, str(300 * MIB)).stdout.splitlines()

    assert out[0].split()[4:] == [str(GIB), str(GIB), "0", "0"]
