"""Placement quality on the openb trace: the full benchmark run, checked.

Runs `gpushare simulate` on the default trace (our policy, fgd and bestfit, seeds
42-51, all cores), then prints the calibration bands (docs/placement.md#calibration),
the targets of issue 6 and the wall time against the 5-minute budget. With --learned
it also runs our policy and fgd learning the workload online, as in the extender
(the wall time is then not the budgeted one).

With --mixes or --set it runs workload mixes instead (docs/placement.md#workload-mixes):
for each named mix (and `default`, the pod list as it is; NAME~N draws it with mix
seed N), or each mix of a benchmark set (`tuning`, what the default was tuned on;
`check`, held out), the default policy learned online, our policy on the trace's
workload, fgd, bestfit and binpack (or --policies), one JSON per mix in --out (a mix
whose JSON is there already is not run again), then a table per mix against fgd and
the issues' targets. --kube-scheduler PROFILE lets the model of kube-scheduler choose
the nodes (docs/placement.md#the-kube-scheduler-model).

Run: .venv/bin/python bench/placement_bench.py [--learned] [--json FILE] [--plot FILE]
     nice .venv/bin/python bench/placement_bench.py --mixes default,gpushare80,gpuspec33 \
         --seeds 42-44 --workers 1 --out mixes/
     nice .venv/bin/python bench/placement_bench.py --set check --seeds 42-44 \
         --policies fgd-lookahead@learned,fgd,binpack --out mixes/
"""

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from gpushare.cli.main import main as gpushare
from gpushare.cli.simulate import default_trace_dir
from gpushare.placement.policies import OUR_POLICY
from gpushare.placement.workload import LearnedWorkload, TaskShape
from gpushare.simulator.arrival import arrivals
from gpushare.simulator.mixes import BENCHMARK_SETS, MIXES, MixRun, generate, parse_run
from gpushare.simulator.run import distribution
from gpushare.simulator.trace import Trace, load

BUDGET_S = 300
CALIBRATION = {"fgd": (4.6, 4.95), "bestfit": (6.9, 7.4)}
TARGET_MEDIAN = 4.0
DEFAULT_LEARNED = f"{OUR_POLICY}@learned"
"""The default policy as the extender runs it: the workload learned online."""
MIX_POLICIES = (DEFAULT_LEARNED, OUR_POLICY, "fgd", "bestfit", "binpack")
FGD_LEARNED = "fgd@learned"
"""FGD learning the workload online, as the extender would run it: given in --policies,
the whole-node targets are also said against it (`whole_nodes_against`)."""
MIX_TARGET_GAIN = 0.10
"""Issue 32: on average over the mixes, >= 10% fewer GPUs unallocated than fgd."""


def run(policies: list[str], json_path: Path, plot: Path | None, workers: int | None) -> float:
    argv = ["simulate", "--policies", ",".join(policies), "--json", str(json_path)]
    argv += ["--no-plot"] if plot is None else ["--plot", str(plot)]
    if workers is not None:
        argv += ["--workers", str(workers)]
    started = time.perf_counter()
    code = gpushare(argv)
    if code:
        raise SystemExit(code)
    return time.perf_counter() - started


def check(document: dict, wall: float, timed: bool) -> None:
    policies = document["policies"]
    print("\nChecks")
    for name, (low, high) in CALIBRATION.items():
        mean = policies[name]["unallocated_pct"]["100"]["mean"]
        verdict = "ok" if low <= mean <= high else "OUT OF BAND"
        print(f"  calibration {name}: mean @100% {mean:.2f} in [{low}, {high}]: {verdict}")
    ours = policies[OUR_POLICY]
    fgd = policies["fgd"]
    median = ours["unallocated_pct"]["100"]["median"]
    print(f"  {OUR_POLICY} median @100% {median:.2f} (target <= {TARGET_MEDIAN}, paper FGD 4.77)")
    mean130, fgd130 = ours["unallocated_pct"]["130"]["mean"], fgd["unallocated_pct"]["130"]["mean"]
    print(f"  {OUR_POLICY} mean @130% {mean130:.2f} vs fgd {fgd130:.2f}")
    paired = ours["paired_vs_fgd"]
    print(
        f"  {OUR_POLICY} better than fgd on {paired['better_seeds']}/{len(paired['diff_100'])} "
        f"seeds; per-seed difference @100%: {', '.join(f'{d:+.2f}' for d in paired['diff_100'])}"
    )
    multi = {
        label: sum(policies[label]["failed_pods"][k] for k in ("2-gpu", "4-gpu", "8-gpu"))
        for label in (OUR_POLICY, "fgd")
    }
    print(f"  failed multi-GPU pods (mean per run): {multi}")
    if timed:
        print(
            f"  wall {wall:.0f} s for the default three policies x 10 seeds (budget {BUDGET_S} s)"
        )
    else:
        print(f"  wall {wall:.0f} s for {len(policies)} policies x 10 seeds")


def run_mixes(
    runs: list[MixRun],
    seeds: str,
    workers: int | None,
    out: Path,
    policies: tuple[str, ...] = MIX_POLICIES,
    kube: str | None = None,
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for mix in runs:
        path = out / result_name(mix, kube)
        if path.exists():
            print(f"{mix.label}: {path} exists, not run again")
            continue
        partial = path.with_suffix(".partial")
        argv = ["simulate", "--policies", ",".join(policies), "--seeds", seeds]
        argv += ["--json", str(partial), "--no-progress", "--no-plot"]
        if mix.name != "default":
            argv += ["--mix", mix.name, "--mix-seed", str(mix.seed)]
        if kube is not None:
            argv += ["--kube-scheduler", kube]
        if workers is not None:
            argv += ["--workers", str(workers)]
        code = gpushare(argv)
        if code:
            raise SystemExit(code)
        partial.rename(path)
    report_mixes(runs, out, policies, kube)


def result_name(mix: MixRun, kube: str | None) -> str:
    return f"{mix.label}{'' if kube is None else '@' + kube}.json"


def mix_trace(mix: MixRun) -> Trace:
    traces = default_trace_dir()
    trace = load(traces / "openb_node_list_gpu_node.csv", traces / "openb_pod_list_default.csv")
    return trace if mix.name == "default" else generate(trace, MIXES[mix.name], mix.seed)


def convergence(mix: MixRun, seed: int, checkpoints: tuple[int, ...] = (100, 1000)) -> str:
    """How close the workload the extender learns online (LearnedWorkload, from its
    prior, not told the mix) comes to the mix's own pod distribution: total variation
    distance after so many pods and after all arrivals, in the seed's order. (The
    prior's shapes are fractions of any GPU, never the trace's own: its distance is 1.)"""
    trace = mix_trace(mix)
    truth = distribution(trace)
    learner = LearnedWorkload()
    adopted, seen = 0, []
    pods = arrivals(trace, seed).pods
    for number, pod in enumerate(pods, start=1):
        adopted += learner.observe(TaskShape.of(pod.request()))
        if number in checkpoints:
            seen.append(f"after {number} pods {learner.current.distance(truth):.3f}")
    return (
        f"learned workload vs the mix's (total variation, seed {seed}): {', '.join(seen)}, "
        f"after all {len(pods)} {learner.current.distance(truth):.3f}; adopted {adopted} times"
    )


def versus(unallocated: float, fgd: dict | None) -> str:
    """The difference from fgd's unallocated % at 100% arrived, where fgd ran."""
    if fgd is None:
        return ""
    diff = unallocated - fgd["unallocated_pct"]["100"]["mean"]
    return f"vs fgd {diff:+.2f} ({100 * diff / fgd['unallocated_pct']['100']['mean']:+.1f}%)"


def against_binpack(label: str, ours: dict, binpack: dict) -> list[str]:
    """Where the default uses more than 1.1 times binpack's GPUs or nodes at 25/50/80%
    arrived. Arrived is not placed: where binpack fails pods the default places (pods
    pinned to a scarce model), its GPUs in use are fewer for that reason alone, so each
    figure is also compared per GPU the placed pods hold, and only that ratio counts."""
    problems = []
    for b in ("25", "50", "80"):
        for metric in ("used_gpus", "occupied_nodes"):
            raw = ours[metric][b] / binpack[metric][b]
            held = ours.get("allocated_gpus", {}).get(b)
            theirs = binpack.get("allocated_gpus", {}).get(b)
            per_gpu = raw if not held or not theirs else raw * theirs / held
            if per_gpu > 1.1:
                problems.append(
                    f"{label}: {metric} at {b}% {raw:.2f} x binpack's ({per_gpu:.2f} per GPU held)"
                )
            elif raw > 1.1:
                print(
                    f"  {metric} at {b}%: {raw:.2f} x binpack's, "
                    f"{per_gpu:.2f} per GPU the placed pods hold"
                )
    return problems


def whole_nodes_against(label: str, ours: dict, fgd: dict, name: str) -> list[str]:
    """Issue 40's whole-node targets against an FGD run: 8-GPU pods failed by 100%
    arrived and nodes occupied at 50% arrived, each at most the FGD run's (means per
    run). Asked of `fgd` (told the workload) they are the targets; asked of
    `fgd@learned` they show what FGD's own terms do without being told it."""
    problems = []
    if ours["failed_pods_by_100"]["8-gpu"] > fgd["failed_pods_by_100"]["8-gpu"]:
        problems.append(f"{label}: more 8-GPU pods failed than under {name}")
    if ours["occupied_nodes"]["50"] > fgd["occupied_nodes"]["50"]:
        problems.append(f"{label}: more nodes occupied at 50% than under {name}")
    return problems


def report_mixes(
    runs: list[MixRun], out: Path, policies: tuple[str, ...] = MIX_POLICIES, kube: str | None = None
) -> None:
    """Per mix: each policy's unallocated % at 100% arrived (mean [min-max] over seeds)
    and its difference from fgd, 8-GPU pods failed by 100% arrived and nodes occupied
    at 50% (means per run), GPUs and nodes in use at 25/50/80% arrived; then the
    targets of issues 32 and 40 for the default policy."""
    gains = []
    problems: list[str] = []
    print("\nWorkload mixes: unallocated GPU % at 100% arrived, mean [min-max] over seeds;")
    print("8-GPU pods failed by 100% arrived; nodes occupied at 50%; GPUs / nodes used at")
    print(f"25/50/80% arrived{'' if kube is None else f' (kube-scheduler model: {kube})'}")
    for mix in runs:
        path = out / result_name(mix, kube)
        if not path.exists():
            print(f"\n{mix.label}: no results")
            continue
        results = json.loads(path.read_text())["policies"]
        fgd = results.get("fgd")
        print(f"\n{mix.label} (seeds {next(iter(results.values()))['seeds']})")
        for label in policies:
            r = results[label]
            at = r["unallocated_pct"]["100"]
            used = " ".join(
                f"{r['used_gpus'][b]:.0f}/{r['occupied_nodes'][b]:.0f}" for b in ("25", "50", "80")
            )
            print(
                f"  {label:24} {at['mean']:5.2f} [{at['min']:.2f}-{at['max']:.2f}] "
                f"{versus(at['mean'], fgd)}  8-GPU {r['failed_pods_by_100']['8-gpu']:.1f}"
                f"  nodes@50 {r['occupied_nodes']['50']:.0f}  used {used}"
            )
        if DEFAULT_LEARNED not in results:
            continue
        ours = results[DEFAULT_LEARNED]
        if kube is not None and "binpack" in results:
            problems += against_binpack(mix.label, ours, results["binpack"])
        if fgd is None:
            # A run of some policies only (a change measured against stored fgd runs).
            print("  no fgd run here: the targets against fgd are not checked")
            continue
        print(f"  {convergence(mix, fgd['seeds'][0])}")
        ours_100 = ours["unallocated_pct"]["100"]["mean"]
        fgd_100 = fgd["unallocated_pct"]["100"]["mean"]
        gains.append((mix.label, 1 - ours_100 / fgd_100, ours_100 <= fgd_100))
        problems += whole_nodes_against(mix.label, ours, fgd, "fgd")
        if FGD_LEARNED in results:
            # Said, not counted: the targets are against fgd told the workload.
            for line in whole_nodes_against(mix.label, ours, results[FGD_LEARNED], FGD_LEARNED):
                print(f"  {line}")
    if not gains:
        print("\n".join(f"  {p}" for p in problems))
        return
    mean_gain = statistics.mean(g for _, g, _ in gains)
    losses = [name for name, _, ok in gains if not ok]
    print(
        f"\n{DEFAULT_LEARNED} vs fgd: <= on {len(gains) - len(losses)}/{len(gains)} mixes"
        f"{' (loses on ' + ', '.join(losses) + ')' if losses else ''}; mean reduction "
        f"{100 * mean_gain:.1f}% (target >= {100 * MIX_TARGET_GAIN:.0f}%): "
        f"{'ok' if not losses and mean_gain >= MIX_TARGET_GAIN else 'NOT MET'}"
    )
    print("\n".join(f"  {p}" for p in problems) or "  8-GPU failures and occupancy: ok")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--learned",
        action="store_true",
        help=f"also run {OUR_POLICY}@learned and fgd@learned (then the run is not the timed set)",
    )
    parser.add_argument("--json", type=Path, help="keep the results here")
    parser.add_argument("--plot", type=Path, help="write the plot here")
    parser.add_argument("--workers", type=int, help="default: all cores")
    parser.add_argument(
        "--mixes",
        help="comma-separated mixes (NAME or NAME~MIXSEED; `default`: the pod list as it "
        "is): run the mixes instead",
    )
    parser.add_argument(
        "--set",
        choices=sorted(BENCHMARK_SETS),
        help="run a benchmark set of mixes: tuning (what the default was tuned on) or "
        "check (held out)",
    )
    parser.add_argument(
        "--policies",
        default=",".join(MIX_POLICIES),
        help="with --mixes or --set (default: %(default)s)",
    )
    parser.add_argument(
        "--kube-scheduler",
        metavar="PROFILE",
        help="with --mixes or --set: kube-scheduler's model chooses nodes (gpushare "
        "simulate --kube-scheduler)",
    )
    parser.add_argument("--seeds", default="42-44", help="with --mixes (default: %(default)s)")
    parser.add_argument(
        "--out", type=Path, default=Path("mixes"), help="with --mixes: the JSON folder"
    )
    args = parser.parse_args()
    if args.mixes or args.set:
        runs = list(BENCHMARK_SETS[args.set]) if args.set else []
        runs += [parse_run(m) for m in (args.mixes or "").split(",") if m.strip()]
        policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
        run_mixes(runs, args.seeds, args.workers, args.out, policies, args.kube_scheduler)
        return
    policies = [OUR_POLICY, "fgd", "bestfit"]
    if args.learned:
        policies[1:1] = [f"{OUR_POLICY}@learned"]
        policies.append("fgd@learned")
    with tempfile.TemporaryDirectory() as scratch:
        path = args.json or Path(scratch) / "placement.json"
        wall = run(policies, path, args.plot, args.workers)
        document = json.loads(path.read_text())
    check(document, wall, timed=not args.learned)


if __name__ == "__main__":
    main()
