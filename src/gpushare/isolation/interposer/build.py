"""Compiles libgpushare-cuda.so from the C sources beside this module.

    library = build_library(Path("/opt/gpushare"))   # -> /opt/gpushare/libgpushare-cuda.so

The system C compiler (cc, gcc or clang) builds it, else the ziglang wheel's; the build
is skipped when the library there was built from the same sources (a SHA-256 stamp).

Tests build a second variant that reads its grant from a path of theirs
(`build_library(directory, grant_path=...)`); it gets a file name of its own, so the two
never overwrite each other. The production library reads gpushare.environment's
GRANT_IN_CONTAINER, and the environment variables named there: `defines()` hands them to
the compiler, so every build (this one, the tests' sanitizer build, clang-tidy) uses it.
"""

import ast
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
    "config.c",
    "resolve.c",
    "log.c",
    "refusals.c",
    "devices.c",
    "grant.c",
    "region.c",
    "held.c",
    "memory.c",
    "vmm.c",
    "pools.c",
    "limits.c",
    "view.c",
    "launch.c",
    "symbols.c",
    "nvml.c",
    "dlsym_entry.S",
)
HEADERS: Final = ("cuda_abi.h", "grant.h", "hooks.h", "hooks.def", "memory.h", "region.h")
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


ENVIRONMENT_SOURCE: Final = SOURCE_DIRECTORY.parents[1] / "environment.py"
ENVIRONMENT_DEFINES: Final = {
    "GS_ENV_MEM_CONTAINER": "MEM_CONTAINER",
    "GS_ENV_VISIBLE_DEVICES": "NVIDIA_VISIBLE_DEVICES",
    "GS_ENV_REGION": "CUDA_REGION",
    "GS_ENV_LOG": "CUDA_LOG",
    "GS_GRANT_PATH": "GRANT_IN_CONTAINER",
}
"""The C macro for each name gpushare.environment defines (the variables the library reads
and where its grant is): the C spells none of them itself."""


def environment_names() -> dict[str, str]:
    """gpushare.environment's string constants, read from its source rather than imported:
    setup.py builds the library before the package's dependencies are installed."""
    tree = ast.parse(ENVIRONMENT_SOURCE.read_text())
    names = {}
    for statement in tree.body:
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            value = statement.value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                names[statement.target.id] = value.value
    return names


def defines(grant_path: str | None = None) -> list[str]:
    """The -D flags every compilation of the sources needs: the environment's names, and
    the grant's path (`grant_path`, for a test variant, else the container's)."""
    names = environment_names()
    values = {macro: names[constant] for macro, constant in ENVIRONMENT_DEFINES.items()}
    if grant_path is not None:
        if not grant_path.startswith("/"):
            raise ValueError(f"grant path {grant_path!r} is not an absolute path")
        values["GS_GRANT_PATH"] = grant_path
    return [f"-D{macro}={_c_string(value)}" for macro, value in values.items()]


def _c_string(text: str) -> str:
    """`text` as a C string literal; it must need no escaping."""
    if not text.isprintable() or any(c in text for c in '"\\'):
        raise ValueError(f"{text!r} is not plain text a C string can carry as it is")
    return f'"{text}"'


def source_digest(grant_path: str | None = None) -> str:
    """SHA-256 over every source and header, in a fixed order, and the defines the variant
    is built with."""
    digest = hashlib.sha256()
    for name in (*SOURCES, *HEADERS):
        digest.update(name.encode())
        digest.update((SOURCE_DIRECTORY / name).read_bytes())
    for define in defines(grant_path):
        digest.update(define.encode() + b"\0")
    return digest.hexdigest()


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
        *defines(grant_path),
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
