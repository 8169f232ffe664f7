"""The build step pyproject.toml cannot say: the wheel carries the CUDA interposer,
libgpushare-cuda.so, compiled from its C sources (src/gpushare/isolation/interposer/)
with the system C compiler (or the ziglang wheel's). Everything else is in pyproject.toml.

The library is a Linux shared object the dynamic loader preloads into containers, not a
Python extension, so the wheel is tagged for the platform it was built on.
"""

import importlib.util
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

INTERPOSER = Path("gpushare") / "isolation" / "interposer"


def _build_module():  # type: ignore[no-untyped-def]
    """build.py by its path: stdlib only, importable before the package is installed."""
    path = Path(__file__).parent / "src" / INTERPOSER / "build.py"
    spec = importlib.util.spec_from_file_location("gpushare_interposer_build", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildWithInterposer(build_py):  # type: ignore[misc]
    def run(self) -> None:
        super().run()
        if not self.dry_run:
            _build_module().build_library(Path(self.build_lib) / INTERPOSER)


class WithMachineCode(Distribution):  # type: ignore[misc]
    """Built like a distribution with extensions: into the platform's library tree."""

    def has_ext_modules(self) -> bool:
        return True


class PlatformWheel(bdist_wheel):  # type: ignore[misc]
    def get_tag(self) -> tuple[str, str, str]:
        # Any CPython 3 runs it; the machine code is the platform's.
        _, _, platform = super().get_tag()
        return "py3", "none", platform


setup(
    distclass=WithMachineCode,
    cmdclass={"build_py": BuildWithInterposer, "bdist_wheel": PlatformWheel},
)
