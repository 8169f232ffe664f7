"""`pip install` adds one top-level package, `gpushare`, holding every module of src/;
the import contracts cover the whole core."""

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
COMPONENTS = (
    "cli", "commandline", "deviceplugin", "draplugin", "extender", "gpunode", "isolation",
    "kubecluster", "kubeletapi", "nodeflags", "nvmllib", "simulator", "standins",
)  # fmt: skip


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """Built from a copy of what the build reads: setuptools leaves build/ beside the
    sources, and a stale build/lib would slip old modules into later wheels."""
    source = tmp_path_factory.mktemp("source")
    for tree in ("src", "examples", "data"):
        shutil.copytree(ROOT / tree, source / tree, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))  # fmt: skip
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(out), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )  # fmt: skip
    [built] = out.glob("kube_gpushare-*.whl")
    return zipfile.ZipFile(built)


def test_the_wheel_adds_exactly_one_top_level_package(wheel: zipfile.ZipFile):
    tops = {name.split("/", 1)[0] for name in wheel.namelist()}
    dist_info = {t for t in tops if t.endswith(".dist-info")}
    assert len(dist_info) == 1
    assert tops - dist_info == {"gpushare"}


def test_the_wheel_holds_every_module_of_src(wheel: zipfile.ZipFile):
    sources = {
        str(p.relative_to(ROOT / "src"))
        for p in (ROOT / "src").rglob("*.py")
        if "__pycache__" not in p.parts and "egg-info" not in str(p)
    }
    packaged = {n for n in wheel.namelist() if n.endswith(".py")}
    assert sources - packaged == set()
    for component in COMPONENTS:
        assert f"gpushare/{component}/__init__.py" in packaged


def test_every_console_script_starts_under_the_one_root(wheel: zipfile.ZipFile):
    [entry_points] = [n for n in wheel.namelist() if n.endswith("entry_points.txt")]
    text = wheel.read(entry_points).decode()
    targets = [line.split("=", 1)[1].strip() for line in text.splitlines() if "=" in line]
    assert targets and all(t.startswith("gpushare.") for t in targets), targets
    assert set(PYPROJECT["project"]["scripts"]) <= {
        line.split("=", 1)[0].strip() for line in text.splitlines() if "=" in line
    }


def test_the_core_contract_names_every_module_of_the_core():
    """A core module missing from the contract could import an adapter unseen."""
    [core] = [
        c
        for c in PYPROJECT["tool"]["importlinter"]["contracts"]
        if c["name"].startswith("The pure core")
    ]
    package = ROOT / "src" / "gpushare"
    modules = {f"gpushare.{p.stem}" for p in package.glob("*.py") if p.stem != "__init__"}
    subpackages = {
        f"gpushare.{p.parent.name}"
        for p in package.glob("*/__init__.py")
        if p.parent.name not in COMPONENTS
    }
    assert set(core["source_modules"]) == modules | subpackages
    assert set(core["forbidden_modules"]) == {f"gpushare.{c}" for c in COMPONENTS}


@pytest.fixture(scope="module")
def installed(wheel: zipfile.ZipFile, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel installed on its own (its dependencies come from this venv), away
    from the checkout: what a user or the image gets."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
         str(target), str(wheel.filename)],
        check=True,
        capture_output=True,
        timeout=300,
    )  # fmt: skip
    return target


def _run_installed(target: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
        cwd=target.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_demo_runs_from_the_installed_wheel_with_its_own_examples(installed: Path):
    where = _run_installed(installed, "-c", "import gpushare; print(gpushare.__file__)")
    assert where.stdout.startswith(str(installed)), where  # not the checkout's src/
    demo = _run_installed(installed, "-m", "gpushare.cli.main", "demo")
    assert demo.returncode == 0, demo.stderr
    assert "cuda-sample" in demo.stdout and "core-not-multiple-of-5" in demo.stdout


def test_the_simulators_default_trace_ships_in_the_wheel(installed: Path):
    probe = "from gpushare.cli.simulate import default_trace_dir as d; print(*sorted(p.name for p in d().iterdir()))"  # noqa: E501
    listed = _run_installed(installed, "-c", probe)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split() == ["openb_node_list_gpu_node.csv", "openb_pod_list_default.csv"]


def test_the_wheel_carries_the_built_cuda_interposer_for_its_platform(wheel: zipfile.ZipFile):
    library = "gpushare/isolation/interposer/libgpushare-cuda.so"
    assert wheel.read(library)[:4] == b"\x7fELF"
    # The headers too: the agent's region layout is read from region.h (layout.py).
    for header in ("hooks.def", "region.h"):
        assert f"gpushare/isolation/interposer/{header}" in wheel.namelist()
    name = Path(str(wheel.filename)).name
    assert name.startswith("kube_gpushare-") and name.endswith(
        f"-py3-none-linux_{os.uname().machine}.whl"
    )
