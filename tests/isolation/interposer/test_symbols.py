"""The hook table (hooks.def) is the library's exports, names real driver functions, and
every way of finding a driver function hands out the hook, while dlsym(RTLD_NEXT) keeps
resolving relative to its real caller."""

import ctypes
import subprocess
from pathlib import Path

from gpushare.isolation.interposer.region import GpuRecord, RegionRecord, SlotRecord
from tests.fakecuda import CUDA_PRELUDE, Container, FakeCuda, dynamic_exports, hook_table
from tests.fakenvml import fake_nvml_or_skip

EXTRA_EXPORTS = {"dlsym", "gpushare_region_layout"}


def test_the_library_exports_exactly_the_hook_table(built: FakeCuda) -> None:
    table = hook_table()
    hooked = table["CUDA_HOOK"] + table["NVML_HOOK"]

    assert len(hooked) == len(set(hooked))
    assert dynamic_exports(built.interposer) == set(hooked) | EXTRA_EXPORTS


def test_every_cuda_name_in_the_table_is_a_driver_export(built: FakeCuda) -> None:
    table = hook_table()

    assert set(table["CUDA_HOOK"] + table["CUDA_REAL"]) <= dynamic_exports(built.driver)


def test_every_nvml_name_in_the_table_is_a_driver_export() -> None:
    table = hook_table()
    names = set(table["NVML_HOOK"] + table["NVML_REAL"])

    assert names <= dynamic_exports(fake_nvml_or_skip())


def test_rtld_next_still_resolves_relative_to_its_caller(built: FakeCuda, tmp_path: Path) -> None:
    # libfirst's dlsym(RTLD_NEXT, "twice") must find libsecond's (2), not its own (1).
    container = Container(built, tmp_path / "region")
    result = subprocess.run(
        [str(built.rtld_next_program)], env=container.env(), capture_output=True, text=True
    )

    assert result.stdout == "next_twice=2 malloc_next_is_libc=1\n"


LOOKUPS = (
    CUDA_PRELUDE
    + """
import sys
from ctypes import byref, c_int, c_void_p, cast
hooks = ctypes.CDLL(sys.argv[1])           # the preloaded interposer, already in the process
def address(function):
    return cast(function, c_void_p).value
def proc(name, version, flags=0):
    pfn, status = c_void_p(), c_int()
    rc = cuda.cuGetProcAddress_v2(name.encode(), byref(pfn), version, ctypes.c_uint64(flags),
                                  byref(status))
    return pfn.value if rc == 0 else None
print("dlsym", address(cuda.cuMemAlloc_v2) == address(hooks.cuMemAlloc_v2),
      address(cuda.cuInit) is not None and not hasattr(hooks, "cuInit"))
print("elsewhere", hasattr(ctypes.CDLL("libm.so.6"), "cuMemAlloc_v2"))
print("getproc", proc("cuGetProcAddress", 12000) == address(hooks.cuGetProcAddress_v2),
      proc("cuGetProcAddress", 11030) == address(hooks.cuGetProcAddress),
      proc("cuMemAlloc", 3000) == address(hooks.cuMemAlloc),
      proc("cuLaunchKernel", 12000, 2) == address(hooks.cuLaunchKernel_ptsz),
      proc("cuInit", 12000) not in (None, address(hooks.cuGetProcAddress)))
"""
)


def test_dlsym_and_cu_get_proc_address_hand_out_hooks(container: Container) -> None:
    out = container.python(LOOKUPS, str(container.built.interposer)).stdout.splitlines()

    assert out == [
        "dlsym True True",
        "elsewhere False",  # a library that does not define the name still says so
        "getproc True True True True True",
    ]


def test_a_process_that_never_calls_cuda_leaves_no_trace(container: Container) -> None:
    subprocess.run(["sh", "-c", "true"], env=container.env(), check=True)

    assert container.region is not None and not container.region.exists()


def test_the_ctypes_region_matches_the_c_layout(built: FakeCuda) -> None:
    class Field(ctypes.Structure):
        _fields_ = [("name", ctypes.c_char_p), ("offset", ctypes.c_uint64),
                    ("size", ctypes.c_uint64)]  # fmt: skip

    library = ctypes.CDLL(str(built.interposer))
    fields = ctypes.POINTER(Field)()
    count = library.gpushare_region_layout(ctypes.byref(fields))
    c_layout = {fields[i].name.decode(): (fields[i].offset, fields[i].size) for i in range(count)}
    mirrors = {"gs_region": RegionRecord, "gs_gpu": GpuRecord, "gs_slot": SlotRecord}

    described_in_c = {
        f"{name}.{field}" for name, mirror in mirrors.items()
        for field, *_ in mirror._fields_ if not field.startswith("_")
    }  # fmt: skip
    assert described_in_c <= c_layout.keys()
    mutex_size = c_layout.pop("pthread_mutex_t")[1]
    assert mutex_size <= RegionRecord.lock.size
    for name, (offset, size) in c_layout.items():
        struct_name, _, member = name.partition(".")
        mirror = mirrors[struct_name]
        if not member:
            assert ctypes.sizeof(mirror) == size, name
            continue
        described = getattr(mirror, member)
        assert (described.offset, described.size) == (offset, size), name
