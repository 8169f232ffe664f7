"""What kube-scheduler's DRA allocator costs in placement (issue 42), on the openb trace.

For one seed and each workload mix, one policy (default: fgd-lookahead, on the trace's
workload) through the same model of kube-scheduler (default: the chart's profile,
docs/placement.md#the-kube-scheduler-model), in five systems:

* `device-plugin`: today's mode: the GPU pod asks `aliyun.com/gpu-mem`, our extender
  scores the nodes and places the pod on the GPUs the policy chooses;
* `dra`: DRA mode without an extender: kube-scheduler's plugins (CPU and memory only)
  choose among the nodes where the claim fits, the allocator takes the first eligible
  GPUs by index (gpushare.simulator.dra); `dra@stock` the same under kube-scheduler as it
  comes (the default scheduler: a pod that needs no extender need not use the chart's);
* `dra+score`: our extender scores the nodes, the allocator still takes the first
  eligible GPUs by index;
* `dra+order`: as dra+score, the slice ordered for each pod so that the allocator takes
  the policy's GPUs (an upper bound of reordering: a slice write per GPU pod);
* `dra+fullest`: as dra+score, the slice rewritten fullest GPU first after every change
  that reorders it.

Printed per mix: unallocated GPU % when 90, 100 and 130% of the capacity has arrived
(the paper's measure, docs/placement.md#benchmark-metrics), the fragmentation ratio at
90%, 8-GPU pods failed by 100% arrived and multi-GPU pods failed in all, nodes and GPUs
in use at 50% arrived, slice writes per GPU pod placed, and the run's time.

Run: nice -n 10 .venv/bin/python bench/dra_placement_bench.py [--seed 42] \
         [--mixes default,gpushare100,multigpu50,cpu250~1] [--workers 1] [--json FILE]
     .venv/bin/python bench/dra_placement_bench.py --quick     # every 8th node and pod
"""

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from gpushare.cli.simulate import default_trace_dir
from gpushare.placement.policies import OUR_POLICY
from gpushare.simulator.arrival import arrivals
from gpushare.simulator.dra import DraMode
from gpushare.simulator.kubescheduler import PROFILES
from gpushare.simulator.mixes import MIXES, MixRun, generate, parse_run
from gpushare.simulator.run import PolicyChoice, RunResult, simulate
from gpushare.simulator.trace import PodClass, Trace, load

DEVICE_PLUGIN = "device-plugin"
STOCK = "stock"
SYSTEMS: tuple[tuple[DraMode | None, str | None], ...] = (
    (None, None),
    (DraMode.FIRST_FIT, None),
    (DraMode.FIRST_FIT, STOCK),
    (DraMode.SCORE, None),
    (DraMode.ORDER, None),
    (DraMode.FULLEST, None),
)
"""(DRA mode, kube-scheduler profile) of each system; None: device-plugin mode, the profile
given (--kube-scheduler). DRA without an extender runs under the default scheduler too:
a pod that needs no extender need not go to the chart's second scheduler."""
DEFAULT_MIXES = "default,gpushare100,multigpu50,cpu250~1"
QUICK_EVERY = 8


@dataclass(frozen=True, slots=True)
class Job:
    mix: MixRun
    policy: str
    dra: DraMode | None
    profile: str
    seed: int
    quick: bool
    own_profile: bool = False
    """Whether the system names its profile (shown in its label)."""

    @property
    def system(self) -> str:
        label = DEVICE_PLUGIN if self.dra is None else self.dra.label
        return f"{label}@{self.profile}" if self.own_profile else label


def trace_of(mix: MixRun, quick: bool) -> Trace:
    traces = default_trace_dir()
    trace = load(traces / "openb_node_list_gpu_node.csv", traces / "openb_pod_list_default.csv")
    if quick:
        trace = Trace(trace.nodes[::QUICK_EVERY], trace.pods[::QUICK_EVERY], trace.source)
    return trace if mix.name == "default" else generate(trace, MIXES[mix.name], mix.seed)


def run(job: Job) -> tuple[RunResult, int]:
    """The run, and how many GPU pods arrived in it."""
    trace = trace_of(job.mix, job.quick)
    choice = PolicyChoice.parse(job.policy)
    result = simulate(trace, choice, job.seed, kube=PROFILES[job.profile], dra=job.dra)
    return result, sum(1 for p in arrivals(trace, job.seed).pods if p.num_gpu)


def row(job: Job, result: RunResult, gpu_pods: int) -> dict[str, object]:
    bins = result.bins

    def at(bin_: int, metric: str) -> float | None:
        return getattr(bins[bin_], metric) if bin_ in bins else None

    failed = result.failed
    multi = sum(failed.get(k, 0) for k in (PodClass.GPU2, PodClass.GPU4, PodClass.GPU8))
    placed_gpu_pods = gpu_pods - sum(n for kind, n in failed.items() if kind is not PodClass.CPU)
    return {
        "mix": job.mix.label,
        "system": job.system,
        "unallocated_90": at(90, "unallocated_pct"),
        "unallocated_100": at(100, "unallocated_pct"),
        "unallocated_130": at(130, "unallocated_pct"),
        "frag_ratio_90": at(90, "frag_ratio_pct"),
        "failed_8gpu_by_100": result.failed_by_100.get(PodClass.GPU8, 0),
        "failed_multi": multi,
        "nodes_50": at(50, "occupied_nodes"),
        "gpus_50": at(50, "used_gpus"),
        "slice_writes": result.slice_writes,
        "writes_per_gpu_pod": result.slice_writes / placed_gpu_pods if placed_gpu_pods else 0.0,
        "wall_s": result.wall_s,
    }


def cell(value: object, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


HEADER = (
    "system", "@90", "@100", "@130", "ratio90", "8gpu<=100", "multi", "nodes@50", "gpus@50",
    "writes/pod", "secs",
)  # fmt: skip


def print_mix(rows: list[dict[str, object]]) -> None:
    widths = (16, 6, 6, 6, 7, 9, 5, 8, 7, 10, 5)
    print("  " + " ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in
                          enumerate(zip(HEADER, widths, strict=True))))  # fmt: skip
    for r in rows:
        cells = (
            str(r["system"]),
            cell(r["unallocated_90"]),
            cell(r["unallocated_100"]),
            cell(r["unallocated_130"]),
            cell(r["frag_ratio_90"], 1),
            cell(r["failed_8gpu_by_100"]),
            cell(r["failed_multi"]),
            cell(r["nodes_50"], 0),
            cell(r["gpus_50"], 0),
            cell(r["writes_per_gpu_pod"]),
            cell(r["wall_s"], 0),
        )
        print("  " + " ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                              enumerate(zip(cells, widths, strict=True))))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--mixes",
        default=DEFAULT_MIXES,
        help="comma-separated mixes, NAME or NAME~MIXSEED; default: the pod list as it is "
        "(default: %(default)s)",
    )
    parser.add_argument("--policy", default=OUR_POLICY, help="default: %(default)s")
    parser.add_argument(
        "--kube-scheduler",
        default="chart",
        choices=sorted(PROFILES),
        help="kube-scheduler's profile for every system (default: %(default)s)",
    )
    parser.add_argument("--workers", type=int, default=1, help="runs in parallel (default: 1)")
    parser.add_argument("--json", type=Path, help="also write every row here")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"every {QUICK_EVERY}th node and pod of the trace, the default mix only: a smoke run",
    )
    args = parser.parse_args()
    mixes = [MixRun("default")] if args.quick else [parse_run(m) for m in args.mixes.split(",")]
    jobs = [
        Job(mix, args.policy, dra, profile or args.kube_scheduler, args.seed, args.quick,
            own_profile=profile is not None and profile != args.kube_scheduler)
        for mix in mixes
        for dra, profile in SYSTEMS
    ]  # fmt: skip
    started = time.perf_counter()
    if args.workers > 1:
        with ProcessPoolExecutor(args.workers) as pool:
            results = list(pool.map(run, jobs))
    else:
        results = [run(job) for job in jobs]
    rows = [row(job, *result) for job, result in zip(jobs, results, strict=True)]
    print(
        f"DRA placement: {args.policy} through kube-scheduler's model ({args.kube_scheduler} "
        "unless named), "
        f"seed {args.seed}{', quick cut' if args.quick else ''}; unallocated GPU % at 90/100/130% "
        f"arrived, fragmentation ratio at 90%, 8-GPU pods failed by 100% and multi-GPU pods "
        f"failed in all, nodes and GPUs used at 50%, slice writes per GPU pod placed"
    )
    for mix in mixes:
        print(f"\n{mix.label}")
        print_mix([r for r in rows if r["mix"] == mix.label])
    print(f"\n{len(jobs)} runs in {time.perf_counter() - started:.0f} s wall")
    if args.json:
        args.json.write_text(json.dumps({"seed": args.seed, "rows": rows}, indent=2) + "\n")
        print(f"results: {args.json}")


if __name__ == "__main__":
    main()
