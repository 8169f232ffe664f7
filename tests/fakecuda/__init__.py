"""A fake libcuda.so.1 (fakecuda.c), the probe program that drives it (probe.c), and the
interposer built beside them, for testing libgpushare-cuda.so without a GPU.

A test describes a container (`Container`: the fake's devices, the caps, the visible
UUIDs, a region path) and runs processes in it, each with the interposer in LD_PRELOAD
(what /etc/ld.so.preload amounts to) and the fake first on LD_LIBRARY_PATH:

    container = Container(fake_cuda_or_skip(), tmp_path / "region", caps="1")
    lines = container.probe("dlsym", "init", "0", "alloc", "mem", str(768 * MIB))
    container.python("import ctypes; ...")      # the same environment, for ctypes cases

A granted container (`granted=True`) preloads a second build of the interposer that reads
its grant at `FakeCuda.grant_path` instead of /etc/gpushare/grant; `grant_text` writes one.

Everything is built once per test process into a temp directory (`fake_cuda()`); a
test skips, saying why, when there is no C compiler.
"""

import atexit
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Final

import pytest

from gpushare.isolation.interposer import build as interposer

HERE: Final = Path(__file__).parent
DRIVER_NAME: Final = "libcuda.so.1"
MIB: Final = 1 << 20
GIB: Final = 1 << 30
COMPILE: Final = ("-O2", "-Wall", "-Wextra", "-Werror", f"-I{interposer.SOURCE_DIRECTORY}")


class FakeCudaUnavailable(RuntimeError):
    """No C compiler to build the fake with; the message says what to install. (Sources
    the compiler refuses raise interposer.BuildFailed: that fails the tests.)"""


def uuid(n: int) -> str:
    """A well-formed GPU UUID, different for each n."""
    return f"GPU-{n:08x}-0000-4000-8000-{n:012x}"


@dataclass(frozen=True)
class FakeCuda:
    """What was built: the fake driver, the probe, the interposer, the RTLD_NEXT pair, and
    the interposer that reads its grant at grant_path (where no file is, unless a test
    writes one)."""

    directory: Path
    driver: Path
    probe: Path
    interposer: Path
    rtld_next_program: Path
    granted_interposer: Path
    grant_path: Path


def _compile(*arguments: str) -> None:
    """Compiles; a missing compiler skips the tests, a refused source fails them."""
    try:
        command = [*interposer.compiler(), *COMPILE, *arguments]
    except interposer.CompilerMissing as missing:
        raise FakeCudaUnavailable(str(missing)) from missing
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise interposer.BuildFailed(f"{' '.join(command)} failed:\n{result.stderr}")


def build_fake_cuda(directory: Path) -> FakeCuda:
    """Builds everything into `directory` and says where it is.

    The fake has no soname (a test process loading it by path must not answer every
    later dlopen("libcuda.so.1")) and binds its own symbols (-Bsymbolic), so that what
    its cuGetProcAddress returns are its functions, not the interposer's, as the real
    driver's internal pointers are."""
    directory.mkdir(parents=True, exist_ok=True)
    driver = directory / DRIVER_NAME
    _compile(
        "-shared",
        "-fPIC",
        "-fvisibility=hidden",
        "-Wl,-Bsymbolic",
        "-o",
        str(driver),
        str(HERE / "fakecuda.c"),
        "-lpthread",
    )
    probe = directory / "probe"
    _compile("-o", str(probe), str(HERE / "probe.c"), f"-L{directory}", f"-l:{DRIVER_NAME}", "-ldl")
    for name in ("first", "second"):
        _compile(
            "-shared",
            "-fPIC",
            f"-DLIBRARY_{name.upper()}",
            "-o",
            str(directory / f"lib{name}.so"),
            str(HERE / "rtld_next.c"),
            "-ldl",
        )
    rtld_next_program = directory / "rtld_next"
    _compile(
        "-DPROGRAM",
        "-o",
        str(rtld_next_program),
        str(HERE / "rtld_next.c"),
        f"-L{directory}",
        "-Wl,--no-as-needed",
        "-lfirst",
        "-lsecond",
        f"-Wl,-rpath,{directory}",
        "-ldl",
    )
    grant_path = directory / "grant"
    try:
        library = interposer.build_library(directory)
        granted = interposer.build_library(directory, grant_path=str(grant_path))
    except interposer.CompilerMissing as missing:
        raise FakeCudaUnavailable(str(missing)) from missing
    return FakeCuda(directory, driver, probe, library, rtld_next_program, granted, grant_path)


@cache
def fake_cuda() -> FakeCuda:
    """Everything, built once per process into a temp directory removed at exit."""
    directory = Path(tempfile.mkdtemp(prefix="fakecuda-"))
    atexit.register(shutil.rmtree, directory, True)
    return build_fake_cuda(directory)


def fake_cuda_or_skip() -> FakeCuda:
    try:
        return fake_cuda()
    except FakeCudaUnavailable as missing:
        pytest.skip(str(missing))


def grant_text(
    region: Path, mem_bytes: Sequence[int], uuids: Sequence[str] = (), /, **more: str
) -> str:
    """A well-formed grant (notes/grant-contract.md) for GPUs capped at `mem_bytes`, by
    UUID or (none given) by ordinal; `more` adds or overrides keys (`_` for `-`)."""
    fields = {
        "id": "0123456789abcdef0123456789abcdef",
        "pod-uid": "c0ffee00-0000-4000-8000-000000000000",
        "namespace": "ml",
        "pod": "train",
        "container": "app",
        "indices": ",".join(str(i) for i in range(len(mem_bytes))),
        "uuids": ",".join(uuids),
        "mem-bytes": ",".join(str(b) for b in mem_bytes),
        "core-percent": ",".join("0" for _ in mem_bytes),
        "region": str(region),
        **{key.replace("_", "-"): value for key, value in more.items()},
    }
    lines = ["gpushare-grant=1", *(f"{key}={value}" for key, value in fields.items())]
    return "".join(f"{line}\n" for line in lines)


def parse_line(line: str) -> dict[str, str]:
    """'alloc kind=mem rc=0 id=0' -> {'op': 'alloc', 'kind': 'mem', 'rc': '0', 'id': '0'}"""
    op, *pairs = line.split()
    return {"op": op, **dict(pair.split("=", 1) for pair in pairs)}


@dataclass
class Container:
    """The environment of one container's processes on the fake driver."""

    built: FakeCuda
    region: Path | None
    """GPUSHARE_CUDA_REGION; None: unset (the interposer passes everything through)."""
    caps: str | None = "1"
    """ALIYUN_COM_GPU_MEM_CONTAINER, GiB per visible GPU."""
    devices: Sequence[tuple[str, int]] = ((uuid(0), 4 * GIB),)
    """The fake's devices in ordinal order: (UUID, bytes)."""
    visible: str | None = None
    """NVIDIA_VISIBLE_DEVICES; None: the devices' UUIDs in order."""
    extra: Mapping[str, str] = field(default_factory=dict)
    preload: bool = True
    granted: bool = False
    """Preload the interposer that reads its grant at built.grant_path."""

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSHARE_", "FAKE_"))}
        for name in ("ALIYUN_COM_GPU_MEM_CONTAINER", "NVIDIA_VISIBLE_DEVICES", "LD_PRELOAD"):
            env.pop(name, None)
        paths = [
            str(self.built.directory),
            *filter(None, env.get("LD_LIBRARY_PATH", "").split(":")),
        ]
        env["LD_LIBRARY_PATH"] = ":".join(paths)
        env["FAKE_CUDA_DEVICES"] = ",".join(f"{u}:{size}" for u, size in self.devices)
        if self.preload:
            chosen = self.built.granted_interposer if self.granted else self.built.interposer
            env["LD_PRELOAD"] = str(chosen)
        if self.region is not None:
            env["GPUSHARE_CUDA_REGION"] = str(self.region)
        if self.caps is not None:
            env["ALIYUN_COM_GPU_MEM_CONTAINER"] = self.caps
        visible = self.visible if self.visible is not None else ",".join(u for u, _ in self.devices)
        env["NVIDIA_VISIBLE_DEVICES"] = visible
        src = Path(interposer.__file__).parents[3]
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(src), env.get("PYTHONPATH")]))
        env.update(self.extra)
        return env

    def run_probe(self, mode: str, *commands: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.built.probe), mode, *commands],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=60,
        )

    def probe(self, mode: str, *commands: str) -> list[dict[str, str]]:
        """The probe's output lines, parsed; fails the test if the probe failed."""
        result = self.run_probe(mode, *commands)
        assert result.returncode == 0, result.stderr
        return [parse_line(line) for line in result.stdout.splitlines()]

    def start_probe(self, mode: str, *commands: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [str(self.built.probe), mode, *commands],
            env=self.env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def python(self, code: str, *arguments: str) -> subprocess.CompletedProcess[str]:
        """Python running `code` in the container (fails the test if it fails)."""
        result = subprocess.run(
            [sys.executable, "-c", code, *arguments],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        return result

    def start_python(self, code: str, *arguments: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-c", code, *arguments],
            env=self.env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


CUDA_PRELUDE: Final = """
import ctypes
cuda = ctypes.CDLL("libcuda.so.1")
def check(rc):
    assert rc == 0, rc
check(cuda.cuInit(0))
def use_device(n):
    ctx = ctypes.c_void_p()
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), n))
    check(cuda.cuCtxSetCurrent(ctx))
use_device(0)
cuda.fakecuda_reached.restype = ctypes.c_ulonglong
def alloc(size):
    pointer = ctypes.c_ulonglong()
    rc = cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(size))
    return rc, pointer.value
def free(pointer):
    check(cuda.cuMemFree_v2(ctypes.c_ulonglong(pointer)))
"""
"""Python for a process in a Container: the driver through ctypes (dlopen + dlsym, so the
hooks), device 0 current, alloc(size) -> (rc, pointer) and free(pointer)."""


def dynamic_exports(library: Path) -> set[str]:
    """The names a 64-bit little-endian ELF shared object defines in its dynamic symbol
    table with default visibility (what `nm -D --defined-only` lists), read directly."""
    data = library.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{library} is not a 64-bit little-endian ELF file")
    section_offset = int.from_bytes(data[0x28:0x30], "little")
    entry_size = int.from_bytes(data[0x3A:0x3C], "little")
    count = int.from_bytes(data[0x3C:0x3E], "little")
    sections = [
        struct.unpack_from("<IIQQQQIIQQ", data, section_offset + i * entry_size)
        for i in range(count)
    ]
    dynsym_type = 11
    names = set()
    for _, kind, _, _, offset, size, link, _, _, symbol_size in sections:
        if kind != dynsym_type:
            continue
        strings = sections[link][4]
        for at in range(offset + symbol_size, offset + size, symbol_size):  # 0 is undefined
            name, info, other, index = struct.unpack_from("<IBBH", data, at)
            bind, visibility = info >> 4, other & 3
            if index != 0 and bind in (1, 2) and visibility == 0:  # GLOBAL/WEAK, DEFAULT
                end = data.index(b"\0", strings + name)
                names.add(data[strings + name : end].decode())
    return names


def hook_table() -> dict[str, list[str]]:
    """hooks.def's entries by macro (CUDA_HOOK, CUDA_REAL, NVML_HOOK, NVML_REAL)."""
    table: dict[str, list[str]] = {}
    text = (interposer.SOURCE_DIRECTORY / "hooks.def").read_text()
    for macro, name in re.findall(r"^((?:CUDA|NVML)_(?:HOOK|REAL))\((\w+),", text, re.M):
        table.setdefault(macro, []).append(name)
    return table
