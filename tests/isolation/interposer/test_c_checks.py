"""The interposer's C held to two checkers a reviewer cannot replace by reading: the
library built with AddressSanitizer and UndefinedBehaviorSanitizer runs the probe's
paths (allocations of every kind, frees, launches, the capped views, fork, a refused
allocation) without a report, and clang-tidy's analyser and bug-prone checks find
nothing in its sources.

The sanitizers come with the system's gcc (Debian's libasan/libubsan); clang-tidy from
its wheel in the dev dependencies (pyproject.toml), so `./scripts/test` needs nothing
installed by hand."""

import dataclasses
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Final

import pytest

from gpushare.isolation.interposer import build as interposer
from tests.fakecuda import MIB, Container, fake_cuda_or_skip

SANITIZE: Final = (
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=all",  # the first report ends the process: a test cannot miss it
    "-fno-omit-frame-pointer",
    "-g",
)
REPORTS: Final = ("ERROR: AddressSanitizer", "runtime error:", "ERROR: LeakSanitizer")
TIDY_CHECKS: Final = ",".join(
    [
        "-*",
        "clang-analyzer-*",
        "bugprone-*",
        # The hooks are the driver's own prototypes: their parameters are as NVIDIA ordered them.
        "-bugprone-easily-swappable-parameters",
        # hooks.def's X-macros paste parameter lists, which cannot be parenthesised.
        "-bugprone-macro-parentheses",
        # Narrowing the driver's sizes is checked where it happens (caps are at most 2^50).
        "-bugprone-narrowing-conversions",
        # memcpy of fixed-size fields whose lengths are checked just before.
        "-clang-analyzer-security.insecureAPI.DeprecatedOrUnsafeBufferHandling",
        # _GNU_SOURCE is how glibc is asked for F_OFD_* and RTLD_NEXT.
        "-bugprone-reserved-identifier",
        # open(2) and mmap(2) flags are signed ints by POSIX: every flag mask would count.
        "-bugprone-signed-bitwise",
        # `if ((x = f()) != NULL)` is the idiom of the hot paths; style, not a bug.
        "-bugprone-assignment-in-if-condition",
        "-bugprone-assignment-in-selection-statement",
    ]
)


def _runtime(name: str) -> str | None:
    """The path of a sanitizer runtime gcc links against, or None without one."""
    for compiler in ("gcc", "cc"):
        found = shutil.which(compiler)
        if found is None:
            continue
        path = subprocess.run(
            [found, f"-print-file-name={name}"], capture_output=True, text=True, check=False
        ).stdout.strip()
        if path and Path(path).is_file():
            return str(Path(path).resolve())
    return None


UNSANITIZED: Final = ("symbols.c", "dlsym_entry.S")
"""The dlsym entry and hook run inside the sanitizer runtime's own start (it resolves the
functions it intercepts with dlsym), before its shadow memory exists: instrumented, they
would fault there. They are built without it; everything else with it."""


@cache
def sanitized_library(directory: Path) -> Path:
    """libgpushare-cuda.so from build.SOURCES with build.FLAGS, build.defines() and the
    sanitizers."""
    out = directory / "sanitized"
    out.mkdir(parents=True, exist_ok=True)
    objects = []
    for name in interposer.SOURCES:
        target = out / f"{name}.o"
        flags = [f for f in interposer.FLAGS if f != "-shared"] + interposer.defines()
        if name not in UNSANITIZED:
            flags += SANITIZE
        _run([*interposer.compiler(), *flags, "-c", "-o", str(target),
              str(interposer.SOURCE_DIRECTORY / name)])  # fmt: skip
        objects.append(str(target))
    library = out / interposer.LIBRARY_NAME
    _run([*interposer.compiler(), "-shared", *SANITIZE, "-o", str(library), *objects,
          *interposer.LIBRARIES])  # fmt: skip
    return library


def _run(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, f"{' '.join(command)}\n{result.stderr}"


@pytest.fixture
def sanitized(tmp_path: Path) -> Container:
    built = fake_cuda_or_skip()
    asan = _runtime("libasan.so")
    if asan is None:
        pytest.skip("gcc has no AddressSanitizer runtime here (Debian: apt-get install gcc)")
    library = sanitized_library(built.directory)
    # The sanitizer runtime must come first among the preloads (the probe is not built with it).
    preload = f"{asan} {library}"
    env = {
        "LD_PRELOAD": preload,
        "ASAN_OPTIONS": "verify_asan_link_order=0:detect_leaks=0:abort_on_error=0",
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
    }
    return Container(dataclasses.replace(built, interposer=library), tmp_path / "region", extra=env)


def _clean(result: subprocess.CompletedProcess[str]) -> None:
    found = [r for r in REPORTS if r in result.stderr]
    assert result.returncode == 0 and not found, result.stderr[-4000:]


@pytest.mark.parametrize(
    "commands",
    [
        ["init", "0", "alloc", "mem", str(256 * MIB), "alloc", "pitch", str(MIB), "free", "0",
         "free", "1", "info", "info_v1", "info_null"],
        ["init", "0", "alloc", "managed", str(MIB), "alloc", "async", str(MIB), "free", "1",
         "alloc", "create", str(2 * MIB), "free", "2", "alloc", "array3d", str(MIB), "free", "0"],
        ["init", "0", "alloc", "array", str(MIB), "free", "0", "alloc", "mem", str(2048 * MIB),
         "alloc", "mem", str(1024 * MIB)],  # the second is refused at the 1 GiB cap
        ["init", "0", "launch", "cuLaunchKernel", "10", "launch", "cuLaunchKernelEx", "10",
         "free", "7"],
        ["init", "0", "limit", "heap", str(64 * MIB), "limit", "stack", str(1 << 20),
         "limit", "stack", str(1 << 62), "limit", "printf", str(MIB), "limit", "heap", "0"],
    ],
    ids=["allocations-and-views", "managed-async-vmm", "refused", "launches-nvml", "limits"],
)  # fmt: skip
def test_the_probe_paths_run_clean_under_the_sanitizers(sanitized: Container, commands):
    _clean(sanitized.run_probe("dlsym", *commands))


def test_getprocaddress_and_link_paths_run_clean_too(sanitized: Container):
    _clean(sanitized.run_probe("getproc", "init", "0", "alloc", "mem", str(MIB), "free", "0"))
    _clean(sanitized.run_probe("link", "init", "0", "alloc", "mem", str(MIB), "free", "0"))


def test_a_process_that_fails_closed_runs_clean_and_counts_in_its_file(sanitized: Container):
    sanitized.caps = "abc"
    _clean(sanitized.run_probe("link", "init", "0", "alloc", "mem", str(MIB), "alloc", "mem", "1"))
    assert sanitized.region is not None
    [counted] = sanitized.region.parent.glob("refusing-*")
    assert counted.read_text().startswith(f"{2:020d}\n")


def test_a_sanitizer_report_would_fail_these_tests(sanitized: Container, tmp_path: Path):
    """The check itself: a library with a heap overflow, preloaded the same way, is caught."""
    source = tmp_path / "overflow.c"
    source.write_text(
        "#include <stdlib.h>\n#include <string.h>\n"
        "__attribute__((constructor)) static void boom(void) {\n"
        "    char *p = malloc(8); memset(p, 0, 9); free(p); }\n"
    )
    broken = tmp_path / "liboverflow.so"
    result = subprocess.run(
        [*interposer.compiler(), "-shared", "-fPIC", *SANITIZE, "-o", str(broken), str(source)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    env = dict(sanitized.extra)
    env["LD_PRELOAD"] = f"{env['LD_PRELOAD']} {broken}"
    run = dataclasses.replace(sanitized, extra=env).run_probe("dlsym", "init", "0")
    with pytest.raises(AssertionError, match="AddressSanitizer"):
        _clean(run)


def _clang_tidy() -> str:
    found = shutil.which("clang-tidy") or shutil.which(
        "clang-tidy", path=str(Path(sys.executable).parent)
    )
    if found is None:
        pytest.skip("clang-tidy is not installed (pip install -e '.[dev]' brings its wheel)")
    return found


@pytest.mark.parametrize(
    "source", [s for s in interposer.SOURCES if s.endswith(".c")], ids=lambda s: s
)
def test_clang_tidy_finds_nothing_in_the_interposer(source: str):
    command = [
        _clang_tidy(),
        f"--checks={TIDY_CHECKS}",
        "--warnings-as-errors=*",
        "--quiet",
        str(interposer.SOURCE_DIRECTORY / source),
        "--",
        "-D_GNU_SOURCE",
        *interposer.defines(),
        f"-I{interposer.SOURCE_DIRECTORY}",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


def test_clang_tidy_would_fail_on_a_finding(tmp_path: Path):
    """The check itself: the same command on a source with a use after free fails."""
    source = tmp_path / "bad.c"
    source.write_text(
        "#include <stdlib.h>\nint f(void) { int *p = malloc(4); free(p); return *p; }\n"
    )
    result = subprocess.run(
        [_clang_tidy(), f"--checks={TIDY_CHECKS}", "--warnings-as-errors=*", "--quiet",
         str(source), "--"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode != 0 and "after it is released" in result.stdout
