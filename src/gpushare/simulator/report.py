"""Runs summed up per policy, as JSON and a table, set beside the paper's
(docs/placement.md#reference-numbers).

Unallocated GPU % is reported as median / mean / min / max over the seeds (the
paper's plot uses the median); fragmentation, failed pods and occupied nodes as
means over the seeds. When `fgd` ran too, every other policy gets its paired
per-seed difference against it (negative: fewer GPUs left unallocated).
"""

import statistics
import textwrap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpushare.simulator.run import RunResult
from gpushare.simulator.trace import MILLI_PER_GPU, PodClass, Trace

HEADLINE_BINS = (100, 130)
FRAG_BINS = (50, 80, 90)
OCCUPANCY_BINS = (25, 50, 80, 90, 100, 130)
"""Where occupied nodes and used GPUs are reported (issue 40: 25, 50 and 80% arrived)."""
REFERENCE = "fgd"


@dataclass(frozen=True, slots=True)
class Spread:
    median: float
    mean: float
    min: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> "Spread":
        return cls(statistics.median(values), statistics.mean(values), min(values), max(values))

    def as_dict(self) -> dict[str, float]:
        return {
            "median": round(self.median, 4),
            "mean": round(self.mean, 4),
            "min": round(self.min, 4),
            "max": round(self.max, 4),
        }


@dataclass(frozen=True, slots=True)
class PolicySummary:
    label: str
    runs: tuple[RunResult, ...]
    """One per seed, in seed order."""

    @property
    def seeds(self) -> list[int]:
        return [r.seed for r in self.runs]

    def at(self, bin_: int, metric: str) -> list[float]:
        """The metric's value in one arrived-% bin, per seed (seeds that never reach the bin
        are left out)."""
        return [getattr(r.bins[bin_], metric) for r in self.runs if bin_ in r.bins]

    def unallocated(self, bin_: int) -> Spread | None:
        values = self.at(bin_, "unallocated_pct")
        return Spread.of(values) if values else None

    def mean_at(self, bin_: int, metric: str) -> float | None:
        values = self.at(bin_, metric)
        return statistics.mean(values) if values else None

    def failed(self, by_100: bool = False) -> dict[str, float]:
        counts = {kind.value: 0.0 for kind in PodClass}
        for run in self.runs:
            for kind, n in (run.failed_by_100 if by_100 else run.failed).items():
                counts[PodClass(kind).value] += n
        return {kind: n / len(self.runs) for kind, n in counts.items()}

    def curve(self) -> tuple[list[int], list[float]]:
        """Median unallocated GPU % per arrived-% bin (bins every seed reached)."""
        bins = sorted(set.intersection(*(set(r.bins) for r in self.runs)))
        return bins, [statistics.median(r.bins[b].unallocated_pct for r in self.runs) for b in bins]

    @property
    def wall_s(self) -> float:
        return sum(r.wall_s for r in self.runs)


def summarise(results: Iterable[RunResult]) -> dict[str, PolicySummary]:
    grouped: dict[str, list[RunResult]] = {}
    for result in results:
        grouped.setdefault(result.policy, []).append(result)
    return {
        label: PolicySummary(label, tuple(sorted(runs, key=lambda r: r.seed)))
        for label, runs in grouped.items()
    }


def paired(summary: PolicySummary, reference: PolicySummary, bin_: int = 100) -> list[float]:
    """Per-seed difference in unallocated GPU % against the reference, on shared seeds."""
    theirs = {r.seed: r.bins[bin_].unallocated_pct for r in reference.runs if bin_ in r.bins}
    return [
        r.bins[bin_].unallocated_pct - theirs[r.seed]
        for r in summary.runs
        if bin_ in r.bins and r.seed in theirs
    ]


def _rounded(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def _allocated(trace: Trace, unallocated_pct: float | None) -> float | None:
    """GPUs' worth the placed pods hold: beside the GPUs in use, it says whether a policy
    uses fewer GPUs by packing or by placing fewer pods."""
    if unallocated_pct is None:
        return None
    return trace.capacity / MILLI_PER_GPU * (100 - unallocated_pct) / 100


def to_json(
    trace: Trace,
    nodes_csv: Path,
    pods_csv: Path,
    summaries: dict[str, PolicySummary],
    inflation: float,
    wall_s: float,
) -> dict[str, Any]:
    reference = summaries.get(REFERENCE)
    policies: dict[str, Any] = {}
    for label, s in summaries.items():
        unallocated = {}
        for b in HEADLINE_BINS:
            spread = s.unallocated(b)
            if spread is not None:
                unallocated[str(b)] = {**spread.as_dict(), "per_seed": _per_seed(s, b)}
        entry: dict[str, Any] = {
            "seeds": s.seeds,
            "unallocated_pct": unallocated,
            "frag_amount_pct": {
                str(b): _rounded(s.mean_at(b, "frag_amount_pct")) for b in FRAG_BINS
            },
            "frag_ratio_pct": {str(b): _rounded(s.mean_at(b, "frag_ratio_pct")) for b in FRAG_BINS},
            "failed_pods": s.failed(),
            "failed_pods_by_100": s.failed(by_100=True),
            "occupied_nodes": {
                str(b): _rounded(s.mean_at(b, "occupied_nodes"), 1) for b in OCCUPANCY_BINS
            },
            "used_gpus": {str(b): _rounded(s.mean_at(b, "used_gpus"), 1) for b in OCCUPANCY_BINS},
            "allocated_gpus": {
                str(b): _rounded(_allocated(trace, s.mean_at(b, "unallocated_pct")), 1)
                for b in OCCUPANCY_BINS
            },
            "pods_offered": statistics.mean(r.pods for r in s.runs),
            "wall_s": round(s.wall_s, 2),
        }
        if reference is not None and label != REFERENCE:
            diffs = paired(s, reference)
            entry["paired_vs_fgd"] = {
                "diff_100": [round(d, 4) for d in diffs],
                "better_seeds": sum(1 for d in diffs if d < 0),
                "mean_diff_100": _rounded(statistics.mean(diffs)) if diffs else None,
            }
        bins, medians = s.curve()
        entry["curve"] = {
            "arrived_pct": bins,
            "unallocated_pct_median": [round(v, 4) for v in medians],
        }
        policies[label] = entry
    return {
        "trace": {
            "nodes": str(nodes_csv),
            "pods": str(pods_csv),
            "node_count": len(trace.nodes),
            "pod_count": len(trace.pods),
            "gpus": trace.capacity // MILLI_PER_GPU,
            "requested_pct": round(100 * trace.requested / trace.capacity, 2),
        },
        "inflation": inflation,
        "wall_s": round(wall_s, 2),
        "policies": policies,
    }


def _per_seed(summary: PolicySummary, bin_: int) -> dict[str, float]:
    return {
        str(r.seed): round(r.bins[bin_].unallocated_pct, 4) for r in summary.runs if bin_ in r.bins
    }


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


@dataclass(frozen=True, slots=True)
class Column:
    """One column of the results table: its short header, what it means (the legend printed
    under the table) and its cell for a policy, given the reference policy's summary."""

    header: str
    meaning: str
    cell: Callable[[PolicySummary, PolicySummary | None], str]


def _spread_cell(bin_: int, part: Callable[[Spread], str]) -> Callable[..., str]:
    def cell(s: PolicySummary, _: PolicySummary | None) -> str:
        spread = s.unallocated(bin_)
        return "-" if spread is None else part(spread)

    return cell


def _failed_multi(s: PolicySummary, _: PolicySummary | None) -> str:
    failed = s.failed()
    return f"{sum(failed[k.value] for k in (PodClass.GPU2, PodClass.GPU4, PodClass.GPU8)):.1f}"


def _versus(s: PolicySummary, reference: PolicySummary | None) -> str:
    if reference is None or s is reference:
        return "-"
    diffs = paired(s, reference)
    if not diffs:
        return "-"
    better = sum(1 for d in diffs if d < 0)
    return f"{better}/{len(diffs)} {statistics.mean(diffs):+.2f}"


# Headers no wider than their figures, so the table fits 100 columns with the longest
# policy label (fgd-lookahead@learned); the legend says the rest.
COLUMNS = (
    Column(
        "policy",
        "placement policy; @learned: it learns the workload online, as the extender does",
        lambda s, _: s.label,
    ),
    Column(
        "@100 med",
        "% of the GPUs unallocated when the arrived pods request 100% of them: median over seeds",
        _spread_cell(100, lambda x: f"{x.median:.2f}"),
    ),
    Column("mean", "the same, mean over the seeds", _spread_cell(100, lambda x: f"{x.mean:.2f}")),
    Column(
        "min-max",
        "the same, lowest and highest seed",
        _spread_cell(100, lambda x: f"{x.min:.2f}-{x.max:.2f}"),
    ),
    Column(
        "@130",
        "% of the GPUs unallocated at 130% arrived (the end of a run): mean over the seeds",
        _spread_cell(130, lambda x: f"{x.mean:.2f}"),
    ),
    Column(
        "frag",
        "fragmentation at 90% arrived: free GPU the typical pods cannot use, % of all GPUs",
        lambda s, _: _fmt(s.mean_at(90, "frag_amount_pct")),
    ),
    Column(
        "ratio",
        "the same in % of the idle GPUs (fragmentation ratio); both means over the seeds",
        lambda s, _: _fmt(s.mean_at(90, "frag_ratio_pct"), 1),
    ),
    Column(
        "multi",
        "multi-GPU pods (2, 4 or 8 GPUs) that no node could take, mean per run",
        _failed_multi,
    ),
    Column(
        "vs fgd",
        f"seeds on which fewer GPUs were unallocated at 100% than with {REFERENCE} / all "
        "seeds, and the mean difference in percentage points (negative: fewer)",
        _versus,
    ),
    Column(
        "run s",
        "run time in seconds, summed over the seeds",
        lambda s, _: f"{s.wall_s:.0f}",
    ),
)


def table(summaries: dict[str, PolicySummary]) -> tuple[list[str], list[list[str]]]:
    """The results table (COLUMNS): header and one row per policy."""
    reference = summaries.get(REFERENCE)
    return [c.header for c in COLUMNS], [
        [c.cell(s, reference) for c in COLUMNS] for s in summaries.values()
    ]


def legend(width: int = 100) -> list[str]:
    """What each column of the table means, one entry per column, wrapped to `width`."""
    indent = max(len(c.header) for c in COLUMNS) + 4
    return [
        line
        for c in COLUMNS
        for line in textwrap.wrap(
            c.meaning,
            width,
            initial_indent=f"  {c.header:<{indent - 4}}  ",
            subsequent_indent=" " * indent,
            break_on_hyphens=False,
        )
    ]
