"""The Dockerfile: parsed and checked everywhere; built and run where Docker runs."""

import re
import shutil
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
SCRIPTS: dict[str, str] = PROJECT["scripts"]


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
    assert stages[0].base == stages[1].base == "python:3.11-slim"
    builder, runtime = stages
    assert any("pip wheel" in run and run.rstrip().endswith(" .") for run in builder.args("RUN"))
    assert any(copy.startswith("--from=builder /wheels") for copy in runtime.args("COPY"))
    # The runtime installs the project itself from the builder's wheels, offline.
    install = next(run for run in runtime.args("RUN") if "pip install" in run)
    assert "--no-index" in install and PROJECT["name"] in install.split()


def test_builder_copies_everything_the_package_needs(stages):
    copied = {source for copy in stages[0].args("COPY") for source in copy.split()[:-1]}
    assert {"pyproject.toml", "README.md", "src"} <= copied
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    for needed in ("pyproject.toml", "README.md", "src/"):
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
