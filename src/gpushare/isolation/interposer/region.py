"""The region file of one container, as the isolation agent and the tests see it: a
ctypes mirror of region.h (the layout test holds the two equal), opened by path.

    with Region.open(path) as region:
        region.gpus()[0].used_bytes       # what the container holds on its first GPU
        region.processes()                # per-process use, by slot
        region.set_gate(0, open=False)    # hold the container's launches on GPU 0
        region.reap()                     # give back what dead processes held

The library fills the header when the first CUDA process of the container starts; the
agent only reads usage, writes gates and share targets, and reaps.
"""

import ctypes
import errno
import fcntl
import mmap
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final, Self

MAGIC: Final = 0x31524853555047
LAYOUT_VERSION: Final = 2
MAX_GPUS: Final = 16
MAX_SLOTS: Final = 1024
UUID_BYTES: Final = 64
CLOSED_FOR_S: Final = 1.0
"""How long a gate closed by `set_gate` holds at most without being written again."""


class GpuRecord(ctypes.Structure):
    """struct gs_gpu: one of the container's GPUs (64-byte aligned in C)."""

    _fields_ = [
        ("uuid", ctypes.c_char * UUID_BYTES),
        ("cap_bytes", ctypes.c_uint64),
        ("used_bytes", ctypes.c_uint64),
        ("gate", ctypes.c_uint32),
        ("share_percent", ctypes.c_uint32),
        ("launches", ctypes.c_uint64),
        ("launches_held", ctypes.c_uint64),
        ("held_ns", ctypes.c_uint64),
        ("last_launch_ns", ctypes.c_uint64),
        ("gate_until_ns", ctypes.c_uint64),
        ("allocations_refused", ctypes.c_uint64),
        ("_align", ctypes.c_uint8 * 56),
    ]


class SlotRecord(ctypes.Structure):
    """struct gs_slot: one process of the container (64-byte aligned in C)."""

    _fields_ = [
        ("pid", ctypes.c_int32),
        ("reserved", ctypes.c_uint32),
        ("attached_ns", ctypes.c_uint64),
        ("used", ctypes.c_uint64 * MAX_GPUS),
        ("_align", ctypes.c_uint8 * 48),
    ]


class RegionRecord(ctypes.Structure):
    """struct gs_region."""

    _fields_ = [
        ("magic", ctypes.c_uint64),
        ("layout_version", ctypes.c_uint32),
        ("gpu_count", ctypes.c_uint32),
        ("slot_count", ctypes.c_uint32),
        ("attached", ctypes.c_uint32),
        ("created_ns", ctypes.c_uint64),
        ("heartbeat_ns", ctypes.c_uint64),
        ("lock", ctypes.c_uint8 * 64),  # a process-shared robust pthread_mutex_t
        ("_align", ctypes.c_uint8 * 24),
        ("gpus", GpuRecord * MAX_GPUS),
        ("slots", SlotRecord * MAX_SLOTS),
    ]


class RegionError(RuntimeError):
    """The file is not a region this code can read; the message says why."""


@dataclass(frozen=True)
class GpuUsage:
    index: int
    uuid: str
    """'' when the container's GPUs are mapped by ordinal."""
    cap_bytes: int
    """0: no cap."""
    used_bytes: int
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


_EOWNERDEAD: Final = errno.EOWNERDEAD
_FLOCK: Final = struct.Struct("@hhqqi4x")  # struct flock on x86_64 / aarch64 Linux


class Region:
    """An open region file, mapped shared; close it (or use `with`)."""

    def __init__(self, path: Path, descriptor: int, mapping: mmap.mmap) -> None:
        self.path = path
        self._descriptor = descriptor
        self._mapping = mapping
        self._record: RegionRecord | None = RegionRecord.from_buffer(mapping)
        self._libc = ctypes.CDLL(None, use_errno=True)

    @classmethod
    def open(cls, path: Path) -> Self:
        descriptor = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            size = os.fstat(descriptor).st_size
            if size < ctypes.sizeof(RegionRecord):
                raise RegionError(
                    f"{path} is {size} bytes; a layout-{LAYOUT_VERSION} region is "
                    f"{ctypes.sizeof(RegionRecord)}"
                )
            mapping = mmap.mmap(descriptor, ctypes.sizeof(RegionRecord), mmap.MAP_SHARED)
        except BaseException:
            os.close(descriptor)
            raise
        region = cls(path, descriptor, mapping)
        if region.record.magic != MAGIC or region.record.layout_version != LAYOUT_VERSION:
            found = (hex(region.record.magic), region.record.layout_version)
            region.close()
            raise RegionError(
                f"{path} is not a layout-{LAYOUT_VERSION} gpushare region "
                f"(magic {found[0]}, layout {found[1]})"
            )
        return region

    @property
    def record(self) -> RegionRecord:
        if self._record is None:
            raise RegionError(f"{self.path} is closed")
        return self._record

    def close(self) -> None:
        if self._record is None:
            return
        self._record = None  # the mapping cannot close while a ctypes view exports it
        self._mapping.close()
        os.close(self._descriptor)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def gpu_count(self) -> int:
        return int(self.record.gpu_count)

    @property
    def attached(self) -> int:
        """Processes of the container holding a slot now (dead ones until reaped)."""
        return int(self.record.attached)

    @property
    def heartbeat_ns(self) -> int:
        """CLOCK_MONOTONIC of the latest attach, allocation or launch in the container."""
        return int(self.record.heartbeat_ns)

    def gpus(self) -> list[GpuUsage]:
        record = self.record
        return [
            GpuUsage(
                index=i,
                uuid=g.uuid.decode(errors="replace"),
                cap_bytes=g.cap_bytes,
                used_bytes=g.used_bytes,
                gate_open=g.gate != 0,
                share_percent=g.share_percent,
                launches=g.launches,
                launches_held=g.launches_held,
                held_ns=g.held_ns,
                last_launch_ns=g.last_launch_ns,
                allocations_refused=g.allocations_refused,
            )
            for i, g in enumerate(record.gpus[: record.gpu_count])
        ]

    def processes(self) -> list[ProcessUsage]:
        count = self.record.gpu_count
        return [
            ProcessUsage(s, slot.pid, slot.attached_ns, tuple(slot.used[:count]))
            for s, slot in enumerate(self.record.slots)
            if slot.pid != 0
        ]

    def set_gate(self, gpu: int, *, open: bool, for_s: float = CLOSED_FOR_S) -> None:
        """Open: the container's launches on `gpu` go. Closed: they wait until it opens
        again, for `for_s` seconds at most, so that launches flow again by themselves
        when the agent stops writing the gate."""
        record = self._gpu(gpu)
        if not open:
            record.gate_until_ns = time.monotonic_ns() + int(for_s * 1e9)
        record.gate = 1 if open else 0

    def set_share(self, gpu: int, percent: int) -> None:
        if not 0 <= percent <= 100:
            raise ValueError(f"a compute share is a percentage, got {percent}")
        self._gpu(gpu).share_percent = percent

    def reap(self) -> list[int]:
        """Gives back the slots (and bytes) of processes that died without detaching; the
        pids they had. A live process holds an OFD lock on its slot's first byte."""
        record = self.record
        # Looked for without the lock first: the agent asks every slice, and the lock is
        # the one the container's allocations take.
        if not any(
            slot.pid != 0 and not self._slot_alive(s) for s, slot in enumerate(record.slots)
        ):
            return []
        reaped = []
        with self._locked():
            for s, slot in enumerate(record.slots):
                if slot.pid != 0 and not self._slot_alive(s):
                    reaped.append(int(slot.pid))
                    for g in range(MAX_GPUS):
                        gpu = record.gpus[g]
                        gpu.used_bytes = max(0, gpu.used_bytes - slot.used[g])
                        slot.used[g] = 0
                    slot.pid = 0
                    record.attached = max(0, record.attached - 1)
        return reaped

    def _gpu(self, gpu: int) -> GpuRecord:
        if not 0 <= gpu < self.record.gpu_count:
            raise IndexError(f"the region has {self.record.gpu_count} GPUs, no GPU {gpu}")
        record: GpuRecord = self.record.gpus[gpu]
        return record

    def _slot_alive(self, slot: int) -> bool:
        start = RegionRecord.slots.offset + slot * ctypes.sizeof(SlotRecord)
        query = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, start, 1, 0)
        answer = fcntl.fcntl(self._descriptor, fcntl.F_OFD_GETLK, query)
        return int(_FLOCK.unpack(answer)[0]) != fcntl.F_UNLCK

    def _locked(self) -> "_RegionLock":
        return _RegionLock(self)

    def _mutex(self) -> int:
        return ctypes.addressof(self.record) + RegionRecord.lock.offset

    def _lock(self) -> None:
        result = self._libc.pthread_mutex_lock(ctypes.c_void_p(self._mutex()))
        if result == _EOWNERDEAD:
            self._recompute_totals()
            self._libc.pthread_mutex_consistent(ctypes.c_void_p(self._mutex()))
        elif result != 0:
            raise RegionError(f"locking {self.path}: {os.strerror(result)}")

    def _unlock(self) -> None:
        self._libc.pthread_mutex_unlock(ctypes.c_void_p(self._mutex()))

    def _recompute_totals(self) -> None:
        """A holder died mid-update: the slots are the truth (as the library does)."""
        record = self.record
        live = [slot for slot in record.slots if slot.pid != 0]
        for g in range(MAX_GPUS):
            record.gpus[g].used_bytes = sum(slot.used[g] for slot in live)
        record.attached = len(live)


class _RegionLock:
    def __init__(self, region: Region) -> None:
        self._region = region

    def __enter__(self) -> None:
        self._region._lock()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._region._unlock()
