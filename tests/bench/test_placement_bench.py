"""bench/placement_bench.py's judgement of the kube-scheduler model's occupancy: against
binpack per GPU the placed pods hold, so that a policy is not blamed for placing pods
binpack fails."""

import importlib.util
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[2] / "bench" / "placement_bench.py"


def _load() -> Any:
    spec = importlib.util.spec_from_file_location("placement_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def figures(used: int, nodes: int, held: float | None) -> dict[str, dict[str, float]]:
    at = ("25", "50", "80")
    entry = {"used_gpus": dict.fromkeys(at, used), "occupied_nodes": dict.fromkeys(at, nodes)}
    if held is not None:
        entry["allocated_gpus"] = dict.fromkeys(at, held)
    return entry


def test_more_gpus_for_more_placed_pods_is_not_a_problem(capsys):
    bench = _load()
    # 12% more GPUs and nodes in use, holding 12% more: the same packing.
    problems = bench.against_binpack("x", figures(1120, 560, 1008), figures(1000, 500, 900))
    assert problems == []
    out = capsys.readouterr().out
    assert "used_gpus at 50%: 1.12 x binpack's, 1.00 per GPU the placed pods hold" in out


def test_more_gpus_for_the_same_pods_is_named_with_both_ratios():
    bench = _load()
    problems = bench.against_binpack("x", figures(1120, 500, 900), figures(1000, 500, 900))
    assert problems == [
        f"x: used_gpus at {b}% 1.12 x binpack's (1.12 per GPU held)" for b in ("25", "50", "80")
    ]


def test_runs_without_the_held_figure_are_judged_as_they_are():
    bench = _load()
    problems = bench.against_binpack("x", figures(1000, 560, None), figures(1000, 500, 900))
    assert len(problems) == 3 and all("occupied_nodes" in p for p in problems)
    assert bench.against_binpack("x", figures(1100, 550, None), figures(1000, 500, None)) == []


def test_without_an_fgd_run_nothing_is_compared_with_it():
    bench = _load()
    assert bench.versus(4.0, None) == ""
    fgd = {"unallocated_pct": {"100": {"mean": 5.0}}}
    assert bench.versus(4.0, fgd) == "vs fgd -1.00 (-20.0%)"


def whole(failed8: float, nodes50: float) -> dict[str, dict[str, float]]:
    return {"failed_pods_by_100": {"8-gpu": failed8}, "occupied_nodes": {"50": nodes50}}


def test_whole_node_targets_are_named_against_the_fgd_run_given():
    bench = _load()
    assert bench.whole_nodes_against("x", whole(5.0, 700), whole(5.0, 700), "fgd") == []
    assert bench.whole_nodes_against("x", whole(5.3, 700), whole(5.0, 701), "fgd@learned") == [
        "x: more 8-GPU pods failed than under fgd@learned"
    ]
    assert bench.whole_nodes_against("x", whole(4.0, 724), whole(5.0, 723), "fgd") == [
        "x: more nodes occupied at 50% than under fgd"
    ]
