"""The control tree on disk: cGPU's procfs (/proc/cgpu_km) as a directory the agent keeps.

What each file holds is the codec's (`gpushare.isolation.treecodec`); this module
writes and reads the files. The agent writes every file atomically (a temp file
renamed over it), so a reader never sees half a value. An operator changes a
setting by writing its file (`echo 2 > <root>/0/policy`); `poll` finds such
writes by content: it reads a file whenever its inode, size or mtime moved, and
while its mtime is too young to tell a write in the same timestamp tick apart.
Each write found is handed to the agent and the file marked stale, so the next
`publish` rewrites it: with the new value if the agent accepted it, the old one
if it refused.
"""

import json
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from gpushare.isolation.treecodec import (
    ControlWrite,
    TreeContent,
    control_write,
    encode,
    is_setting,
)

SAVED_SETTINGS: Final = ".settings.json"
"""Settings the agent accepted, kept beside the tree so they survive an agent restart."""
_MAX_FILE_CHARS: Final = 1 << 20
"""What a reader takes of one file: the tree's are a few lines, a stray big file is cut."""
_YOUNG_NS: Final = 50_000_000
"""Files whose mtime is younger than this are read, not just stat'ed (see _changed)."""


class ControlTree:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._base = str(root)
        self._written: dict[str, str] = {}
        self._stats: dict[str, tuple[int, int, int]] = {}
        self._empty_once: set[str] = set()
        self._dirs: set[str] | None = None
        self._settings: set[str] = set()

    def publish(self, content: TreeContent) -> None:
        files = encode(content)
        self._sync_dirs(content)
        for path, text in files.items():
            if self._written.get(path) != text:
                self._write(path, text)
        if len(self._written) != len(files):
            self._written = {path: text for path, text in self._written.items() if path in files}
            self._stats = {path: stat for path, stat in self._stats.items() if path in files}
            self._settings &= self._written.keys()

    def poll(self, read_only_too: bool = True) -> list[ControlWrite]:
        """Files changed since the agent wrote them: the settings always, the read-only
        files only when asked (the agent checks them about once a second). A setting
        found empty gets one poll to fill, since `echo 2 > file` truncates first."""
        found = []
        paths = (
            list(self._written)
            if read_only_too
            else [p for p in self._settings if p in self._written]
        )
        for path in paths:
            ours = self._written[path]
            text = self._changed(path, ours)
            if text is None:
                continue
            if text == "" and path not in self._empty_once:
                self._empty_once.add(path)
                continue
            self._empty_once.discard(path)
            del self._written[path]
            found.append(control_write(path, text))
        return found

    def _changed(self, path: str, ours: str) -> str | None:
        """The file's text when it differs from ours, else None. A file is only read when
        its inode, size or mtime moved, or while its mtime is young: file timestamps are
        coarse (a few ms), so a same-size write right after ours can keep the same mtime."""
        full = os.path.join(self._base, path)
        try:
            signature = _signature(os.stat(full))
            if signature == self._stats.get(path) and time.time_ns() - signature[2] > _YOUNG_NS:
                return None
            with open(full, errors="replace") as file:
                text = file.read()
        except FileNotFoundError:
            del self._written[path]
            return None
        if text == ours:
            self._empty_once.discard(path)
            self._stats[path] = signature
            return None
        return text

    def load_settings(self) -> dict[str, str]:
        """Settings an earlier run of the agent accepted (tree path to value); empty when
        there are none or they cannot be read."""
        try:
            data = json.loads((self.root / SAVED_SETTINGS).read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict):
            return {}
        return {str(path): str(value) for path, value in data.items()}

    def save_settings(self, settings: Mapping[str, str]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        _replace(os.path.join(self._base, SAVED_SETTINGS), json.dumps(dict(settings), indent=1))

    def _write(self, path: str, text: str) -> None:
        target = os.path.join(self._base, path)
        _replace(target, text)
        self._written[path] = text
        self._stats[path] = _signature(os.stat(target))
        if is_setting(path):
            self._settings.add(path)

    def _sync_dirs(self, content: TreeContent) -> None:
        """Create the directories of new GPUs and containers, remove those of gone ones."""
        wanted = {str(g.index) for g in content.gpus} | {
            f"{g.index}/{c.id}" for g in content.gpus for c in g.containers
        }
        if wanted == self._dirs and self.root.is_dir():
            return
        self.root.mkdir(parents=True, exist_ok=True)
        for gpu_dir in _subdirs(self.root):
            if gpu_dir.name not in wanted:
                shutil.rmtree(gpu_dir, ignore_errors=True)
                continue
            for container_dir in _subdirs(gpu_dir):
                if f"{gpu_dir.name}/{container_dir.name}" not in wanted:
                    shutil.rmtree(container_dir, ignore_errors=True)
        for directory in sorted(wanted):
            os.makedirs(os.path.join(self._base, directory), exist_ok=True)
        self._dirs = wanted
        # Files of removed directories are gone: forget them, so they are rewritten if back.
        self._written = {p: t for p, t in self._written.items() if _parent(p) in wanted | {""}}


def read_files(root: Path) -> dict[str, str]:
    """Every file of a tree on disk (relative path to text), for readers such as cgpu-smi:
    the top level, the GPU directories and their container directories. Hidden files (the
    saved settings, temp files) are left out, and so are files that go while read."""
    files: dict[str, str] = {}
    pending = [("", str(root))]
    while pending:
        prefix, directory = pending.pop()
        try:
            entries = list(os.scandir(directory))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            if entry.name.startswith("."):
                continue
            path = f"{prefix}{entry.name}"
            if entry.is_dir():
                # A GPU's directory (named by its index) or a container's in it, no deeper:
                # pointed at another directory (/tmp), the reader stays out of its trees.
                if (prefix or entry.name.isdigit()) and path.count("/") < 2:
                    pending.append((f"{path}/", entry.path))
                continue
            if not entry.is_file():
                continue  # a FIFO or a socket is no file of the tree, and would block or fail
            try:
                # Non-blocking: a FIFO put in the file's place since the scan would hang us.
                fd = os.open(entry.path, os.O_RDONLY | os.O_NONBLOCK)
                with open(fd, errors="replace") as file:
                    files[path] = file.read(_MAX_FILE_CHARS)
            except (FileNotFoundError, IsADirectoryError):
                continue
    return files


def _replace(target: str, text: str) -> None:
    """Write a file atomically: readers see the old content or the new, never a part."""
    directory, name = os.path.split(target)
    if not os.path.isdir(directory):  # someone removed it under us
        os.makedirs(directory, exist_ok=True)
    temp = os.path.join(directory, f".{name}.tmp")
    with open(temp, "w") as file:
        file.write(text)
    os.replace(temp, target)


def _parent(path: str) -> str:
    return path.rpartition("/")[0]


def _subdirs(directory: Path) -> list[Path]:
    try:
        return [entry for entry in directory.iterdir() if entry.is_dir()]
    except FileNotFoundError:
        return []


def _signature(stat: os.stat_result) -> tuple[int, int, int]:
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns)
