"""NVML for the node components: pynvml with its libnvidia-ml.so.1 found (`bindings`),
and the GPU discovery both components share (`discovery.py`).

Usually the dynamic loader finds libnvidia-ml.so.1 by its name: the NVIDIA container toolkit mounts
the driver's copy into the container (the chart sets NVIDIA_VISIBLE_DEVICES=all and
NVIDIA_DRIVER_CAPABILITIES=utility), the driver is installed on the host itself, or
LD_LIBRARY_PATH names a directory holding it (the tests' fake).

Where the driver lives under a root of its own and no toolkit serves the pod (the
chart's gpu.driverRoot, e.g. the GPU operator's /run/nvidia/driver, mounted at
/driver-root), GPUSHARE_DRIVER_ROOT names that root as the container sees it, and
`load_from_driver_root` loads the library by its path before nvmlInit. Not through
LD_LIBRARY_PATH: the driver root's library directories also hold its own C library,
which the dynamic loader would then take for the image's and Python would not start.

pynvml is imported here only, by `bindings` when an nvml backend is built: the backends
take it injected, so tests hand them stand-ins and `--backend mock` never loads it.
"""

import ctypes
import importlib
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

log = logging.getLogger(__name__)

DRIVER_ROOT_ENV: Final = "GPUSHARE_DRIVER_ROOT"
LIBRARY: Final = "libnvidia-ml.so.1"
LIBRARY_DIRS: Final = (
    "usr/lib/x86_64-linux-gnu",
    "usr/lib64",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib",
)
"""Where a driver root holds its libraries (Debian/Ubuntu, RHEL, Arm64, others), in
the order they are looked at."""


def library_in(root: Path) -> Path | None:
    """The first libnvidia-ml.so.1 under one of the driver root's library directories."""
    for directory in LIBRARY_DIRS:
        candidate = root / directory / LIBRARY
        if candidate.exists():
            return candidate
    return None


def bindings(environ: Mapping[str, str] | None = None) -> Any:
    """pynvml, to hand to an nvml backend: its library loaded from GPUSHARE_DRIVER_ROOT
    where that is set (see `load_from_driver_root`), else found by name at nvmlInit."""
    pynvml = importlib.import_module("pynvml")
    load_from_driver_root(environ, pynvml)
    return pynvml


def load_from_driver_root(
    environ: Mapping[str, str] | None = None, nvml: Any = None
) -> Path | None:
    """With GPUSHARE_DRIVER_ROOT set, loads libnvidia-ml.so.1 from that root as
    pynvml's library and returns its path; None (and nothing done) without it, or
    when pynvml has loaded a library already. Raises RuntimeError saying what to fix
    when the root holds no loadable library."""
    root = (os.environ if environ is None else environ).get(DRIVER_ROOT_ENV, "")
    if not root:
        return None
    library = library_in(Path(root))
    if library is None:
        looked = ", ".join(str(Path(root) / d) for d in LIBRARY_DIRS)
        raise RuntimeError(
            f"{DRIVER_ROOT_ENV}={root} holds no {LIBRARY} (looked in {looked}): is the "
            f"driver's root filesystem mounted there (chart value gpu.driverRoot), and is "
            f"the driver installed yet?"
        )
    pynvml: Any = nvml if nvml is not None else importlib.import_module("pynvml")
    with pynvml.libLoadLock:
        if pynvml.nvmlLib is not None:
            return None
        try:
            # pynvml dlopens libnvidia-ml.so.1 by name only while nvmlLib is None.
            pynvml.nvmlLib = ctypes.CDLL(str(library))
        except OSError as err:
            raise RuntimeError(f"cannot load {library} ({err})") from None
    log.info("NVML library: %s (%s=%s)", library, DRIVER_ROOT_ENV, root)
    return library
