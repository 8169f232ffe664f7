"""A model of kube-scheduler's structured allocator choosing devices on one node.

This is the model, not a port: the real allocator walks the node's pools, slices and
devices in order and takes, for each request of the claim, the first device that
satisfies every constraint, backtracking across requests when a later one finds
nothing (DRA-INTERFACES §6). So does `DeviceLedger.allocate`, over the devices in the
order it was given them (slice order). What it models:

- exact-count requests (`allocationMode: ExactCount`), selected by one predicate each
  (the device class and the request's selectors together);
- the N devices of one request are distinct; other requests of the claim and other
  claims may reuse a device with `allowMultipleAllocations` while its capacities hold
  (capacity.fits), unless a `distinctAttribute` constraint forbids it;
- an exclusive device serves one result, ever (its capacity requests only filter);
- results on a shared device get a new shareID and list every capacity consumed;
  results elsewhere get neither; a result without shareID holds its device whole.

Not modelled: `allocationMode: All`, `firstAvailable`, `matchAttribute`, admin access,
taints and counters.
"""

import copy
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import TypeAlias

from gpushare.dra.capacity import DeviceCapacity, Ineligible, consumption, fits

AttributeValue: TypeAlias = int | bool | str
DeviceKey: TypeAlias = tuple[str, str, str]
"""(driver, pool, device): how results name a device."""

SEARCH_BUDGET = 4096
"""Devices tried per claim before giving up. The real allocator has no step budget but a
time limit (DRASchedulerFilterTimeout); one claim of a few requests on 8 GPUs needs far
fewer steps, this bounds the simulator on claims that cannot fit."""


@dataclass(frozen=True, slots=True)
class Device:
    """One device of a ResourceSlice, with its attributes and capacities as the slice
    spells them (unqualified names belong to the driver's domain)."""

    driver: str
    pool: str
    name: str
    attributes: Mapping[str, AttributeValue] = field(default_factory=dict)
    capacity: DeviceCapacity = field(default_factory=dict)
    allow_multiple_allocations: bool = False

    @property
    def key(self) -> DeviceKey:
        return self.driver, self.pool, self.name

    def attribute(self, qualified: str) -> AttributeValue | None:
        """The attribute a constraint names as `domain/name`: an unqualified attribute of
        the device belongs to its driver's domain."""
        if qualified in self.attributes:
            return self.attributes[qualified]
        domain, _, name = qualified.rpartition("/")
        return self.attributes.get(name) if domain == self.driver else None


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    """One `spec.devices.requests[].exactly` of a claim."""

    name: str
    selects: Callable[[Device], bool]
    """The device class's selectors and the request's own, as one predicate."""
    count: int = 1
    capacity: Mapping[str, int] = field(default_factory=dict)
    """`capacity.requests`, in base units."""


@dataclass(frozen=True, slots=True)
class DistinctAttribute:
    """`constraints[].distinctAttribute`: the devices given to `requests` (all of the
    claim's when empty) have pairwise different values of the fully qualified
    `attribute`; a device without it never satisfies the constraint."""

    attribute: str
    requests: tuple[str, ...] = ()

    def covers(self, request: str) -> bool:
        return not self.requests or request in self.requests


@dataclass(frozen=True, slots=True)
class DeviceClaim:
    """What the allocator reads of a ResourceClaim's spec."""

    requests: tuple[DeviceRequest, ...]
    constraints: tuple[DistinctAttribute, ...] = ()


@dataclass(frozen=True, slots=True)
class Result:
    """One `status.allocation.devices.results[]` entry."""

    request: str
    driver: str
    pool: str
    device: str
    share_id: str | None = None
    """Set on results on a shared device, which then hold only `consumed_capacity`."""
    consumed_capacity: Mapping[str, int] = field(default_factory=dict)
    """Every capacity of the shared device, in base units; empty for exclusive results."""

    @property
    def key(self) -> DeviceKey:
        return self.driver, self.pool, self.device


@dataclass(frozen=True, slots=True)
class Allocation:
    results: tuple[Result, ...]


@dataclass(frozen=True, slots=True)
class Unfit:
    """Why a claim has no allocation on the node."""

    message: str

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True, slots=True)
class _Use:
    """What is given out of one device; immutable, so ledgers can share it."""

    whole: int = 0
    """Results holding the device without a shareID (more than one only when the
    API says so, e.g. a device that stopped being shared)."""
    consumed: Mapping[str, int] = field(default_factory=dict)
    shares: frozenset[str] = frozenset()


_FREE = _Use()


def random_share_id() -> str:
    """A new shareID: a random UUID, as the allocator makes one."""
    return str(uuid.uuid4())


class DeviceLedger:
    """The devices of one node in slice order and what claims hold of each.

    `allocate` chooses devices for a claim and records them; `record` takes allocations
    the API already holds, `release` gives them back. Each device's use is an immutable
    record replaced on change, so `copy` is cheap and copies never affect each other."""

    def __init__(
        self,
        devices: Iterable[Device],
        new_share_id: Callable[[], str] = random_share_id,
    ) -> None:
        self.devices = tuple(devices)
        self._new_share_id = new_share_id
        self._uses: dict[DeviceKey, _Use] = {d.key: _FREE for d in self.devices}

    def copy(self) -> "DeviceLedger":
        twin = copy.copy(self)
        twin._uses = dict(self._uses)
        return twin

    def used(self, device: Device) -> Mapping[str, int]:
        """What the device's shares consume, per capacity."""
        return self._uses[device.key].consumed

    def allocate(self, claim: DeviceClaim) -> Allocation | Unfit:
        """Chooses devices for every request of the claim, or none at all, and records them."""
        search = _Search(self, claim)
        chosen = search.run()
        if chosen is None:
            return _diagnose(self, claim, search.exhausted)
        results = []
        for request, devices in zip(claim.requests, chosen, strict=True):
            for device in devices:
                results.append(self._result(request, device))
        allocation = Allocation(tuple(results))
        self.record(allocation)
        return allocation

    def _result(self, request: DeviceRequest, device: Device) -> Result:
        result = Result(request.name, *device.key)
        if not device.allow_multiple_allocations:
            return result
        taken = consumption(device.capacity, request.capacity)
        assert not isinstance(taken, Ineligible)  # the search checked it
        return replace(result, share_id=self._new_share_id(), consumed_capacity=taken)

    def record(self, allocation: Allocation) -> None:
        """Holds what the allocation's results hold; results on devices of other pools or
        drivers than this ledger's are not its concern."""
        for result in allocation.results:
            use = self._uses.get(result.key)
            if use is None:
                continue
            if result.share_id is None:
                self._uses[result.key] = replace(use, whole=use.whole + 1)
                continue
            consumed = dict(use.consumed)
            for name, amount in result.consumed_capacity.items():
                consumed[name] = consumed.get(name, 0) + amount
            shares = use.shares | {result.share_id}
            self._uses[result.key] = replace(use, consumed=consumed, shares=shares)

    def release(self, allocation: Allocation) -> None:
        """Gives back what `record` or `allocate` took for the allocation; releasing what
        the ledger does not hold is a bug of the caller's and raises ValueError."""
        for result in allocation.results:
            use = self._uses.get(result.key)
            if use is None:
                continue
            if result.share_id is None:
                if not use.whole:
                    raise ValueError(f"device {result.device} is not held whole")
                self._uses[result.key] = replace(use, whole=use.whole - 1)
                continue
            if result.share_id not in use.shares:
                raise ValueError(f"device {result.device} holds no share {result.share_id}")
            consumed = dict(use.consumed)
            for name, amount in result.consumed_capacity.items():
                consumed[name] -= amount
            shares = use.shares - {result.share_id}
            self._uses[result.key] = replace(use, consumed=consumed, shares=shares)

    def available(self, device: Device) -> bool:
        """Whether the device can take another result at all, capacity aside."""
        use = self._uses[device.key]
        return not use.whole and (device.allow_multiple_allocations or not use.shares)


class _Search:
    """Depth first over requests, then over each request's N devices in slice order
    (as combinations: the N devices of a request are interchangeable)."""

    def __init__(self, ledger: DeviceLedger, claim: DeviceClaim) -> None:
        self.ledger = ledger
        self.requests = claim.requests
        self.constraints = claim.constraints
        self.devices = ledger.devices
        self.chosen: list[list[Device]] = [[] for _ in claim.requests]
        self.in_flight: dict[DeviceKey, dict[str, int]] = {}
        """What the claim's earlier choices take of each device."""
        self.taken: set[DeviceKey] = set()
        """Exclusive devices the claim's earlier choices took."""
        self.values: list[list[AttributeValue]] = [[] for _ in claim.constraints]
        self.budget = SEARCH_BUDGET
        self.exhausted = False

    def run(self) -> list[list[Device]] | None:
        return self.chosen if self._place(0, 0) else None

    def _place(self, index: int, start: int) -> bool:
        if index == len(self.requests):
            return True
        request = self.requests[index]
        if len(self.chosen[index]) == request.count:
            return self._place(index + 1, 0)
        for pos in range(start, len(self.devices)):
            self.budget -= 1
            if self.budget < 0:
                self.exhausted = True
                return False
            device = self.devices[pos]
            taken = self._fits(request, device)
            if taken is None:
                continue
            self._take(index, device, taken)
            if self._place(index, pos + 1):
                return True
            self._give_back(index, device, taken)
        return False

    def _fits(self, request: DeviceRequest, device: Device) -> dict[str, int] | None:
        if device.key in self.taken or not self.ledger.available(device):
            return None
        if not request.selects(device):
            return None
        for values, value in self._constrained(request, device):
            if value is None or value in values:
                return None
        used = _plus(self.ledger.used(device), self.in_flight.get(device.key, {}))
        taken = fits(device.capacity, request.capacity, used)
        return None if isinstance(taken, Ineligible) else taken

    def _constrained(
        self, request: DeviceRequest, device: Device
    ) -> Iterator[tuple[list[AttributeValue], AttributeValue | None]]:
        """For each constraint on the request: the values the claim's devices have so far,
        and the device's."""
        for constraint, values in zip(self.constraints, self.values, strict=True):
            if constraint.covers(request.name):
                yield values, device.attribute(constraint.attribute)

    def _take(self, index: int, device: Device, taken: dict[str, int]) -> None:
        self.chosen[index].append(device)
        for values, value in self._constrained(self.requests[index], device):
            assert value is not None  # _fits refused devices without it
            values.append(value)
        if device.allow_multiple_allocations:
            self.in_flight[device.key] = _plus(self.in_flight.get(device.key, {}), taken)
        else:
            self.taken.add(device.key)

    def _give_back(self, index: int, device: Device, taken: dict[str, int]) -> None:
        self.chosen[index].pop()
        for values, value in self._constrained(self.requests[index], device):
            assert value is not None
            values.remove(value)
        if device.allow_multiple_allocations:
            flight = self.in_flight[device.key]
            for name, amount in taken.items():
                flight[name] -= amount
        else:
            self.taken.discard(device.key)


def _plus(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    total = dict(a)
    for name, amount in b.items():
        total[name] = total.get(name, 0) + amount
    return total


def _diagnose(ledger: DeviceLedger, claim: DeviceClaim, exhausted: bool) -> Unfit:
    """Why the search found nothing: the first request that cannot be served on its own,
    else the requests together."""
    for request in claim.requests:
        matching = [d for d in ledger.devices if request.selects(d)]
        if not matching:
            return Unfit(f"request {request.name!r}: no device matches its class and selectors")
        why = [(d.name, _refusal(ledger, request, d)) for d in matching]
        eligible = [name for name, reason in why if reason is None]
        if len(eligible) < request.count:
            reasons = "; ".join(f"{name} {reason}" for name, reason in why if reason)
            return Unfit(
                f"request {request.name!r} needs {request.count} device(s), "
                f"{len(eligible)} of the {len(matching)} matching can serve it: {reasons}"
            )
    if exhausted:
        return Unfit(
            f"each request can be served alone; no allocation of all of them was found "
            f"within {SEARCH_BUDGET} devices tried"
        )
    return Unfit(
        "each request can be served alone, but not all together (devices of one "
        "request are distinct, exclusive devices serve one request, and constraints hold)"
    )


def _refusal(ledger: DeviceLedger, request: DeviceRequest, device: Device) -> str | None:
    if not ledger.available(device):
        return "is held by another claim"
    taken = fits(device.capacity, request.capacity, ledger.used(device))
    return str(taken) if isinstance(taken, Ineligible) else None
