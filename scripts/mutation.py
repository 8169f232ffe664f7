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

Prints per module: mutants, killed, survived, timed out, no tests, the score
(killed + timed out over all mutants), then each survivor with its diff. mutmut
works in ./mutants (a copy of src/ and tests/; the checkout is never changed) and
keeps its results there: `--no-run` reports them, `--retest` runs again only what a
new test may kill. A plain run retests every mutant of the modules named, so a
module's score always comes from the tests as they are now.

A mutant a test can never kill (an equivalent mutant) is marked in the source
with `# pragma: no mutate` and a reason on the same line; mutmut does not make it.
"""

import argparse
import ast
import fnmatch
import json
import re
import shutil
import subprocess
import sys
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BAR = 85.0
"""Percent of mutants killed that every module of the scope must reach."""
RECORD = ROOT / "docs" / "mutation-scores.json"
"""The last full run's score per module: what --check holds a module under the bar to."""

_KILLED = {"killed", "timeout", "caught by type check", "segfault"}
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
        return sum(n for status, n in self.statuses.items() if status != "not checked")

    @property
    def unchecked(self) -> int:
        return self.statuses["not checked"]

    @property
    def killed(self) -> int:
        return sum(n for status, n in self.statuses.items() if status in _KILLED)

    @property
    def score(self) -> float:
        return 100.0 * self.killed / self.total if self.total else 100.0


def scope() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    return list(config["only_mutate"])


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


_NO_MATCH = "Filtered for specific mutants, but nothing matches"
"""mutmut's refusal of a run whose names match no mutant (changed functions it has
nothing to mutate in: a docstring, `# pragma: no mutate` lines)."""


def mutmut(*args: str, quiet: bool = False) -> str:
    run = subprocess.run(
        [sys.executable, "-m", "mutmut", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE if quiet else None,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    if run.returncode != 0 and args[0] == "run" and _NO_MATCH in run.stderr:
        print("mutation: the functions named have no mutants")
    elif run.returncode != 0:
        sys.exit(f"mutmut {' '.join(args)} failed (exit {run.returncode})\n{run.stderr}")
    else:
        sys.stderr.write(run.stderr)
    return run.stdout or ""


def refresh_copied_sources() -> None:
    """Copies src/'s other files (the interposer's C sources) over mutmut's copy in
    mutants/: mutmut renews the Python files it mutates and keeps the rest as they were
    at its first run, and tests that build the C library from a stale copy fail the
    stats run ("failed to collect stats", with nothing said)."""
    copy = ROOT / "mutants" / "src"
    if not copy.is_dir():
        return  # mutmut's first run copies everything
    for source in (ROOT / "src").rglob("*"):
        if source.is_file() and source.suffix not in (".py", ".pyc"):
            target = copy / source.relative_to(ROOT / "src")
            if not target.exists() or target.read_bytes() != source.read_bytes():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)


def scores(modules: list[str]) -> list[ModuleScore]:
    by_module = {m: ModuleScore(m) for m in modules}
    for line in mutmut("results", "--all", "true", quiet=True).splitlines():
        match = _RESULT.match(line)
        named = _FUNCTION.match(match["name"]) if match is not None else None
        if match is None or named is None or named["module"] not in by_module:
            continue
        name, status, result = match["name"], match["status"], by_module[named["module"]]
        result.statuses[status] += 1
        tally = result.functions.setdefault(named["function"], [0, 0])
        if status != "not checked":
            tally[0] += 1
        if status in _KILLED:
            tally[1] += 1
        else:
            result.not_killed.append(name)
            if status != "not checked":
                result.survivors.append(f"{name} ({status})")
    return list(by_module.values())


def judged(result: ModuleScore, changed: set[str], path: str, recorded: dict) -> ModuleScore:
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


def report(results: list[ModuleScore], show_diffs: bool) -> None:
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
            if show_diffs:
                print(mutmut("show", survivor.split(" ", 1)[0], quiet=True).rstrip())


def main() -> int:
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
    args = parser.parse_args()

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
    patterns = [
        pattern
        for module, functions in changed.items()
        for pattern in ([f"{module}.*"] if functions is None else
                        [f"{module}.{f}__mutmut_*" for f in sorted(functions)])
    ]  # fmt: skip
    print(f"mutation: {len(modules)} module(s): {', '.join(modules)}", flush=True)
    for module, functions in changed.items():
        if functions is not None:
            print(f"mutation: {module}: changed functions: {', '.join(sorted(functions)) or '-'}")
    if not args.no_run:
        refresh_copied_sources()
    if args.retest:
        names = [name for r in scores(modules) for name in r.not_killed]
        print(f"mutation: retesting {len(names)} mutant(s) not killed yet", flush=True)
        if names:
            mutmut("run", "--max-children", str(args.max_children), *names)
    elif not args.no_run and patterns:
        mutmut("run", "--max-children", str(args.max_children), *patterns)
    recorded = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    results = [
        r if changed[r.module] is None else judged(r, changed[r.module], p, recorded)
        for r, p in zip(scores(modules), paths, strict=True)
    ]
    report(results, show_diffs=not args.no_diffs)
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
