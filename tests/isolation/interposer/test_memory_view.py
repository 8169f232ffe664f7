"""cuMemGetInfo and NVML show the container its share: total = min(cap, physical),
used = what the container holds, free = the rest and never below zero."""

from pathlib import Path

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
    print(index, first.total, first.used, first.free, second.total, second.used, second.free)
print("null", loaded.nvmlDeviceGetMemoryInfo(handle, None),
      linked.nvmlDeviceGetMemoryInfo_v2(handle, None))
"""
)


def nvml_container(container: Container, tmp_path: Path, nvml_order: list[str]) -> Container:
    """The container's processes also find the fake libnvidia-ml, answering for GPUs in
    `nvml_order` (8 GiB each)."""
    library = fake_nvml_or_skip()
    world = tmp_path / "nvml-world"
    write_world(world, World([FakeGpu(u, total_bytes=8 * GIB) for u in nvml_order]))
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
        f"0 {2 * GIB} 0 {2 * GIB} {2 * GIB} 0 {2 * GIB}",
        f"1 {GIB} {256 * MIB} {768 * MIB} {GIB} {256 * MIB} {768 * MIB}",
        "null 2 2",
    ]


def test_nvml_is_untouched_without_a_region(container: Container, tmp_path: Path) -> None:
    container.region = None
    nvml_container(container, tmp_path, [uuid(0)])

    out = container.python(NVML, str(256 * MIB)).stdout.splitlines()

    assert out[0] == f"0 {8 * GIB} 0 {8 * GIB} {8 * GIB} 0 {8 * GIB}"
