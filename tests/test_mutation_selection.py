"""scripts/mutation's CI step: the tests it maps to a change's mutants (the test files
importing the modules changed), its retry on the whole suite where those kill less
than the record says, and its time budget (a fixed sample, a hard stop)."""

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.test_mutation_scope import ROOT, mutation  # scripts/mutation.py, loaded once

# A checkout: src/gpushare/{a,b,c,d,e,f}.py and tests/ that reach them in each way.
FILES = {
    "pyproject.toml": """
        [tool.mutmut]
        source_paths = ["src/"]
        only_mutate = ["src/gpushare/*.py"]
        pytest_add_cli_args_test_selection = ["tests", "--ignore=tests/e2e", "-m", "not slow"]
        also_copy = ["docs/", "README.md"]
    """,
    "src/gpushare/__init__.py": "",
    "src/gpushare/a.py": "def f():\n    return 1\n",
    "src/gpushare/b.py": "def g():\n    return 2\n",
    "src/gpushare/c.py": "from . import e\n",  # e is only ever used through c
    "src/gpushare/e.py": "def h():\n    return 3\n",
    "src/gpushare/f.py": "def k():\n    return 4\n",
    "src/gpushare/pkg/__init__.py": "from .d import Thing\n",
    "src/gpushare/pkg/d.py": "class Thing:\n    pass\n",
    "src/gpushare/lonely.py": "def z():\n    return 5\n",
    "tests/__init__.py": "",
    "tests/helpers.py": "from gpushare.b import g\n",
    "tests/test_a.py": "from gpushare.a import f\n",
    "tests/test_b.py": "from tests.helpers import g\n",
    "tests/test_c.py": "def test_c():\n    import gpushare.c\n",
    "tests/test_pkg.py": "from gpushare.pkg import Thing\n",
    "tests/sub/__init__.py": "",
    "tests/sub/conftest.py": "from gpushare import f\n",
    "tests/sub/test_sub.py": "def test_sub():\n    pass\n",
    "tests/e2e/test_e2e.py": "from gpushare.a import f\n",  # ignored by the selection
    # g: one test imports one of its functions, another the module that uses the rest.
    "src/gpushare/g.py": "def one():\n    return 1\n\n\ndef two():\n    return 2\n",
    "src/gpushare/uses_g.py": "from gpushare import g\n",
    "tests/test_g_one.py": "from gpushare.g import one\n",
    "tests/test_uses_g.py": "import gpushare.uses_g\n",
}


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name, text in FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    (tmp_path / "docs").mkdir()
    monkeypatch.setattr(mutation, "ROOT", tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    ("module", "expected"),
    [
        ("gpushare.a", ["tests/test_a.py"]),  # imported by a test (the e2e one is ignored)
        ("gpushare.b", ["tests/test_b.py"]),  # through a helper of tests/
        ("gpushare.e", ["tests/test_c.py"]),  # no test imports it: those of its importer
        ("gpushare.pkg.d", ["tests/test_pkg.py"]),  # a name its package re-exports
        ("gpushare.f", ["tests/sub/test_sub.py"]),  # a conftest.py the test runs with
        ("gpushare.lonely", []),
    ],
)
def test_a_modules_tests_are_the_test_files_that_import_it(checkout, module, expected):
    assert mutation.selected_tests([module]) == expected


def test_a_module_takes_more_test_files_while_none_reaches_its_changed_functions(
    checkout, monkeypatch
):
    prepared_with: list[list[str]] = []

    def fake(*args: str, space: mutation.Space | None = None, **_: object) -> str:
        assert space is not None and space.narrow
        tests = space.overrides["pytest_add_cli_args_test_selection"][:-2]  # less "-m not slow"
        if args[0] == "prepare":
            prepared_with.append(tests)
            # mutmut's map: test_g_one reaches one(), test_uses_g two().
            reached = {"gpushare.g.x_one": ["tests/test_g_one.py::test"]}
            if "tests/test_uses_g.py" in tests:
                reached["gpushare.g.x_two"] = ["tests/test_uses_g.py::test"]
            stats = space.root / "mutants" / "mutmut-stats.json"
            stats.parent.mkdir(exist_ok=True)
            stats.write_text(json.dumps({"tests_by_mangled_function_name": reached}))
        return "".join(f"    gpushare.g.x_{f}__mutmut_1: not checked\n" for f in ("one", "two"))

    monkeypatch.setattr(mutation, "mutmut", fake)
    args = mutation.argparse.Namespace(tests="imports", max_children=2)

    def prepare(changed: set[str]) -> mutation.Space:
        prepared_with.clear()
        return mutation.prepared(args, ["src/gpushare/g.py"], {"gpushare.g": changed}, None)

    space = prepare({"x_one"})
    assert prepared_with == [["tests/test_g_one.py"]]
    space = prepare({"x_two"})
    assert prepared_with == [
        ["tests/test_g_one.py"],
        ["tests/test_g_one.py", "tests/test_uses_g.py"],  # one step more: what imports g
    ]
    assert space.overrides["pytest_add_cli_args_test_selection"][:-2] == prepared_with[-1]
    # A function nothing reaches: as many steps as HOPS allows, then it runs as it is.
    prepare({"x_three"})
    assert len(prepared_with) <= mutation.HOPS + 1


def test_the_tests_of_several_modules_are_the_union_of_theirs(checkout):
    assert mutation.selected_tests(["gpushare.a", "gpushare.f"]) == [
        "tests/sub/test_sub.py",
        "tests/test_a.py",
    ]


def test_the_selected_tests_run_in_a_copy_of_their_own_with_the_suites_options(checkout):
    mutants = checkout / "mutants" / "imports"
    mutants.mkdir(parents=True)
    (mutants / "stale").write_text("from the last change")

    space = mutation.narrow_space(["src/gpushare/a.py"], ["tests/test_a.py"])

    assert space.narrow and space.root == mutants
    assert space.overrides == {
        "only_mutate": ["src/gpushare/a.py"],
        "pytest_add_cli_args_test_selection": ["tests/test_a.py", "-m", "not slow"],
    }
    # What mutmut copies and exists (README.md, in also_copy, does not here).
    assert sorted(p.name for p in mutants.iterdir() if p.is_symlink()) == [
        "docs",
        "pyproject.toml",
        "src",
        "tests",
    ]
    assert (mutants / "src").resolve() == checkout / "src"
    assert not (mutants / "stale").exists()
    assert mutation.kept_narrow_space() == space  # what --no-run and --retest find


def test_no_run_without_a_kept_selection_says_to_run_first(checkout):
    with pytest.raises(SystemExit, match="run without --no-run or --retest first"):
        mutation.kept_narrow_space()


def test_a_mutant_is_estimated_at_what_the_tests_of_its_function_took(checkout):
    stats = checkout / "mutants" / "mutmut-stats.json"
    stats.parent.mkdir()
    stats.write_text(
        json.dumps(
            {
                "tests_by_mangled_function_name": {"gpushare.a.x_f": ["t1", "t2"]},
                "duration_by_test": {"t1": 2.0, "t2": 0.5},
            }
        )
    )
    estimates = mutation.costs(
        mutation.suite_space(), ["gpushare.a.x_f__mutmut_1", "gpushare.b.x_g__mutmut_1"]
    )
    start, share = mutation.MUTANT_START_S, mutation.TESTS_SHARE
    assert estimates == {
        "gpushare.a.x_f__mutmut_1": start + share * 2.5,  # most mutants die at a first test
        "gpushare.b.x_g__mutmut_1": start,  # no test reaches it
    }


ESTIMATES = {f"gpushare.a.x_f__mutmut_{n}": 10.0 for n in range(1, 41)}


def test_mutants_that_fit_the_budget_all_run():
    assert mutation.sample(ESTIMATES, seconds=200.0, max_children=2) == list(ESTIMATES)


def test_over_the_budget_a_fixed_sample_runs_that_fits_it():
    chosen = mutation.sample(ESTIMATES, seconds=100.0, max_children=2)
    assert len(chosen) == 20  # 100 s on 2 workers, 10 s each
    # The same sample whatever order they come in: every machine judges the same mutants.
    reordered = dict(reversed(list(ESTIMATES.items())))
    assert sorted(mutation.sample(reordered, seconds=100.0, max_children=2)) == sorted(chosen)
    assert chosen != list(ESTIMATES)[:20]  # not just the first ones made


def test_the_sample_takes_cheaper_mutants_after_one_that_does_not_fit():
    estimates = {"gpushare.a.x_f__mutmut_1": 500.0, **ESTIMATES}
    chosen = mutation.sample(estimates, seconds=100.0, max_children=2)
    assert "gpushare.a.x_f__mutmut_1" not in chosen and len(chosen) == 20


RECORDED = {
    "gpushare.a": {
        "score": 90.0,
        "functions": {"x_f": [10, 9], "x_g": [10, 10]},
    }
}


@pytest.mark.parametrize(
    ("functions", "changed", "below"),
    [
        ({"x_f": [10, 9]}, {"x_f"}, False),  # as the record
        ({"x_f": [10, 8]}, {"x_f"}, True),  # the tests run missed one the suite kills
        ({"x_f": [20, 19], "x_g": [10, 10]}, {"x_f", "x_g"}, False),  # 29/30 over 19/20
        ({"x_f": [10, 9], "x_g": [10, 9]}, {"x_f", "x_g"}, True),
        ({"x_f": [10, 9], "x_new": [4, 3]}, {"x_f", "x_new"}, True),  # a new one: all killed
        ({"x_f": [0, 0], "x_g": [10, 10]}, {"x_f", "x_g"}, False),  # x_f not run (budget)
        ({"x_f": [10, 8], "x_g": [10, 10]}, None, False),  # a whole module: 90% = its score
        ({"x_f": [10, 7], "x_g": [10, 10]}, None, True),
    ],
)
def test_a_module_judged_on_its_tests_is_told_when_they_kill_less_than_its_record(
    functions, changed, below
):
    result = mutation.ModuleScore("gpushare.a", functions=functions)
    tried = sum(t for t, _ in functions.values())
    killed = sum(k for _, k in functions.values())
    result.statuses.update(killed=killed, survived=tried - killed)
    assert mutation.below_record(result, changed, RECORDED) is below


def test_a_module_never_recorded_is_told_of_any_survivor():
    result = mutation.ModuleScore("gpushare.new", functions={"x_f": [3, 2]})
    result.statuses.update(killed=2, survived=1)
    assert mutation.below_record(result, {"x_f"}, {})
    assert mutation.below_record(result, None, {})


_SELECTION = {"pytest_add_cli_args_test_selection": ["tests/test_a.py"]}


def test_the_mutants_a_failing_module_did_not_kill_are_retried_on_the_suite(checkout, monkeypatch):
    narrow = mutation.Space(checkout / "mutants" / "imports", _SELECTION)
    narrow.root.mkdir(parents=True)
    found = {
        "gpushare.a.x_f__mutmut_1": "killed",
        "gpushare.a.x_f__mutmut_2": "survived",
        "gpushare.a.x_f__mutmut_3": "not checked",  # left out by the budget: not retried
        "gpushare.b.x_g__mutmut_1": "survived",  # of a module that passes: not retried
    }
    calls: list[tuple[tuple[str, ...], mutation.Space]] = []

    def fake(*args: str, space: mutation.Space | None = None, **_: object) -> str:
        calls.append((args, space or mutation.suite_space()))
        return "    gpushare.a.x_f__mutmut_2: killed\n    gpushare.b.x_g__mutmut_1: survived\n"

    monkeypatch.setattr(mutation, "mutmut", fake)
    merged = mutation.retry_on_suite(narrow, found, ["gpushare.a"], 2, None)

    assert [args for args, space in calls if args[0] != "results"] == [
        ("prepare", "2"),
        ("run", "--max-children", "2", "gpushare.a.x_f__mutmut_2"),
    ]
    assert all(space == mutation.suite_space() for _, space in calls)
    assert merged == {**found, "gpushare.a.x_f__mutmut_2": "killed"}
    # --no-run finds the suite's word on the mutant retried.
    assert json.loads((narrow.root / "retried.json").read_text()) == {
        "gpushare.a.x_f__mutmut_2": "killed"
    }


SHAPE = "def parse(text):\n    return text.strip()\n\n\ndef grow(size, by):\n    return size + by\n"


@pytest.mark.parametrize(
    ("parse_recorded", "retried"),
    [
        ([8, 8], False),  # 1 of grow's 2 survives: 9 of 10, over the bar: no retry needed
        ([2, 2], True),  # 3 of 4: under the bar and the record, unless the suite kills it
    ],
)
def test_the_ci_step_retries_on_the_suite_only_a_module_failing_on_its_tests(
    checkout, monkeypatch, capsys, parse_recorded, retried
):
    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=checkout, check=True, capture_output=True)

    shape = checkout / "src" / "gpushare" / "shape.py"
    shape.write_text(SHAPE)
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    shape.write_text(SHAPE.replace("size + by", "by + size"))
    record = checkout / "scores.json"
    record.write_text(
        json.dumps(
            {
                "gpushare.shape": {
                    "score": 100.0,
                    "functions": {"x_grow": [2, 2], "x_parse": parse_recorded},
                }
            }
        )
    )
    monkeypatch.setattr(mutation, "RECORD", record)
    monkeypatch.setattr(mutation, "test_reach", lambda graph: {"tests.test_a": {"gpushare.shape"}})
    monkeypatch.setattr(mutation, "unreached", lambda space, names: set())
    runs: list[tuple[str, bool]] = []

    def fake(*args: str, space: mutation.Space | None = None, **_: object) -> str:
        narrow = space is not None and space.narrow
        runs.append((args[0], narrow))
        survivor = "survived" if narrow else "killed"  # a test that does not import it
        return (
            f"    gpushare.shape.x_grow__mutmut_1: killed\n"
            f"    gpushare.shape.x_grow__mutmut_2: {survivor}\n"
        )

    monkeypatch.setattr(mutation, "mutmut", fake)
    monkeypatch.setattr(
        sys, "argv", ["mutation", "--changed-since", "HEAD", "--check", "--no-diffs"]
    )
    assert mutation.main() == 0
    out = capsys.readouterr().out
    ran = [r for r in runs if r[0] in ("prepare", "run")]
    assert ran[:2] == [("prepare", True), ("run", True)]
    assert ran[2:] == ([("prepare", False), ("run", False)] if retried else [])
    assert ("gpushare.shape: judged on the test files that import it" in out) is not retried


def test_no_retry_once_the_budget_is_spent(checkout, monkeypatch, capsys):
    narrow = mutation.Space(checkout / "mutants" / "imports", _SELECTION)
    monkeypatch.setattr(mutation, "mutmut", lambda *a, **k: pytest.fail("mutmut ran"))
    found = {"gpushare.a.x_f__mutmut_1": "survived"}
    spent = time.monotonic() - 1
    assert mutation.retry_on_suite(narrow, found, ["gpushare.a"], 2, spent) == found
    assert "no budget left to retry 1 mutant(s)" in capsys.readouterr().out


def test_the_run_is_stopped_at_the_budget():
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    started = time.monotonic()
    run, stopped = mutation._call(sleeper, ROOT, {}, True, time.monotonic() + 0.5)
    assert stopped and run.returncode != 0
    assert time.monotonic() - started < 10


def test_a_run_deaf_to_the_stop_is_killed_with_its_children(monkeypatch):
    monkeypatch.setattr(mutation, "STOP_GRACE_S", 0.5)
    deaf = [
        sys.executable,
        "-c",
        "import signal, subprocess, sys, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "print(child.pid, flush=True); time.sleep(60)",
    ]
    run, stopped = mutation._call(deaf, ROOT, {}, True, time.monotonic() + 1.0)
    assert stopped and run.returncode == -9
    child = int(run.stdout.split()[0])
    time.sleep(0.2)
    zombie_or_gone = subprocess.run(
        ["ps", "-o", "stat=", "-p", str(child)], capture_output=True, text=True, check=False
    ).stdout.strip()
    assert zombie_or_gone in ("", "Z")


@pytest.mark.parametrize(
    ("argv", "tests", "budget"),
    [
        (["--changed-since", "HEAD~1"], "imports", mutation.BUDGET_S),  # the CI step
        (["--changed-since", "HEAD~1", "--budget-s", "600"], "imports", 600),
        (["--changed-since", "HEAD~1", "--budget-s", "0"], "imports", 0),  # none
        (["--changed-since", "HEAD~1", "--tests", "suite"], "suite", mutation.BUDGET_S),
        (["--changed-since", "HEAD~1", "--record"], "suite", 0),  # a record is complete
        (["src/gpushare/request.py"], "suite", 0),
    ],
)
def test_the_ci_step_selects_by_imports_under_a_budget(monkeypatch, argv, tests, budget):
    monkeypatch.setattr(sys, "argv", ["mutation", *argv])
    args = mutation.arguments()
    assert (args.tests, args.budget_s) == (tests, budget)


@pytest.mark.parametrize(
    "argv", [["--record", "--tests", "imports"], ["--record", "--budget-s", "60"]]
)
def test_a_record_takes_every_mutant_on_the_whole_suite(monkeypatch, capsys, argv):
    monkeypatch.setattr(sys, "argv", ["mutation", *argv])
    with pytest.raises(SystemExit):
        mutation.arguments()
    assert "--record keeps" in capsys.readouterr().err


def test_the_scripts_test_step_states_its_budget():
    step = (ROOT / "scripts" / "test").read_text()
    assert f"--changed-since HEAD~1 --check --no-diffs --budget-s {mutation.BUDGET_S}" in step
