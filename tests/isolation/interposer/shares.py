"""Compute shares through the whole chain, on the fake driver: the real isolation agent
(real clock, its scheduler and policy) writes the gates of two containers' regions; in
each container a process with the interposer preloaded launches kernels as fast as it
may. The fake driver runs one kernel at a time per device across processes (like a GPU)
and each kernel busy-waits a set time, so a container's launches times that time is its
GPU time. Used by tests/isolation/interposer/test_shares.py and bench/interposer_bench.py.

    infer: 30 percent, weight 1      train: 70 percent, weight 3
"""

import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

from gpushare.environment import CONTAINER, REGION_FILE
from gpushare.isolation.agent import AgentConfig, IsolationAgent
from gpushare.isolation.backends.mock import Demand, MockBackend, MockContainer
from gpushare.isolation.backends.port import Observation
from gpushare.isolation.clock import SystemClock
from gpushare.isolation.control import ControlTree
from gpushare.isolation.interposer.region import Region
from gpushare.isolation.policy import Policy
from gpushare.labels import NodeMode
from gpushare.standins.scenario import Node, Workload, place
from tests.fakecuda import Container, FakeCuda, parse_line

KERNEL_US: Final = 200
SLICE_S: Final = 0.02
MAX_INST: Final = {Policy.FAIR_SHARE: 4}
"""max_inst per policy where it is not the default (fair share: 1/max_inst each)."""


class MeasuredUse(MockBackend):
    """The mock's processes, with the GPU use NVML would report: each container's kernel
    time since the previous observation, from its region's launch count (a kernel takes
    KERNEL_US). The soft and preemptive policies decide from it. Each container's mock
    process goes by the pid of its launcher in `pids`, as a process is named in its region."""

    def __init__(
        self, node: Node, clock: SystemClock, regions: dict[str, Path], pids: dict[str, int]
    ) -> None:
        super().__init__(node.devices, clock, node.containers)
        for key, launcher in pids.items():
            for pid in self.pids(key):
                self.set_ns_pid(pid, launcher)
        self._regions = {key: Region.open(path) for key, path in regions.items()}
        self._seen: dict[str, tuple[float, int]] = {}

    def observe(self) -> Observation:
        observation = super().observe()
        use = {key: self._use(key, region, observation.at) for key, region in self._regions.items()}
        return replace(
            observation,
            processes=tuple(
                replace(p, sm_percent=use[p.container_id]) if p.container_id in use else p
                for p in observation.processes
            ),
        )

    def _use(self, key: str, region: Region, now: float) -> float | None:
        launches = region.gpus()[0].launches
        before = self._seen.get(key)
        self._seen[key] = (now, launches)
        if before is None or now <= before[0]:
            return None
        busy = (launches - before[1]) * KERNEL_US / 1e6
        return min(100.0, 100 * busy / (now - before[0]))

    def close(self) -> None:
        super().close()
        for region in self._regions.values():
            region.close()


@dataclass(frozen=True)
class Share:
    measured: float
    """Fraction of the wall time its kernels ran."""
    promised: float | None
    """What the agent's policy promises it (the control tree's limit); None: native."""
    held_s: float
    """Time its launches waited at a closed gate."""


def region_of(directory: Path, container: MockContainer) -> Path:
    """Where Allocate's accounting directory puts the container's region."""
    name = container.environ[CONTAINER]
    return directory / "interposer" / "regions" / container.pod_uid / name / REGION_FILE


def measure(
    built: FakeCuda, directory: Path, policy: Policy, contended: bool, seconds: float = 2.5
) -> dict[str, Share]:
    """infer's (and, contended, train's) share of the GPU under `policy`."""
    node = place(
        [
            Workload("infer", 2, core=30, weight=1),
            Workload(
                "train", 4, core=70, weight=3, demand=Demand() if contended else Demand.never()
            ),
        ],
        mode=NodeMode.CORE_MEM,
    )
    clock = SystemClock()
    config = AgentConfig(
        version="shares",
        slice_s=SLICE_S,
        default_policy=policy,
        max_inst=MAX_INST.get(policy, 16),
        interposer_dir=directory / "interposer",
    )
    busy = ["infer", "train"] if contended else ["infer"]
    launchers, regions = {}, {}
    for name in busy:
        mock = node.container(name)
        region = region_of(directory, mock)
        region.parent.mkdir(parents=True)
        regions[mock.id] = region
        container = Container(
            built,
            region,
            caps="2",
            extra={"FAKE_CUDA_LOCKS": str(directory), "FAKE_CUDA_KERNELS": "sleep"},
        )
        launchers[name] = container.start_probe(
            "link", "init", "0", "alloc", "mem", str(1 << 20),  # attaches to the region
            "wait", "loop", "kernel", str(KERNEL_US), str(int(seconds * 1000)),
        )  # fmt: skip
    try:
        for launcher in launchers.values():
            assert launcher.stdout is not None
            for expected in ("init", "alloc"):
                assert launcher.stdout.readline().startswith(expected)
        pids = {node.container(name).id: launcher.pid for name, launcher in launchers.items()}
        agent = IsolationAgent(
            MeasuredUse(node, clock, regions, pids), ControlTree(directory / "cgpu"), clock, config
        )
        stop = threading.Event()
        running = threading.Thread(target=agent.run, args=(stop,), daemon=True)
        running.start()
        time.sleep(10 * SLICE_S)  # the agent finds the regions and takes over the gates
        for launcher in launchers.values():
            assert launcher.stdin is not None
            launcher.stdin.write("go\n")
            launcher.stdin.flush()
        time.sleep(seconds / 2)  # what the policy promises while both have work
        promised = {c.pod: c.limit for g in agent.content().gpus for c in g.containers}
        done = {}
        for name, launcher in launchers.items():
            out, err = launcher.communicate(timeout=seconds + 30)
            assert launcher.returncode == 0, err
            done[name] = parse_line(out.strip().splitlines()[-1])
        stop.set()
        running.join(timeout=5)
    finally:
        for launcher in launchers.values():
            launcher.kill()
    shares = {}
    for name in busy:
        mock = node.container(name)
        with Region.open(region_of(directory, mock)) as region:
            held = region.gpus()[0].held_ns / 1e9
        limit = promised.get(f"default/{name}")
        shares[name] = Share(
            measured=int(done[name]["busy_ns"]) / 1e9 / float(done[name]["seconds"]),
            promised=None if limit is None else limit / 100,
            held_s=held,
        )
    return shares
