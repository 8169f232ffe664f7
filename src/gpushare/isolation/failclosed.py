"""What the CUDA interposer's processes that fail closed leave in their container's
accounting directory, read back for the metrics.

A process that cannot trust its configuration (a bad grant or cap value, an unusable or
foreign region, no free slot) refuses every allocation and keeps `refusing-<pid>` beside
the region: the count it refused so far (20 digits) and why (interposer/refusals.c). The
directory is the container's to write, so each file is untrusted input: at most
MAX_FILES of them are read (among the first MAX_ENTRIES names listed), each opened
without following a link or waiting on a FIFO, a regular file only, MAX_BYTES read and
parsed strictly; anything else is skipped. A file's count moves its container's total
only forward (the most seen of it; a file gone keeps what it counted), so deleting or
rewriting files cannot take the total back: a tenant can only push its own count on.
"""

import itertools
import logging
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

log = logging.getLogger(__name__)

PREFIX: Final = "refusing-"
MAX_FILES: Final = 64
MAX_ENTRIES: Final = 1024
"""Directory entries looked at per pass: a directory filled with other files costs no more."""
MAX_BYTES: Final = 512
MAX_COUNT: Final = 2**64 - 1
"""The library counts in 64 bits: a larger count is forged."""

_NAME: Final = re.compile(r"refusing-[1-9][0-9]{0,9}")
_LAYOUT: Final = re.compile(rb"([0-9]{20})\n[^\n]{0,200}\n")
_OPEN_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class FailedClosed:
    """One container's processes that fail closed, as its accounting directory says."""

    allocations: int = 0
    """Allocations they refused, summed over their files (only ever grows)."""
    processes: int = 0
    """Their files read this pass (a file stays after its process exits)."""


@dataclass(slots=True)
class _Files:
    most: dict[str, int] = field(default_factory=dict)
    """Per file present at the latest pass, the most it counted."""
    gone: int = 0
    """What the files no longer there counted."""
    present: int = 0


class FailedClosedBook:
    """Per container, what its `refusing-*` files counted."""

    def __init__(self) -> None:
        self._files: dict[str, _Files] = {}

    def read(self, key: str, directory: Path) -> None:
        """Reads the container's files in `directory` now; never raises."""
        counts = read_counts(directory)
        files = self._files.setdefault(key, _Files())
        for name in set(files.most) - set(counts):
            files.gone += files.most.pop(name)
        for name, count in counts.items():
            files.most[name] = max(count, files.most.get(name, 0))
        files.present = len(counts)

    def of(self, key: str) -> FailedClosed:
        files = self._files.get(key)
        if files is None:
            return FailedClosed()
        return FailedClosed(files.gone + sum(files.most.values()), files.present)

    def forget(self, key: str) -> None:
        """A container gone for good: should its ID come back, it starts afresh."""
        self._files.pop(key, None)


def read_counts(directory: Path) -> dict[str, int]:
    """The count of each well-formed `refusing-<pid>` file in `directory`; {} when the
    directory cannot be read."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        with os.scandir(fd) as entries:
            names = [e.name for e in itertools.islice(entries, MAX_ENTRIES)]
        counts = {}
        for name in itertools.islice(filter(_NAME.fullmatch, names), MAX_FILES):
            count = _read_count(fd, name)
            if count is not None:
                counts[name] = count
        return counts
    except OSError as err:
        log.debug("reading %s: %s", directory, err)
        return {}
    finally:
        os.close(fd)


def _read_count(directory_fd: int, name: str) -> int | None:
    """The count `name` says, or None: not a regular file, unreadable, or not the layout."""
    try:
        fd = os.open(name, _OPEN_FLAGS, dir_fd=directory_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, MAX_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
    match = _LAYOUT.fullmatch(data)
    if match is None:
        return None
    count = int(match[1])
    return count if count <= MAX_COUNT else None
