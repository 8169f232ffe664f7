"""Isolation agent: achieved compute share against target per policy, and memory-cap reaction.

Shares: the agent runs on the mock backend and a simulated clock (100 ms slices,
60 s per scenario); achieved is the mock GPU's ground truth, target is what the
control tree promises each container (its `limit` file), or for native the
GPU's own split by intensity. A share passes when within 3 percentage points.

Reaction: the agent runs on the system clock in a thread; the bench makes a
container allocate past its cap at a random moment and times how long until
the agent killed the offending process (one poll = one slice at most).

Tick cost: wall and CPU time of one agent tick (observe, enforce, decide,
apply, publish the control tree) for 1 GPU x 4 and 4 GPUs x 10 containers. Control trees
go to /dev/shm when it exists: tmpfs, like the agent's default under /run. Then what the
CUDA interposer's regions add to a tick: 40 containers' regions read (pread into a copy,
live slots told by their OFD locks) and their gates and shares written.
Run: .venv/bin/python bench/isolation_bench.py [--quick]
"""

import argparse
import fcntl
import logging
import os
import random
import statistics
import struct
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpushare.environment import ContainerLimits
from gpushare.isolation.agent import AgentConfig, IsolationAgent
from gpushare.isolation.backends.mock import Demand, MemoryStep, MockBackend, share_gpu
from gpushare.isolation.backends.port import GIB, GpuProcess
from gpushare.isolation.clock import SimulatedClock, SystemClock
from gpushare.isolation.control import ControlTree
from gpushare.isolation.interposer.region import LAYOUT_VERSION, MAGIC, MAX_SLOTS, RegionRecord
from gpushare.isolation.pacing import RegionPacer
from gpushare.isolation.policy import Policy
from gpushare.isolation.workload import ObservedContainer
from gpushare.labels import NodeMode
from gpushare.standins.scenario import Workload, place
from gpushare.table import render

SECONDS = 60.0
TOLERANCE_PP = 3.0


@dataclass(frozen=True)
class Scenario:
    label: str
    workloads: tuple[Workload, ...]
    policy: Policy | None
    mode: NodeMode = NodeMode.CGPU
    max_inst: int = 16
    prio_ratio: int = 50
    targets: tuple[float, ...] = ()
    """Percent per workload where the control tree's promise is not the whole story."""


SCENARIOS = (
    Scenario(
        "0 fair-share, max_inst 4",
        (Workload("a", 2), Workload("b", 2), Workload("c", 2)),
        Policy.FAIR_SHARE,
        max_inst=4,
    ),
    Scenario(
        "1 preemptive, c idle",
        (Workload("a", 2), Workload("b", 2), Workload("c", 2, demand=Demand.never())),
        Policy.PREEMPTIVE,
    ),
    Scenario(
        "2 weight-based 1:2:3",
        (Workload("a", 2, weight=1), Workload("b", 2, weight=2), Workload("c", 2, weight=3)),
        Policy.WEIGHTED,
    ),
    Scenario(
        "3 fixed 30% + 50%",
        (Workload("a", 2, core=30), Workload("b", 2, core=50)),
        None,
        mode=NodeMode.CORE_MEM,
    ),
    Scenario(
        "4 soft, intensity 3:1",
        (Workload("a", 2, intensity=3.0), Workload("b", 2, intensity=1.0)),
        Policy.SOFT,
    ),
    Scenario(
        "5 native, intensity 3:1",
        (Workload("a", 2, intensity=3.0), Workload("b", 2, intensity=1.0)),
        Policy.NATIVE,
    ),
    Scenario(
        "1 preemptive + high prio, ratio 40",
        (Workload("hp", 2, high_priority=True), Workload("a", 2), Workload("b", 2)),
        Policy.PREEMPTIVE,
        prio_ratio=40,
    ),
    Scenario(
        "2 weight-based 1:2, b busy 2s/idle 1s",
        (Workload("a", 2, weight=1), Workload("b", 2, weight=2, demand=Demand(2.0, 1.0))),
        Policy.WEIGHTED,
        # b busy 2/3 of the time: b gets 2/3 of that, a 1/3 of it plus all of b's idle third.
        targets=(100 * (2 / 3 * 1 / 3 + 1 / 3), 100 * (2 / 3 * 2 / 3)),
    ),
)


def shares(scenario: Scenario, tmp: Path, seconds: float) -> list[list[object]]:
    node = place(scenario.workloads, layout="1x16GiB", mode=scenario.mode)
    clock = SimulatedClock()
    backend = MockBackend(node.devices, clock, node.containers)
    config = AgentConfig(
        version="bench",
        default_policy=scenario.policy,
        max_inst=scenario.max_inst,
        prio_ratio=scenario.prio_ratio,
    )
    agent = IsolationAgent(backend, ControlTree(tmp / scenario.label), clock, config)
    agent.run(duration_s=seconds)
    [gpu] = agent.content().gpus
    limits = {c.id: c.limit for c in gpu.containers}
    natural = share_gpu({i: w.intensity for i, w in enumerate(scenario.workloads)})
    rows = []
    for i, w in enumerate(scenario.workloads):
        key = node.container(w.name).id
        achieved = 100 * backend.used_s(key, 0) / seconds
        target = limits[key]
        if scenario.targets:
            target = scenario.targets[i]
        elif target is None:
            target = 100 * natural[i]  # native: the GPU's own split
        elif w.demand.busy_s <= 0:
            target = 0.0  # no work: promised a share, it uses none of it
        delta = achieved - target
        verdict = "ok" if abs(delta) <= TOLERANCE_PP else "OFF"
        rows.append(
            [scenario.label, w.name, f"{target:.1f}", f"{achieved:.1f}", f"{delta:+.1f}", verdict]
        )
    return rows


def reaction_ms(slice_ms: int, trials: int, tmp: Path) -> list[float]:
    workloads = [Workload(f"p{i}", 2, memory=(MemoryStep(0, GIB),)) for i in range(trials)]
    node = place(workloads, layout="2x80GiB", mode=NodeMode.CGPU)
    clock = SystemClock()
    backend = MockBackend(node.devices, clock, node.containers)
    config = AgentConfig(version="bench", slice_s=slice_ms / 1000)
    agent = IsolationAgent(backend, ControlTree(tmp / f"react-{slice_ms}"), clock, config)
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, kwargs={"stop": stop})
    runner.start()
    rng = random.Random(7)
    results = []
    try:
        for i in range(trials):
            time.sleep(slice_ms / 1000 * (1 + rng.random()))
            started = time.monotonic()
            name = f"p{i}"
            backend.allocate(node.container(name).id, node.gpu_of[name], 3 * GIB)
            while len(backend.kills) <= i:
                time.sleep(0.0005)
            results.append(1000 * (time.monotonic() - started))
    finally:
        stop.set()
        runner.join()
    return results


def tick_ms(gpus: int, per_gpu: int, ticks: int, tmp: Path) -> tuple[list[float], list[float]]:
    workloads = [
        Workload(f"p{i}", 1, weight=1 + i % 3, memory=(MemoryStep(0, GIB // 2),))
        for i in range(gpus * per_gpu)
    ]
    node = place(workloads, layout=f"{gpus}x{per_gpu}GiB", mode=NodeMode.CGPU)
    clock = SimulatedClock()
    backend = MockBackend(node.devices, clock, node.containers)
    config = AgentConfig(version="bench", default_policy=Policy.WEIGHTED)
    agent = IsolationAgent(backend, ControlTree(tmp / "ticks"), clock, config)
    wall, cpu = [], []
    for _ in range(ticks):
        started, started_cpu = time.perf_counter(), time.process_time()
        agent.tick()
        wall.append(1000 * (time.perf_counter() - started))
        cpu.append(1000 * (time.process_time() - started_cpu))
        clock.advance(config.slice_s)
    return wall, cpu


def region_tick_ms(containers: int, ticks: int, tmp: Path) -> tuple[list[float], list[float]]:
    """What reading the interposer's regions adds to a tick: `containers` paced containers,
    each region read by pread into a copy, its live slots told by their OFD locks, and its
    gate and share written, as the agent does every slice."""
    directory = tmp / "interposer"
    observed, holders = {}, []
    for i in range(containers):
        grant_id = f"{i:032x}"
        path = directory / "grants" / grant_id / "region" / "cuda-region"
        path.parent.mkdir(parents=True)
        record = RegionRecord()
        record.magic, record.layout_version = MAGIC, LAYOUT_VERSION
        record.gpu_count, record.slot_count = 1, MAX_SLOTS
        record.gpus[0].cap_bytes, record.gpus[0].gate = GIB, 1
        record.slots[0].pid = 1000 + i
        path.write_bytes(bytes(record))
        holder = os.open(path, os.O_RDWR)  # the container's process, holding its slot
        start = RegionRecord.slots.offset
        fcntl.fcntl(holder, fcntl.F_OFD_SETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, start, 1, 0))
        holders.append(holder)
        process = GpuProcess(
            1000 + i, 0, GIB // 2, 10.0, f"{i:064x}", "uid", {}, 1000 + i, grant_id
        )
        limits = ContainerLimits(f"ns/p{i}", "main", ("GPU-0",), (0,), (1,), (16,), (30,))
        observed[process.container_id] = ObservedContainer(
            process.container_id, limits, "uid", (process,), grant_id
        )
    pacer = RegionPacer(directory, slice_s=0.1)
    wall, cpu = [], []
    try:
        for _ in range(ticks):
            started, started_cpu = time.perf_counter(), time.process_time()
            paced = pacer.paced(observed)
            pacer.pace(observed, paced, {0: frozenset()})
            pacer.usage(observed)
            wall.append(1000 * (time.perf_counter() - started))
            cpu.append(1000 * (time.process_time() - started_cpu))
        assert len(paced) == containers, f"{len(paced)} of {containers} paced"
    finally:
        pacer.close()
        for holder in holders:
            os.close(holder)
    return wall, cpu


_FLOCK = struct.Struct("@hhqqi4x")


def summary(values: Sequence[float]) -> str:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return (
        f"mean {statistics.mean(values):.1f}  p50 {statistics.median(values):.1f}  "
        f"p95 {p95:.1f}  max {max(values):.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 10 s per policy scenario (shares may miss their tolerance), "
        "5 reactions per slice length, 30 ticks",
    )
    args = parser.parse_args()
    seconds, trials, ticks = (10.0, 5, 30) if args.quick else (SECONDS, 30, 300)
    logging.getLogger("gpushare.isolation").setLevel(logging.ERROR)  # the kills are expected
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else None) as directory:
        tmp = Path(directory)
        rows = [row for scenario in SCENARIOS for row in shares(scenario, tmp, seconds)]
        print(f"Compute share per policy, mock backend, {seconds:.0f} s simulated, 100 ms slices")
        header = ["POLICY", "POD", "TARGET %", "ACHIEVED %", "DELTA pp", f"±{TOLERANCE_PP:g}pp"]
        print(render(header, rows))
        off = [r for r in rows if r[-1] != "ok"]
        print(f"{len(rows) - len(off)}/{len(rows)} shares within ±{TOLERANCE_PP:g} pp")
        print()
        print("Memory-cap reaction (allocation past the cap -> process killed), system clock:")
        for slice_ms in (100, 20):
            print(f"  slice {slice_ms:>3} ms: {summary(reaction_ms(slice_ms, trials, tmp))} ms")
        print()
        for gpus, per_gpu in ((1, 4), (4, 10)):
            wall, cpu = tick_ms(gpus, per_gpu, ticks, tmp)
            print(f"Agent tick, {gpus} GPU(s) x {per_gpu} containers, control tree on tmpfs:")
            print(f"  wall {summary(wall)} ms")
            print(f"  cpu  {summary(cpu)} ms")
        wall, cpu = region_tick_ms(40, ticks, tmp)
        print("Regions read and gates written in a tick, 40 containers under the interposer:")
        print(f"  wall {summary(wall)} ms")
        print(f"  cpu  {summary(cpu)} ms")


if __name__ == "__main__":
    main()
