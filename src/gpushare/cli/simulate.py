"""`gpushare simulate`: replay an openb trace through the placement policies.

The harness of docs/placement.md#the-benchmark (Weng et al., ATC'23): for each seed the
trace is shuffled and inflated to 130% of the cluster's GPU capacity, pods are
offered once each in that order, ties go to a seeded node rank, and metrics are
taken after every pod. The policies are the extender's own (gpushare.placement.policies).
Workload-aware policies (fgd and ours) use the trace's target workload by
default, as the paper does; add @learned to a name to have it learn the workload
online from the pods it sees, as it does in the extender.

--mix NAME replays a workload mix instead of the pod list as it is: the FGD
paper's variants (more sharing pods, more multi-GPU pods, GPU-model-constrained
pods, more or fewer CPU-only pods), drawn from --pods with --mix-seed
(docs/placement.md#workload-mixes). --write-pods FILE writes the pod list a run
would use and exits; `--pods FILE` then replays exactly that list.

It prints one row per policy and, under the table, what each column means; --json FILE
keeps every figure, per seed too. The plot of unallocated GPU against arrived workload
goes to placement-unallocated.png in the current directory (--plot FILE: elsewhere,
--no-plot: nowhere) when matplotlib, the package's plot extra, is installed. On a
terminal, stderr shows a progress bar per run (policy and seed).
"""

import argparse
import json
import os
import sys
import textwrap
import time
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from importlib import resources
from multiprocessing import get_context
from multiprocessing.queues import Queue
from pathlib import Path

from gpushare.cli.progress import RunBars, Sink, relayed, throttled
from gpushare.placement.policies import OUR_POLICY
from gpushare.simulator.arrival import DEFAULT_SEEDS, INFLATION
from gpushare.simulator.dra import DraMode, dra_config
from gpushare.simulator.kubescheduler import PROFILES as KUBE_PROFILES
from gpushare.simulator.kubescheduler import KubeSchedulerConfig
from gpushare.simulator.mixes import DEFAULT_MIX_SEED, MIXES, Mix, generate
from gpushare.simulator.mixes import parse as parse_mix
from gpushare.simulator.report import legend, summarise, table, to_json
from gpushare.simulator.run import PolicyChoice, RunResult, simulate
from gpushare.simulator.trace import Trace, TraceError, load, pod_rows
from gpushare.table import render

DEFAULT_POLICIES = (OUR_POLICY, "fgd", "bestfit")
DEFAULT_PLOT = Path("placement-unallocated.png")
WIDTH = 100
"""Columns the printed results fit in, the table and its legend included."""
MATPLOTLIB = "matplotlib (the package's plot extra: pip install 'matplotlib>=3.8')"


def default_trace_dir() -> Path:
    """The openb trace shipped as package data (see pyproject.toml)."""
    return Path(str(resources.files("gpushare.cli") / "data" / "openb"))


def register(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = commands.add_parser(
        "simulate",
        help="replay the openb GPU-sharing trace through the placement policies",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    traces = default_trace_dir()
    parser.add_argument(
        "--nodes",
        type=Path,
        default=traces / "openb_node_list_gpu_node.csv",
        help="node list CSV (columns sn,cpu_milli,memory_mib,gpu,model; "
        "default: the repository's data/openb copy)",
    )
    parser.add_argument(
        "--pods",
        type=Path,
        default=traces / "openb_pod_list_default.csv",
        help="pod list CSV (columns name,cpu_milli,memory_mib,num_gpu,gpu_milli and "
        "optionally gpu_spec; default: the repository's data/openb copy)",
    )
    parser.add_argument(
        "--mix",
        type=_mix,
        metavar="NAME",
        help="replay a workload mix drawn from --pods instead of --pods as it is: "
        f"{', '.join(MIXES)}",
    )
    parser.add_argument(
        "--mix-seed",
        type=int,
        default=DEFAULT_MIX_SEED,
        help="seed the mix is drawn with; the same seed gives the same pods (default: %(default)s)",
    )
    parser.add_argument(
        "--write-pods",
        type=Path,
        metavar="FILE",
        help="write the pod list the runs would use (after --mix) as an openb CSV and exit",
    )
    parser.add_argument(
        "--policies",
        type=_policies,
        default=[PolicyChoice.parse(p) for p in DEFAULT_POLICIES],
        help="comma-separated policy names from the extender's registry, each optionally "
        "NAME@learned (workload learned online) or NAME@trace (the trace's; the default) "
        f"(default: {','.join(DEFAULT_POLICIES)})",
    )
    parser.add_argument(
        "--seeds",
        type=_seeds,
        default=list(DEFAULT_SEEDS),
        help="seeds, as a list and/or ranges: 42-51 or 42,45,50-51 (default: 42-51)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="runs in parallel, one process each (default: all cores, here %(default)s)",
    )
    parser.add_argument(
        "--inflation",
        type=float,
        default=INFLATION,
        help="pods arrive until they request this multiple of the GPU capacity "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--kube-scheduler",
        choices=sorted(KUBE_PROFILES),
        metavar="PROFILE",
        help="let a model of kube-scheduler choose the nodes, the policy's scores its "
        "extender's (docs/placement.md#the-kube-scheduler-model): stock (as it comes: "
        "adaptive node sample, LeastAllocated), chart-before (every node, the default "
        "plugins) or chart (the chart's profile); default: the paper's scheduler",
    )
    parser.add_argument(
        "--dra",
        choices=[m.value for m in DraMode],
        metavar="MODE",
        help="DRA mode (docs/dra.md): GPU pods ask for ResourceClaims and kube-scheduler's "
        "allocator picks their GPUs, the first eligible in the ResourceSlice's order, on "
        "the node kube-scheduler's model chooses (--kube-scheduler, default chart; no GPU "
        "term in NodeResourcesFit). first-fit: no extender, GPUs by index; score: our "
        "extender scores the nodes, GPUs by index; order: as score, the slice reordered for "
        "each pod so the policy's GPUs come first (an upper bound); fullest: as score, the "
        "slice reordered fullest GPU first after every change. Default: device-plugin mode",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the results as JSON")
    plot = parser.add_mutually_exclusive_group()
    plot.add_argument(
        "--plot",
        type=Path,
        metavar="FILE",
        help="write the PNG of unallocated GPU %% against arrived workload, one line per "
        f"policy, here (default: {DEFAULT_PLOT} in the current directory, when matplotlib, "
        "the package's plot extra, is installed)",
    )
    plot.add_argument("--no-plot", action="store_true", help="do not write the plot")
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="do not show progress bars (shown only when stderr is a terminal)",
    )
    parser.set_defaults(run=run)


def _policies(text: str) -> list[PolicyChoice]:
    names = [n for n in (part.strip() for part in text.split(",")) if n]
    if not names:
        raise argparse.ArgumentTypeError("give at least one policy")
    try:
        choices = [PolicyChoice.parse(n) for n in names]
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    labels = [c.label for c in choices]
    if len(set(labels)) != len(labels):
        raise argparse.ArgumentTypeError(f"a policy is named twice in {text!r}")
    return choices


def _mix(text: str) -> Mix:
    try:
        return parse_mix(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        low, dash, high = part.partition("-")
        try:
            first, last = int(low), int(high) if dash else int(low)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"seed {part!r} is not a whole number or a range like 42-51"
            ) from None
        if last < first:
            raise argparse.ArgumentTypeError(f"seed range {part!r} runs backwards")
        seeds.extend(range(first, last + 1))
    if not seeds:
        raise argparse.ArgumentTypeError("give at least one seed")
    return sorted(set(seeds))


Job = tuple[PolicyChoice, int, float, KubeSchedulerConfig | None, DraMode | None]
"""A run: policy, seed, inflation, kube-scheduler's configuration (None: the paper's), DRA
mode (None: device-plugin mode)."""

_TRACE: Trace | None = None
_SINK: Sink | None = None
"""Where runs report their progress; None when no bar is shown."""


def _set_up(trace: Trace, sink: Sink | None) -> None:
    global _TRACE, _SINK
    _TRACE, _SINK = trace, sink


def _set_up_worker(trace: Trace, queue: "Queue[tuple[str, int, int, int]] | None") -> None:
    _set_up(trace, None if queue is None else lambda *report: queue.put(report))


def _run_one(job: Job) -> RunResult:
    assert _TRACE is not None
    choice, seed, inflation, kube, dra = job
    progress = None if _SINK is None else throttled(_SINK, choice.label, seed)
    return simulate(_TRACE, choice, seed, inflation, progress, kube, dra)


def run_all(
    trace: Trace, jobs: Sequence[Job], workers: int, bars: RunBars | None = None
) -> Iterator[RunResult]:
    """Every run, in the order they finish; in this process when one worker suffices.
    While `bars` are shown, each run reports its progress to them."""
    if workers <= 1 or len(jobs) <= 1:
        _set_up(trace, bars.advance if bars is not None and bars.shown else None)
        yield from map(_run_one, jobs)
        return
    context = get_context("spawn")
    queue = context.Queue() if bars is not None and bars.shown else None
    # The trace travels to each worker once (a mix is not a file it could read).
    pool = context.Pool(
        min(workers, len(jobs)), initializer=_set_up_worker, initargs=(trace, queue)
    )
    try:
        with nullcontext() if queue is None or bars is None else relayed(queue, bars):
            yield from pool.imap_unordered(_run_one, jobs)
            # Workers that exit on their own flush their reports first; killed ones may not.
            pool.close()
            pool.join()
    finally:
        pool.terminate()


def _can_plot() -> bool:
    """Whether the `plot` extra is installed (checked before minutes of simulation)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _bad_flag(args: argparse.Namespace) -> str | None:
    """Why the flags cannot give a run, said before minutes of simulation; or None."""
    if args.workers < 1:
        return "--workers must be at least 1"
    if not 0 < args.inflation <= 10:
        return "--inflation must be in (0, 10]"
    if args.plot is not None and args.plot.suffix.lower() != ".png":
        return f"--plot {args.plot}: the plot is a PNG, name it *.png"
    if args.plot is not None and not _can_plot():
        return f"--plot {args.plot}: the plot needs {MATPLOTLIB}"
    for flag, path in (
        ("--json", args.json),
        ("--plot", args.plot),
        ("--write-pods", args.write_pods),
    ):
        problem = _unwritable(path) if path else None
        if problem:
            return f"{flag} {path}: {problem}"
    return None


def _plot_target(args: argparse.Namespace) -> tuple[Path | None, str]:
    """Where the plot goes; when it goes nowhere though --no-plot was not given, the line
    that says why. Only the default one is skipped: a --plot that cannot be made is a
    bad flag."""
    if args.no_plot:
        return None, ""
    if args.plot is not None:
        return args.plot, ""
    if not _can_plot():
        return None, f"plot: skipped, it needs {MATPLOTLIB}"
    path = Path.cwd() / DEFAULT_PLOT
    problem = _unwritable(path)
    if problem:
        return None, f"plot: skipped, {path}: {problem} (--plot FILE writes it elsewhere)"
    return path, ""


def run(args: argparse.Namespace) -> int:
    problem = _bad_flag(args)
    if problem:
        print(f"gpushare simulate: {problem}", file=sys.stderr)
        return 2
    try:
        trace = load(args.nodes, args.pods)
    except TraceError as err:  # a file that cannot be read or parsed: the run cannot start
        print(f"gpushare simulate: {err}", file=sys.stderr)
        return 1
    if args.mix is not None:
        try:
            trace = generate(trace, args.mix, args.mix_seed)
        except ValueError as err:  # the pod list lacks the pods the mix draws from
            print(f"gpushare simulate: --mix {args.mix.name}: {err}", file=sys.stderr)
            return 2
    if args.write_pods is not None:
        try:
            args.write_pods.write_text(pod_rows(trace.pods))
        except OSError as err:
            print(
                f"gpushare simulate: cannot write {err.filename}: {err.strerror}", file=sys.stderr
            )
            return 1
        print(f"gpushare simulate: {len(trace.pods)} pods of {trace.source}: {args.write_pods}")
        return 0
    if trace.requested <= 0:  # arrivals stop at a multiple of the GPU requested
        print(f"gpushare simulate: {trace.source}: the pods request no GPU", file=sys.stderr)
        return 2
    return _simulate(args, trace)


def _simulate(args: argparse.Namespace, trace: Trace) -> int:
    choices: list[PolicyChoice] = args.policies
    plot_path, plot_skipped = _plot_target(args)
    _say(
        f"gpushare simulate: {len(trace.nodes)} nodes ({trace.capacity // 1000} GPUs), "
        f"{len(trace.pods)} pods requesting {100 * trace.requested / trace.capacity:.1f}% "
        "of GPU"
    )
    _say(
        f"  policies {', '.join(c.label for c in choices)}; seeds {_seed_text(args.seeds)}; "
        f"inflation {args.inflation}; {args.workers} worker(s)"
    )
    dra = None if args.dra is None else DraMode(args.dra)
    profile = args.kube_scheduler or (None if dra is None else "chart")
    kube = None if profile is None else KUBE_PROFILES[profile]
    if kube is not None:
        scoring = kube if dra is None else dra_config(kube, dra)
        _say(f"  nodes chosen by kube-scheduler's model, {profile}: {scoring.describe()}")
    if dra is not None:
        _say(f"  DRA mode, {dra.describe()}")
    jobs: list[Job] = [(c, seed, args.inflation, kube, dra) for c in choices for seed in args.seeds]
    started = time.perf_counter()
    results: list[RunResult] = []
    bars = RunBars(len(jobs), sys.stderr, disable=True if args.no_progress else None)
    try:
        for result in run_all(trace, jobs, args.workers, bars):
            results.append(result)
            bars.finished(result.policy, result.seed)
    finally:
        bars.close()
    wall = time.perf_counter() - started
    summaries = summarise(results)
    ordered = {c.label: summaries[c.label] for c in choices}
    print()
    print(render(*table(ordered)))
    print()
    print("\n".join(legend(WIDTH)))
    print(f"\n{len(jobs)} runs in {wall:.1f} s wall")
    try:
        if args.json:
            document = to_json(trace, args.nodes, args.pods, ordered, args.inflation, wall)
            args.json.write_text(json.dumps(document, indent=2) + "\n")
            print(f"results: {args.json}")
        if plot_path is not None:
            from gpushare.simulator.plot import (
                plot,  # matplotlib loads only when a plot is made
            )

            plot(ordered, plot_path, title=f"{trace.source}, seeds {_seed_text(args.seeds)}")
            print(f"plot: {plot_path}")
    except OSError as err:
        print(f"gpushare simulate: cannot write {err.filename}: {err.strerror}", file=sys.stderr)
        return 1
    if plot_skipped:
        _say(plot_skipped)
    return 0


def _say(line: str) -> None:
    """A line of the report, wrapped to WIDTH (policy names are never split)."""
    print(textwrap.fill(line, WIDTH, subsequent_indent="  ", break_on_hyphens=False), flush=True)


def _unwritable(path: Path) -> str | None:
    """Why a results file cannot be written there, or None."""
    if path.is_dir():
        return "is a directory"
    folder = path.parent
    if not folder.is_dir():
        return f"folder {folder} does not exist"
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        return "not writable"
    return None


def _seed_text(seeds: Sequence[int]) -> str:
    if list(seeds) == list(range(seeds[0], seeds[-1] + 1)) and len(seeds) > 1:
        return f"{seeds[0]}-{seeds[-1]}"
    return ",".join(map(str, seeds))
