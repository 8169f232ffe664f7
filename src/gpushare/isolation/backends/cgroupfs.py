"""Freezing and thawing a container: its cgroup when the kernel lets us, its processes otherwise.

In order of preference: cgroup v2 `cgroup.freeze` (the whole container, new
processes included), the cgroup v1 freezer's `freezer.state`, then SIGSTOP /
SIGCONT to each of its processes. Everything is relative to --cgroup-root, so
the host's cgroup tree can be mounted anywhere (and tests use a tmp dir).
"""

import os
import signal
from collections.abc import Callable, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Final

from gpushare.isolation.backends.procfs import CgroupRef, ProcessTable

_SEARCH_DEPTH: Final = 8


class FreezeMethod(StrEnum):
    CGROUP_V2 = "cgroup.freeze"
    CGROUP_V1 = "freezer.state"
    SIGNAL = "SIGSTOP/SIGCONT"


class Freezer:
    def __init__(
        self,
        cgroup_root: Path,
        processes: ProcessTable,
        send_signal: Callable[[int, int], None] = os.kill,
    ) -> None:
        self.root = cgroup_root
        self._processes = processes
        self._send_signal = send_signal
        self._found: dict[str, Path | None] = {}

    def set_frozen(self, ref: CgroupRef | None, pids: Sequence[int], frozen: bool) -> FreezeMethod:
        """Freeze or thaw one container; `pids` are its known processes, used when it has
        no cgroup of its own to freeze (a process started outside a container)."""
        if ref is not None:
            unified = self._unified_dir(ref)
            if unified is not None and (unified / "cgroup.freeze").exists():
                (unified / "cgroup.freeze").write_text("1" if frozen else "0")
                return FreezeMethod.CGROUP_V2
            if ref.freezer is not None:
                state = self.root / "freezer" / ref.freezer.lstrip("/") / "freezer.state"
                if state.exists():
                    state.write_text("FROZEN" if frozen else "THAWED")
                    return FreezeMethod.CGROUP_V1
            pids = self._pids(ref, unified) or pids
        for pid in pids:
            try:
                self._send_signal(pid, signal.SIGSTOP if frozen else signal.SIGCONT)
            except ProcessLookupError:
                continue
        return FreezeMethod.SIGNAL

    def forget(self, keep: set[str]) -> None:
        """Drop remembered cgroup directories of containers that are gone."""
        self._found = {key: path for key, path in self._found.items() if key in keep}

    def _unified_dir(self, ref: CgroupRef) -> Path | None:
        if ref.unified is not None:
            direct = self.root / ref.unified.lstrip("/")
            if ref.unified.strip("/") and direct.is_dir():
                return direct
        return self._search(ref.container_id)

    def _search(self, container_id: str) -> Path | None:
        """The container's cgroup directory found by its ID. Needed when the agent runs
        in its own cgroup namespace, where /proc/<pid>/cgroup paths are relative to it."""
        if container_id in self._found:
            return self._found[container_id]
        found: Path | None = None
        for directory, subdirs, _ in os.walk(self.root):
            depth = len(Path(directory).relative_to(self.root).parts)
            if depth >= _SEARCH_DEPTH:
                subdirs.clear()
            match = next((d for d in subdirs if container_id in d and "conmon" not in d), None)
            if match is not None:
                found = Path(directory) / match
                break
        self._found[container_id] = found
        return found

    def _pids(self, ref: CgroupRef, unified: Path | None) -> list[int]:
        for directory in (unified, self._v1_dir(ref)):
            if directory is not None and (directory / "cgroup.procs").exists():
                text = (directory / "cgroup.procs").read_text()
                return [int(line) for line in text.split() if line.isdigit()]
        return self._processes.pids_of(ref.container_id)

    def _v1_dir(self, ref: CgroupRef) -> Path | None:
        if ref.freezer is None:
            return None
        return self.root / "freezer" / ref.freezer.lstrip("/")
