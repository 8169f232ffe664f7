"""Compiles libgpushare-cuda.so from the C sources beside this module.

    library = build_library(Path("/opt/gpushare"))   # -> /opt/gpushare/libgpushare-cuda.so

The system C compiler (cc, gcc or clang) builds it, else the ziglang wheel's; the build
is skipped when the library there was built from the same sources (a SHA-256 stamp).
"""

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Final

SOURCE_DIRECTORY: Final = Path(__file__).parent
LIBRARY_NAME: Final = "libgpushare-cuda.so"
SOURCES: Final = (
    "init.c",
    "region.c",
    "memory.c",
    "launch.c",
    "symbols.c",
    "nvml.c",
    "dlsym_entry.S",
)
HEADERS: Final = ("cuda_abi.h", "hooks.h", "hooks.def", "region.h")
FLAGS: Final = (
    "-O2",
    "-fPIC",
    "-shared",
    "-fvisibility=hidden",  # exports are only the EXPORT-marked hooks and the dlsym entry
    "-Wall",
    "-Wextra",
    "-Werror",
)
LIBRARIES: Final = ("-ldl", "-lpthread")


class CompilerMissing(RuntimeError):
    """No C compiler to build the library with; the message says what to install."""


class BuildFailed(RuntimeError):
    """The compiler refused the sources; the message carries its output."""


def compiler() -> list[str]:
    """The C compiler command: cc, gcc or clang, else the ziglang wheel's if installed."""
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return [found]
    if importlib.util.find_spec("ziglang") is not None:
        return [sys.executable, "-m", "ziglang", "cc"]
    raise CompilerMissing(
        "no C compiler to build libgpushare-cuda.so: install gcc (apt-get install gcc) "
        "or clang, or pip install ziglang"
    )


def source_digest() -> str:
    """SHA-256 over every source and header, in a fixed order."""
    digest = hashlib.sha256()
    for name in (*SOURCES, *HEADERS):
        digest.update(name.encode())
        digest.update((SOURCE_DIRECTORY / name).read_bytes())
    return digest.hexdigest()


def build_library(directory: Path) -> Path:
    """Builds the library into `directory` (unless it is there from the same sources)
    and returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    library = directory / LIBRARY_NAME
    stamp = directory / f"{LIBRARY_NAME}.source-sha256"
    digest = source_digest()
    if library.exists() and stamp.exists() and stamp.read_text() == digest:
        return library
    partial = directory / f".{LIBRARY_NAME}.{os.getpid()}"
    command = [
        *compiler(),
        *FLAGS,
        "-o",
        str(partial),
        *(str(SOURCE_DIRECTORY / name) for name in SOURCES),
        *LIBRARIES,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise BuildFailed(f"building {LIBRARY_NAME} failed:\n{result.stderr}")
    partial.replace(library)
    stamp.write_text(digest)
    return library


def main() -> None:
    """python -m gpushare.isolation.interposer.build DIRECTORY"""
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(
            "usage: python -m gpushare.isolation.interposer.build DIRECTORY\n"
            "Compiles libgpushare-cuda.so into DIRECTORY and prints its path."
        )
        raise SystemExit(0 if len(sys.argv) == 2 else 2)
    print(build_library(Path(sys.argv[1])))


if __name__ == "__main__":
    main()
