"""The mock backend: simulated GPUs and container processes, good enough to run the agent on.

Each mock container carries the contract environment the device plugin would
have given it (`gpushare.environment.container_env`), so the agent reads its
limits exactly as on a real node. It has one process per GPU of that
environment, a demand pattern (when it has GPU work), an intensity (how hard it
pushes the GPU when it shares it with others) and a memory schedule.

The simulated GPU time-slices natively: between two observations, the thawed
containers with work split the GPU in proportion to their intensity. Frozen
containers get nothing; a killed process is gone.
"""

import hashlib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from gpushare.allocation import ContainerAllocation, PodAllocation
from gpushare.environment import MEM_IDX, container_env
from gpushare.inventory import Gpu
from gpushare.isolation.backends.port import GIB, GpuDevice, GpuProcess, Observation, container_key
from gpushare.isolation.backends.procfs import ContractProcess
from gpushare.isolation.clock import Clock
from gpushare.objects import Pod

FIRST_PID: Final = 4000


@dataclass(frozen=True, slots=True)
class Demand:
    """When a container has GPU work: busy for busy_s, idle for idle_s, repeating,
    starting offset_s after the backend started. idle_s = 0 means always busy."""

    busy_s: float = math.inf
    idle_s: float = 0.0
    offset_s: float = 0.0

    @classmethod
    def never(cls) -> "Demand":
        return cls(busy_s=0.0, idle_s=1.0)

    def busy_at(self, t: float) -> bool:
        if t < self.offset_s:
            return False
        if self.idle_s <= 0:
            return True
        if self.busy_s <= 0:
            return False
        return (t - self.offset_s) % (self.busy_s + self.idle_s) < self.busy_s


@dataclass(frozen=True, slots=True)
class MemoryStep:
    """From at_s seconds after the backend started, each of the container's processes
    holds this many bytes of GPU memory."""

    at_s: float
    mem_bytes: int


@dataclass(frozen=True, slots=True)
class MockContainer:
    id: str
    environ: Mapping[str, str]
    demand: Demand = field(default_factory=Demand)
    intensity: float = 1.0
    memory: tuple[MemoryStep, ...] = ()
    pod_uid: str = ""

    @classmethod
    def from_allocation(
        cls,
        pod: Pod,
        allocation: PodAllocation,
        container: ContainerAllocation,
        *,
        isolation_disabled: bool = False,
        demand: Demand = Demand(),
        intensity: float = 1.0,
        memory: Sequence[MemoryStep] = (),
    ) -> "MockContainer":
        """A container started with the environment the device plugin hands it."""
        return cls(
            id=mock_container_id(pod.key, container.name),
            environ=container_env(pod, allocation, container, isolation_disabled),
            demand=demand,
            intensity=intensity,
            memory=tuple(memory),
            pod_uid=pod.metadata.uid,
        )

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        raw = self.environ.get(MEM_IDX, "")
        return tuple(int(part) for part in raw.split(",") if part.strip())


def mock_container_id(pod_key: str, container: str) -> str:
    """A stable 64-hex ID, shaped like a containerd container ID."""
    return hashlib.sha256(f"{pod_key}/{container}".encode()).hexdigest()


def mock_devices(gpus: Iterable[Gpu]) -> tuple[GpuDevice, ...]:
    return tuple(GpuDevice(g.index, g.uuid, g.mem * GIB, g.model) for g in gpus)


@dataclass(slots=True)
class _Process:
    pid: int
    container: MockContainer
    gpu_index: int
    mem_override: int | None = None
    ns_pid: int | None = None
    """What it is called in its container's pid namespace; None: its pid."""
    alive: bool = True
    sm_percent: float = 0.0
    used_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Kill:
    at: float
    pid: int
    container_id: str
    gpu_index: int
    mem_bytes: int


@dataclass(slots=True)
class _State:
    processes: list[_Process] = field(default_factory=list)
    frozen: frozenset[str] = frozenset()
    next_pid: int = FIRST_PID


class MockBackend:
    """Implements `IsolationBackend` on simulated GPUs, driven by the agent's clock."""

    name = "mock"

    def __init__(
        self,
        devices: Sequence[GpuDevice],
        clock: Clock,
        containers: Iterable[MockContainer] = (),
        discover: Callable[[], Sequence[MockContainer]] | None = None,
        discover_every_s: float = 2.0,
    ) -> None:
        self._devices = tuple(devices)
        self._clock = clock
        self._started = clock.now()
        self._last = self._started
        self._discover = discover
        self._discover_every_s = discover_every_s
        self._discovered_at: float | None = None
        self._state = _State()
        self.kills: list[Kill] = []
        for container in containers:
            self.add(container)

    def devices(self) -> tuple[GpuDevice, ...]:
        return self._devices

    def add(self, container: MockContainer) -> None:
        """Start a container: one process on each GPU its environment names."""
        known = {d.index for d in self._devices}
        for index in container.gpu_indices:
            if index not in known:
                raise ValueError(
                    f"container {container.id[:12]} names GPU {index}, not on this node"
                )
            self._state.processes.append(_Process(self._state.next_pid, container, index))
            self._state.next_pid += 1

    def start(self, container_id: str, gpu_index: int, mem_bytes: int = 0) -> int:
        """One more process of a running container on one of its GPUs (a second program
        in it); its pid."""
        [first, *_] = [p for p in self._state.processes if p.container.id == container_id]
        pid = self._state.next_pid
        self._state.processes.append(_Process(pid, first.container, gpu_index, mem_bytes))
        self._state.next_pid += 1
        return pid

    def set_ns_pid(self, pid: int, ns_pid: int) -> None:
        """Name a process in its container's pid namespace (a test pairs it with a real
        process that attached to the container's region)."""
        for p in self._state.processes:
            if p.pid == pid:
                p.ns_pid = ns_pid

    def remove(self, container_id: str) -> None:
        self._state.processes = [p for p in self._state.processes if p.container.id != container_id]

    def allocate(self, container_id: str, gpu_index: int, mem_bytes: int) -> None:
        """Make a container's process on one GPU hold this much memory from now on."""
        for process in self._live(container_id, gpu_index):
            process.mem_override = mem_bytes

    @property
    def frozen(self) -> frozenset[str]:
        """The containers held frozen now."""
        return self._state.frozen

    def pids(self, container_id: str) -> list[int]:
        return [p.pid for p in self._state.processes if p.container.id == container_id and p.alive]

    def used_s(self, container_id: str, gpu_index: int) -> float:
        """GPU-seconds the container has computed on one GPU up to now (the ground truth)."""
        self._advance()
        return sum(
            p.used_s
            for p in self._state.processes
            if p.container.id == container_id and p.gpu_index == gpu_index
        )

    def observe(self) -> Observation:
        now = self._clock.now()
        if self._discover is not None and (
            self._discovered_at is None or now - self._discovered_at >= self._discover_every_s
        ):
            self._discovered_at = now
            self._sync(self._discover())
        self._advance()
        processes = tuple(
            GpuProcess(
                pid=p.pid,
                gpu_index=p.gpu_index,
                mem_bytes=self._memory(p, now),
                sm_percent=p.sm_percent,
                container_id=p.container.id,
                pod_uid=p.container.pod_uid,
                environ=p.container.environ,
                ns_pid=p.pid if p.ns_pid is None else p.ns_pid,
            )
            for p in self._state.processes
            if p.alive
        )
        return Observation(now, processes)

    def hold(self, frozen: frozenset[str]) -> None:
        self._advance()
        self._state.frozen = frozen

    def kill(self, pid: int) -> None:
        self._advance()
        now = self._clock.now()
        for p in self._state.processes:
            if p.pid == pid and p.alive:
                p.alive = False
                self.kills.append(Kill(now, pid, p.container.id, p.gpu_index, self._memory(p, now)))

    def close(self) -> None:
        self.hold(frozenset())

    def _live(self, container_id: str, gpu_index: int) -> list[_Process]:
        return [
            p
            for p in self._state.processes
            if p.container.id == container_id and p.gpu_index == gpu_index and p.alive
        ]

    def _memory(self, process: _Process, now: float) -> int:
        if process.mem_override is not None:
            return process.mem_override
        held = 0
        for step in process.container.memory:
            if step.at_s <= now - self._started:
                held = step.mem_bytes
        return held

    def _advance(self) -> None:
        """Hand out each GPU's time since the last call to the thawed processes with work."""
        now = self._clock.now()
        elapsed = now - self._last
        if elapsed <= 0:
            return
        since_start = self._last - self._started
        self._last = now
        for device in self._devices:
            running = [
                p
                for p in self._state.processes
                if p.gpu_index == device.index
                and p.alive
                and p.container.id not in self._state.frozen
                and p.container.demand.busy_at(since_start)
            ]
            shares = share_gpu({p.pid: p.container.intensity for p in running})
            for p in self._state.processes:
                if p.gpu_index == device.index:
                    p.sm_percent = 100 * shares.get(p.pid, 0.0)
                    p.used_s += elapsed * shares.get(p.pid, 0.0)

    def _sync(self, found: Sequence[MockContainer]) -> None:
        """Follow the containers discovery finds (kind: real pods on a mock GPU)."""
        wanted = {c.id: c for c in found}
        present = {p.container.id for p in self._state.processes}
        for key in present - wanted.keys():
            self.remove(key)
        for key in wanted.keys() - present:
            self.add(wanted[key])


def discovered_containers(processes: Iterable[ContractProcess]) -> list[MockContainer]:
    """Mock containers for real processes started with the contract environment (pods on
    a kind node with mock GPUs): always busy, holding no memory."""
    found: dict[str, MockContainer] = {}
    for process in processes:
        container_id = process.cgroup.container_id if process.cgroup else ""
        key = container_key(container_id, process.environ, process.pid)
        pod_uid = process.cgroup.pod_uid if process.cgroup else ""
        found.setdefault(key, MockContainer(key, process.environ, pod_uid=pod_uid))
    return list(found.values())


def share_gpu(intensity: Mapping[int, float]) -> dict[int, float]:
    """How a GPU splits its time among processes running at once: by intensity."""
    total = sum(intensity.values())
    if total <= 0:
        return {}
    return {key: value / total for key, value in intensity.items()}
