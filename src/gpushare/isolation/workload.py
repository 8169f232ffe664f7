"""The containers behind an observation: GPU processes grouped by container, with the
limits the node granted them (gpushare.grant, found by the grant ID in their mounts), or
for containers without a grant the limits their environment carries (read with
`gpushare.environment.limits_from_env`)."""

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gpushare.environment import MEM_CONTAINER, ContainerLimits, limits_from_env
from gpushare.grant import Grant
from gpushare.isolation.backends.port import GIB, GpuProcess

GrantLookup = Callable[[str], Grant | None]


@dataclass(frozen=True, slots=True)
class ObservedContainer:
    key: str
    limits: ContainerLimits
    pod_uid: str
    processes: tuple[GpuProcess, ...]
    grant_id: str = ""
    """The grant in its processes' mounts; '' for a container without one."""
    grant: Grant | None = None
    """That grant, read: its limits come from it (else from its environment)."""

    @property
    def granted(self) -> bool:
        return self.grant is not None

    @property
    def pod(self) -> str:
        return self.limits.pod or (f"uid:{self.pod_uid}" if self.pod_uid else "-")

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        """The GPUs its environment gives it, then any other it was seen on."""
        seen = [p.gpu_index for p in self.processes if p.gpu_index not in self.limits.gpu_indices]
        return tuple(dict.fromkeys([*self.limits.gpu_indices, *seen]))

    def on(self, gpu: int) -> tuple[GpuProcess, ...]:
        return tuple(p for p in self.processes if p.gpu_index == gpu)

    def mem_used(self, gpu: int) -> int:
        return sum(p.mem_bytes for p in self.on(gpu))

    def cap_bytes(self, gpu: int) -> int | None:
        """Its memory cap on one GPU; None when not capped there (isolation off, no slice)."""
        if self.limits.isolation_disabled or gpu not in self.limits.gpu_indices:
            return None
        position = self.limits.gpu_indices.index(gpu)
        if position >= len(self.limits.mem_gib):
            return None
        gib = self.limits.mem_gib[position]
        return gib * GIB if gib > 0 else None

    def core_percent(self, gpu: int) -> int:
        if gpu not in self.limits.gpu_indices:
            return 0
        position = self.limits.gpu_indices.index(gpu)
        percents = self.limits.core_percent
        return percents[position] if position < len(percents) else 0

    def utilisation(self, gpu: int) -> float | None:
        """Its share of one GPU's compute since the last observation, in percent."""
        readings = [p.sm_percent for p in self.on(gpu) if p.sm_percent is not None]
        if not readings and self.on(gpu):
            return None
        return min(100.0, sum(readings))


@dataclass(frozen=True, slots=True)
class Unreadable:
    key: str
    reason: str


def group_containers(
    processes: Iterable[GpuProcess],
    known: Mapping[str, ObservedContainer] | None = None,
    grants: GrantLookup | None = None,
) -> tuple[dict[str, ObservedContainer], list[Unreadable]]:
    """Containers gpushare gave limits to, and those whose limits could not be read.

    A container with a grant is held to it: any of its processes, whatever its
    environment (a child started with another cap, or with none), is the container's.
    Without one, processes without the contract environment are not ours and are left
    alone. Limits of a `known` container are reused while its grant is the same object
    (the book hands out one per file), or without one while its environment is the same
    object (backends hand out one environment per process for its lifetime)."""
    grouped: dict[str, list[GpuProcess]] = {}
    for process in processes:
        grouped.setdefault(process.container_key, []).append(process)
    containers: dict[str, ObservedContainer] = {}
    unreadable: list[Unreadable] = []
    for key, members in grouped.items():
        grant_id = next((p.grant_id for p in members if p.grant_id), "")
        before = (known or {}).get(key)
        grant = grants(grant_id) if grant_id and grants is not None else None
        if grant is not None:
            kept = before is not None and before.grant is grant
            containers[key] = ObservedContainer(
                key,
                before.limits if kept and before is not None else grant.limits(),
                members[0].pod_uid or grant.pod_uid,
                tuple(members),
                grant_id,
                grant,
            )
            continue
        if (
            before is not None
            and before.grant is None
            and before.grant_id == grant_id
            and before.processes[0].environ is members[0].environ
        ):
            containers[key] = ObservedContainer(
                key, before.limits, before.pod_uid, tuple(members), grant_id
            )
            continue
        try:
            # The environment of a process of the contract, should another have none.
            limits = limits_from_env(_contract_environ(members))
        except ValueError as err:
            unreadable.append(Unreadable(key, str(err)))
            continue
        if limits is None:
            continue
        containers[key] = ObservedContainer(
            key, limits, members[0].pod_uid, tuple(members), grant_id
        )
    return containers, unreadable


def _contract_environ(members: list[GpuProcess]) -> Mapping[str, str]:
    return next((p.environ for p in members if MEM_CONTAINER in p.environ), members[0].environ)
