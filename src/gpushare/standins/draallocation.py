"""A stand-in for kube-scheduler's DRA plugin: allocates a pod's ResourceClaim on a node.

kube-scheduler, once it has chosen a node for a pod, allocates the pod's pending claims
with its structured allocator and writes the outcome into the claim's status before
it binds the pod (DRA-INTERFACES §4, §6): `status.allocation` (the devices chosen, each
with its shareID and consumedCapacity on a shared device; the configuration of the
device classes and the claim; a node selector naming the node) and `status.reservedFor`
(the pod, without which the kubelet refuses to prepare the claim). This does the same
on a DraCluster, choosing devices with gpushare.dra.allocator.

The stand-in reads what the allocator reads: the node's slices (complete pools at
their newest generation), the device classes, and every claim already allocated (what
they hold is not free). Its selectors are a subset of CEL, conjunctions of
`device.driver`, `device.allowMultipleAllocations` and `device.attributes["domain"].name`
compared with `==` or `!=` to a literal: what our device class and claims write. A
claim using more (other CEL, firstAvailable, allocationMode All, matchAttribute) is
refused with a message saying so.
"""

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime

from gpushare.cluster import DraCluster
from gpushare.dra import objects as api
from gpushare.dra.allocator import (
    Allocation,
    AttributeValue,
    Device,
    DeviceClaim,
    DeviceLedger,
    DeviceRequest,
    DistinctAttribute,
    Result,
    Unfit,
    random_share_id,
)
from gpushare.dra.capacity import Capacity, RequestPolicy, ValidRange
from gpushare.objects import Pod

Selector = Callable[[Device], bool]


class UnsupportedClaim(ValueError):
    """The claim or its device class asks what the stand-in does not model."""


class DraAllocationStandIn:
    """kube-scheduler's DRA plugin for one claim at a time, on the node it is given."""

    def __init__(
        self,
        cluster: DraCluster,
        new_share_id: Callable[[], str] = random_share_id,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.cluster = cluster
        self.new_share_id = new_share_id
        self.clock = clock

    def allocate(self, namespace: str, name: str, node: str, pod: Pod) -> Allocation | Unfit:
        """Allocates the claim on the node for the pod and writes its status, or says why
        it does not fit there (and writes nothing). A claim already allocated on the node
        is reserved for the pod too, as a claim shared by several pods is."""
        claim = self.cluster.get_resource_claim(namespace, name)
        if claim.status.allocation is not None:
            return self._reserve(claim, node, pod)
        classes = {c.metadata.name: c for c in self.cluster.list_device_classes()}
        try:
            wanted = device_claim(claim.spec, classes)
        except UnsupportedClaim as error:
            return Unfit(f"claim {claim.key}: {error}")
        ledger = self._ledger(node)
        allocation = ledger.allocate(wanted)
        if isinstance(allocation, Unfit):
            return Unfit(f"claim {claim.key} does not fit on node {node}: {allocation}")
        status = api.ResourceClaimStatus(
            allocation=api.AllocationResult(
                devices=api.DeviceAllocationResult(
                    results=[_api_result(r, ledger.devices) for r in allocation.results],
                    config=_config(claim.spec, classes),
                ),
                node_selector=node_selector(node),
                allocation_timestamp=self.clock().strftime("%Y-%m-%dT%H:%M:%SZ"),
            ),
            reserved_for=[_consumer(pod)],
        )
        self.cluster.update_resource_claim_status(claim.model_copy(update={"status": status}))
        return allocation

    def _reserve(self, claim: api.ResourceClaim, node: str, pod: Pod) -> Allocation | Unfit:
        allocation = claim.status.allocation
        assert allocation is not None
        if allocation.node_selector != node_selector(node):
            return Unfit(f"claim {claim.key} is allocated for another node than {node}")
        consumer = _consumer(pod)
        if consumer not in claim.status.reserved_for:
            reserved = [*claim.status.reserved_for, consumer]
            status = claim.status.model_copy(update={"reserved_for": reserved})
            self.cluster.update_resource_claim_status(claim.model_copy(update={"status": status}))
        return held(claim)

    def _ledger(self, node: str) -> DeviceLedger:
        """The node's devices (of its node-local slices) and what every allocated claim
        holds of them."""
        devices = node_devices(self.cluster.list_resource_slices(node_name=node))
        ledger = DeviceLedger(devices, self.new_share_id)
        for claim in self.cluster.list_resource_claims():
            ledger.record(held(claim))
        return ledger


def node_selector(node: str) -> dict[str, object]:
    """The allocation's node selector for a node-local pool: the node by name."""
    term = {"key": "metadata.name", "operator": "In", "values": [node]}
    return {"nodeSelectorTerms": [{"matchFields": [term]}]}


def node_devices(slices: Iterable[api.ResourceSlice]) -> list[Device]:
    """The devices the allocator may choose, in slice order: only a pool's newest
    generation counts, and only when all of its slices are there (DRA-INTERFACES §4)."""
    pools: dict[tuple[str, str], list[api.ResourceSlice]] = {}
    for piece in slices:
        pools.setdefault((piece.spec.driver, piece.spec.pool.name), []).append(piece)
    devices: list[Device] = []
    for (driver, pool), pieces in pools.items():
        newest = max(p.spec.pool.generation for p in pieces)
        current = [p for p in pieces if p.spec.pool.generation == newest]
        if len(current) < max(p.spec.pool.resource_slice_count for p in current):
            continue
        for piece in current:
            devices.extend(_device(driver, pool, d) for d in piece.spec.devices)
    return devices


def _device(driver: str, pool: str, device: api.Device) -> Device:
    attributes = {
        name: value
        for name, attribute in device.attributes.items()
        if (value := attribute.value) is not None
    }
    capacity = {
        name: Capacity(api.quantity_units(entry.value), _policy(entry.request_policy))
        for name, entry in device.capacity.items()
    }
    return Device(
        driver=driver,
        pool=pool,
        name=device.name,
        attributes=attributes,
        capacity=capacity,
        allow_multiple_allocations=bool(device.allow_multiple_allocations),
    )


def _policy(policy: api.CapacityRequestPolicy | None) -> RequestPolicy | None:
    if policy is None:
        return None
    valid_range = None
    if policy.valid_range is not None and policy.valid_range.min is not None:
        valid_range = ValidRange(
            min=api.quantity_units(policy.valid_range.min),
            max=_units(policy.valid_range.max),
            step=_units(policy.valid_range.step),
        )
    return RequestPolicy(
        default=_units(policy.default),
        valid_values=tuple(api.quantity_units(v) for v in policy.valid_values) or None,
        valid_range=valid_range,
    )


def _units(quantity: str | None) -> int | None:
    return None if quantity is None else api.quantity_units(quantity)


def device_claim(spec: api.ResourceClaimSpec, classes: dict[str, api.DeviceClass]) -> DeviceClaim:
    """The claim as the allocator model reads it. Raises UnsupportedClaim for what the
    model does not cover, or a device class that does not exist."""
    requests = tuple(_request(r, classes) for r in spec.devices.requests)
    constraints = []
    for constraint in spec.devices.constraints:
        if constraint.distinct_attribute is None:
            raise UnsupportedClaim("only distinctAttribute constraints are modelled")
        constraints.append(
            DistinctAttribute(constraint.distinct_attribute, tuple(constraint.requests))
        )
    return DeviceClaim(requests, tuple(constraints))


def _request(request: api.DeviceRequest, classes: dict[str, api.DeviceClass]) -> DeviceRequest:
    exactly = request.exactly
    if exactly is None:
        raise UnsupportedClaim(f"request {request.name!r}: firstAvailable is not modelled")
    if (exactly.allocation_mode or "ExactCount") != "ExactCount":
        raise UnsupportedClaim(f"request {request.name!r}: only ExactCount is modelled")
    device_class = classes.get(exactly.device_class_name)
    if device_class is None:
        raise UnsupportedClaim(
            f"request {request.name!r}: device class {exactly.device_class_name!r} not found"
        )
    expressions = [
        s.cel.expression
        for s in (*device_class.spec.selectors, *exactly.selectors)
        if s.cel is not None
    ]
    capacity = {} if exactly.capacity is None else exactly.capacity.requests
    return DeviceRequest(
        name=request.name,
        selects=selector(expressions),
        count=exactly.count or 1,
        capacity=_amounts(capacity),
    )


_LITERAL = r'"[^"]*"|true|false|-?[0-9]+'
_TERM = re.compile(
    r"\s*device\.(?:(?P<field>driver|allowMultipleAllocations)"
    r'|attributes\["(?P<domain>[^"]+)"\]\.(?P<name>[A-Za-z_][A-Za-z0-9_]*))'
    rf"\s*(?P<op>==|!=)\s*(?P<literal>{_LITERAL})\s*"
)


def selector(expressions: Sequence[str]) -> Selector:
    """The CEL selectors, all of which a device must satisfy, as one predicate. Raises
    UnsupportedClaim for an expression outside the subset (module docstring)."""
    terms = [_term(t) for e in expressions for t in e.split("&&")]
    return lambda device: all(term(device) for term in terms)


def _term(text: str) -> Selector:
    match = _TERM.fullmatch(text)
    if match is None:
        raise UnsupportedClaim(f"selector {text.strip()!r} is beyond the CEL this stand-in reads")
    expected = _literal(match["literal"])
    equal = match["op"] == "=="
    field, qualified = match["field"], f"{match['domain']}/{match['name']}"

    def term(device: Device) -> bool:
        actual: AttributeValue | None
        if field == "driver":
            actual = device.driver
        elif field == "allowMultipleAllocations":
            actual = device.allow_multiple_allocations
        else:
            actual = device.attribute(qualified)
        if actual is None:
            return False  # CEL fails on a missing attribute: the device is not selected
        same = type(actual) is type(expected) and actual == expected
        return same == equal

    return term


def _literal(text: str) -> AttributeValue:
    if text.startswith('"'):
        return text[1:-1]
    if text in ("true", "false"):
        return text == "true"
    return int(text)


def held(claim: api.ResourceClaim) -> Allocation:
    """What the claim's allocation holds, in the allocator's units (none before it is
    allocated)."""
    if claim.status.allocation is None:
        return Allocation(())
    return Allocation(
        tuple(
            Result(
                request=r.request,
                driver=r.driver,
                pool=r.pool,
                device=r.device,
                share_id=r.share_id,
                consumed_capacity={
                    n: api.quantity_units(q) for n, q in r.consumed_capacity.items()
                },
            )
            for r in claim.status.allocation.devices.results
        )
    )


def _amounts(quantities: Mapping[str, str]) -> dict[str, int]:
    return {name: api.quantity_units(q) for name, q in quantities.items()}


def _api_result(result: Result, devices: Sequence[Device]) -> api.DeviceRequestAllocationResult:
    device = next(d for d in devices if d.key == result.key)
    return api.DeviceRequestAllocationResult(
        request=result.request,
        driver=result.driver,
        pool=result.pool,
        device=result.device,
        share_id=result.share_id,
        consumed_capacity={
            name: api.format_quantity(amount, binary=_binary(device, name))
            for name, amount in result.consumed_capacity.items()
        },
    )


def _binary(device: Device, capacity: str) -> bool:
    """Whether to write the capacity's amounts with binary suffixes: where its value is a
    multiple of 1024 (memory, "15Gi"), not for counts (cores "100", shares "20")."""
    value = device.capacity[capacity].value
    return value % 1024 == 0


def _config(
    spec: api.ResourceClaimSpec, classes: dict[str, api.DeviceClass]
) -> list[api.DeviceAllocationConfiguration]:
    """The device classes' configuration for each request using them, then the claim's
    own: what the kubelet hands the drivers with the devices."""
    config = []
    for request in spec.devices.requests:
        assert request.exactly is not None  # device_claim refused the others
        for entry in classes[request.exactly.device_class_name].spec.config:
            config.append(
                api.DeviceAllocationConfiguration(
                    source="FromClass", requests=[request.name], opaque=entry.opaque
                )
            )
    for own in spec.devices.config:
        config.append(
            api.DeviceAllocationConfiguration(
                source="FromClaim", requests=own.requests, opaque=own.opaque
            )
        )
    return config


def _consumer(pod: Pod) -> api.ResourceClaimConsumerReference:
    return api.ResourceClaimConsumerReference(
        resource="pods", name=pod.metadata.name, uid=pod.metadata.uid
    )
