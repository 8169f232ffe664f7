"""The benches still run: a small-size smoke run of each one that has a --quick mode."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_scale_bench_prints_its_three_figures():
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "scale_bench.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    for figure in ("events/min, one device plugin", "extender RSS", "rebuild from 2,000 pods"):
        rows = [line for line in run.stdout.splitlines() if line.startswith(figure)]
        assert len(rows) == 1 and rows[0].endswith("PASS"), run.stdout


def test_isolation_bench_prints_shares_memory_reaction_and_tick_cost():
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "isolation_bench.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    [shares] = [line for line in out.splitlines() if line.endswith("shares within ±3 pp")]
    within, total = shares.split()[0].split("/")
    assert int(total) == 20 and int(within) >= 15, shares  # --quick: short runs, loose shares
    assert "Memory-cap reaction" in out and out.count("Agent tick,") == 2, out
