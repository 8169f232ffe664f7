"""The port between the isolation agent and a node's GPUs.

A backend reports the GPU processes it sees (with the environment and
container each one belongs to), freezes and thaws containers, and kills a
process. The agent holds all policy; a backend only observes and acts.
"""

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol

from gpushare import environment
from gpushare.inventory import MemoryRounding, gpu_mem_gib

GIB: Final = 1 << 30
NVIDIA_MAJOR: Final = 195
"""The character-device major of /dev/nvidia*, shown as each GPU's `major`."""


@dataclass(frozen=True, slots=True)
class GpuDevice:
    index: int
    uuid: str
    mem_bytes: int
    model: str = ""
    major: int = NVIDIA_MAJOR
    rounding: MemoryRounding = MemoryRounding.UP
    """How its memory becomes whole GiB; the device plugin's --gpu-memory-rounding."""

    @property
    def mem_gib(self) -> int:
        """The GiB the node advertises for it (ALIYUN_COM_GPU_MEM_DEV)."""
        return gpu_mem_gib(self.mem_bytes, self.rounding)


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process using one GPU, as seen since the previous observation."""

    pid: int
    gpu_index: int
    mem_bytes: int
    sm_percent: float | None
    """Share of the GPU's compute it used since the previous observation; None if unknown."""
    container_id: str = ""
    """The runtime's container ID from /proc/<pid>/cgroup; empty outside a container."""
    pod_uid: str = ""
    environ: Mapping[str, str] = field(default_factory=dict)
    ns_pid: int | None = None
    """Its pid in its own (innermost) pid namespace, the one its container's region
    names it by (`NSpid:` of /proc/<pid>/status); None when unknown."""
    grant_id: str = ""
    """The grant its container was given (gpushare.grant), from its mounts, which the
    container cannot change; empty when it has none."""

    @property
    def container_key(self) -> str:
        return container_key(self.container_id, self.environ, self.pid, self.grant_id)


@dataclass(frozen=True, slots=True)
class Observation:
    at: float
    processes: tuple[GpuProcess, ...]


class IsolationBackend(Protocol):
    name: str

    def devices(self) -> tuple[GpuDevice, ...]: ...

    def observe(self) -> Observation:
        """The GPU processes now, with their use since the previous call."""
        ...

    def hold(self, frozen: frozenset[str]) -> None:
        """Freeze exactly these containers (by container key); thaw every other one."""
        ...

    def kill(self, pid: int) -> None: ...

    def close(self) -> None:
        """Thaw everything held and let go of the GPUs."""
        ...


def container_key(
    container_id: str, environ: Mapping[str, str], pid: int, grant_id: str = ""
) -> str:
    """What the agent calls a container: the runtime's ID, or for processes outside a
    container (a test on a bare node) the grant they were given, else one name per
    pod/container pair of their environment, else the process itself."""
    if container_id:
        return container_id
    if grant_id:
        return f"grant-{grant_id}"
    pod = environ.get(environment.POD, "")
    name = environ.get(environment.CONTAINER, "")
    if pod or name:
        return "local-" + hashlib.sha256(f"{pod}/{name}".encode()).hexdigest()[:16]
    return f"pid-{pid}"
