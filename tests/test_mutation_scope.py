"""scripts/mutation: the scope covers the whole core, scores count what the tool
reports, and the CI check holds a module to the bar or to its record."""

import importlib.util
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
    core = {
        str(p.relative_to(ROOT))
        for p in (ROOT / "src" / "gpushare").glob("*.py")
        if p.name != "__init__.py"
    }
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
    monkeypatch.setattr(mutation, "mutmut", lambda *args, quiet=False: listing)
    request, annotation = mutation.scores(["gpushare.request", "gpushare.annotation"])
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

    def fake(*args: str, quiet: bool = False) -> str:
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
