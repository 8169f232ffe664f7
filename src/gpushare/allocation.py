"""The allocation of a pod: which GPUs each of its containers got, and how much of each.

Written once by the extender at bind, read by everyone else; see annotation.py
for how it travels on the pod.
"""

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gpushare.objects import Container, Pod
from gpushare.request import ContainerRole, JobType

ALLOCATION_VERSION: Literal[1] = 1

UNKNOWN_BIND_TIME = datetime(1970, 1, 1, tzinfo=UTC)
"""When a pod counts as bound whose bind time nobody wrote down: first."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="ignore")


class GpuSlice(_Frozen):
    """The part of one GPU a container holds."""

    index: int = Field(ge=0)
    uuid: str = ""
    mem: int = Field(alias="memGiB", ge=0)
    core: int = Field(default=0, alias="corePercent", ge=0)
    """Compute percent; 0 means no compute limit (memory-only), 100 a whole GPU."""
    gpu_mem: int = Field(alias="gpuMemGiB", ge=0)
    """Memory of the whole GPU (ALIYUN_COM_GPU_MEM_DEV)."""


class ContainerAllocation(_Frozen):
    name: str
    role: ContainerRole
    index: int = Field(ge=0)
    """Position in spec.containers, or in spec.initContainers for init and sidecar roles."""
    gpus: tuple[GpuSlice, ...]
    exclusive: bool = False
    assigned: bool = False
    """Set by the device plugin once the kubelet's Allocate for this container was answered."""

    def spec_in(self, pod: Pod) -> Container | None:
        """This container's spec in `pod`: by its index, else by its name."""
        init = self.role is not ContainerRole.APP
        return pod.spec.container(self.index, self.name, init=init)


class PodAllocation(_Frozen):
    version: Literal[1] = ALLOCATION_VERSION
    node: str
    bound_at: datetime = Field(alias="boundAt")
    containers: tuple[ContainerAllocation, ...]
    cpu_milli: int | None = Field(default=None, exclude=True)
    """Host CPU the pod holds where the node tracks it (the simulator). Not written to
    the annotation: on Kubernetes the kube-scheduler accounts CPU and memory."""
    memory_mib: int | None = Field(default=None, exclude=True)
    """Host memory the pod holds where the node tracks it; not written either."""
    unknown: bool = Field(default=False, exclude=True)
    """The pod's record could not be trusted: it holds something on `node`, nobody knows
    what, so the node takes no new GPU pod until the record is repaired or the pod goes
    (`unknown_on`; never written)."""

    @classmethod
    def unknown_on(cls, node: str) -> "PodAllocation":
        """What a pod on `node` holds when neither of its records can be read."""
        return cls(node=node, bound_at=UNKNOWN_BIND_TIME, containers=(), unknown=True)

    @property
    def assigned(self) -> bool:
        return all(c.assigned for c in self.containers)

    @property
    def job_type(self) -> JobType:
        shared = [c for c in self.containers if not c.exclusive]
        if not shared:
            return JobType.EXCLUSIVE
        if any(s.core for c in shared for s in c.gpus):
            return JobType.MEMORY_CORE
        return JobType.MEMORY

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        return tuple(sorted({s.index for c in self.containers for s in c.gpus}))

    @property
    def exclusive_gpus(self) -> frozenset[int]:
        return frozenset(s.index for c in self.containers if c.exclusive for s in c.gpus)

    @property
    def total_mem(self) -> int:
        """GiB the pod holds while running (app containers and sidecars)."""
        return sum(s.mem for c in self.containers if c.role.runs_with_apps for s in c.gpus)

    def charges(self) -> dict[int, tuple[int, int]]:
        """Memory and compute the pod holds on each GPU it touches.

        Ordinary init containers run one at a time before the others start, and
        the kubelet hands their devices on to the app containers, so a GPU carries
        the larger of the biggest init slice and the sum of the running containers.
        """
        return charges(self.containers)

    def with_assigned(self, names: Iterable[str]) -> "PodAllocation":
        wanted = set(names)
        return self.model_copy(
            update={
                "containers": tuple(
                    c.model_copy(update={"assigned": True}) if c.name in wanted else c
                    for c in self.containers
                )
            }
        )


def charges(containers: Iterable[ContainerAllocation]) -> dict[int, tuple[int, int]]:
    running: dict[int, list[int]] = {}
    init_peak: dict[int, list[int]] = {}
    for container in containers:
        into = running if container.role.runs_with_apps else init_peak
        for s in container.gpus:
            mem, core = into.setdefault(s.index, [0, 0])
            if container.role.runs_with_apps:
                into[s.index] = [mem + s.mem, core + s.core]
            else:
                into[s.index] = [max(mem, s.mem), max(core, s.core)]
    result: dict[int, tuple[int, int]] = {}
    for index in running.keys() | init_peak.keys():
        run_mem, run_core = running.get(index, (0, 0))
        init_mem, init_core = init_peak.get(index, (0, 0))
        result[index] = (max(run_mem, init_mem), max(run_core, init_core))
    return result
