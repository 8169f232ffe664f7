"""What a pod asks of the GPUs, parsed from its spec and checked against the rules.

`parse_pod_request` is the single place the rules of the resource model live;
the admission webhook, the extender and the device plugin all call it.
"""

from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property

from gpushare.errors import PodRefused, Refusal, Rule
from gpushare.objects import Container, Pod
from gpushare.resources import (
    CORE_PER_GPU,
    CORE_STEP,
    GPU_CORE,
    GPU_COUNT,
    GPU_MEM,
    MANAGED_RESOURCES,
    POD_LABEL_GPU_COUNT,
    parse_quantity,
)


class ContainerRole(StrEnum):
    INIT = "init"
    """An ordinary init container: runs to completion before the app containers."""
    SIDECAR = "sidecar"
    """A restartable init container: runs beside the app containers."""
    APP = "app"

    @property
    def runs_with_apps(self) -> bool:
        return self is not ContainerRole.INIT


class JobType(StrEnum):
    MEMORY = "memory"
    """Shares GPUs by memory only."""
    MEMORY_CORE = "memory+core"
    """Shares GPUs by memory and a compute percentage."""
    EXCLUSIVE = "exclusive"
    """Whole GPUs only; shares nothing."""


@dataclass(frozen=True, slots=True)
class ContainerRequest:
    """One container's GPU demand, per GPU, in the node's capacity units
    (GiB and percent on Kubernetes nodes; milli-GPU in the simulator)."""

    name: str
    role: ContainerRole
    index: int
    """Position in spec.containers, or in spec.initContainers for init and sidecar roles."""
    gpus: int
    mem: int
    core: int = 0
    exclusive: bool = False

    @property
    def total_mem(self) -> int:
        return self.mem * self.gpus

    def describe(self) -> str:
        if self.exclusive:
            return f"{self.gpus} whole GPU{'s' if self.gpus > 1 else ''}"
        # "percent", not "%": kube-scheduler reads refusal reasons as printf formats.
        slice_ = f"{self.mem} GiB" + (f" + {self.core} percent compute" if self.core else "")
        if self.gpus == 1:
            return f"{slice_} on one GPU"
        return f"{slice_} on each of {self.gpus} GPUs"


@dataclass(frozen=True)
class PodRequest:
    containers: tuple[ContainerRequest, ...]
    cpu_milli: int | None = None
    """Host CPU the pod needs, where the node tracks it (the simulator); None on
    Kubernetes, where the kube-scheduler accounts CPU itself."""
    memory_mib: int | None = None
    """Host memory the pod needs, where the node tracks it; None otherwise."""
    gpu_spec: frozenset[str] | None = None
    """GPU models the pod accepts; None for any model."""

    @cached_property
    def job_type(self) -> JobType:
        shared = [c for c in self.containers if not c.exclusive]
        if not shared:
            return JobType.EXCLUSIVE
        return JobType.MEMORY_CORE if any(c.core for c in shared) else JobType.MEMORY

    @cached_property
    def shape(self) -> tuple[object, ...]:
        """The request without names: equal shapes fit equally, so results can be cached.

        One entry per container, then the host requirements when any is set."""
        containers = tuple((c.role, c.gpus, c.mem, c.core, c.exclusive) for c in self.containers)
        if self.tracks_host:
            return (*containers, (self.cpu_milli, self.memory_mib, self.gpu_spec))
        return containers

    @property
    def tracks_host(self) -> bool:
        """True when the request carries CPU, host memory or a GPU model constraint."""
        return not (self.cpu_milli is None and self.memory_mib is None and self.gpu_spec is None)

    @property
    def uses_core(self) -> bool:
        return self.job_type is JobType.MEMORY_CORE

    @property
    def total_mem(self) -> int:
        """Memory of the app containers and sidecars (what the pod holds while running)."""
        return sum(c.total_mem for c in self.containers if c.role.runs_with_apps)

    def describe(self) -> str:
        return ", ".join(f"{c.name}: {c.describe()}" for c in self.containers)


def requests_gpu(pod: Pod) -> bool:
    """True when some container or init container names one of our resources."""
    for container in (*pod.spec.init_containers, *pod.spec.containers):
        resources = container.resources
        if any(r in resources.limits or r in resources.requests for r in MANAGED_RESOURCES):
            return True
    return False


def parse_pod_request(pod: Pod) -> PodRequest | None:
    """The pod's GPU request, or None when it asks for none of our resources.

    Raises PodRefused listing every rule the pod breaks.
    """
    refusals: list[Refusal] = []
    split = _split_label(pod, refusals)
    containers: list[ContainerRequest] = []
    for role_of, group in (
        (_init_role, pod.spec.init_containers),
        (lambda _: ContainerRole.APP, pod.spec.containers),
    ):
        for index, container in enumerate(group):
            request = _container_request(container, role_of(container), index, split, refusals)
            if request is not None:
                containers.append(request)
    if refusals:
        raise PodRefused(refusals)
    if not containers:
        return None
    shared = [c for c in containers if not c.exclusive]
    with_core = [c.name for c in shared if c.core]
    without_core = [c.name for c in shared if not c.core]
    if with_core and without_core:
        raise PodRefused(
            [
                Refusal(
                    Rule.MIXED_JOB_TYPES,
                    f"containers {', '.join(with_core)} set {GPU_CORE} but "
                    f"{', '.join(without_core)} do not; set it on every container that "
                    f"asks for {GPU_MEM}, or on none",
                )
            ]
        )
    return PodRequest(tuple(containers))


def _init_role(container: Container) -> ContainerRole:
    return ContainerRole.SIDECAR if container.restart_policy == "Always" else ContainerRole.INIT


def _split_label(pod: Pod, refusals: list[Refusal]) -> int:
    value = pod.metadata.labels.get(POD_LABEL_GPU_COUNT)
    if value is None:
        return 1
    count = parse_quantity(value)
    if count is None or count < 1:
        refusals.append(
            Refusal(
                Rule.MULTI_GPU_LABEL,
                f"pod label {POD_LABEL_GPU_COUNT} must be a whole number of GPUs "
                f"(1 or more), got {value!r}",
            )
        )
        return 1
    return count


def _quantity(container: Container, resource: str, refusals: list[Refusal]) -> int:
    limit = container.resources.limits.get(resource)
    request = container.resources.requests.get(resource)
    where = f"container {container.name!r}: {resource}"
    if limit is None and request is None:
        return 0
    if limit is None:
        refusals.append(
            Refusal(
                Rule.REQUEST_WITHOUT_LIMIT,
                f"{where} is set in requests only; set it in limits "
                f"(requests may be left out or must equal limits)",
            )
        )
        return 0
    count = parse_quantity(limit)
    if count is None:
        refusals.append(
            Refusal(Rule.NOT_AN_INTEGER, f"{where} must be a whole number, got {limit!r}")
        )
        return 0
    if request is not None and parse_quantity(request) != count:
        refusals.append(
            Refusal(
                Rule.REQUEST_NOT_EQUAL_LIMIT,
                f"{where} request {request!r} must equal its limit {limit!r}",
            )
        )
    return count


def _container_request(
    container: Container,
    role: ContainerRole,
    index: int,
    split: int,
    refusals: list[Refusal],
) -> ContainerRequest | None:
    before = len(refusals)
    mem = _quantity(container, GPU_MEM, refusals)
    core = _quantity(container, GPU_CORE, refusals)
    count = _quantity(container, GPU_COUNT, refusals)
    where = f"container {container.name!r}"
    if core:
        if core % CORE_STEP:
            refusals.append(
                Refusal(
                    Rule.CORE_STEP,
                    f"{where}: {GPU_CORE} must be a multiple of {CORE_STEP}, got {core}",
                )
            )
        if not CORE_STEP <= core <= CORE_PER_GPU:
            refusals.append(
                Refusal(
                    Rule.CORE_RANGE,
                    f"{where}: {GPU_CORE} must be between {CORE_STEP} and {CORE_PER_GPU} "
                    f"(it is a share of one GPU), got {core}",
                )
            )
        if not mem and not count:
            refusals.append(
                Refusal(
                    Rule.CORE_NEEDS_MEM,
                    f"{where}: {GPU_CORE} needs {GPU_MEM} in the same container",
                )
            )
        if split > 1:
            refusals.append(
                Refusal(
                    Rule.CORE_WITH_MULTI_GPU,
                    f"{where}: {GPU_CORE} cannot be combined with the pod label "
                    f"{POD_LABEL_GPU_COUNT}={split}; split memory only, or drop the label",
                )
            )
    if count and (mem or core):
        refusals.append(
            Refusal(
                Rule.EXCLUSIVE_WITH_SHARED,
                f"{where}: {GPU_COUNT} asks for whole GPUs and cannot be combined with "
                f"{GPU_MEM} or {GPU_CORE}; use one or the other",
            )
        )
    if GPU_MEM in container.resources.limits and not mem and (core or count):
        refusals.append(
            Refusal(
                Rule.ZERO_GPU_MEM,
                f"{where}: {GPU_MEM}: 0 asks for no GPU memory beside "
                f"{GPU_CORE if core else GPU_COUNT}, which means nothing; leave it out "
                f"or ask for the GiB the container needs",
            )
        )
    if mem and split > 1 and mem % split:
        refusals.append(
            Refusal(
                Rule.MULTI_GPU_SPLIT,
                f"{where}: {GPU_MEM}={mem} cannot be split evenly over "
                f"{POD_LABEL_GPU_COUNT}={split} GPUs; use a multiple of {split}",
            )
        )
    if len(refusals) > before or not (mem or core or count):
        return None
    if count:
        return ContainerRequest(container.name, role, index, gpus=count, mem=0, exclusive=True)
    return ContainerRequest(container.name, role, index, gpus=split, mem=mem // split, core=core)
