"""Reading a file a flag names, refusing with a reason anything that is not a regular
UTF-8 text file: the user sees which file and why, never an OSError or a decode error.

Nothing here blocks: a FIFO (or a socket, a device) is refused from its stat before it is
opened, and the open itself is non-blocking in case the path changes in between."""

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml


class InputFileError(Exception):
    """A file or directory a flag names cannot be used: `what` names it for the user
    (the flag, or the role of the file), `reason` says why."""

    def __init__(self, what: str, path: Path, reason: str) -> None:
        self.what = what
        self.path = path
        self.reason = reason
        super().__init__(f"{what} {path}: {reason}")


def read_text(path: Path | str, what: str = "file") -> str:
    """The text of the regular, non-empty, UTF-8 file at `path`; InputFileError otherwise."""
    path = Path(path)
    _require(path, what, stat.S_ISREG, "a file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as err:
        raise InputFileError(what, path, f"cannot be opened: {err.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):  # swapped since the stat
            raise InputFileError(what, path, "is no longer a regular file")
        try:
            data = handle.read()
        except OSError as err:
            raise InputFileError(what, path, f"cannot be read: {err.strerror}") from None
    if not data.strip():
        raise InputFileError(what, path, "is empty")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputFileError(
            what, path, f"is not UTF-8 text (byte {err.start} is {data[err.start]:#04x}): binary?"
        ) from None


def read_yaml(path: Path | str, what: str = "file") -> list[Any]:
    """The YAML documents of the file at `path`; InputFileError naming the line otherwise."""
    text = read_text(path, what)
    try:
        return list(yaml.safe_load_all(text))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        raise InputFileError(what, Path(path), f"{where}not valid YAML: {problem}") from None


def check_directory(path: Path | str, what: str = "directory") -> Path:
    """`path`, when it is a directory (or a link to one); InputFileError otherwise."""
    path = Path(path)
    _require(path, what, stat.S_ISDIR, "a directory")
    return path


def _require(path: Path, what: str, is_kind: Callable[[int], bool], kind: str) -> None:
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        if path.is_symlink():
            target = os.readlink(path)
            raise InputFileError(
                what, path, f"is a link to {target}, which does not exist"
            ) from None
        raise InputFileError(what, path, "does not exist") from None
    except OSError as err:  # a parent that is a file, a loop of links, no permission
        raise InputFileError(what, path, f"cannot be used: {err.strerror}") from None
    if not is_kind(mode):
        raise InputFileError(what, path, f"is {_kind(mode)}, not {kind}")


def _kind(mode: int) -> str:
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISREG, "a file"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    )
    return next((name for test, name in kinds if test(mode)), "not a regular file")
