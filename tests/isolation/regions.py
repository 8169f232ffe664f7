"""A container's side of its region, for tests: what a tenant can do to the file it
mounts read-write. Regions are made here from Python (no C library needed), fields are
poked in place, slots held live by a helper process, and the region's mutex held by
another.

    make_region(path, caps=(2 * GIB,))
    poke(path, gpu_field(0, "cap_bytes"), ctypes.c_uint64(64 * GIB))
    with slot_holder(path, slot=3, pid=4242):   # slot 3 live, named pid 4242
        ...
"""

import ctypes
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from gpushare.isolation.interposer.region import (
    LAYOUT_VERSION,
    MAGIC,
    MAX_SLOTS,
    GpuRecord,
    RegionRecord,
    SlotRecord,
)

GIB = 1 << 30


def make_region(path: Path, caps: Sequence[int] = (GIB,)) -> None:
    """A valid region as the library's first process leaves it: gates open, no slot taken."""
    record = RegionRecord()
    record.magic = MAGIC
    record.layout_version = LAYOUT_VERSION
    record.gpu_count = len(caps)
    record.slot_count = MAX_SLOTS
    for g, cap in enumerate(caps):
        record.gpus[g].cap_bytes = cap
        record.gpus[g].gate = 1
    path.write_bytes(bytes(record))


def header_field(name: str) -> int:
    offset: int = getattr(RegionRecord, name).offset
    return offset


def gpu_field(gpu: int, name: str) -> int:
    field: int = getattr(GpuRecord, name).offset
    return header_field("gpus") + gpu * ctypes.sizeof(GpuRecord) + field


def slot_field(slot: int, name: str) -> int:
    field: int = getattr(SlotRecord, name).offset
    return header_field("slots") + slot * ctypes.sizeof(SlotRecord) + field


def poke(path: Path, offset: int, value: ctypes._SimpleCData | bytes) -> None:  # type: ignore[type-arg]
    """Writes `value` over the file at `offset`, as a process of the container may."""
    with path.open("r+b") as f:
        f.seek(offset)
        f.write(bytes(value))


_HOLDER = textwrap.dedent(
    """
    import ctypes, fcntl, os, struct, sys, time
    path, slot_at, pid, used_at, used = sys.argv[1], *map(int, sys.argv[2:])
    fd = os.open(path, os.O_RDWR)
    if pid:
        os.pwrite(fd, struct.pack("=i", pid), slot_at)
        os.pwrite(fd, struct.pack("=Q", used), used_at)
    lock = struct.pack("@hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, slot_at, 1, 0)
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, lock)
    print("holding", flush=True)
    time.sleep(120)
    """
)


@contextmanager
def slot_holder(path: Path, slot: int, pid: int, used_bytes: int = 0) -> Iterator[int]:
    """Slot `slot` live (a helper holds its OFD lock, as the library's process does),
    naming `pid` and holding `used_bytes` on the first GPU; yields the helper's pid."""
    with _helper(
        _HOLDER,
        path,
        slot_field(slot, "pid"),
        pid,
        slot_field(slot, "used"),
        used_bytes,
    ) as helper:
        yield helper


_MUTEX = textwrap.dedent(
    """
    import ctypes, mmap, os, sys, time
    libc = ctypes.CDLL(None, use_errno=True)
    path, offset = sys.argv[1], int(sys.argv[2])
    fd = os.open(path, os.O_RDWR)
    mapping = mmap.mmap(fd, os.fstat(fd).st_size, mmap.MAP_SHARED)
    address = ctypes.addressof(ctypes.c_char.from_buffer(mapping)) + offset
    attr = ctypes.create_string_buffer(64)
    libc.pthread_mutexattr_init(attr)
    libc.pthread_mutexattr_setpshared(attr, 1)   # PTHREAD_PROCESS_SHARED
    libc.pthread_mutexattr_setrobust(attr, 1)    # PTHREAD_MUTEX_ROBUST
    assert libc.pthread_mutex_init(ctypes.c_void_p(address), attr) == 0
    assert libc.pthread_mutex_lock(ctypes.c_void_p(address)) == 0
    print("holding", flush=True)
    time.sleep(120)
    """
)


@contextmanager
def mutex_holder(path: Path) -> Iterator[int]:
    """The region's robust process-shared mutex, made and held by a live process."""
    with _helper(_MUTEX, path, header_field("lock")) as helper:
        yield helper


@contextmanager
def _helper(script: str, path: Path, *arguments: int) -> Iterator[int]:
    process = subprocess.Popen(
        [sys.executable, "-c", script, str(path), *map(str, arguments)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "holding"
        yield process.pid
    finally:
        process.kill()
        process.wait()
