"""The region file of one container, as the isolation agent and the tests see it: a
ctypes mirror of region.h, generated from the header itself (layout.py), opened by path.

    with Region.open(path) as region:
        region.gpus()[0].used_bytes       # what the container's live processes hold
        region.processes()                # the live processes, by slot
        region.dead()                     # pids of slots whose owner died without leaving
        region.set_gate(0, open=False)    # hold the container's launches on GPU 0

The region lives in a directory the container mounts read-write, so every byte of it is
the container's to write, at any time: the agent trusts none of it. It never maps the
file (a container that truncates it would kill the agent with SIGBUS), never takes its
mutex (a holder would block the agent, and glibc would write through the container's
robust-list pointers inside the agent), and refuses anything that is not a regular
file of exactly the region's size. Each read is one pread into a private copy; each write
is a pwrite of one field. The library reaps dead processes' slots by itself, under its
own lock; the agent only tells live slots from dead ones (the owner's OFD lock).
"""

import ctypes
import fcntl
import os
import stat
import struct
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import TracebackType
from typing import Final, Self

from gpushare.isolation.interposer import layout

_HEADER: Final = layout.HEADER.read_text()
_CONSTANTS: Final = layout.constants(_HEADER)
MAGIC: Final = _CONSTANTS["GS_REGION_MAGIC"]
LAYOUT_VERSION: Final = _CONSTANTS["GS_LAYOUT_VERSION"]
MAX_GPUS: Final = _CONSTANTS["GS_MAX_GPUS"]
MAX_SLOTS: Final = _CONSTANTS["GS_MAX_SLOTS"]
UUID_BYTES: Final = _CONSTANTS["GS_UUID_BYTES"]
CLOSED_FOR_S: Final = 1.0
"""How long a gate closed by `set_gate` holds at most without being written again."""


class GpuRecord(ctypes.Structure):
    """struct gs_gpu: one of the container's GPUs."""


class SlotRecord(ctypes.Structure):
    """struct gs_slot: one process of the container."""


class RegionRecord(ctypes.Structure):
    """struct gs_region; its `lock` is the bytes of a process-shared robust mutex."""


layout.define(_HEADER, {"gs_gpu": GpuRecord, "gs_slot": SlotRecord, "gs_region": RegionRecord})

REGION_BYTES: Final = ctypes.sizeof(RegionRecord)


class Refusal(StrEnum):
    """Why a region cannot be used (few values: a metric label)."""

    NOT_A_FILE = "not-a-file"
    """A FIFO, device, socket, symlink or directory where the region should be."""
    SIZE = "size"
    """Not exactly a region's size: truncated, grown, or read short."""
    HEADER = "header"
    """Wrong magic or layout version, or counts beyond the layout's."""
    IO = "io"
    """Reading or writing it failed."""


class RegionError(RuntimeError):
    """The file is not a region this code can use; the message says why."""

    def __init__(self, message: str, refusal: Refusal) -> None:
        super().__init__(message)
        self.refusal = refusal


@dataclass(frozen=True)
class GpuUsage:
    index: int
    uuid: str
    """'' when the container's GPUs are mapped by ordinal."""
    cap_bytes: int
    """0: no cap. What the region says: the container can write it."""
    used_bytes: int
    """Summed over the live processes' slots (a dead process's bytes are not counted)."""
    gate_open: bool
    share_percent: int
    launches: int
    launches_held: int
    held_ns: int
    last_launch_ns: int
    """CLOCK_MONOTONIC (time.monotonic_ns()) of the latest launch; 0: none yet."""
    allocations_refused: int
    """Allocations refused at the cap."""


@dataclass(frozen=True)
class ProcessUsage:
    slot: int
    pid: int
    """In the process's own pid namespace."""
    attached_ns: int
    used_bytes: tuple[int, ...]
    """Per GPU of the container."""


@dataclass(frozen=True)
class RegionView:
    """One read of a region: its GPUs and live processes as they were at that moment."""

    gpus: tuple[GpuUsage, ...]
    processes: tuple[ProcessUsage, ...]
    """The live ones: their owner holds its slot's OFD lock."""
    dead: tuple[int, ...]
    """Pids of slots still taken whose owner died (the library gives them back)."""


_FLOCK: Final = struct.Struct("@hhqqi4x")  # struct flock on x86_64 / aarch64 Linux
_SLOTS: Final = RegionRecord.slots.offset
_PID_STRIDE: Final = ctypes.sizeof(SlotRecord) // ctypes.sizeof(ctypes.c_int32)
_GPUS: Final = RegionRecord.gpus.offset


class Region:
    """An open region file; close it (or use `with`)."""

    def __init__(self, path: Path, descriptor: int, identity: tuple[int, int]) -> None:
        self.path = path
        self._descriptor: int | None = descriptor
        self.identity = identity
        """(st_dev, st_ino) of the file opened: another file at the path is another region."""
        self.gpu_count = 0
        """As of the latest read."""

    @classmethod
    def open(cls, path: Path) -> Self:
        """The region at `path`, read once to check it; RegionError saying why it cannot
        be used, FileNotFoundError when there is none."""
        descriptor, identity = _open_regular(path)
        region = cls(path, descriptor, identity)
        try:
            region.read()
        except BaseException:
            region.close()
            raise
        return region

    def close(self) -> None:
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def replaced(self) -> bool:
        """Whether the path names no file, or another file, than the one open."""
        try:
            found = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return True
        return (found.st_dev, found.st_ino) != self.identity

    def read(self) -> RegionRecord:
        """A private copy of the whole region now, its header checked."""
        descriptor = self._fd()
        size = os.fstat(descriptor).st_size
        if size != REGION_BYTES:
            raise RegionError(
                f"{self.path} is {size} bytes; a layout-{LAYOUT_VERSION} region is {REGION_BYTES}",
                Refusal.SIZE,
            )
        data = os.pread(descriptor, REGION_BYTES, 0)
        if len(data) != REGION_BYTES:
            raise RegionError(
                f"{self.path}: read {len(data)} of {REGION_BYTES} bytes", Refusal.SIZE
            )
        record = RegionRecord.from_buffer_copy(data)
        _check(self.path, record)
        self.gpu_count = int(record.gpu_count)
        return record

    def view(self) -> RegionView:
        """The GPUs and processes now, counting live processes only."""
        record = self.read()
        count = self.gpu_count
        live, dead = [], []
        for s, pid in _taken(_pids(record)):
            if not self._slot_alive(s):
                dead.append(pid)
                continue
            slot = record.slots[s]
            live.append(ProcessUsage(s, pid, int(slot.attached_ns), tuple(slot.used[:count])))
        gpus = tuple(
            GpuUsage(
                index=i,
                uuid=g.uuid.decode(errors="replace"),
                cap_bytes=g.cap_bytes,
                used_bytes=sum(p.used_bytes[i] for p in live),
                gate_open=g.gate != 0,
                share_percent=g.share_percent,
                launches=g.launches,
                launches_held=g.launches_held,
                held_ns=g.held_ns,
                last_launch_ns=g.last_launch_ns,
                allocations_refused=g.allocations_refused,
            )
            for i, g in enumerate(record.gpus[:count])
        )
        return RegionView(gpus, tuple(live), tuple(dead))

    def gpus(self) -> list[GpuUsage]:
        return list(self.view().gpus)

    def processes(self) -> list[ProcessUsage]:
        return list(self.view().processes)

    def dead(self) -> list[int]:
        return list(self.view().dead)

    @property
    def attached(self) -> int:
        """Processes holding a slot, as the library counts them (dead ones until reaped)."""
        return int(self.read().attached)

    @property
    def heartbeat_ns(self) -> int:
        """CLOCK_MONOTONIC of the latest attach, allocation or launch in the container."""
        return int(self.read().heartbeat_ns)

    def set_gate(self, gpu: int, *, open: bool, for_s: float = CLOSED_FOR_S) -> None:
        """Open: the container's launches on `gpu` go. Closed: they wait until it opens
        again, for `for_s` seconds at most, so that launches flow again by themselves
        when the agent stops writing the gate."""
        if not open:  # the horizon first: a closed gate is never seen with an old one
            until = time.monotonic_ns() + int(for_s * 1e9)
            self._write(gpu, GpuRecord.gate_until_ns.offset, ctypes.c_uint64(until))
        self._write(gpu, GpuRecord.gate.offset, ctypes.c_uint32(1 if open else 0))

    def set_share(self, gpu: int, percent: int) -> None:
        if not 0 <= percent <= 100:
            raise ValueError(f"a compute share is a percentage, got {percent}")
        self._write(gpu, GpuRecord.share_percent.offset, ctypes.c_uint32(percent))

    def _write(self, gpu: int, field: int, value: ctypes.c_uint32 | ctypes.c_uint64) -> None:
        if not 0 <= gpu < self.gpu_count:
            raise IndexError(f"the region has {self.gpu_count} GPUs, no GPU {gpu}")
        data = bytes(value)
        at = _GPUS + gpu * ctypes.sizeof(GpuRecord) + field
        if os.pwrite(self._fd(), data, at) != len(data):
            raise RegionError(f"{self.path}: short write at {at}", Refusal.IO)

    def _fd(self) -> int:
        if self._descriptor is None:
            raise RegionError(f"{self.path} is closed", Refusal.IO)
        return self._descriptor

    def _slot_alive(self, slot: int) -> bool:
        """Its owner holds an OFD lock on the slot's first byte. Asked on the agent's own
        descriptor, which never locks: nothing the container wrote is followed."""
        start = _SLOTS + slot * ctypes.sizeof(SlotRecord)
        query = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, start, 1, 0)
        answer = fcntl.fcntl(self._fd(), fcntl.F_OFD_GETLK, query)
        return int(_FLOCK.unpack(answer)[0]) != fcntl.F_UNLCK


def _open_regular(path: Path) -> tuple[int, tuple[int, int]]:
    """A read-write descriptor on the regular file at `path` itself (never what a symlink
    there points to), and its (st_dev, st_ino). A FIFO, device or socket is looked at
    through O_PATH only, so opening it has no side effect (no blocking, no driver)."""
    handle = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        found = os.fstat(handle)
        if not stat.S_ISREG(found.st_mode):
            kind = stat.filemode(found.st_mode)[0]
            raise RegionError(f"{path} is not a regular file (mode {kind!r})", Refusal.NOT_A_FILE)
        # Through the O_PATH handle: the file checked, whatever the path names by now.
        descriptor = os.open(f"/proc/self/fd/{handle}", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    finally:
        os.close(handle)
    opened = os.fstat(descriptor)
    if (opened.st_dev, opened.st_ino) != (found.st_dev, found.st_ino):
        os.close(descriptor)
        raise RegionError(f"{path} changed while it was opened", Refusal.NOT_A_FILE)
    return descriptor, (found.st_dev, found.st_ino)


def _check(path: Path, record: RegionRecord) -> None:
    if record.magic != MAGIC or record.layout_version != LAYOUT_VERSION:
        raise RegionError(
            f"{path} is not a layout-{LAYOUT_VERSION} gpushare region "
            f"(magic {hex(record.magic)}, layout {record.layout_version})",
            Refusal.HEADER,
        )
    if record.gpu_count > MAX_GPUS or record.slot_count != MAX_SLOTS:
        raise RegionError(
            f"{path} says {record.gpu_count} GPUs and {record.slot_count} slots; the layout "
            f"has at most {MAX_GPUS} GPUs and exactly {MAX_SLOTS} slots",
            Refusal.HEADER,
        )


_BLOCK: Final = 64
"""Slots looked at together: a block of free slots (pid 0) is passed over in one compare,
so a region with few processes costs a few compares, not a Python step per slot."""
_FREE_BLOCK: Final = bytes(4 * _BLOCK)


def _taken(pids: memoryview) -> list[tuple[int, int]]:
    """(slot, pid) of the slots whose pid is not 0."""
    data = pids.tobytes()
    found: list[tuple[int, int]] = []
    for start in range(0, len(pids), _BLOCK):
        if data[4 * start : 4 * (start + _BLOCK)] == _FREE_BLOCK:
            continue
        found.extend((s, pid) for s, pid in enumerate(pids[start : start + _BLOCK], start) if pid)
    return found


def _pids(record: RegionRecord) -> memoryview:
    """Each slot's pid, read from the copy at once (a slot is a whole number of int32)."""
    raw = memoryview(record).cast("B")[_SLOTS : _SLOTS + MAX_SLOTS * ctypes.sizeof(SlotRecord)]
    return raw.cast("i")[::_PID_STRIDE]
