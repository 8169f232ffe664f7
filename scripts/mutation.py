"""Mutation testing of the scope in pyproject.toml ([tool.mutmut] only_mutate), with mutmut.

    scripts/mutation                      every module of the scope
    scripts/mutation src/gpushare/request.py ...   those modules (must be in the scope)
    scripts/mutation --changed-since REF  the functions of the scope changed since REF
                (a whole module where code outside its functions changed)
    --check     exit 1 when a module is under the bar (BAR percent killed) and under
                its recorded score: a module may not slide back, one under the bar
                may not get worse (the CI step: ./scripts/test, --changed-since HEAD~1);
                a module not recorded yet is reported, not held. After a run of
                changed functions a module is judged by its record with those
                functions' figures replaced by this run's
    --record    write the scores of this run into docs/mutation-scores.json
    --retest    run only the mutants not killed yet (survived, no tests, never run):
                after writing tests for survivors, minutes instead of the module's run
    --tests imports|suite   the tests mutmut maps to the mutants: `suite`, the unit
                suite ([tool.mutmut] pytest_add_cli_args_test_selection; the default,
                and what --record takes), or `imports`, the test files that import the
                modules (the default with --changed-since): a module that fails on
                them has the mutants they did not kill retried on the suite
    --budget-s S   the seconds the run may take (default BUDGET_S with --changed-since
                unless --record, none otherwise; 0: none): over it, a sample of the
                mutants runs, and at it mutmut is stopped (docs/testing.md)

Prints per module: mutants, killed, survived, timed out, no tests, the score
(killed + timed out over all mutants), then each survivor with its diff, then the time
taken. mutmut works in ./mutants (a copy of src/ and tests/; the checkout is never
changed) and keeps its results there (in ./mutants/imports for --tests imports):
`--no-run` reports them, `--retest` runs again only what a new test may kill. A plain
run retests every mutant of the modules named, so a module's score always comes from
the tests as they are now.

A mutant a test can never kill (an equivalent mutant) is marked in the source
with `# pragma: no mutate` and a reason on the same line; mutmut does not make it.
"""

import argparse
import ast
import fnmatch
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BAR = 85.0
"""Percent of mutants killed that every module of the scope must reach."""
RECORD = ROOT / "docs" / "mutation-scores.json"
"""The last full run's score per module: what --check holds a module under the bar to."""
DRIVER = Path(__file__).resolve().parent / "mutmut_driver.py"
"""mutmut's command line, with settings replaced per run and a `prepare` step."""
NARROW = Path("mutants") / "imports"
"""Where mutmut works for --tests imports (below ROOT): apart from mutants/, since mutmut
drops every result it keeps once its test selection changes, and each change selects
other tests."""

BUDGET_S = 1800
"""The CI step's seconds (scripts/test): with the unit tests (about 10 min), lint and the
setup, CI stays well inside its 90 minutes."""
RETRY_SHARE = 1 / 3
"""Of the budget left once the selected tests are mapped, the share the mutants leave
for retrying on the whole suite a module that fails on its selection (retry_on_suite)."""
HOPS = 2
"""How far a module's test files are looked for when none imports it, or none of those
reaches a changed function: test files that import a module of src/ importing it, then
one importing that one."""
MUTANT_START_S = 1.0
"""What a mutant costs besides its tests: mutmut forks it and pytest collects its tests."""
TESTS_SHARE = 0.25
"""The share of what a mutant's tests took in mutmut's traced stats run that the mutant
is estimated at: most are killed by one of their first tests (pytest -x), only a
survivor runs them all, and the traced run is the slower. Measured on a ten-module
change (247 mutants): 0.23."""
STOP_GRACE_S = 30.0
"""How long mutmut may take to wind down once stopped at the budget, before it is killed."""

Recorded = dict[str, dict[str, Any]]
"""docs/mutation-scores.json: per module, its mutants, killed, score and functions."""

_KILLED = {"killed", "timeout", "caught by type check", "segfault"}
_NOT_RUN = {"not checked", "check was interrupted by user"}
"""Never run, or stopped at the budget before its tests ended: left out of the scores."""
_RESULT = re.compile(r"^\s+(?P<name>\S+): (?P<status>.+)$")
_FUNCTION = re.compile(r"^(?P<module>.+)\.(?P<function>x[^.]+)__mutmut_\d+$")
"""gpushare.request.x_parse__mutmut_3, gpushare.request.xǁClassǁmethod__mutmut_1"""


@dataclass
class ModuleScore:
    module: str
    statuses: Counter[str] = field(default_factory=Counter)
    survivors: list[str] = field(default_factory=list)
    not_killed: list[str] = field(default_factory=list)
    """Names of the survivors and of the mutants never run."""
    functions: dict[str, list[int]] = field(default_factory=dict)
    """[mutants tried, killed] per function (mutmut's name for it, x_name or
    xǁClassǁmethod), what --record keeps so a run of changed functions can be judged."""

    @property
    def total(self) -> int:
        """Mutants tried: those of an interrupted run that were never run are left out."""
        return sum(n for status, n in self.statuses.items() if status not in _NOT_RUN)

    @property
    def unchecked(self) -> int:
        return sum(self.statuses[status] for status in _NOT_RUN)

    @property
    def killed(self) -> int:
        return sum(n for status, n in self.statuses.items() if status in _KILLED)

    @property
    def score(self) -> float:
        return 100.0 * self.killed / self.total if self.total else 100.0


def settings() -> dict[str, Any]:
    """pyproject.toml's [tool.mutmut]."""
    return dict(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"])


def scope() -> list[str]:
    return list(settings()["only_mutate"])


def unit_selection() -> list[str]:
    """The unit tests, as pytest's arguments ([tool.mutmut] pytest_add_cli_args_test_selection)."""
    return list(settings()["pytest_add_cli_args_test_selection"])


def in_scope(path: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(path, pattern) for pattern in patterns)


def module_of(path: str) -> str:
    """src/gpushare/extender/binder.py -> gpushare.extender.binder"""
    return path.removeprefix("src/").removesuffix(".py").replace("/", ".")


def function_sources(source: str) -> tuple[dict[str, str], str]:
    """The text of each function mutmut mutates (top-level functions and the methods of
    top-level classes, by mutmut's names for them) and the rest of the module. Text, not
    the syntax tree: a `# pragma: no mutate` added or removed changes the mutants."""
    lines = source.splitlines()
    tree = ast.parse(source)
    functions: dict[str, str] = {}
    taken: set[int] = set()

    def keep(name: str, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        end = node.end_lineno or node.lineno
        functions[name] = "\n".join(lines[first - 1 : end])
        taken.update(range(first, end + 1))

    def skip(node: ast.stmt) -> None:
        taken.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))

    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom) or _is_docstring(node):
            # Neither is mutated: a module that moved (or whose neighbours moved) imports
            # the same objects by new paths, and its docstrings may name the new paths.
            skip(node)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            keep(f"x_{node.name}", node)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    keep(f"xǁ{node.name}ǁ{item.name}", item)
                elif _is_docstring(item):
                    skip(item)
    rest = "\n".join(line for n, line in enumerate(lines, 1) if n not in taken and line.strip())
    return functions, rest


def _is_docstring(node: ast.stmt) -> bool:
    """A string standing alone: a module's, class's or attribute's docstring."""
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def changed_functions(ref: str, path: str) -> set[str] | None:
    """mutmut's names of the functions of `path` changed (or added) since `ref`; None
    when the module changed outside its functions (constants, imports, class bodies:
    any mutant may behave differently) or is new."""
    before = subprocess.run(
        ["git", "show", f"{ref}:{renamed_from(ref).get(path, path)}"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if before.returncode != 0:
        return None
    old_functions, old_rest = function_sources(before.stdout)
    new_functions, new_rest = function_sources((ROOT / path).read_text())
    if old_rest != new_rest:
        return None
    return {name for name, text in new_functions.items() if old_functions.get(name) != text}


def renamed_from(ref: str) -> dict[str, str]:
    """Each module of src/ moved since `ref`: its path now -> its path then. A module
    that moved keeps its functions, so only those whose text changed are run again."""
    diff = subprocess.run(
        ["git", "diff", "--find-renames", "--name-status", ref, "--", "src/"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    moves = (line.split("\t") for line in diff.stdout.splitlines() if line.startswith("R"))
    return {fields[2]: fields[1] for fields in moves if len(fields) == 3}


def changed_since(ref: str) -> list[str]:
    known = subprocess.run(
        ["git", "rev-parse", "--quiet", "--verify", f"{ref}^{{commit}}"],
        cwd=ROOT, capture_output=True, check=False,
    )  # fmt: skip
    if known.returncode != 0:
        print(f"mutation: {ref} is not a commit of this clone (shallow?): nothing to compare with")
        return []
    diff = subprocess.run(
        ["git", "diff", "--name-only", ref, "--", "src/"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return [p for p in diff.stdout.split() if p.endswith(".py") and (ROOT / p).exists()]


def targets(args: argparse.Namespace) -> list[str]:
    patterns = scope()
    if args.changed_since:
        return [p for p in changed_since(args.changed_since) if in_scope(p, patterns)]
    if args.paths:
        paths = [str(Path(p).resolve().relative_to(ROOT)) for p in args.paths]
        outside = [p for p in paths if not in_scope(p, patterns)]
        if outside:
            sys.exit(
                f"not in the mutation scope ([tool.mutmut] only_mutate in pyproject.toml): "
                f"{', '.join(outside)}"
            )
        return paths
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "src").rglob("*.py")
                  if in_scope(str(p.relative_to(ROOT)), patterns))  # fmt: skip


def dotted(path: Path) -> str:
    """src/gpushare/placement/fit.py -> gpushare.placement.fit, tests/core/test_fit.py ->
    tests.core.test_fit, a package's __init__.py -> the package."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    parts = parts[1:] if parts[0] == "src" else parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """The modules `path` imports, by absolute name, at any depth of its code: `from a
    import b` names both a and a.b (b may be a module of package a, or a name in a)."""
    module = dotted(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


@dataclass
class Imports:
    """What each module of src/ and tests/ imports (imports_of)."""

    of: dict[str, set[str]]
    packages: set[str]
    """The modules that are packages (an __init__.py)."""
    paths: dict[str, str] = field(default_factory=dict)
    """Each module's file, relative to ROOT."""


def import_graph() -> Imports:
    files = [*(ROOT / "src").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]
    return Imports(
        of={dotted(p): imports_of(p) for p in files},
        packages={dotted(p) for p in files if p.name == "__init__.py"},
        paths={dotted(p): str(p.relative_to(ROOT)) for p in files},
    )


def _is_test_side(module: str) -> bool:
    return module == "tests" or module.startswith("tests.")


def reached(test: str, graph: Imports) -> set[str]:
    """The modules test module `test` imports: its own imports, and those of the helpers
    of tests/ and the conftest.py files it runs with (transitively) and of the packages
    it imports from (a name imported from a package comes from its __init__.py's imports).
    Not what the modules of src/ import in turn: that closure is nearly all of src/."""
    parts = test.split(".")
    todo = [test, *(".".join([*parts[:n], "conftest"]) for n in range(1, len(parts)))]
    seen: set[str] = set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        if _is_test_side(module) or module in graph.packages:
            todo.extend(graph.of.get(module, ()))
    return seen


def importers(modules: set[str], graph: Imports) -> set[str]:
    """The modules of src/ that import one of `modules`."""
    return {m for m, names in graph.of.items() if not _is_test_side(m) and names & modules}


def _is_path(argument: str) -> bool:
    """Whether a pytest argument names tests (not an option, nor an option's value)."""
    return not argument.startswith("-") and (ROOT / argument).exists()


def test_files(selection: list[str]) -> list[Path]:
    """The test files of a pytest selection (paths and --ignore=PATH, as configured)."""
    ignored = [ROOT / a.removeprefix("--ignore=") for a in selection if a.startswith("--ignore=")]
    files: list[Path] = []
    for root in (ROOT / a for a in selection if _is_path(a)):
        files += [root] if root.is_file() else sorted(root.rglob("test_*.py"))
    return [f for f in files if not any(f == i or i in f.parents for i in ignored)]


def test_reach(graph: Imports) -> dict[str, set[str]]:
    """What each test module of the unit suite imports (reached)."""
    return {dotted(f): reached(dotted(f), graph) for f in test_files(unit_selection())}


def selection(
    modules: list[str], graph: Imports, reach: dict[str, set[str]], at_least: dict[str, int]
) -> tuple[list[str], dict[str, int]]:
    """The test files of the unit suite that import each of `modules` (through tests/'s
    helpers and conftest.py files too); for a module no test file imports, or one to
    take `at_least` some steps (prepared), also those that import a module of src/
    importing it, and so on, up to HOPS such steps. Returns the files, and the steps
    each module took. Those are the tests written for the module; a test that reaches
    it only through other modules (the simulator's, through the placement policies) is
    left out, which the retry on the suite makes good where it mattered."""
    chosen: set[str] = set()
    steps: dict[str, int] = {}
    for module in modules:
        wanted = {module}
        for step in range(HOPS + 1):
            found = {test for test, names in reach.items() if names & wanted}
            steps[module] = step
            if found and step >= at_least.get(module, 0):
                break
            wanted |= importers(wanted, graph)
        chosen |= found
    return sorted(graph.paths[test] for test in chosen), steps


def selected_tests(modules: list[str], graph: Imports | None = None) -> list[str]:
    """The test files of `modules`, each at the fewest steps (selection)."""
    graph = graph or import_graph()
    return selection(modules, graph, test_reach(graph), {})[0]


@dataclass(frozen=True)
class Space:
    """Where mutmut works (in root/mutants) and the [tool.mutmut] settings it is given
    instead of pyproject.toml's."""

    root: Path
    overrides: dict[str, list[str]] = field(default_factory=dict)

    @property
    def narrow(self) -> bool:
        return "pytest_add_cli_args_test_selection" in self.overrides


def suite_space() -> Space:
    """mutmut as pyproject.toml configures it, in ./mutants."""
    return Space(ROOT)


def narrow_space(paths: list[str], tests: list[str]) -> Space:
    """mutmut in NARROW, made afresh: it mutates only `paths` (seconds, not the scope's
    minute) and maps only `tests` to the mutants (its stats run and clean run cover
    them only). NARROW links the checkout's files mutmut copies, so its copy is the
    checkout's as ./mutants is; the settings are kept for --no-run and --retest."""
    root = ROOT / NARROW
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    config = settings()
    for entry in {"pyproject.toml", "tests", *config["source_paths"], *config["also_copy"]}:
        name = Path(entry).parts[0]
        if (ROOT / name).exists() and not (root / name).is_symlink():
            (root / name).symlink_to(ROOT / name)
    options = [a for a in unit_selection() if not _is_path(a) and not a.startswith("--ignore=")]
    space = Space(
        root, {"only_mutate": paths, "pytest_add_cli_args_test_selection": [*tests, *options]}
    )
    (root / "space.json").write_text(json.dumps(space.overrides, indent=2) + "\n")
    return space


def kept_narrow_space() -> Space:
    """The NARROW of the last --tests imports run, for --no-run and --retest."""
    kept = ROOT / NARROW / "space.json"
    if not kept.exists():
        sys.exit(f"mutation: nothing kept in {NARROW}: run without --no-run or --retest first")
    return Space(ROOT / NARROW, json.loads(kept.read_text()))


_NO_MATCH = "Filtered for specific mutants, but nothing matches"
"""mutmut's refusal of a run whose names match no mutant (changed functions it has
nothing to mutate in: a docstring, `# pragma: no mutate` lines)."""


def mutmut(
    *args: str, quiet: bool = False, space: Space | None = None, until: float | None = None
) -> str:
    """Runs mutmut in `space` (default ./mutants) and returns what it printed when
    `quiet`; stops it at `until` (time.monotonic()), its results so far kept."""
    space = space or suite_space()
    env = {**os.environ, "GPUSHARE_MUTMUT_OVERRIDES": json.dumps(space.overrides)}
    run, stopped = _call([sys.executable, str(DRIVER), *args], space.root, env, quiet, until)
    if stopped:
        print(f"mutation: the budget is spent: mutmut {args[0]} stopped", flush=True)
    elif run.returncode != 0 and args[0] == "run" and _NO_MATCH in run.stderr:
        print("mutation: the functions named have no mutants")
    elif run.returncode != 0:
        sys.exit(f"mutmut {' '.join(args[:4])} failed (exit {run.returncode})\n{run.stderr}")
    else:
        sys.stderr.write(run.stderr)
    return run.stdout or ""


def _call(
    command: list[str], cwd: Path, env: dict[str, str], quiet: bool, until: float | None
) -> tuple[subprocess.CompletedProcess[str], bool]:
    """The command's run, and whether it was stopped at `until`: with SIGINT, which
    mutmut answers by stopping its mutants and saving what it has, then SIGKILL to its
    whole process group (the fork server and its children) if it has not ended."""
    process = subprocess.Popen(
        command, cwd=cwd, env=env, text=True, start_new_session=True,
        stdout=subprocess.PIPE if quiet else None, stderr=subprocess.PIPE,
        preexec_fn=_interruptible,
    )  # fmt: skip
    stopped = False
    try:
        out, err = process.communicate(timeout=None if until is None else until - time.monotonic())
    except (subprocess.TimeoutExpired, ValueError):  # ValueError: `until` already past
        stopped = True
        process.send_signal(signal.SIGINT)
        try:
            out, err = process.communicate(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
    return subprocess.CompletedProcess(command, process.returncode, out, err), stopped


def _interruptible() -> None:
    """In the child: SIGINT as Python has it by default. A shell starts a background job
    with SIGINT ignored and children inherit that, so a run started with `&` or nohup
    could not be stopped at its budget, nor could the tests' own pytest children."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def refresh_copied_sources(space: Space) -> None:
    """Copies src/'s other files (the interposer's C sources) over mutmut's copy in
    mutants/: mutmut renews the Python files it mutates and keeps the rest as they were
    at its first run, and tests that build the C library from a stale copy fail the
    stats run ("failed to collect stats", with nothing said)."""
    copy = space.root / "mutants" / "src"
    if not copy.is_dir():
        return  # mutmut's first run copies everything
    for source in (ROOT / "src").rglob("*"):
        if source.is_file() and source.suffix not in (".py", ".pyc"):
            target = copy / source.relative_to(ROOT / "src")
            if not target.exists() or target.read_bytes() != source.read_bytes():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)


def statuses(space: Space) -> dict[str, str]:
    """Each mutant mutmut keeps in `space`, and its status; in NARROW, with the status
    the suite gave those retried on it (retried)."""
    found: dict[str, str] = {}
    for line in mutmut("results", "--all", "true", quiet=True, space=space).splitlines():
        match = _RESULT.match(line)
        if match is not None:
            found[match["name"]] = match["status"]
    overlay = space.root / "retried.json"
    return {**found, **json.loads(overlay.read_text())} if overlay.exists() else found


def scores(modules: list[str], found: dict[str, str]) -> list[ModuleScore]:
    by_module = {m: ModuleScore(m) for m in modules}
    for name, status in found.items():
        named = _FUNCTION.match(name)
        if named is None or named["module"] not in by_module:
            continue
        result = by_module[named["module"]]
        result.statuses[status] += 1
        tally = result.functions.setdefault(named["function"], [0, 0])
        if status not in _NOT_RUN:
            tally[0] += 1
        if status in _KILLED:
            tally[1] += 1
        else:
            result.not_killed.append(name)
            if status not in _NOT_RUN:
                result.survivors.append(f"{name} ({status})")
    return list(by_module.values())


def wanted(found: dict[str, str], changed: dict[str, set[str] | None]) -> list[str]:
    """The mutants of the changed functions of each module (of all of it for None)."""
    names = []
    for name in found:
        named = _FUNCTION.match(name)
        if named is not None and named["module"] in changed:
            functions = changed[named["module"]]
            if functions is None or named["function"] in functions:
                names.append(name)
    return names


def costs(space: Space, names: list[str]) -> dict[str, float]:
    """Each mutant's estimated seconds: its start and TESTS_SHARE of what the tests that
    reach its function took in mutmut's stats run."""
    kept = space.root / "mutants" / "mutmut-stats.json"
    stats = json.loads(kept.read_text()) if kept.exists() else {}
    tests = stats.get("tests_by_mangled_function_name", {})
    took = stats.get("duration_by_test", {})
    return {
        name: MUTANT_START_S
        + TESTS_SHARE
        * sum(took.get(test, 0.0) for test in tests.get(name.partition("__mutmut_")[0], []))
        for name in names
    }


def sample(estimates: dict[str, float], seconds: float, max_children: int) -> list[str]:
    """All the mutants when their estimated time fits `seconds`; else those a fixed order
    (by a hash of each name) takes until the time is full: the same change runs the same
    mutants on every machine, and each function keeps about its share of them."""
    room = seconds * max_children
    if sum(estimates.values()) <= room:
        return list(estimates)
    chosen: list[str] = []
    for name in sorted(estimates, key=lambda n: hashlib.sha256(n.encode()).hexdigest()):
        if estimates[name] <= room:
            chosen.append(name)
            room -= estimates[name]
    return chosen


def run_mutants(
    space: Space, names: list[str], max_children: int, until: float | None, share: float = 1.0
) -> None:
    """Runs the mutants named, or the sample of them `share` of the time left allows."""
    estimates = costs(space, names)
    if until is not None:
        seconds = (until - time.monotonic()) * share
        chosen = sample(estimates, seconds, max_children)
        if len(chosen) < len(names):
            print(
                f"mutation: the budget leaves {seconds:.0f} s for mutants: a fixed sample of "
                f"{len(chosen)} of the {len(names)} runs, the others are reported as not run",
                flush=True,
            )
        names = chosen
    if names:
        started = time.monotonic()
        mutmut("run", "--max-children", str(max_children), *names, space=space, until=until)
        # What calibrates the estimates (MUTANT_START_S, TESTS_SHARE), in CI's log.
        estimate = sum(estimates[name] for name in names) / max_children
        print(
            f"mutation: {len(names)} mutant(s) took {time.monotonic() - started:.0f} s "
            f"(estimated {estimate:.0f} s)",
            flush=True,
        )


def below_record(result: ModuleScore, changed: set[str] | None, recorded: Recorded) -> bool:
    """Whether this run killed a smaller share of the mutants it ran (of the changed
    functions, or of the whole module) than the record says the suite kills of the same
    functions: what a module judged on its test files alone is told of (the suite may
    kill the difference). A function or module never recorded: any not killed."""
    record = recorded.get(result.module, {})
    if changed is None or "functions" not in record:
        return result.score < float(record.get("score", 100.0))
    mutants = killed = expected_mutants = expected_killed = 0
    for function, (tried, hit) in result.functions.items():
        if function in changed and tried:
            mutants, killed = mutants + tried, killed + hit
            was = record["functions"].get(function, [tried, tried])
            expected_mutants, expected_killed = expected_mutants + was[0], expected_killed + was[1]
    return killed * expected_mutants < expected_killed * mutants


def retry_on_suite(
    narrow: Space, found: dict[str, str], failing: list[str], max_children: int, until: float | None
) -> dict[str, str]:
    """The statuses of a --tests imports run, with the mutants it ran and did not kill of
    the modules `failing` (FAILED on it) run again on the whole unit suite: a test
    elsewhere may kill what the importing files miss, and a module is not to fail on
    tests that were not run. No other module needs it: more tests kill no fewer mutants,
    so a module that passes on its selection passes on the suite."""
    names = [
        name
        for result in scores(failing, found)
        for name in result.not_killed
        if found[name] not in _NOT_RUN
    ]
    if not names:
        return found
    if until is not None and until <= time.monotonic():
        print(f"mutation: no budget left to retry {len(names)} mutant(s) on the whole suite")
        return found
    print(
        f"mutation: {', '.join(failing)} failing on the test files that import them: "
        f"their {len(names)} mutant(s) not killed are retried on the whole unit suite",
        flush=True,
    )
    suite = suite_space()
    refresh_copied_sources(suite)
    mutmut("prepare", str(max_children), space=suite, until=until)
    if until is None or until > time.monotonic():
        mutmut("run", "--max-children", str(max_children), *names, space=suite, until=until)
    again = statuses(suite)
    retried = {n: again[n] for n in names if again.get(n, "not checked") not in _NOT_RUN}
    kept = narrow.root / "retried.json"
    before = json.loads(kept.read_text()) if kept.exists() else {}
    kept.write_text(json.dumps({**before, **retried}, indent=2) + "\n")
    return {**found, **retried}


def forget_retried(space: Space, names: list[str]) -> None:
    """Drops the suite's statuses of mutants about to run again in NARROW (--retest):
    their new status is this run's."""
    kept = space.root / "retried.json"
    if space.narrow and kept.exists():
        retried = json.loads(kept.read_text())
        kept.write_text(json.dumps({n: s for n, s in retried.items() if n not in names}) + "\n")


def judged(result: ModuleScore, changed: set[str], path: str, recorded: Recorded) -> ModuleScore:
    """The module as its record stands with the changed functions' figures taken from
    this run (and functions no longer in the module dropped): the score the module
    would have after a full run, without running the functions nobody touched."""
    record = recorded.get(result.module, {}).get("functions")
    if record is None:
        return result
    present, _ = function_sources((ROOT / path).read_text())
    estimate = ModuleScore(result.module, survivors=result.survivors)
    for function in present:
        fresh = result.functions.get(function, [0, 0])
        mutants, killed = fresh if function in changed else record.get(function, fresh)
        estimate.functions[function] = [mutants, killed]
        estimate.statuses["killed"] += killed
        estimate.statuses["survived"] += mutants - killed
    return estimate


def report(results: list[ModuleScore], diff: Callable[[str], str] | None) -> None:
    width = max(len(r.module) for r in results)
    print(f"\n{'module':<{width}}  mutants  killed  survived  timeout  no-tests   score")
    for r in results:
        s = r.statuses
        print(
            f"{r.module:<{width}}  {r.total:>7}  {s['killed'] + s['caught by type check']:>6}  "
            f"{s['survived']:>8}  {s['timeout']:>7}  {s['no tests']:>8}  {r.score:>5.1f}%"
            + (f"  ({r.unchecked} not run yet)" if r.unchecked else "")
        )
    total = sum(r.total for r in results)
    killed = sum(r.killed for r in results)
    print(f"{'all':<{width}}  {total:>7}  {killed:>6}  {'':>8}  {'':>7}  {'':>8}  "
          f"{100.0 * killed / total if total else 100.0:>5.1f}%")  # fmt: skip
    for r in results:
        for survivor in r.survivors:
            print(f"\nsurvived: {survivor}")
            if diff is not None:
                print(diff(survivor.split(" ", 1)[0]).rstrip())


def diff_in(space: Space) -> Callable[[str], str]:
    """A mutant's diff, from the mutmut that ran it last: the suite's for one retried."""
    kept = space.root / "retried.json"
    retried = json.loads(kept.read_text()) if space.narrow and kept.exists() else {}

    def diff(name: str) -> str:
        return mutmut("show", name, quiet=True, space=suite_space() if name in retried else space)

    return diff


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("paths", nargs="*", help="modules of the scope (default: all of it)")
    parser.add_argument("--changed-since", metavar="REF", help="only modules changed since REF")
    parser.add_argument(
        "--check", action="store_true", help=f"exit 1 under {BAR:.0f}%% and under the record"
    )
    parser.add_argument("--record", action="store_true", help=f"write the scores to {RECORD.name}")
    parser.add_argument("--no-diffs", action="store_true", help="list survivors without diffs")
    parser.add_argument(
        "--no-run", action="store_true", help="report the results kept in mutants/, run nothing"
    )
    parser.add_argument("--retest", action="store_true", help="run only the mutants not killed yet")
    parser.add_argument("--max-children", type=int, default=2, help="parallel mutants (2)")
    parser.add_argument(
        "--tests",
        choices=["imports", "suite"],
        help="the test files importing the modules (default with --changed-since), or the suite",
    )
    parser.add_argument(
        "--budget-s",
        type=int,
        metavar="S",
        help=f"seconds the run may take ({BUDGET_S} with --changed-since, else none; 0: none)",
    )
    args = parser.parse_args()
    if args.tests is None:
        args.tests = "imports" if args.changed_since and not args.record else "suite"
    if args.record and args.tests == "imports":
        parser.error("--record keeps the whole suite's figures: it takes --tests suite")
    if args.record and args.budget_s:
        parser.error("--record keeps figures of every mutant: it takes no --budget-s")
    if args.budget_s is None:
        args.budget_s = BUDGET_S if args.changed_since and not args.record else 0
    return args


def mutate(
    args: argparse.Namespace,
    paths: list[str],
    changed: dict[str, set[str] | None],
    until: float | None,
) -> tuple[Space, dict[str, str]]:
    """Runs what the arguments ask for; returns where, and each mutant's status there."""
    if args.no_run or args.retest:
        space = kept_narrow_space() if args.tests == "imports" else suite_space()
        if args.no_run:
            return space, statuses(space)
        refresh_copied_sources(space)
        names = [name for r in scores(list(changed), statuses(space)) for name in r.not_killed]
        forget_retried(space, names)
        print(f"mutation: retesting {len(names)} mutant(s) not killed yet", flush=True)
    else:
        started = time.monotonic()
        space = prepared(args, paths, changed, until)
        names = wanted(statuses(space), changed)
        print(f"mutation: mutants made, tests mapped: {time.monotonic() - started:.0f} s")
        if not names:
            print("mutation: the functions named have no mutants")
    # A --tests imports run leaves time to retry on the suite what its tests missed.
    share = 1 - RETRY_SHARE if space.narrow else 1.0
    run_mutants(space, names, args.max_children, until, share)
    return space, statuses(space)


def prepared(
    args: argparse.Namespace,
    paths: list[str],
    changed: dict[str, set[str] | None],
    until: float | None,
) -> Space:
    """Where mutmut has made the mutants and mapped the tests: ./mutants for --tests
    suite, else NARROW with the test files importing the modules (selection). A module
    with a changed function none of those reaches (mutmut's map) takes one step more,
    as long as HOPS allows: a test file that imports one class of a module (the cache's
    rooms import FilteredPods alone) says nothing of the module's others."""
    if args.tests == "imports":
        graph = import_graph()
        reach, at_least = test_reach(graph), dict.fromkeys(changed, 0)
        while True:
            tests, steps = selection(list(changed), graph, reach, at_least)
            print(f"mutation: the tests: {len(tests)} file(s): {' '.join(tests)}", flush=True)
            if not tests:
                print("mutation: no test file imports them: the whole suite runs", flush=True)
                break
            space = narrow_space(paths, tests)
            mutmut("prepare", str(args.max_children), space=space, until=until)
            missed = unreached(space, wanted(statuses(space), changed))
            wider = sorted(m for m in missed if steps[m] < HOPS)
            if not wider:
                return space
            print(f"mutation: no test file of {', '.join(wider)} reaches a changed function: "
                  "adding those that import what imports it", flush=True)  # fmt: skip
            at_least.update({m: steps[m] + 1 for m in wider})
    space = suite_space()
    refresh_copied_sources(space)
    mutmut("prepare", str(args.max_children), space=space, until=until)
    return space


def unreached(space: Space, names: list[str]) -> set[str]:
    """The modules of the mutants named whose function no test reaches, by the map
    mutmut made of the tests to the functions (mutants/mutmut-stats.json)."""
    kept = space.root / "mutants" / "mutmut-stats.json"
    stats = json.loads(kept.read_text()) if kept.exists() else {}
    tests = stats.get("tests_by_mangled_function_name", {})
    return {
        named["module"]
        for name in names
        if (named := _FUNCTION.match(name)) is not None
        and not tests.get(name.partition("__mutmut_")[0])
    }


def judge(
    found: dict[str, str],
    paths: list[str],
    changed: dict[str, set[str] | None],
    recorded: Recorded,
) -> list[ModuleScore]:
    """Each module's score: of the run, or of its record with its changed functions'
    figures taken from the run (judged)."""
    results = scores(list(changed), found)
    return [
        r if functions is None else judged(r, functions, p, recorded)
        for r, p, functions in zip(results, paths, changed.values(), strict=True)
    ]


def main() -> int:
    started = time.monotonic()
    args = arguments()
    paths = targets(args)
    if not paths:
        print("mutation: no module of the scope to test")
        return 0
    modules = [module_of(p) for p in paths]
    # Per module, the functions changed since the ref (None: all of the module).
    changed = {
        module_of(p): changed_functions(args.changed_since, p) if args.changed_since else None
        for p in paths
    }
    print(f"mutation: {len(modules)} module(s): {', '.join(modules)}", flush=True)
    for module, functions in changed.items():
        if functions is not None:
            print(f"mutation: {module}: changed functions: {', '.join(sorted(functions)) or '-'}")
    recorded = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    until = started + args.budget_s if args.budget_s else None
    space, found = mutate(args, paths, changed, until)
    results = judge(found, paths, changed, recorded)
    failing = [r.module for r in results if verdict(r, recorded).startswith("FAILED")]
    if space.narrow and failing and not args.no_run:
        found = retry_on_suite(space, found, failing, args.max_children, until)
        results = judge(found, paths, changed, recorded)
    report(results, None if args.no_diffs else diff_in(space))
    if space.narrow:
        for r in scores(modules, found):
            if below_record(r, changed[r.module], recorded):
                print(
                    f"{r.module}: judged on the test files that import it, which kill less of "
                    "it than the record says the suite does (--tests suite: the suite's figures)"
                )
    if args.record:
        for r in results:
            if r.unchecked:
                print(f"{r.module}: not recorded, {r.unchecked} mutants were never run")
                continue
            recorded[r.module] = {
                "mutants": r.total,
                "killed": r.killed,
                "score": round(r.score, 1),
                "functions": dict(sorted(r.functions.items())),
            }
        RECORD.write_text(json.dumps(dict(sorted(recorded.items())), indent=2) + "\n")
        print(f"\nrecorded in {RECORD.relative_to(ROOT)}")
    verdicts = [(r, verdict(r, recorded)) for r in results]
    for r, v in verdicts:
        if v != "ok":
            print(f"{r.module}: {r.score:.1f}% killed, {v}")
    took = time.monotonic() - started
    print(f"mutation: {took:.0f} s" + (f" of the {args.budget_s} s budget" if until else ""))
    failed = [r for r, v in verdicts if v.startswith("FAILED")]
    return 1 if failed and args.check else 0


def verdict(result: ModuleScore, recorded: dict[str, dict[str, float]]) -> str:
    """ok at or over the bar; under it, a module must not fall below its record. One
    never recorded is only reported until a full run records it (docs/testing.md)."""
    if result.score >= BAR:
        return "ok"
    if result.module not in recorded:
        return f"under the bar ({BAR:.0f}%), no record yet: run scripts/mutation --record"
    record = float(recorded[result.module]["score"])
    if result.score < record:
        return f"FAILED: under the bar ({BAR:.0f}%) and below its record ({record:.1f}%)"
    return f"under the bar ({BAR:.0f}%), not below its record ({record:.1f}%)"


if __name__ == "__main__":
    sys.exit(main())
