"""The headline plot: unallocated GPU % against arrived workload, one line per policy.

The paper's Fig. 9(a): the median over seeds of each arrived-% bin. The left panel
shows the whole run, the right one zooms in where the policies part (90-130%).
"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never a display

import matplotlib.pyplot as plt

from gpushare.simulator.report import PolicySummary

ZOOM = (90, 130)
"""Arrived-% range of the right panel: below it every policy places everything."""


def plot(summaries: dict[str, PolicySummary], path: Path, title: str = "") -> None:
    figure, (whole, zoom) = plt.subplots(1, 2, figsize=(12, 4.5))
    for label, summary in summaries.items():
        bins, medians = summary.curve()
        whole.plot(bins, medians, label=label, linewidth=1.5)
        near = [(b, m) for b, m in zip(bins, medians, strict=True) if b >= ZOOM[0]]
        if near:
            zoom.plot(*zip(*near, strict=True), label=label, linewidth=1.5, marker=".")
    for axes, (low, high) in ((whole, (0, 130)), (zoom, ZOOM)):
        axes.set_xlim(low, high)
        axes.axvline(100, color="grey", linewidth=0.8, linestyle="--")
        axes.set_xlabel("arrived workload (% of GPU capacity)")
        axes.set_ylabel("unallocated GPU (%)")
        axes.grid(alpha=0.3)
    zoom.set_ylim(bottom=0)
    zoom.legend()
    if title:
        figure.suptitle(f"Unallocated GPU, median over seeds ({title})")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
