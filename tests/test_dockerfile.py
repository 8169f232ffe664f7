"""The Dockerfile: parsed and checked everywhere; built and run where Docker runs."""

import importlib.util
import json
import re
import shutil
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
SCRIPTS: dict[str, str] = PROJECT["scripts"]


def _offline_builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "build_image", ROOT / "scripts" / "build_image.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


OFFLINE = _offline_builder()
"""scripts/build_image.py: the same image, built without Docker or a registry."""


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, keyword: str) -> list[str]:
        return [a for k, a in self.instructions if k == keyword]


def parse(text: str) -> list[Stage]:
    """Stages of a Dockerfile: comments dropped, continuations joined, ARGs before the
    first FROM substituted into FROM lines."""
    logical: list[str] = []
    pending = ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    globals_: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.strip().partition(" ")
        keyword = keyword.upper()
        if keyword == "ARG" and not stages:
            name, _, default = rest.partition("=")
            globals_[name.strip()] = default.strip()
        elif keyword == "FROM":
            parts = re.split(r"\s+as\s+", rest.strip(), flags=re.I)
            image = re.sub(r"\$\{(\w+)\}", lambda m: globals_[m.group(1)], parts[0].strip())
            stages.append(Stage(parts[1].strip() if len(parts) > 1 else str(len(stages)), image))
        else:
            stages[-1].instructions.append((keyword, rest.strip()))
    return stages


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse(DOCKERFILE.read_text())


def test_builds_wheels_in_one_stage_and_runs_on_slim_python_in_another(stages):
    assert [s.name for s in stages] == ["builder", "runtime"]
    assert stages[0].base == stages[1].base == f"python:3.11-slim-{OFFLINE.SUITE}"
    builder, runtime = stages
    assert any("pip wheel" in run and run.rstrip().endswith(" .") for run in builder.args("RUN"))
    assert any(copy.startswith("--from=builder /wheels") for copy in runtime.args("COPY"))
    # The runtime installs the project itself from the builder's wheels, offline.
    install = next(run for run in runtime.args("RUN") if "pip install" in run)
    assert "--no-index" in install and PROJECT["name"] in install.split()


def test_builder_copies_everything_the_package_needs(stages):
    copied = {source for copy in stages[0].args("COPY") for source in copy.split()[:-1]}
    assert {"pyproject.toml", "setup.py", "README.md", "src"} <= copied
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    for needed in ("pyproject.toml", "setup.py", "README.md", "src/"):
        assert f"!{needed}" in ignore


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_every_console_script_resolves_to_code_in_the_image(stages, script):
    module, _, function = SCRIPTS[script].partition(":")
    path = ROOT / "src" / Path(*module.split("."))
    source = path.with_suffix(".py") if path.with_suffix(".py").exists() else path / "__init__.py"
    assert source.exists(), f"{script}: {module} is not under src/ (the only code in the image)"
    assert re.search(rf"^def {function}\(", source.read_text(), re.M), f"{script}: no {function}()"
    # The build itself fails if an installed console script is missing or does not import.
    check = next(run for run in stages[1].args("RUN") if "console_scripts" in run)
    assert "shutil.which" in check and "load()" in check


def test_runs_as_a_non_root_user(stages):
    users = stages[-1].args("USER")
    assert users, "the runtime stage sets no USER"
    uid = users[-1].split(":")[0]
    assert uid not in ("0", "root")
    assert any(f"--uid {uid}" in run for run in stages[-1].args("RUN"))


def _squeezed(text: str) -> str:
    return re.sub(r"\s+", "", text)


def test_the_offline_build_makes_the_same_image(stages):
    """scripts/build-image must give what `docker build` gives: same distribution, venv,
    user, environment, command, examples, removals and entry-point check."""
    runtime = stages[-1]
    env = " ".join(runtime.args("ENV")).split()
    for setting in OFFLINE.ENV:
        assert setting in env, f"the Dockerfile's ENV lacks {setting}"
    assert runtime.args("USER")[-1] == OFFLINE.USER
    assert json.loads(runtime.args("CMD")[-1]) == list(OFFLINE.CMD)
    runs = " ".join(runtime.args("RUN"))
    assert f"python -m venv {OFFLINE.VENV}" in runs
    assert f"{OFFLINE.VENV}/bin/pip install --no-index" in runs
    assert f"--find-links /tmp/wheels {OFFLINE.DIST}" in runs
    assert "pip uninstall --quiet --yes pip setuptools" in runs
    for removed in OFFLINE.REMOVED_FROM_VENV:
        assert f"{OFFLINE.VENV}/{removed}" in runs, f"the Dockerfile keeps {removed}"
    [check] = [r for r in runtime.args("RUN") if "console_scripts" in r]
    assert _squeezed(OFFLINE.ENTRY_POINT_CHECK) in _squeezed(check)
    assert f"examples {OFFLINE.EXAMPLES}" in runtime.args("COPY")
    assert PROJECT["name"] == OFFLINE.DIST


def test_nothing_in_the_product_imports_what_the_image_leaves_out():
    # kubernetes/aio is removed from the image; matplotlib is the `plot` extra, loaded
    # only by the plot module (and probed lazily before a plot is asked for).
    for path in (ROOT / "src").rglob("*.py"):
        text = path.read_text()
        assert "kubernetes.aio" not in text and "from kubernetes import aio" not in text, path
        if re.search(r"^(import|from) matplotlib", text, re.M):
            assert path.name == "plot.py", f"{path} imports matplotlib at load time"
    assert all("matplotlib" not in dep for dep in PROJECT["dependencies"])
    assert any("matplotlib" in dep for dep in PROJECT["optional-dependencies"]["plot"])


def test_parser_reads_continuations_and_arguments():
    stages = parse("ARG B=img:1\n# c\nFROM ${B} AS a\nRUN one \\\n  two\nFROM a\nUSER 5\n")
    assert [(s.name, s.base) for s in stages] == [("a", "img:1"), ("1", "a")]
    assert stages[0].args("RUN") == ["one    two"]


def _docker_engine() -> str | None:
    """Why the build test cannot run here, or None when it can."""
    if shutil.which("docker") is None:
        return "docker is not installed"
    probe = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        return f"no Docker engine reachable: {probe.stderr.strip().splitlines()[-1:]}"
    return None


@pytest.mark.e2e
@pytest.mark.timeout(1800)
def test_docker_build_gives_an_image_with_every_entry_point():
    reason = _docker_engine()
    if reason:
        pytest.skip(reason)
    tag = "gpushare/gpushare:test-build"
    subprocess.run(["docker", "build", "-t", tag, str(ROOT)], check=True, timeout=1700)
    uid = subprocess.run(
        ["docker", "run", "--rm", tag, "id", "-u"], capture_output=True, text=True, check=True
    )
    assert uid.stdout.strip() == "10001"
    for script in SCRIPTS:
        result = subprocess.run(
            ["docker", "run", "--rm", tag, script, "--help"], capture_output=True, text=True
        )
        assert result.returncode == 0, f"{script} --help: {result.stderr}"
