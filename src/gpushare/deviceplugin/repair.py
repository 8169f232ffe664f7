"""What to correct in the allocation annotations once the kubelet says who holds
which device IDs (pure: no I/O). The kubelet's truth wins.

- The kubelet lists a container with the IDs of a grant the plugin matched to
  another container (the kubelet admitted pods in another order than the plugin
  assumed): the holder runs with the environment of that grant, so its
  annotation takes the grant's GPUs and is marked assigned; the container the
  grant named takes the holder's former GPUs and waits for its own Allocate.
  Node accounting stays as the extender left it: the two placements swap.
- The kubelet lists a container the annotation does not mark assigned, with
  IDs the plugin has no record of (a plugin restart lost the mark): it is
  marked assigned.
"""

from collections.abc import Mapping
from dataclasses import dataclass

from gpushare.allocation import ContainerAllocation, GpuSlice, PodAllocation
from gpushare.deviceplugin.journal import Grant
from gpushare.deviceplugin.podresources import Holder, Holdings


@dataclass(frozen=True, slots=True)
class Repair:
    pod_key: str
    container: str
    assigned: bool
    gpus: tuple[GpuSlice, ...] | None
    """The container's new GPU placement; None leaves it as it is."""
    resources: tuple[str, ...]
    """Resources the kubelet reports the container holds (answered ones)."""
    message: str
    interposer_grant: str = ""
    """The grant of the answer the container runs with, when the plugin matched that answer
    to another container: it names the wrong pod until corrected."""

    @property
    def moves(self) -> bool:
        return self.gpus is not None


@dataclass(frozen=True, slots=True)
class Plan:
    repairs: tuple[Repair, ...]
    settled: tuple[Grant, ...]
    """Grants the kubelet's records account for: no longer needed."""


def plan(holdings: Holdings, grants: list[Grant], allocations: Mapping[str, PodAllocation]) -> Plan:
    by_ids = {(g.resource, g.device_ids): g for g in grants}
    settled: list[Grant] = []
    mismatched: dict[Holder, Grant] = {}
    unrecorded: dict[Holder, list[str]] = {}
    for holder, per_resource in holdings.items():
        if _container(allocations, holder) is None:
            continue
        for resource, ids in sorted(per_resource.items()):
            grant = by_ids.get((resource, ids))
            if grant is None:
                unrecorded.setdefault(holder, []).append(resource)
                continue
            settled.append(grant)
            if grant.target != holder:
                mismatched.setdefault(holder, grant)
    repairs = []
    for holder, grant in mismatched.items():
        repairs.extend(_swap(holder, grant, holdings, mismatched, allocations))
    for holder, resources in unrecorded.items():
        container = _container(allocations, holder)
        if holder not in mismatched and container is not None and not container.assigned:
            repairs.append(
                Repair(
                    holder[0],
                    holder[1],
                    True,
                    None,
                    tuple(resources),
                    f"the kubelet reports container {holder[1]} holds {', '.join(resources)} "
                    f"devices but the allocation did not mark it assigned; marked assigned",
                )
            )
    return Plan(tuple(repairs), tuple(settled))


def _swap(
    holder: Holder,
    grant: Grant,
    holdings: Holdings,
    mismatched: Mapping[Holder, Grant],
    allocations: Mapping[str, PodAllocation],
) -> list[Repair]:
    container = _container(allocations, holder)
    assert container is not None
    resources = tuple(sorted(holdings[holder]))
    target = grant.target
    if len(container.gpus) != len(grant.gpus):
        return [
            Repair(
                holder[0],
                holder[1],
                True,
                None,
                resources,
                f"the kubelet gave container {holder[1]} the devices the plugin answered for "
                f"{_name(target)}, whose GPU slices have another shape; marked assigned, "
                f"GPU placement left as the scheduler wrote it (check the pod's environment)",
                grant.interposer_grant,
            )
        ]
    holder_gpus = _placed(container.gpus, grant.gpus)
    repairs = [
        Repair(
            holder[0],
            holder[1],
            True,
            holder_gpus,
            resources,
            f"the kubelet gave container {holder[1]} the devices the plugin answered for "
            f"{_name(target)}; it runs on GPU {_indices(holder_gpus)} as that answer said, "
            f"and its allocation now records that",
            grant.interposer_grant,
        )
    ]
    target_container = _container(allocations, target)
    if target in mismatched or target in holdings or target_container is None:
        return repairs
    if len(target_container.gpus) == len(container.gpus):
        target_gpus = _placed(target_container.gpus, container.gpus)
        repairs.append(
            Repair(
                target[0],
                target[1],
                False,
                target_gpus,
                (),
                f"the devices the plugin answered for container {target[1]} went to "
                f"{_name(holder)}; it takes that container's place on GPU "
                f"{_indices(target_gpus)} and waits for its own Allocate",
            )
        )
    return repairs


def _placed(slices: tuple[GpuSlice, ...], on: tuple[GpuSlice, ...]) -> tuple[GpuSlice, ...]:
    """`slices` (their memory and compute) moved to the GPUs of `on`, slice by slice."""
    return tuple(
        s.model_copy(update={"index": g.index, "uuid": g.uuid, "gpu_mem": g.gpu_mem})
        for s, g in zip(slices, on, strict=True)
    )


def _container(
    allocations: Mapping[str, PodAllocation], holder: Holder
) -> ContainerAllocation | None:
    allocation = allocations.get(holder[0])
    if allocation is None:
        return None
    return next((c for c in allocation.containers if c.name == holder[1]), None)


def _name(holder: Holder) -> str:
    return f"{holder[0]} container {holder[1]}"


def _indices(slices: tuple[GpuSlice, ...]) -> str:
    return ",".join(str(s.index) for s in slices)
