"""The resource.k8s.io/v1 objects DRA mode reads and writes, as typed models
(DRA-INTERFACES §4): DeviceClass, ResourceSlice, ResourceClaim, ResourceClaimTemplate.

Unlike gpushare.objects, whose pods and nodes are only ever patched, these are written
back whole (a slice replaced, a claim's status updated), so every model keeps the
fields it does not declare and `to_api()` gives them back: a read-modify-write loses
nothing a newer API server added. `to_api()` leaves out what the API leaves out (unset
fields, empty lists and maps), so the JSON read is the JSON written.

Quantities stay strings, as on the wire ("16Gi"); `quantity_units` reads one as an
exact integer of base units and `format_quantity` writes one back.
"""

import re
from fractions import Fraction
from typing import Annotated, Any, Final

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
)
from pydantic.alias_generators import to_camel

API_VERSION: Final = "resource.k8s.io/v1"

_QUANTITY = re.compile(
    r"\+?(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?P<suffix>[KMGTPE]i|[kMGTPE])?"
)
_SUFFIXES: Final = {
    "": 1,
    **{s: 1000 ** (n + 1) for n, s in enumerate("kMGTPE")},
    **{f"{s}i": 1024 ** (n + 1) for n, s in enumerate("KMGTPE")},
}


def quantity_units(quantity: str) -> int:
    """A Quantity string as an exact whole number of base units: "16Gi" is 17179869184,
    "1.5k" 1500, "20" 20. Raises ValueError naming the value for anything else (a
    fraction of a unit, a sign, milli or exponent notation): capacities are counted in
    whole bytes, percent and shares."""
    match = _QUANTITY.fullmatch(quantity)
    if match is None:
        raise ValueError(f"quantity {quantity!r} is not a number with an optional suffix")
    amount = Fraction(match["number"]) * _SUFFIXES[match["suffix"] or ""]
    if amount.denominator != 1:
        raise ValueError(f"quantity {quantity!r} is not a whole number of units")
    return int(amount)


def format_quantity(units: int, binary: bool = False) -> str:
    """`units` in the canonical form the API server writes: the largest suffix that
    divides it exactly, binary (Ki, Mi, ...) or decimal (k, M, ...); else plain."""
    base = 1024 if binary else 1000
    suffixes = [f"{s}i" for s in "KMGTPE"] if binary else list("kMGTPE")
    for power in range(len(suffixes), 0, -1):
        if units and units % base**power == 0:
            return f"{units // base**power}{suffixes[power - 1]}"
    return str(units)


def _text(value: Any) -> Any:
    # The API sends quantities as strings; builders and YAML users write numbers too.
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


Quantity = Annotated[str, BeforeValidator(_text)]


def _empty(value: object) -> bool:
    return not value


def _list() -> Any:
    """A list field the API omits when empty (Go's omitempty). (Called by class bodies at
    import, before mutmut can switch a mutant in; test_objects.py checks what it makes.)"""
    return Field(default_factory=list, exclude_if=_empty)  # pragma: no mutate: at import


def _map() -> Any:
    """A map field the API omits when empty (called at import, as `_list`)."""
    return Field(default_factory=dict, exclude_if=_empty)  # pragma: no mutate: at import


class ApiModel(BaseModel):
    model_config = ConfigDict(
        frozen=True, populate_by_name=True, alias_generator=to_camel, extra="allow"
    )

    def to_api(self) -> dict[str, Any]:
        """The object as the API's JSON: camelCase, unset and empty fields left out,
        undeclared fields kept as they came."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class OwnerReference(ApiModel):
    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool | None = None
    block_owner_deletion: bool | None = None


class ObjectMeta(ApiModel):
    name: str = Field("", exclude_if=_empty)
    generate_name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    labels: dict[str, str] = _map()
    annotations: dict[str, str] = _map()
    owner_references: list[OwnerReference] = _list()


# ----- DeviceClass


class CELDeviceSelector(ApiModel):
    expression: str


class DeviceSelector(ApiModel):
    cel: CELDeviceSelector | None = None


class OpaqueDeviceConfiguration(ApiModel):
    driver: str
    parameters: Any = None
    """Any JSON the driver reads; the API passes it through."""


class DeviceClassConfiguration(ApiModel):
    opaque: OpaqueDeviceConfiguration | None = None


class DeviceClassSpec(ApiModel):
    selectors: list[DeviceSelector] = _list()
    config: list[DeviceClassConfiguration] = _list()
    extended_resource_name: str | None = None


class DeviceClass(ApiModel):
    api_version: str = API_VERSION
    kind: str = "DeviceClass"
    metadata: ObjectMeta
    spec: DeviceClassSpec = Field(default_factory=DeviceClassSpec)


# ----- ResourceSlice


class DeviceAttribute(ApiModel):
    """One attribute value: exactly one of its four fields is set."""

    int_: StrictInt | None = Field(None, alias="int")
    bool_: StrictBool | None = Field(None, alias="bool")
    string: StrictStr | None = None
    version: StrictStr | None = None

    @classmethod
    def of(cls, value: int | bool | str) -> "DeviceAttribute":
        """The attribute holding `value` (a str as `string`; versions are spelled out)."""
        if isinstance(value, bool):
            return cls(bool_=value)
        if isinstance(value, int):
            return cls(int_=value)
        return cls(string=value)

    @property
    def value(self) -> int | bool | str | None:
        for value in (self.int_, self.bool_, self.string, self.version):
            if value is not None:
                return value
        return None


class CapacityRequestPolicyRange(ApiModel):
    min: Quantity | None = None
    max: Quantity | None = None
    step: Quantity | None = None


class CapacityRequestPolicy(ApiModel):
    default: Quantity | None = None
    valid_values: list[Quantity] = _list()
    valid_range: CapacityRequestPolicyRange | None = None


class DeviceCapacity(ApiModel):
    value: Quantity
    request_policy: CapacityRequestPolicy | None = None


class Counter(ApiModel):
    value: Quantity


class CounterSet(ApiModel):
    name: str
    counters: dict[str, Counter] = _map()


class DeviceCounterConsumption(ApiModel):
    counter_set: str
    counters: dict[str, Counter] = _map()


class DeviceTaint(ApiModel):
    key: str
    value: str | None = None
    effect: str
    time_added: str | None = None


class Device(ApiModel):
    name: str
    attributes: dict[str, DeviceAttribute] = _map()
    capacity: dict[str, DeviceCapacity] = _map()
    allow_multiple_allocations: bool | None = None
    consumes_counters: list[DeviceCounterConsumption] = _list()
    taints: list[DeviceTaint] = _list()


class ResourcePool(ApiModel):
    name: str
    generation: int = 0
    resource_slice_count: int = 0
    """Required by the API (> 0); 0 is what Go reads when it is missing."""


class ResourceSliceSpec(ApiModel):
    driver: str
    pool: ResourcePool
    node_name: str | None = None
    node_selector: dict[str, Any] | None = None
    all_nodes: bool | None = None
    per_device_node_selection: bool | None = None
    devices: list[Device] = _list()
    shared_counters: list[CounterSet] = _list()


class ResourceSlice(ApiModel):
    api_version: str = API_VERSION
    kind: str = "ResourceSlice"
    metadata: ObjectMeta
    spec: ResourceSliceSpec


# ----- ResourceClaim and ResourceClaimTemplate


class CapacityRequirements(ApiModel):
    requests: dict[str, Quantity] = _map()


class DeviceToleration(ApiModel):
    key: str | None = None
    operator: str | None = None
    value: str | None = None
    effect: str | None = None
    toleration_seconds: int | None = None


class DeviceSubRequest(ApiModel):
    """One alternative of `firstAvailable`: an exact request with a name of its own."""

    name: str
    device_class_name: str = ""
    selectors: list[DeviceSelector] = _list()
    allocation_mode: str | None = None
    """ExactCount (the API's default) or All."""
    count: int | None = None
    """Devices for ExactCount; the API defaults it to 1."""
    tolerations: list[DeviceToleration] = _list()
    capacity: CapacityRequirements | None = None


class ExactDeviceRequest(ApiModel):
    device_class_name: str = ""
    selectors: list[DeviceSelector] = _list()
    allocation_mode: str | None = None
    """ExactCount (the API's default) or All."""
    count: int | None = None
    """Devices for ExactCount; the API defaults it to 1."""
    admin_access: bool | None = None
    tolerations: list[DeviceToleration] = _list()
    capacity: CapacityRequirements | None = None


class DeviceRequest(ApiModel):
    name: str
    exactly: ExactDeviceRequest | None = None
    first_available: list[DeviceSubRequest] = _list()


class DeviceConstraint(ApiModel):
    requests: list[str] = _list()
    match_attribute: str | None = None
    distinct_attribute: str | None = None


class DeviceClaimConfiguration(ApiModel):
    requests: list[str] = _list()
    opaque: OpaqueDeviceConfiguration | None = None


class DeviceClaim(ApiModel):
    requests: list[DeviceRequest] = _list()
    constraints: list[DeviceConstraint] = _list()
    config: list[DeviceClaimConfiguration] = _list()


class ResourceClaimSpec(ApiModel):
    devices: DeviceClaim = Field(default_factory=DeviceClaim)


class DeviceRequestAllocationResult(ApiModel):
    request: str
    """The request's name; `<request>/<subrequest>` for a firstAvailable alternative."""
    driver: str
    pool: str
    device: str
    admin_access: bool | None = None
    tolerations: list[DeviceToleration] = _list()
    share_id: str | None = Field(None, alias="shareID")
    """Set on a device with allowMultipleAllocations: this claim's share of it."""
    consumed_capacity: dict[str, Quantity] = _map()


class DeviceAllocationConfiguration(ApiModel):
    source: str
    """FromClass or FromClaim."""
    requests: list[str] = _list()
    opaque: OpaqueDeviceConfiguration | None = None


class DeviceAllocationResult(ApiModel):
    results: list[DeviceRequestAllocationResult] = _list()
    config: list[DeviceAllocationConfiguration] = _list()


class AllocationResult(ApiModel):
    devices: DeviceAllocationResult = Field(default_factory=DeviceAllocationResult)
    node_selector: dict[str, Any] | None = None
    allocation_timestamp: str | None = None


class ResourceClaimConsumerReference(ApiModel):
    api_group: str | None = None
    resource: str
    name: str
    uid: str


class AllocatedDeviceStatus(ApiModel):
    driver: str
    pool: str
    device: str
    share_id: str | None = Field(None, alias="shareID")
    conditions: list[dict[str, Any]] = _list()
    data: Any = None
    network_data: dict[str, Any] | None = None


class ResourceClaimStatus(ApiModel):
    allocation: AllocationResult | None = None
    reserved_for: list[ResourceClaimConsumerReference] = _list()
    devices: list[AllocatedDeviceStatus] = _list()


class ResourceClaim(ApiModel):
    api_version: str = API_VERSION
    kind: str = "ResourceClaim"
    metadata: ObjectMeta
    spec: ResourceClaimSpec = Field(default_factory=ResourceClaimSpec)
    status: ResourceClaimStatus = Field(default_factory=ResourceClaimStatus)

    @property
    def key(self) -> str:
        return f"{self.metadata.namespace}/{self.metadata.name}"

    def results_for(self, driver: str) -> list[DeviceRequestAllocationResult]:
        """The allocation's results for one driver's devices (none before allocation):
        what that driver prepares (DRA-INTERFACES §6, driver view)."""
        if self.status.allocation is None:
            return []
        return [r for r in self.status.allocation.devices.results if r.driver == driver]

    def config_for(self, driver: str) -> list[DeviceAllocationConfiguration]:
        """The allocation's opaque configuration addressed to one driver."""
        if self.status.allocation is None:
            return []
        return [
            c
            for c in self.status.allocation.devices.config
            if c.opaque is not None and c.opaque.driver == driver
        ]

    def reserved_pod_uids(self) -> frozenset[str]:
        """The pods the claim is reserved for: the kubelet prepares it for no other."""
        return frozenset(
            r.uid for r in self.status.reserved_for if r.resource == "pods" and not r.api_group
        )


class ResourceClaimTemplateSpec(ApiModel):
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    """Labels and annotations copied onto each claim made from the template."""
    spec: ResourceClaimSpec = Field(default_factory=ResourceClaimSpec)


class ResourceClaimTemplate(ApiModel):
    api_version: str = API_VERSION
    kind: str = "ResourceClaimTemplate"
    metadata: ObjectMeta
    spec: ResourceClaimTemplateSpec = Field(default_factory=ResourceClaimTemplateSpec)
