"""scripts/mutation: the scope covers the whole core, scores count what the tool
reports, and the CI check holds a module to the bar or to its record."""

import importlib.util
import re
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("mutation", ROOT / "scripts" / "mutation.py")
assert _spec is not None and _spec.loader is not None
mutation = importlib.util.module_from_spec(_spec)
sys.modules["mutation"] = mutation
_spec.loader.exec_module(mutation)

SCOPE = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]["only_mutate"]


def test_every_module_of_the_core_is_in_the_mutation_scope():
    package = ROOT / "src" / "gpushare"
    core = {
        str(p.relative_to(ROOT))
        for p in [
            *package.glob("*.py"),
            *(package / "placement").glob("*.py"),
            *(package / "dra").glob("*.py"),
        ]
        if p.name != "__init__.py"
    }
    assert "src/gpushare/placement/fit.py" in core
    assert core - set(SCOPE) == set()


def test_every_path_of_the_scope_exists():
    assert [p for p in SCOPE if not (ROOT / p).is_file()] == []


def test_a_score_counts_timeouts_and_type_check_catches_as_killed():
    score = mutation.ModuleScore(
        "gpushare.request",
        Counter(
            {"killed": 6, "timeout": 1, "caught by type check": 1, "survived": 1, "no tests": 1}
        ),
    )
    assert (score.total, score.killed, score.score) == (10, 8, 80.0)


@pytest.mark.parametrize(
    ("score", "record", "expected"),
    [
        (85.0, None, "ok"),
        (90.0, 95.0, "ok"),  # over the bar: the record does not matter
        (80.0, 82.0, "FAILED"),  # under the bar and slid below its record
        (82.0, 82.0, "under the bar"),  # under the bar, held where it was
        (60.0, None, "under the bar (85%), no record yet"),
    ],
)
def test_a_module_is_held_to_the_bar_or_its_record(score, record, expected):
    result = mutation.ModuleScore(
        "gpushare.request", Counter(killed=int(score), survived=100 - int(score))
    )
    recorded = {} if record is None else {"gpushare.request": {"score": record}}
    assert mutation.verdict(result, recorded).startswith(expected)


def test_results_are_grouped_by_module_with_survivors_named(monkeypatch):
    listing = (
        "    gpushare.request.x_parse__mutmut_1: killed\n"
        "    gpushare.request.xǁPodRequestǁdescribe__mutmut_2: survived\n"
        "    gpushare.requestx.x_other__mutmut_1: survived\n"
        "    gpushare.annotation.x_encode__mutmut_1: no tests\n"
    )
    monkeypatch.setattr(mutation, "mutmut", lambda *args, **_: listing)
    found = mutation.statuses(mutation.suite_space())
    request, annotation = mutation.scores(["gpushare.request", "gpushare.annotation"], found)
    assert request.statuses == Counter({"killed": 1, "survived": 1})
    assert request.survivors == ["gpushare.request.xǁPodRequestǁdescribe__mutmut_2 (survived)"]
    assert annotation.survivors == ["gpushare.annotation.x_encode__mutmut_1 (no tests)"]


def test_a_retest_runs_only_the_mutants_not_killed(monkeypatch):
    listing = (
        "    gpushare.request.x_parse__mutmut_1: killed\n"
        "    gpushare.request.x_parse__mutmut_2: survived\n"
        "    gpushare.request.x_parse__mutmut_3: no tests\n"
        "    gpushare.request.x_parse__mutmut_4: not checked\n"
        "    gpushare.request.x_parse__mutmut_5: timeout\n"
    )
    runs: list[tuple[str, ...]] = []

    def fake(*args: str, **_: object) -> str:
        if args[0] == "run":
            runs.append(args)
        return listing

    monkeypatch.setattr(mutation, "mutmut", fake)
    monkeypatch.setattr(sys, "argv", ["mutation", "src/gpushare/request.py", "--retest"])
    mutation.main()
    assert runs == [
        (
            "run",
            "--max-children",
            "2",
            "gpushare.request.x_parse__mutmut_2",
            "gpushare.request.x_parse__mutmut_3",
            "gpushare.request.x_parse__mutmut_4",
        )
    ]


def test_a_module_outside_the_scope_is_refused_by_name():
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "mutation.py"), "src/gpushare/cli/main.py"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode != 0
    assert "not in the mutation scope" in run.stderr and "src/gpushare/cli/main.py" in run.stderr


@pytest.mark.parametrize(
    ("changed", "expected"),
    [
        (["src/gpushare/request.py", "src/gpushare/cli/main.py"], ["src/gpushare/request.py"]),
        (["docs/testing.md"], []),
    ],
)
def test_changed_since_keeps_the_changed_modules_of_the_scope(monkeypatch, changed, expected):
    monkeypatch.setattr(
        mutation, "changed_since", lambda ref: [p for p in changed if p.endswith(".py")]
    )
    args = mutation.argparse.Namespace(changed_since="HEAD~1", paths=[])
    assert mutation.targets(args) == expected


MODULE = '''"""A module."""
LIMIT = 3


def parse(text):
    return text.strip()


class Shape:
    size = 1

    @property
    def area(self):
        return self.size * self.size

    def grow(self, by):
        return self.size + by
'''


def _committed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str) -> Path:
    """A git repository holding src/gpushare/shape.py as `source`, as the checkout."""

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    path = tmp_path / "src" / "gpushare" / "shape.py"
    path.parent.mkdir(parents=True)
    path.write_text(source)
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    monkeypatch.setattr(mutation, "ROOT", tmp_path)
    return path


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("return text.strip()", "return text.lstrip()", {"x_parse"}),
        ("return self.size + by", "return self.size - by", {"xǁShapeǁgrow"}),
        ("return self.size * self.size", "return self.size ** 2", {"xǁShapeǁarea"}),
        # The mutants change though the syntax does not: the function counts as changed.
        (
            "return self.size + by",
            "return self.size + by  # pragma: no mutate: a reason",
            {"xǁShapeǁgrow"},
        ),
        ("A module.", "The module.", set()),  # a docstring: no mutant changes
        ("return text.strip()", "return text.strip()\n\nLIMIT_DOC = 1", None),
        ("LIMIT = 3", "LIMIT = 4", None),
        ("    size = 1", "    size = 2", None),  # a class body
    ],
)
def test_changed_since_names_the_functions_a_change_touched(
    tmp_path, monkeypatch, old, new, expected
):
    path = _committed(tmp_path, monkeypatch, MODULE)
    assert old in MODULE
    path.write_text(MODULE.replace(old, new))
    assert mutation.changed_functions("HEAD", "src/gpushare/shape.py") == expected


def test_a_new_function_is_changed_and_a_new_module_is_all_changed(tmp_path, monkeypatch):
    path = _committed(tmp_path, monkeypatch, MODULE)
    path.write_text(MODULE.replace("class Shape:", "def extra():\n    return 1\n\n\nclass Shape:"))
    assert mutation.changed_functions("HEAD", "src/gpushare/shape.py") == {"x_extra"}
    (path.parent / "new.py").write_text("def f():\n    return 1\n")
    assert mutation.changed_functions("HEAD", "src/gpushare/new.py") is None


def test_a_module_that_moved_is_compared_with_its_old_path_imports_aside(tmp_path, monkeypatch):
    path = _committed(tmp_path, monkeypatch, "import os\n" + MODULE)
    moved = path.parent / "shapes" / "shape.py"
    moved.parent.mkdir()
    subprocess.run(["git", "mv", str(path), str(moved)], cwd=tmp_path, check=True)
    moved.write_text("import sys\n" + MODULE.replace("self.size + by", "self.size - by"))
    assert mutation.changed_functions("HEAD", "src/gpushare/shapes/shape.py") == {"xǁShapeǁgrow"}


def test_a_run_of_changed_functions_is_judged_with_the_rest_of_the_module_as_recorded(
    tmp_path, monkeypatch
):
    path = _committed(tmp_path, monkeypatch, MODULE)
    path.write_text(MODULE.replace("return self.size + by", "return self.size - by"))
    recorded = {
        "gpushare.shape": {
            "score": 79.0,
            # parse and area as the last full run left them; `gone` was since removed.
            "functions": {"x_parse": [10, 10], "xǁShapeǁarea": [10, 6], "x_gone": [5, 0]},
        }
    }
    run = mutation.ModuleScore("gpushare.shape")
    run.functions = {"xǁShapeǁgrow": [4, 3], "x_parse": [10, 2]}  # parse: stale cached results

    estimate = mutation.judged(run, {"xǁShapeǁgrow"}, "src/gpushare/shape.py", recorded)

    assert estimate.functions == {
        "x_parse": [10, 10],
        "xǁShapeǁarea": [10, 6],
        "xǁShapeǁgrow": [4, 3],
    }
    assert (estimate.total, estimate.killed) == (24, 19)
    assert (
        mutation.verdict(estimate, recorded) == "under the bar (85%), not below its record (79.0%)"
    )


def test_the_ci_step_runs_only_the_mutants_of_the_changed_functions(tmp_path, monkeypatch, capsys):
    path = _committed(tmp_path, monkeypatch, MODULE)
    path.write_text(MODULE.replace("return self.size + by", "return self.size - by"))
    monkeypatch.setattr(mutation, "scope", lambda: ["src/gpushare/*.py"])
    monkeypatch.setattr(mutation, "test_reach", lambda graph: {})  # no test imports it
    runs: list[tuple[str, ...]] = []

    def fake(*args: str, **_: object) -> str:
        runs.append(args)
        return (
            "    gpushare.shape.xǁShapeǁgrow__mutmut_1: killed\n"
            "    gpushare.shape.x_parse__mutmut_1: not checked\n"
        )

    monkeypatch.setattr(mutation, "mutmut", fake)
    monkeypatch.setattr(mutation, "RECORD", tmp_path / "scores.json")
    monkeypatch.setattr(sys, "argv", ["mutation", "--changed-since", "HEAD", "--check"])
    assert mutation.main() == 0
    assert [r for r in runs if r[0] != "results"] == [
        ("prepare", "2"),
        ("run", "--max-children", "2", "gpushare.shape.xǁShapeǁgrow__mutmut_1"),
    ]
    assert re.search(r"mutation: \d+ s of the 1800 s budget", capsys.readouterr().out)


def test_functions_without_mutants_are_reported_not_failed(monkeypatch, capsys):
    refused = subprocess.CompletedProcess(
        [], 1, stdout=None, stderr=f"AssertionError: {mutation._NO_MATCH}\n\nFilter: ..."
    )
    monkeypatch.setattr(mutation, "_call", lambda *a, **k: (refused, False))
    assert mutation.mutmut("run", "gpushare.shape.x_parse__mutmut_*") == ""
    assert "the functions named have no mutants" in capsys.readouterr().out
    broken = subprocess.CompletedProcess([], 1, stdout=None, stderr="Traceback: boom")
    monkeypatch.setattr(mutation, "_call", lambda *a, **k: (broken, False))
    with pytest.raises(SystemExit, match="boom"):
        mutation.mutmut("run", "gpushare.shape.x_parse__mutmut_*")
