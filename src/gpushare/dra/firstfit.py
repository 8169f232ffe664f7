"""The devices kube-scheduler's structured allocator gives a claim on one node, over our
placement state: the first eligible devices in slice order (DRA-INTERFACES §6).

Our slice lists `gpu-0`, `gpu-1`, ... by index (dra.slices). For a request of count N
the allocator takes the first N eligible devices, distinct; later requests of the
claim see what earlier ones consumed. A device is eligible when the claim's selector
accepts its model and what the request consumes fits what is left of every capacity:
`memory` and `cores` as asked, one of the `shares`; a whole-GPU request asks every
share and, naming no memory, consumes the full memory (its requestPolicy default), so
it needs an untouched device. The simulator's DRA model (simulator.dra) and the
extender's charge of a pod kube-scheduler bound but whose driver has not written the
record yet (extender.mirror) both read it; dra.allocator is the same rule over the
ResourceSlice objects themselves, for the stand-ins.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from gpushare.allocation import PodAllocation
from gpushare.placement.fit import Assignment, to_allocation
from gpushare.request import PodRequest
from gpushare.resources import DEFAULT_MAX_PODS_PER_GPU
from gpushare.state import NodeState

SHARES_PER_GPU: Final = DEFAULT_MAX_PODS_PER_GPU
"""A device's `shares` capacity (dra.claims.SHARES): the 20-pods-per-GPU rule; a claim
takes one, a whole-GPU claim all of them."""


@dataclass(frozen=True, slots=True)
class DeviceLeft:
    """One device of the node's slice and what is left of its capacities."""

    index: int
    model: str
    memory: int
    cores: int
    shares: int
    untouched: bool
    """No claim holds any of it: a whole-GPU request may take it."""


def devices_left(state: NodeState) -> tuple[DeviceLeft, ...]:
    """The node's devices in slice order (by index), each with its capacities left."""
    return tuple(
        DeviceLeft(
            index=gpu.index,
            model=gpu.model,
            memory=gpu.mem_free,
            cores=gpu.core_free,
            shares=max(SHARES_PER_GPU - state.used(gpu.index)[2], 0) if gpu.usable else 0,
            untouched=gpu.whole,
        )
        for gpu in state.view().gpus
    )


def first_fit(
    devices: Sequence[DeviceLeft], request: PodRequest, order: Sequence[int] | None = None
) -> Assignment | None:
    """The devices the structured allocator gives the pod's claim on one node: for each
    request (one per GPU container), the first `gpus` eligible devices in slice order,
    distinct; later requests see what earlier ones consumed. `order` is the slice's order,
    a permutation of the device positions (default: as listed). None when a request
    finds too few."""
    order = range(len(devices)) if order is None else order
    memory = [d.memory for d in devices]
    cores = [d.cores for d in devices]
    shares = [d.shares for d in devices]
    taken = [False] * len(devices)
    chosen: list[tuple[int, ...]] = []
    for container in request.containers:
        picked: list[int] = []
        for pos in order:
            if len(picked) == container.gpus:
                break
            device = devices[pos]
            if request.gpu_spec is not None and device.model not in request.gpu_spec:
                continue
            if container.exclusive:
                eligible = device.untouched and not taken[pos]
            else:
                eligible = (
                    shares[pos] >= 1
                    and memory[pos] >= container.mem
                    and cores[pos] >= container.core
                )
            if eligible:
                picked.append(pos)
        if len(picked) < container.gpus:
            return None
        for pos in picked:
            taken[pos] = True
            if container.exclusive:
                memory[pos] = cores[pos] = shares[pos] = 0
            else:
                memory[pos] -= container.mem
                cores[pos] -= container.core
                shares[pos] -= 1
        chosen.append(tuple(devices[pos].index for pos in picked))
    added = tuple(
        (d.index, d.memory - memory[pos], d.cores - cores[pos])
        for pos, d in enumerate(devices)
        if taken[pos]
    )
    return Assignment(gpus=tuple(chosen), added=added)


def allocation_on(
    state: NodeState, request: PodRequest, bound_at: datetime
) -> PodAllocation | None:
    """The allocation record of what the allocator gives the pod's claim on the node
    (slice order: by index); None when the claim does not fit there."""
    fit = first_fit(devices_left(state), request)
    if fit is None:
        return None
    return to_allocation(request, fit, state.inventory, bound_at)
