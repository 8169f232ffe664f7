"""Compiles libgpushare-cuda.so from the C sources beside this module.

    library = build_library(Path("/opt/gpushare"))   # -> /opt/gpushare/libgpushare-cuda.so

The system C compiler (cc, gcc or clang) builds it, else the ziglang wheel's; the build
is skipped when the library there was built from the same sources (a SHA-256 stamp).

Tests build a second variant that reads its grant from a path of theirs
(`build_library(directory, grant_path=...)`); it gets a file name of its own, so the two
never overwrite each other. The production library reads /etc/gpushare/grant.
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
    "grant.c",
    "region.c",
    "memory.c",
    "launch.c",
    "symbols.c",
    "nvml.c",
    "dlsym_entry.S",
)
HEADERS: Final = ("cuda_abi.h", "grant.h", "hooks.h", "hooks.def", "region.h")
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


def source_digest(grant_path: str | None = None) -> str:
    """SHA-256 over every source and header, in a fixed order, and the grant path the
    variant is built with."""
    digest = hashlib.sha256()
    for name in (*SOURCES, *HEADERS):
        digest.update(name.encode())
        digest.update((SOURCE_DIRECTORY / name).read_bytes())
    if grant_path is not None:
        digest.update(b"GS_GRANT_PATH=" + grant_path.encode())
    return digest.hexdigest()


def grant_define(grant_path: str) -> str:
    """The -D flag that makes the library read its grant at `grant_path` (an absolute
    path, quoted as a C string, so nothing in it may need escaping)."""
    plain = grant_path.isprintable() and not any(c in grant_path for c in '"\\')
    if not grant_path.startswith("/") or not plain:
        raise ValueError(f"grant path {grant_path!r} is not a plain absolute path")
    return f'-DGS_GRANT_PATH="{grant_path}"'


def library_name(grant_path: str | None = None) -> str:
    """libgpushare-cuda.so, or for a test variant a name that says which grant it reads."""
    if grant_path is None:
        return LIBRARY_NAME
    tag = hashlib.sha256(grant_path.encode()).hexdigest()[:12]
    return f"libgpushare-cuda.grant-{tag}.so"


def build_library(directory: Path, *, grant_path: str | None = None) -> Path:
    """Builds the library into `directory` (unless it is there from the same sources)
    and returns its path. `grant_path`: tests only, where the variant reads its grant."""
    directory.mkdir(parents=True, exist_ok=True)
    name = library_name(grant_path)
    library = directory / name
    stamp = directory / f"{name}.source-sha256"
    digest = source_digest(grant_path)
    if library.exists() and stamp.exists() and stamp.read_text() == digest:
        return library
    partial = directory / f".{name}.{os.getpid()}"
    command = [
        *compiler(),
        *FLAGS,
        *([grant_define(grant_path)] if grant_path is not None else []),
        "-o",
        str(partial),
        *(str(SOURCE_DIRECTORY / name) for name in SOURCES),
        *LIBRARIES,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise BuildFailed(f"building {name} failed:\n{result.stderr}")
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
