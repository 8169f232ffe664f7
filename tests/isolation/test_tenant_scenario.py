"""The tenant scenario, whole, on one node in CI: what the device plugin writes, what the
CUDA interposer enforces from it and what the isolation agent does, together, when a
tenant turns on the file it may write.

The real device plugin answers two pods on one 16 GiB GPU of a core_mem node through
the kubelet stand-in: `tenant` (2 GiB, 30 percent) and `neighbour` (4 GiB, 70 percent).
Each answer's grant and accounting directory (the node's side of /etc/gpushare/grant and
/run/gpushare) are what the containers run on: their processes are probes on the fake
driver with the interposer preloaded, a build of it per container that reads the grant
the plugin wrote (its region path turned into the node's side of the mount, which is
what the bind mount amounts to). The real agent ticks in a thread on the real clock over
an NVML stand-in that lists those processes with the bytes the fake driver served them.

The tenant sets ALIYUN_COM_GPU_MEM_CONTAINER=16 for its processes, then spoils its
region (truncates it, writes garbage over it) or forges it (a 16 GiB cap, 1,000 processes
attached), and runs a process without the interposer. Whatever it does: the library
refuses past its granted cap (everything, where the region is no region), the agent
distrusts it alone, freezes it by its share, kills what holds more than its cap allows;
the agent keeps ticking, and the neighbour keeps its cap, its share and its pacing.

An agent that mapped the region would die of SIGBUS at the truncation, taking this test
process with it (test_hostile_region.py shows it in a subprocess).
"""

import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final

import pytest

from gpushare import grant as grants
from gpushare.environment import ACCOUNTING_DIR_IN_CONTAINER, MEM_CONTAINER, REGION_FILE
from gpushare.isolation.agent import AgentConfig, IsolationAgent
from gpushare.isolation.backends.mock import mock_container_id
from gpushare.isolation.backends.port import GpuDevice, GpuProcess, Observation
from gpushare.isolation.clock import SystemClock
from gpushare.isolation.control import ControlTree
from gpushare.isolation.interposer.build import build_library
from gpushare.isolation.interposer.region import REGION_BYTES, Refusal, Region
from gpushare.isolation.metrics import AgentMetrics
from gpushare.standins.kubelet import AdmittedContainer
from tests.deviceplugin.rig import Rig, eventually
from tests.deviceplugin.test_interposer_injection import granted, installed, mounted
from tests.fakecuda import GIB, MIB, Container, FakeCuda, fake_cuda_or_skip, parse_line
from tests.isolation.regions import gpu_field, header_field, poke

SLICE_S: Final = 0.02
NODE: Final = "n1"
OUT_OF_MEMORY: Final = "2"
WATCH_S: Final = 1.0
"""How long the shares are watched: 50 slices."""
TICK_SECONDS: Final = "gpushare_isolation_tick_seconds"
TICK_BOUND_S: Final = 0.25
"""The histogram bucket every tick must fall in; a blocked tick never ends at all."""


@dataclass
class Tenancy:
    """One pod's container as its Allocate answer made it: the grant the plugin wrote,
    the node's side of its region, and the fake driver's GPU as the container sees it."""

    pod: str
    grant: grants.Grant
    region: Path
    container: Container
    environ: dict[str, str]

    @property
    def key(self) -> str:
        """What the agent calls the container (its runtime ID)."""
        return mock_container_id(f"default/{self.pod}", self.grant.container)


class NvmlStandIn:
    """The node's GPU as NVML lists it, for the agent (a IsolationBackend): the real processes
    the test lists, by their pid (also their pid in the container: no pid namespace
    here), in their container, with their grant and the bytes the test says they hold.
    kill() kills them; hold() records what the agent froze."""

    name = "nvml-stand-in"

    def __init__(self, device: GpuDevice) -> None:
        self._device = device
        self._lock = threading.Lock()
        self._listed: dict[int, tuple[subprocess.Popen[str], GpuProcess]] = {}
        self.holds: list[tuple[float, frozenset[str]]] = []
        self.kills: list[int] = []

    def show(self, process: subprocess.Popen[str], tenancy: Tenancy, mem_bytes: int) -> None:
        listed = GpuProcess(
            pid=process.pid,
            gpu_index=self._device.index,
            mem_bytes=mem_bytes,
            sm_percent=None,
            container_id=tenancy.key,
            pod_uid=tenancy.grant.pod_uid,
            environ=tenancy.environ,
            ns_pid=process.pid,
            grant_id=tenancy.grant.id,
        )
        with self._lock:
            self._listed[process.pid] = (process, listed)

    def devices(self) -> tuple[GpuDevice, ...]:
        return (self._device,)

    def observe(self) -> Observation:
        with self._lock:
            listed = list(self._listed.values())
        return Observation(time.monotonic(), tuple(p for run, p in listed if run.poll() is None))

    def hold(self, frozen: frozenset[str]) -> None:
        with self._lock:
            self.holds.append((time.monotonic(), frozen))

    def kill(self, pid: int) -> None:
        os.kill(pid, signal.SIGKILL)
        with self._lock:
            self.kills.append(pid)

    def close(self) -> None:
        self.hold(frozenset())

    def holds_since(self, since: float) -> list[frozenset[str]]:
        with self._lock:
            return [frozen for at, frozen in self.holds if at >= since]


@dataclass
class Node:
    rig: Rig
    nvml: NvmlStandIn
    agent: IsolationAgent
    ticking: threading.Thread
    tenancy: dict[str, Tenancy]
    started: list[subprocess.Popen[str]] = field(default_factory=list)

    def start(self, pod: str, *commands: str, preload: bool = True) -> subprocess.Popen[str]:
        """A probe in the pod's container, with the interposer unless `preload` is off."""
        tenancy = self.tenancy[pod]
        container = replace(tenancy.container, preload=preload)
        process = container.start_probe("link", *commands)
        self.started.append(process)
        return process

    def sample(self, name: str, **labels: str) -> float | None:
        return self.agent.metrics.registry.get_sample_value(name, {"node": NODE, **labels})

    def labels(self, pod: str) -> dict[str, str]:
        tenancy = self.tenancy[pod]
        return {
            "namespace": "default",
            "pod": pod,
            "container": tenancy.grant.container,
            "container_id": tenancy.key,
        }

    def paced(self, pod: str) -> bool:
        return self.sample("gpushare_isolation_interposer", gpu="0", **self.labels(pod)) == 1

    def ticks(self) -> float:
        return self.sample(f"{TICK_SECONDS}_count") or 0.0

    def slow_ticks(self) -> float:
        """Ticks that took over TICK_BOUND_S, from one read of the histogram (the agent
        ticks on between two reads)."""
        [tick] = [m for m in self.agent.metrics.registry.collect() if m.name == TICK_SECONDS]
        buckets = {s.labels["le"]: s.value for s in tick.samples if s.name.endswith("_bucket")}
        return buckets["+Inf"] - buckets[str(TICK_BOUND_S)]

    def watch(self, seconds: float = WATCH_S) -> list[frozenset[str]]:
        """What the agent froze at each tick over the next `seconds`."""
        since = time.monotonic()
        time.sleep(seconds)
        return self.nvml.holds_since(since)


def held(process: subprocess.Popen[str]) -> int:
    """The bytes the fake driver has served the process so far (what NVML would list it
    holding), from its next `reached` line."""
    assert process.stdout is not None
    while True:
        line = process.stdout.readline()
        assert line, f"the probe ended: {process.communicate()[1]}"
        if line.startswith("reached "):
            return int(parse_line(line)["bytes"])


def go(process: subprocess.Popen[str]) -> None:
    assert process.stdin is not None
    process.stdin.write("go\n")
    process.stdin.flush()


def rcs(stdout: str) -> list[str]:
    return [parse_line(line)["rc"] for line in stdout.splitlines() if line.startswith("alloc ")]


def granted_build(built: FakeCuda, pod: str) -> FakeCuda:
    """The fake driver and probe, with an interposer of the pod's own that reads its grant
    at a path of its own: two containers run at once, each under its grant."""
    grant_path = built.directory / f"grant-{pod}"
    library = build_library(built.directory, grant_path=str(grant_path))
    return replace(built, granted_interposer=library, grant_path=grant_path)


def run_on_the_node(
    built: FakeCuda, pod: str, answer: AdmittedContainer, environment_cap: str | None = None
) -> Tenancy:
    """The container the answer describes: its grant written where its build reads it,
    naming the node's side of its region."""
    grant = granted(answer)
    accounting = Path(mounted(answer)[ACCOUNTING_DIR_IN_CONTAINER][0])
    region = accounting / REGION_FILE
    build = granted_build(built, pod)
    build.grant_path.write_bytes(grants.encode(replace(grant, region=str(region))))
    environ = dict(answer.envs)
    if environment_cap is not None:
        environ[MEM_CONTAINER] = environment_cap
    container = Container(
        build,
        region,
        caps=environ[MEM_CONTAINER],
        devices=((grant.uuids[0], 16 * GIB),),
        visible=environ["NVIDIA_VISIBLE_DEVICES"],
        granted=True,
    )
    return Tenancy(pod, grant, region, container, environ)


@pytest.fixture
def node() -> Iterator[Node]:
    """Both pods admitted, each with one process that allocated 1 GiB and waits, both
    paced by the agent ticking in its thread."""
    built = fake_cuda_or_skip()
    with tempfile.TemporaryDirectory(prefix="gp-", dir="/tmp") as tmp, ExitStack() as stack:
        root = Path(tmp)  # short: the rig's unix sockets
        directory = installed(root / "interposer")
        rig = Rig(root / "rig", layout="1x16GiB", mode="core_mem", interposer_dir=directory)
        stack.callback(rig.stop)
        rig.start()
        [tenant_answer] = rig.kubelet.admit(rig.bind("tenant", [[0]], mem=2, core=30))
        [neighbour_answer] = rig.kubelet.admit(rig.bind("neighbour", [[0]], mem=4, core=70))
        # The tenant asks its processes for 16 GiB, as any process of it can.
        tenancy = {
            "tenant": run_on_the_node(built, "tenant", tenant_answer, environment_cap="16"),
            "neighbour": run_on_the_node(built, "neighbour", neighbour_answer),
        }
        for t in tenancy.values():
            stack.callback(t.container.built.grant_path.unlink, missing_ok=True)
        device = GpuDevice(0, tenancy["tenant"].grant.uuids[0], 16 * GIB)
        nvml = NvmlStandIn(device)
        config = AgentConfig(version="tenant", slice_s=SLICE_S, interposer_dir=directory)
        clock = SystemClock()
        agent = IsolationAgent(nvml, ControlTree(root / "cgpu"), clock, config, AgentMetrics(NODE))
        stop = threading.Event()
        ticking = threading.Thread(target=agent.run, args=(stop,), daemon=True)
        n = Node(rig, nvml, agent, ticking, tenancy)
        stack.callback(_end, n, stop)
        for pod in tenancy:
            first = n.start(pod, "init", "0", "alloc", "mem", str(GIB), "reached", "0", "wait")
            nvml.show(first, tenancy[pod], held(first))
        ticking.start()
        assert eventually(lambda: n.paced("tenant") and n.paced("neighbour"))
        assert n.sample("gpushare_isolation_distrusted_regions") == 0
        yield n


def _end(n: Node, stop: threading.Event) -> None:
    stop.set()
    n.ticking.join(timeout=5)
    for process in n.started:
        process.kill()
        process.communicate()


def truncate(region: Path) -> None:
    os.truncate(region, 0)


def garble(region: Path) -> None:
    region.write_bytes(b"garbage!" * (REGION_BYTES // 8))


SPOILED: dict[str, tuple[Callable[[Path], None], Refusal]] = {
    "truncated": (truncate, Refusal.SIZE),
    "garbage": (garble, Refusal.HEADER),
}


def assert_the_neighbour_keeps_its_cap_share_and_pace(
    n: Node, frozen: list[frozenset[str]]
) -> None:
    neighbour = n.tenancy["neighbour"]
    assert frozen and not any(neighbour.key in f for f in frozen)
    assert n.paced("neighbour")
    with Region.open(neighbour.region) as region:
        assert region.gpus()[0].share_percent == 70
        # Its gate is written as its scheduler says: closed for the tenant's 30 percent,
        # each closing a fresh horizon.
        before = region.read().gpus[0].gate_until_ns
        assert eventually(lambda: region.read().gpus[0].gate_until_ns > before, timeout=1)
    # Its first process holds 1 GiB of its 4: 2 GiB more fit, 2 GiB past that do not.
    result = neighbour.container.run_probe(
        "link", "init", "0", "alloc", "mem", str(2 * GIB), "alloc", "mem", str(2 * GIB)
    )
    assert rcs(result.stdout) == ["0", OUT_OF_MEMORY], result.stderr


def assert_frozen_by_its_share(n: Node, frozen: list[frozenset[str]]) -> None:
    """Not paced: frozen in about 70 percent of the slices, as its 30 percent says."""
    tenant = n.tenancy["tenant"].key
    assert not n.paced("tenant")
    assert sum(tenant in f for f in frozen) / len(frozen) == pytest.approx(0.7, abs=0.15)


def assert_the_agent_kept_ticking(n: Node, ticks_before: float, since: float) -> None:
    assert n.ticking.is_alive()
    slices = (time.monotonic() - since) / SLICE_S
    assert n.ticks() - ticks_before > slices / 2
    assert n.slow_ticks() == 0


def killed_over_its_cap(n: Node, bypass: subprocess.Popen[str]) -> None:
    """The agent kills the process without the interposer (the one holding the most) and
    nothing else of the tenant's."""
    assert eventually(lambda: bypass.poll() is not None), "the agent left it running"
    assert bypass.returncode == -signal.SIGKILL
    assert n.nvml.kills == [bypass.pid]
    labels = {**n.labels("tenant"), "gpu": "0", "action": "kill"}
    violations = "gpushare_isolation_memory_cap_violations_total"
    assert eventually(lambda: n.sample(violations, **labels) == 1)  # published after the kill


@pytest.mark.parametrize("spoiled", SPOILED, ids=SPOILED)
def test_a_tenant_that_spoils_its_region_is_refused_distrusted_and_frozen_alone(
    node: Node, spoiled: str
) -> None:
    spoil, refusal = SPOILED[spoiled]
    tenant = node.tenancy["tenant"]
    since, ticks_before = time.monotonic(), node.ticks()

    spoil(tenant.region)

    # The library fails closed: nothing, not even within its cap, reaches the driver.
    result = tenant.container.run_probe(
        "link", "init", "0", "alloc", "mem", str(512 * MIB), "alloc", "mem", str(3 * GIB),
        "reached", "0",
    )  # fmt: skip
    assert rcs(result.stdout) == [OUT_OF_MEMORY, OUT_OF_MEMORY], result.stderr
    assert "reached device=0 bytes=0" in result.stdout
    # The agent distrusts its region, alone, and freezes it by its share instead.
    assert eventually(lambda: node.sample("gpushare_isolation_distrusted_regions") == 1)
    distrusted = {**node.labels("tenant"), "reason": refusal}
    assert node.sample("gpushare_isolation_region_distrusted_total", **distrusted) == 1
    frozen = node.watch()
    assert_frozen_by_its_share(node, frozen)
    assert_the_neighbour_keeps_its_cap_share_and_pace(node, frozen)
    # A process without the library that takes 3 GiB: 4 GiB in all, over its 2.
    bypass = node.start("tenant", "init", "0", "alloc", "mem", str(3 * GIB), "reached", "0",
                        "wait", preload=False)  # fmt: skip
    node.nvml.show(bypass, tenant, held(bypass))
    killed_over_its_cap(node, bypass)
    assert_the_agent_kept_ticking(node, ticks_before, since)


def test_a_tenant_that_forges_its_region_is_held_to_its_grant(node: Node) -> None:
    """A 16 GiB cap and 1,000 processes attached, written into its region: the library
    caps it at its grant's 2 GiB, and the agent paces it only while every process NVML
    lists holds a live slot, whatever `attached` says."""
    tenant = node.tenancy["tenant"]
    since, ticks_before = time.monotonic(), node.ticks()

    poke(tenant.region, gpu_field(0, "cap_bytes"), (16 * GIB).to_bytes(8, "little"))
    poke(tenant.region, header_field("attached"), (1000).to_bytes(4, "little"))

    # Its first process holds 1 GiB of its 2: 3 GiB more do not fit, 512 MiB do.
    result = tenant.container.run_probe(
        "link", "init", "0", "alloc", "mem", str(3 * GIB), "alloc", "mem", str(512 * MIB)
    )
    assert rcs(result.stdout) == [OUT_OF_MEMORY, "0"], result.stderr
    # A process without the library, under the cap: no slot of its own, so not paced.
    bypass = node.start("tenant", "init", "0", "alloc", "mem", str(512 * MIB), "reached", "0",
                        "wait", "alloc", "mem", str(3 * GIB), "reached", "0", "wait",
                        preload=False)  # fmt: skip
    node.nvml.show(bypass, tenant, held(bypass))
    assert eventually(lambda: not node.paced("tenant"))
    frozen = node.watch()
    assert_frozen_by_its_share(node, frozen)
    assert_the_neighbour_keeps_its_cap_share_and_pace(node, frozen)
    assert node.nvml.kills == []
    # It takes 3 GiB more: 4.5 GiB in all, over its cap plus any slack it could have had.
    go(bypass)
    node.nvml.show(bypass, tenant, held(bypass))
    killed_over_its_cap(node, bypass)
    assert node.sample("gpushare_isolation_distrusted_regions") == 0  # its region reads
    assert_the_agent_kept_ticking(node, ticks_before, since)
