"""Placement quality on the openb trace: the full benchmark run, checked.

Runs `gpushare simulate` on the default trace (our policy, fgd and bestfit, seeds
42-51, all cores), then prints the calibration bands (docs/placement.md#calibration),
the targets of issue 6 and the wall time against the 5-minute budget. With --learned
it also runs our policy and fgd learning the workload online, as in the extender
(the wall time is then not the budgeted one).

Run: .venv/bin/python bench/placement_bench.py [--learned] [--json FILE] [--plot FILE]
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

from gpushare.cli.main import main as gpushare
from gpushare.placement.policies import OUR_POLICY

BUDGET_S = 300
CALIBRATION = {"fgd": (4.6, 4.95), "bestfit": (6.9, 7.4)}
TARGET_MEDIAN = 4.0


def run(policies: list[str], json_path: Path, plot: Path | None, workers: int | None) -> float:
    argv = ["simulate", "--policies", ",".join(policies), "--json", str(json_path)]
    if plot is not None:
        argv += ["--plot", str(plot)]
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
    args = parser.parse_args()
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
