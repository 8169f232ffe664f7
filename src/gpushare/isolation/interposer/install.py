"""Putting the interposer where Allocate mounts it from: the node's interposer directory.

The agent does this at start, since the library is the isolation component's: it copies
libgpushare-cuda.so there (the wheel's build, or one compiled from the sources beside
this module in a checkout) and writes an ld.so.preload naming the library's path inside
containers. The device plugin adds the mounts once both files are there.

The copy replaces the file by renaming a new one over it: a container started earlier
keeps the library it mapped, and none ever sees half a file.
"""

import logging
import os
import tempfile
from pathlib import Path
from typing import Final

from gpushare.environment import INTERPOSER_IN_CONTAINER
from gpushare.isolation.interposer.build import LIBRARY_NAME, build_library

log = logging.getLogger(__name__)

PRELOAD_NAME: Final = "ld.so.preload"
PACKAGED: Final = Path(__file__).with_name(LIBRARY_NAME)
"""Where the wheel's build puts the library (setup.py)."""


def library() -> Path:
    """The library to install: the wheel's, else one built from the sources here (a
    checkout, the tests); raises CompilerMissing or BuildFailed when it cannot be built."""
    if PACKAGED.is_file():
        return PACKAGED
    return build_library(Path(tempfile.gettempdir()) / "gpushare-interposer")


def install(directory: Path, source: Path | None = None) -> Path:
    """Puts the library and the preload file naming it into `directory`; the installed
    library's path."""
    directory.mkdir(parents=True, exist_ok=True)
    _replace(directory / LIBRARY_NAME, (source or library()).read_bytes(), 0o755)
    _replace(directory / PRELOAD_NAME, f"{INTERPOSER_IN_CONTAINER}\n".encode(), 0o644)
    log.info("CUDA interposer installed in %s", directory)
    return directory / LIBRARY_NAME


def _replace(path: Path, content: bytes, mode: int) -> None:
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(content)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
