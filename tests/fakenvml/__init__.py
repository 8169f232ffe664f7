"""A fake libnvidia-ml.so.1 (fakenvml.c) that the unmodified nvidia-ml-py loads in place
of the driver's, so the nvml backends run without a GPU against a world a test describes.

Another process uses it through its environment alone (`nvml_env`): LD_LIBRARY_PATH names
the directory of the built library first, and FAKE_NVML_CONFIG the world file, which the
fake reads again whenever it changes. Within the test process, `loaded_in_process` points
pynvml at it. The world file's format is described at the top of fakenvml.c.

    library = fake_nvml_library()          # built once per process (or build_fake_nvml(dir))
    world = World([FakeGpu("GPU-0", total_bytes=T4_BYTES)])
    write_world(tmp_path / "world", world)
    subprocess.run([...], env=nvml_env(library, tmp_path / "world"))
    world.events.append(Event.xid(0, 79)); write_world(tmp_path / "world", world)
"""

import atexit
import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Final

import pytest

from gpushare.isolation.interposer import build as interposer_build

SOURCE: Final = Path(__file__).with_name("fakenvml.c")
LIBRARY_NAME: Final = "libnvidia-ml.so.1"
MIB: Final = 1 << 20
T4_BYTES: Final = 15_843_721_216
"""A Tesla T4's total as NVML reports it: 15,109 MiB (and 0.75 MiB)."""

XID: Final = 0x8
"""nvmlEventTypeXidCriticalError; the event's data is the XID."""
DOUBLE_BIT_ECC: Final = 0x2
SINGLE_BIT_ECC: Final = 0x1


class FakeNvmlUnavailable(RuntimeError):
    """No C compiler to build the fake with; the message says what to install."""


@dataclass
class FakeProcess:
    pid: int
    used_bytes: int | None = 0
    """GPU memory it holds; None: NVML cannot say (NVML_VALUE_NOT_AVAILABLE)."""
    sm_percent: int | None = None
    """Its share of the GPU's SMs in each utilisation sample; None: no samples."""


@dataclass
class FakeGpu:
    uuid: str
    name: str = "Tesla T4"
    total_bytes: int = T4_BYTES
    minor: int | None = None
    """/dev/nvidiaN; None: its index."""
    used_bytes: int | None = None
    """None: the sum of its processes' memory."""
    reserved_bytes: int = 0
    """What nvmlDeviceGetMemoryInfo_v2 says the driver keeps (the first form does not say)."""
    utilization: int = 0
    retired_pages_pending: bool = False
    retired_pages: tuple[int, int] = (0, 0)
    """Pages retired for (multiple single-bit, double-bit) ECC errors."""
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)
    """(corrected, uncorrected, pending, failure)"""
    ecc_errors: tuple[int, int] = (0, 0)
    """(corrected, uncorrected)"""
    supported_events: int = XID | DOUBLE_BIT_ECC | SINGLE_BIT_ECC
    processes: list[FakeProcess] = field(default_factory=list)

    def record(self) -> str:
        optional = {
            "minor": self.minor,
            "used": self.used_bytes,
            "reserved": self.reserved_bytes or None,
            "util": self.utilization,
            "retired_sbe": self.retired_pages[0],
            "retired_dbe": self.retired_pages[1],
            "retired_pending": int(self.retired_pages_pending),
            "remapped": ",".join(str(n) for n in self.remapped_rows),
            "ecc_corrected": self.ecc_errors[0],
            "ecc_uncorrected": self.ecc_errors[1],
            "events": hex(self.supported_events),
        }
        fields = " ".join(f"{k}={v}" for k, v in optional.items() if v is not None)
        return f"gpu uuid={self.uuid} total={self.total_bytes} {fields} name={self.name}"


@dataclass(frozen=True)
class Event:
    gpu: int
    type: int
    data: int = 0

    @classmethod
    def xid(cls, gpu: int, xid: int) -> "Event":
        return cls(gpu, XID, xid)

    @classmethod
    def double_bit_ecc(cls, gpu: int) -> "Event":
        return cls(gpu, DOUBLE_BIT_ECC)


@dataclass(frozen=True)
class Failure:
    """`function` (pynvml's C name; a trailing _vN is ignored) answers `error` (an
    NVML_ERROR_ name without the prefix), on every GPU or on one."""

    function: str
    error: str = "NOT_SUPPORTED"
    gpu: int | None = None


@dataclass
class World:
    """What the fake driver reports. Events are a log: append to it, and each event that
    appears after a process first read the world is delivered once to its event sets."""

    gpus: list[FakeGpu] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    init_error: str | None = None
    """nvmlInit fails with it, e.g. DRIVER_NOT_LOADED."""
    driver_version: str = "550.54.15"

    def render(self) -> str:
        lines = [f"driver {self.driver_version}"]
        if self.init_error is not None:
            lines.append(f"init {self.init_error}")
        for f in self.failures:
            lines.append(
                f"fail {f.function} {f.error}" + ("" if f.gpu is None else f" gpu={f.gpu}")
            )
        for index, gpu in enumerate(self.gpus):
            lines.append(gpu.record())
            for p in gpu.processes:
                used = "-" if p.used_bytes is None else p.used_bytes
                sm = "-" if p.sm_percent is None else p.sm_percent
                lines.append(f"process gpu={index} pid={p.pid} used={used} sm={sm}")
        lines += [f"event gpu={e.gpu} type={e.type} data={e.data}" for e in self.events]
        return "\n".join(lines) + "\n"


def write_world(path: Path, world: World) -> None:
    """Replaces the world file at once (a rename), so the fake never reads half of it."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    temporary.write_text(world.render())
    temporary.replace(path)


def nvml_env(
    library: Path,
    world: Path,
    base: Mapping[str, str] | None = None,
    log: Path | None = None,
) -> dict[str, str]:
    """The environment of a process whose pynvml should load the fake: `base` (default
    os.environ) with the library's directory first in LD_LIBRARY_PATH, the world, and
    the file the fake logs each call to (FAKE_NVML_LOG), if any."""
    env = dict(os.environ if base is None else base)
    search = [str(library.parent), *filter(None, env.get("LD_LIBRARY_PATH", "").split(":"))]
    env["LD_LIBRARY_PATH"] = ":".join(search)
    env["FAKE_NVML_CONFIG"] = str(world)
    if log is not None:
        env["FAKE_NVML_LOG"] = str(log)
    return env


def compiler() -> list[str]:
    """The C compiler command the project builds its C with (the interposer's choice)."""
    try:
        return interposer_build.compiler()
    except interposer_build.CompilerMissing as err:
        raise FakeNvmlUnavailable(f"cannot build the fake libnvidia-ml: {err}") from None


def build_fake_nvml(directory: Path) -> Path:
    """Builds fakenvml.c into `directory`/libnvidia-ml.so.1 (unless it is there from the
    same source) and returns its path; put its directory first in LD_LIBRARY_PATH.

    It has no soname on purpose: loaded by its path into a test process, it would
    otherwise also answer every later dlopen("libnvidia-ml.so.1") there."""
    directory.mkdir(parents=True, exist_ok=True)
    library = directory / LIBRARY_NAME
    stamp = directory / f"{LIBRARY_NAME}.source-sha256"
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()
    if library.exists() and stamp.exists() and stamp.read_text() == digest:
        return library
    partial = directory / f".{LIBRARY_NAME}.{os.getpid()}"
    command = [
        *compiler(),
        "-shared",
        "-fPIC",
        "-O2",
        "-Wall",
        "-Wextra",
        "-fvisibility=hidden",
        "-o",
        str(partial),
        str(SOURCE),
        "-lpthread",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise FakeNvmlUnavailable(f"building the fake libnvidia-ml failed: {result.stderr}")
    partial.replace(library)
    stamp.write_text(digest)
    return library


@cache
def fake_nvml_library() -> Path:
    """The fake, built once per process into a temp directory removed at exit."""
    directory = Path(tempfile.mkdtemp(prefix="fakenvml-"))
    atexit.register(shutil.rmtree, directory, True)
    return build_fake_nvml(directory)


@contextmanager
def loaded_in_process(library: Path, world: Path, log: Path | None = None) -> Iterator[ModuleType]:
    """pynvml of this process answered by the fake from `world`, until the block ends.

    The dynamic loader reads LD_LIBRARY_PATH only when a process starts, so within it
    pynvml's library handle is swapped instead (and its function cache emptied)."""
    import pynvml

    saved = (pynvml.nvmlLib, dict(pynvml._nvmlGetFunctionPointer_cache), pynvml._nvmlLib_refcount)
    wanted = {"FAKE_NVML_CONFIG": str(world), "FAKE_NVML_LOG": str(log) if log else None}
    saved_env = {name: os.environ.get(name) for name in wanted}
    _set_env(wanted)
    pynvml.nvmlLib = ctypes.CDLL(str(library))
    pynvml._nvmlGetFunctionPointer_cache.clear()
    try:
        yield pynvml
    finally:
        pynvml.nvmlLib, cached, pynvml._nvmlLib_refcount = saved
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlGetFunctionPointer_cache.update(cached)
        _set_env(saved_env)


def _set_env(values: Mapping[str, str | None]) -> None:
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def calls(log: Path, function: str, gpu: int | None = None) -> int:
    """How many times the fake logged a call of `function` in FAKE_NVML_LOG: on `gpu`, or
    all of them. As in the world's `fail` lines, a trailing _vN of the name is ignored."""
    try:
        lines = log.read_text().splitlines()
    except FileNotFoundError:
        return 0
    wanted = [_unversioned(function)] + ([] if gpu is None else [str(gpu)])
    return sum(1 for line in lines if _logged(line)[: len(wanted)] == wanted)


def _logged(line: str) -> list[str]:
    function, *rest = line.split()
    return [_unversioned(function), *rest]


def _unversioned(function: str) -> str:
    return re.sub(r"_v\d+$", "", function)


def fake_nvml_or_skip() -> Path:
    """The fake library, or the test skips saying why it cannot be built."""
    try:
        return fake_nvml_library()
    except FakeNvmlUnavailable as err:
        pytest.skip(str(err))


@dataclass
class FakeDriver:
    """The world a test changes and writes again, and the fake's log of calls."""

    path: Path
    world: World
    log: Path

    def write(self) -> None:
        write_world(self.path, self.world)

    def calls(self, function: str, gpu: int | None = None) -> int:
        return calls(self.log, function, gpu)


@contextmanager
def fake_driver(directory: Path, world: World) -> Iterator[FakeDriver]:
    """This process's pynvml on the fake, answering from `world` (written under
    `directory`), for the length of the block. Skips the test without a compiler."""
    library = fake_nvml_or_skip()
    driver = FakeDriver(directory / "nvml-world", world, directory / "nvml-calls")
    driver.write()
    with loaded_in_process(library, driver.path, driver.log):
        yield driver
