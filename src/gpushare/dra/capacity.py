"""Consumable capacity: how much of a shared device one request takes (DRA-INTERFACES §6).

kube-scheduler's structured allocator lets a device with `allowMultipleAllocations`
serve many requests; each takes an amount of every capacity the device declares,
rounded to the capacity's `requestPolicy`, and the device serves another request only
while what is allocated plus what is being allocated plus the new amount stays within
the capacity's value, for every capacity. Quantities here are integers in base units
(bytes, percent, shares): whoever reads the API objects converts them.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeAlias

from gpushare.dra.objects import format_quantity


@dataclass(frozen=True, slots=True)
class ValidRange:
    """`requestPolicy.validRange`: amounts from `min` on, in steps of `step` from `min`."""

    min: int
    max: int | None = None
    step: int | None = None


@dataclass(frozen=True, slots=True)
class RequestPolicy:
    """`requestPolicy`: at most one of `valid_values` (ascending) and `valid_range`."""

    default: int | None = None
    """Taken by a request that does not name the capacity; None: the full value."""
    valid_values: tuple[int, ...] | None = None
    valid_range: ValidRange | None = None


@dataclass(frozen=True, slots=True)
class Capacity:
    """One entry of a device's `capacity` map."""

    value: int
    policy: RequestPolicy | None = None


DeviceCapacity: TypeAlias = Mapping[str, Capacity]
"""A device's `capacity` map, by the name as the slice spells it."""


@dataclass(frozen=True, slots=True)
class Ineligible:
    """Why a request cannot take its share of a device."""

    capacity: str
    """The capacity that stands in the way."""
    reason: str

    def __str__(self) -> str:
        return self.reason


def consumed(value: int, policy: RequestPolicy | None, requested: int | None) -> int | None:
    """What a request takes of one capacity of `value` under `policy`, having asked for
    `requested` (None: the request does not name the capacity); None when no amount the
    policy allows covers the request, which makes the device ineligible."""
    if requested is None:
        if policy is not None and policy.default is not None:
            return policy.default
        return value
    if policy is None:
        return requested
    if policy.valid_range is not None:
        return _in_range(policy.valid_range, requested)
    if policy.valid_values is not None:
        return next((v for v in policy.valid_values if v >= requested), None)
    return requested


def _in_range(valid: ValidRange, requested: int) -> int | None:
    amount = max(requested, valid.min)
    if valid.step:
        # Round up to the next min + n*step: ceiling division on integers, no floats.
        steps = -(-(amount - valid.min) // valid.step)
        amount = valid.min + steps * valid.step
    # The rounded amount is what the device gives, so it is what the maximum bounds.
    if valid.max is not None and amount > valid.max:
        return None
    return amount


def consumption(
    capacity: DeviceCapacity, requests: Mapping[str, int]
) -> dict[str, int] | Ineligible:
    """What a request with capacity `requests` takes of each capacity of a device, the
    ones it does not name included, or why the device cannot serve it at all.

    Request names are matched verbatim: `memory` and `gpu.gpushare.io/memory` are
    different capacities to the allocator, which does not normalise domains."""
    for name in requests:
        if name not in capacity:
            return Ineligible(name, f"has no capacity {name!r}")
    taken = {}
    for name, entry in capacity.items():
        requested = requests.get(name)
        amount = consumed(entry.value, entry.policy, requested)
        if amount is None:
            return Ineligible(name, f"{name}: {requested} is more than its request policy allows")
        taken[name] = amount
    return taken


def fits(
    capacity: DeviceCapacity, requests: Mapping[str, int], used: Mapping[str, int]
) -> dict[str, int] | Ineligible:
    """What a request takes of a device that already gives out `used` (what is allocated
    plus what the allocation in progress took), or why it does not fit there: every
    capacity must hold its share, not just the ones the request names."""
    taken = consumption(capacity, requests)
    if isinstance(taken, Ineligible):
        return taken
    for name, amount in taken.items():
        value, already = capacity[name].value, used.get(name, 0)
        if already + amount > value:
            return Ineligible(
                name,
                f"{name}: {_quantity(already)} of {_quantity(value)} in use, "
                f"{_quantity(amount)} more does not fit",
            )
    return taken


def _quantity(units: int) -> str:
    """A number of base units as a person reads it: 16Gi for bytes, 20 for shares
    (format_quantity writes a number no binary suffix divides as it is)."""
    return format_quantity(units, binary=True)
