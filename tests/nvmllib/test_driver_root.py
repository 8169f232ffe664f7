"""gpu.driverRoot: libnvidia-ml.so.1 loaded from the driver's root filesystem by its path
(GPUSHARE_DRIVER_ROOT), never through LD_LIBRARY_PATH, which would hand the dynamic
loader the driver root's own C library too."""

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpushare.nvmllib import (
    DRIVER_ROOT_ENV,
    LIBRARY,
    LIBRARY_DIRS,
    library_in,
    load_from_driver_root,
)
from tests.fakenvml import FakeGpu, World, compiler, fake_nvml_or_skip, write_world

CHECK = (
    "from gpushare.nvmllib import load_from_driver_root; load_from_driver_root(); "
    "import pynvml; pynvml.nvmlInit(); print(pynvml.nvmlDeviceGetCount())"
)
"""The check docs/install.md gives for every setup, gpu.driverRoot included."""


def stub_pynvml(loaded: object = None) -> SimpleNamespace:
    return SimpleNamespace(nvmlLib=loaded, libLoadLock=threading.Lock())


def driver_root(tmp_path: Path, library_dir: str = "usr/lib64") -> Path:
    """A driver root as the GPU operator's: the fake NVML in one library directory."""
    root = tmp_path / "driver"
    (root / library_dir).mkdir(parents=True)
    shutil.copy(fake_nvml_or_skip(), root / library_dir / LIBRARY)
    return root


def python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", DRIVER_ROOT_ENV)}
    return {**env, **extra}


@pytest.mark.parametrize("directory", LIBRARY_DIRS)
def test_each_library_directory_of_a_driver_root_is_looked_at(tmp_path, directory):
    (tmp_path / directory).mkdir(parents=True)
    (tmp_path / directory / LIBRARY).touch()
    assert library_in(tmp_path) == tmp_path / directory / LIBRARY


def test_without_the_variable_nothing_is_loaded():
    nvml = stub_pynvml()
    assert load_from_driver_root({}, nvml) is None
    assert nvml.nvmlLib is None


def test_a_root_without_the_library_is_refused_saying_where_it_looked(tmp_path):
    with pytest.raises(RuntimeError) as refused:
        load_from_driver_root({DRIVER_ROOT_ENV: str(tmp_path)}, stub_pynvml())
    message = str(refused.value)
    assert f"{DRIVER_ROOT_ENV}={tmp_path} holds no {LIBRARY}" in message
    assert all(str(tmp_path / d) in message for d in LIBRARY_DIRS)
    assert "gpu.driverRoot" in message


def test_a_library_loaded_already_is_kept(tmp_path):
    loaded = object()
    nvml = stub_pynvml(loaded)
    assert load_from_driver_root({DRIVER_ROOT_ENV: str(driver_root(tmp_path))}, nvml) is None
    assert nvml.nvmlLib is loaded


def test_the_library_becomes_pynvmls(tmp_path):
    root = driver_root(tmp_path)
    nvml = stub_pynvml()
    library = load_from_driver_root({DRIVER_ROOT_ENV: str(root)}, nvml)
    assert library == root / "usr/lib64" / LIBRARY
    assert nvml.nvmlLib._name == str(library)


def test_the_documented_check_counts_the_gpus_through_the_driver_root(tmp_path):
    world = tmp_path / "world"
    write_world(world, World([FakeGpu("GPU-a", "Tesla T4"), FakeGpu("GPU-b", "Tesla T4")]))
    env = clean_env(FAKE_NVML_CONFIG=str(world))

    found = python(CHECK, {**env, DRIVER_ROOT_ENV: str(driver_root(tmp_path))})
    assert (found.returncode, found.stdout.strip()) == (0, "2"), found.stderr

    # The same check where the toolkit mounted the library: LD_LIBRARY_PATH stands in.
    library_dir = str(fake_nvml_or_skip().parent)
    found = python(CHECK, {**env, "LD_LIBRARY_PATH": library_dir})
    assert (found.returncode, found.stdout.strip()) == (0, "2"), found.stderr


def test_both_entry_points_load_through_the_driver_root_before_nvml(tmp_path, monkeypatch):
    from gpushare.deviceplugin.main import build_parser as plugin_parser
    from gpushare.gpunode.backendflags import build_backend as plugin_backend
    from gpushare.isolation.clock import SystemClock
    from gpushare.isolation.main import build_backend as agent_backend
    from gpushare.isolation.main import build_parser as agent_parser

    monkeypatch.setenv(DRIVER_ROOT_ENV, str(tmp_path / "empty"))
    expected = f"{DRIVER_ROOT_ENV}={tmp_path / 'empty'} holds no {LIBRARY}"
    with pytest.raises(RuntimeError, match=expected):
        plugin_backend(plugin_parser().parse_args(["--node-name=n1", "--backend=nvml"]))
    with pytest.raises(RuntimeError, match=expected):
        agent_backend(agent_parser().parse_args(["--backend=nvml"]), SystemClock())


def test_ld_library_path_to_a_driver_roots_libraries_would_stop_python(tmp_path):
    """Why the chart does not set LD_LIBRARY_PATH for gpu.driverRoot: a driver root holds
    a whole distribution's libraries, its libc.so.6 among them, and the loader would take
    that one for the image's. A libc.so.6 that is not the image's stands in for it here."""
    root = driver_root(tmp_path)
    source = tmp_path / "libc.c"
    source.write_text("int not_the_c_library(void) { return 0; }\n")
    for directory in LIBRARY_DIRS:
        (root / directory).mkdir(parents=True, exist_ok=True)
        command = [*compiler(), "-shared", "-fPIC", "-Wl,-soname,libc.so.6"]
        built = subprocess.run(
            [*command, "-o", str(root / directory / "libc.so.6"), str(source)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert built.returncode == 0, built.stderr
    world = tmp_path / "world"
    write_world(world, World([FakeGpu("GPU-a", "Tesla T4")]))
    env = clean_env(FAKE_NVML_CONFIG=str(world))

    through_path = python(
        CHECK, {**env, "LD_LIBRARY_PATH": ":".join(str(root / d) for d in LIBRARY_DIRS)}
    )
    assert through_path.returncode != 0 and through_path.stdout == ""

    by_path = python(CHECK, {**env, DRIVER_ROOT_ENV: str(root)})
    assert (by_path.returncode, by_path.stdout.strip()) == (0, "1"), by_path.stderr
