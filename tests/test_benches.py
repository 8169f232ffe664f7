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


def test_interposer_bench_prints_the_added_cost_of_each_call():
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "interposer_bench.py"), "--iterations", "2000",
         "--no-shares", "--live", "10000"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    table, pair = run.stdout.splitlines()[2:-1], run.stdout.splitlines()[-1]
    rows = {line.split()[0]: line.split() for line in table}
    assert set(rows) == {"cuMemAlloc_v2", "cuMemFree_v2", "cuLaunchKernel", "cuMemFree_v2@10000"}
    assert all(len(row) == 7 and int(row[5]) < 100_000 for row in rows.values()), run.stdout
    assert pair.startswith("cuLaunchKernel p50 with two processes of one container"), pair


def test_bind_bench_holds_bind_p50_near_its_record():
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bind_bench.py"), "--nodes", "200", "--pods", "120",
         "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip
    print(run.stdout)  # the figures, in CI's output (pytest -s, or -rP)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    for verb in ("webhook", "filter", "prioritize", "bind"):
        assert sum(line.startswith(f"{verb:<11} p50") for line in lines) == 1, run.stdout
    assert any(line.startswith("extender CPU per pod") for line in lines), run.stdout
    assert lines[-1].startswith("bind p50") and lines[-1].endswith("PASS"), run.stdout


def test_dra_placement_bench_prints_every_system():
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "dra_placement_bench.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    rows = {line.split()[0]: line.split() for line in run.stdout.splitlines() if line[:2] == "  "}
    systems = {"device-plugin", "dra", "dra@stock", "dra+score", "dra+order", "dra+fullest"}
    assert set(rows) == {"system", *systems}, run.stdout
    assert all(len(row) == len(rows["system"]) for row in rows.values()), run.stdout
    # dra+order rewrites the slice once per GPU pod placed; without reordering, never.
    writes = rows["system"].index("writes/pod")
    assert rows["dra+order"][writes] == "1.00" and rows["dra+score"][writes] == "0.00", run.stdout


def test_dra_mechanism_bench_finds_kep_5004_splitting_pods_and_ours_not():
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "dra_mechanism_bench.py"), "--pods", "200"],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    rows = [line.split() for line in done.stdout.splitlines() if " ours " in f" {line} "]
    assert len(rows) == 3
    assert all(row[row.index("ours") + 5] == "0" for row in rows)  # never split
    per_gib = [line for line in done.stdout.splitlines() if "kep-5004" in line]
    assert len(per_gib) == 3 and all("( 0.0%)" not in line for line in per_gib)
