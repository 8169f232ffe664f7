"""CUDA interposer: the cost libgpushare-cuda.so adds to an allocation, a free and a
launch, at p50 and p99, measured call by call (bench/interposer_bench.c) with and
without the library preloaded (a region, a cap far above what is used, the gate open).

By default over the fake driver (tests/fakecuda), where the driver itself costs almost
nothing, so the difference is the interposer's own path; with --real over the machine's
libcuda.so.1 and GPU 0 (an empty PTX kernel). Frees are also timed while 10k, 100k and
1M allocations are live (cuMemFree_v2@LIVE; --live), where a table of held allocations
that does not grow would slow them down.

Then, on the fake driver, the share accuracy: under each cGPU policy that slices time,
the real agent paces two containers (30/70 percent, weights 1:3) and the first alone
through their regions' gates, and each container's measured GPU time is set beside what
its policy promises (tests/isolation/interposer/shares.py).
Run: .venv/bin/python bench/interposer_bench.py [--real] [--iterations N] [--no-shares]
"""

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from gpushare.isolation.interposer.build import build_library, compiler
from gpushare.table import render

ROOT = Path(__file__).resolve().parents[1]
FAKE_SOURCE = ROOT / "tests" / "fakecuda" / "fakecuda.c"
HARNESS_SOURCE = Path(__file__).with_name("interposer_bench.c")
FAKE_UUID = "GPU-00000000-0000-4000-8000-000000000000"
Timings = dict[str, tuple[int, int]]


def build(directory: Path, real: bool) -> tuple[Path, Path]:
    """The harness and the interposer; the fake libcuda.so.1 too unless `real`."""
    from gpushare.isolation.interposer.build import SOURCE_DIRECTORY

    harness = directory / "interposer_bench"
    cc = compiler()
    subprocess.run([*cc, "-O2", "-o", str(harness), str(HARNESS_SOURCE), "-ldl"], check=True)
    if not real:
        subprocess.run(
            [*cc, "-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-Wl,-Bsymbolic",
             f"-I{SOURCE_DIRECTORY}", "-o", str(directory / "libcuda.so.1"), str(FAKE_SOURCE),
             "-lpthread"],
            check=True,
        )  # fmt: skip
    return harness, build_library(directory)


def run_pair(harness: Path, iterations: int, env: dict[str, str]) -> tuple[int, int]:
    """cuLaunchKernel's p50 in each of two processes of one container launching at once
    (the region's shared counters are where two processes would meet)."""
    runs = [
        subprocess.Popen(
            [str(harness), str(iterations)], env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    p50s = []
    for process in runs:
        out, _ = process.communicate()
        assert process.returncode == 0, f"the harness exited {process.returncode}"
        rows = {line.split()[0]: int(line.split()[1]) for line in out.splitlines()}
        p50s.append(rows["cuLaunchKernel"])
    return p50s[0], p50s[1]


def run(harness: Path, iterations: int, env: dict[str, str], *live: int) -> Timings:
    out = subprocess.run(
        [str(harness), str(iterations), *map(str, live)],
        env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    rows = (line.split() for line in out.splitlines())
    return {call: (int(p50), int(p99)) for call, p50, p99 in rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", action="store_true", help="the machine's libcuda.so.1, GPU 0")
    parser.add_argument("--iterations", type=int, default=100_000, help="calls timed per kind")
    parser.add_argument("--no-shares", action="store_true", help="skip the share accuracy")
    parser.add_argument(
        "--live", default="10000,100000,1000000",
        help="also time frees while this many allocations are held (comma-separated)",
    )  # fmt: skip
    parser.add_argument(
        "--seconds", type=float, default=2.5, help="run time of each share measurement"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="interposer-bench-") as temporary:
        directory = Path(temporary)
        harness, library = build(directory, args.real)
        plain = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_")}
        if not args.real:
            plain["LD_LIBRARY_PATH"] = f"{directory}:{plain.get('LD_LIBRARY_PATH', '')}"
            plain["FAKE_CUDA_DEVICES"] = f"{FAKE_UUID}:{1 << 40}"
        hooked = plain | {
            "LD_PRELOAD": str(library),
            "GPUSHARE_CUDA_REGION": str(directory / "region"),
            "ALIYUN_COM_GPU_MEM_CONTAINER": "1000",
            "NVIDIA_VISIBLE_DEVICES": "all" if args.real else FAKE_UUID,
        }
        without = run(harness, args.iterations, plain)
        with_library = run(harness, args.iterations, hooked)
        for live in (int(n) for n in args.live.split(",") if n):
            without |= run(harness, args.iterations, plain, live)
            with_library |= run(harness, args.iterations, hooked, live)
        pair_without = run_pair(harness, args.iterations, plain)
        pair_with = run_pair(harness, args.iterations, hooked)
    rows = [
        [call, *map(str, without[call]), *map(str, with_library[call]),
         str(with_library[call][0] - without[call][0]),
         str(with_library[call][1] - without[call][1])]
        for call in without
    ]  # fmt: skip
    driver = "the machine's libcuda" if args.real else "the fake driver"
    print(f"libgpushare-cuda.so on {driver}, {args.iterations:,} calls each, ns")
    print(render(["call", "p50", "p99", "p50 hooked", "p99 hooked", "+p50", "+p99"], rows))
    added = [w - o for w, o in zip(pair_with, pair_without, strict=True)]
    print(
        "cuLaunchKernel p50 with two processes of one container launching at once: "
        f"{'/'.join(map(str, pair_without))} ns without, {'/'.join(map(str, pair_with))} ns "
        f"with the library (+{added[0]} / +{added[1]} ns)"
    )
    if not args.no_shares:
        shares(args.seconds)


def shares(seconds: float) -> None:
    sys.path.insert(0, str(ROOT))
    from gpushare.isolation.policy import Policy
    from tests.fakecuda import fake_cuda
    from tests.isolation.interposer.shares import measure

    rows, within, total = [], 0, 0
    for policy in (p for p in Policy if p.slices_time):
        for contended in (True, False):
            with tempfile.TemporaryDirectory(prefix="shares-") as temporary:
                measured = measure(fake_cuda(), Path(temporary), policy, contended, seconds)
            for name, share in measured.items():
                promised = share.promised or 0.0
                off = 100 * (share.measured - promised)
                within += abs(off) <= 3
                total += 1
                case = "30/70 contended" if contended else "30 alone"
                rows.append([policy.label, case, name, f"{100 * promised:.1f}",
                             f"{100 * share.measured:.1f}", f"{off:+.1f}"])  # fmt: skip
    print(f"\nShares at the call on the fake driver, {seconds:g} s each, percent of the GPU")
    print(render(["policy", "case", "container", "promised", "measured", "pp"], rows))
    print(f"{within}/{total} shares within ±3 pp")


if __name__ == "__main__":
    main()
