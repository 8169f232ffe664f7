"""What the API server checks and changes on a resource.k8s.io/v1 write (DRA-INTERFACES
§4, §5), so the in-memory cluster refuses what a real one refuses.

`validate_*` return every `FieldError`, each naming its field by path
(`spec.devices[3].capacity.memory.requestPolicy.validRange.step`: list items by index,
map entries by key). `drop_disabled_fields` removes, silently as the API server does,
the fields of feature gates that are off in the `ApiGates` of a release, except where
the stored object already used them; `with_defaults` fills what the server defaults.
"""

import re
from collections.abc import Iterator, Mapping, Sequence, Sized
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, TypeVar

from gpushare.dra.objects import (
    CapacityRequestPolicy,
    CapacityRequestPolicyRange,
    DeviceClass,
    DeviceSubRequest,
    ExactDeviceRequest,
    ResourceClaim,
    ResourceClaimSpec,
    ResourceClaimStatus,
    ResourceClaimTemplate,
    ResourceSlice,
    quantity_units,
)


@dataclass(frozen=True, slots=True)
class FieldError:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ApiRelease(StrEnum):
    V1_34 = "1.34"
    V1_35 = "1.35"
    V1_36 = "1.36"

    @property
    def minor(self) -> int:
        return int(self.value.split(".")[1])


class Gate(StrEnum):
    PRIORITIZED_LIST = "DRAPrioritizedList"
    ADMIN_ACCESS = "DRAAdminAccess"
    DEVICE_STATUS = "DRAResourceClaimDeviceStatus"
    CONSUMABLE_CAPACITY = "DRAConsumableCapacity"
    PARTITIONABLE_DEVICES = "DRAPartitionableDevices"
    EXTENDED_RESOURCE = "DRAExtendedResource"
    DEVICE_TAINTS = "DRADeviceTaints"
    BINDING_CONDITIONS = "DRADeviceBindingConditions"


_BETA_BEFORE_1_36: Final = frozenset({Gate.PRIORITIZED_LIST, Gate.ADMIN_ACCESS, Gate.DEVICE_STATUS})
ON_BY_DEFAULT: Final[Mapping[ApiRelease, frozenset[Gate]]] = {
    ApiRelease.V1_34: _BETA_BEFORE_1_36,
    ApiRelease.V1_35: _BETA_BEFORE_1_36,
    ApiRelease.V1_36: frozenset(Gate),
}
"""The API server's gates on by default in each release (DRA-INTERFACES §5)."""


@dataclass(frozen=True, slots=True)
class ApiGates:
    """The API server's release and its enabled feature gates."""

    release: ApiRelease
    enabled: frozenset[Gate]

    @classmethod
    def of(
        cls, release: ApiRelease = ApiRelease.V1_36, overrides: Mapping[Gate, bool] | None = None
    ) -> "ApiGates":
        """The release's defaults, with some gates switched (`--feature-gates`)."""
        enabled = set(ON_BY_DEFAULT[release])
        for gate, on in (overrides or {}).items():
            if on:
                enabled.add(gate)
            else:
                enabled.discard(gate)
        return cls(release, frozenset(enabled))


DEFAULT_GATES: Final = ApiGates.of()

MAX_DEVICES: Final = 128
MAX_DEVICES_WITH_TAINTS_OR_COUNTERS: Final = 64
MAX_ATTRIBUTES_AND_CAPACITIES: Final = 32
MAX_ATTRIBUTE_STRING: Final = 64
MAX_VALID_VALUES: Final = 10
MAX_REQUESTS: Final = 32
MAX_FIRST_AVAILABLE: Final = 8
MAX_CONSTRAINTS: Final = 32
MAX_SELECTORS: Final = 32
MAX_RESERVED_FOR: Final = 256
MAX_RESULTS: Final = 32

_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_LABEL = re.compile(_LABEL)
_DNS_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")
_C_IDENTIFIER = re.compile("[A-Za-z_][A-Za-z0-9_]*")
_QUALIFIED_NAME_PART = re.compile("([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")

DNS_LABEL_RULE: Final = "a lowercase RFC 1123 label of at most 63 characters"
DNS_SUBDOMAIN_RULE: Final = "a lowercase RFC 1123 subdomain"
ATTRIBUTE_NAME_RULE: Final = (
    "a C identifier of at most 32 characters, optionally prefixed by a DNS subdomain of "
    "at most 63 characters and a slash"
)


def is_dns_label(name: str) -> bool:
    return len(name) <= 63 and _DNS_LABEL.fullmatch(name) is not None


def is_dns_subdomain(name: str, limit: int = 253) -> bool:
    return len(name) <= limit and _DNS_SUBDOMAIN.fullmatch(name) is not None


def is_attribute_name(name: str, qualified: bool = False) -> bool:
    """A device attribute's or capacity's name: `[domain/]identifier`; `qualified`
    requires the domain (constraints name attributes fully)."""
    domain, slash, identifier = name.rpartition("/")
    if (slash or qualified) and not is_dns_subdomain(domain, 63):
        return False
    return len(identifier) <= 32 and _C_IDENTIFIER.fullmatch(identifier) is not None


def is_extended_resource_name(name: str) -> bool:
    """Kubernetes' rule: a `domain/name` outside kubernetes.io, and `requests.<name>`
    a qualified name (what a ResourceQuota would call it)."""
    if "/" not in name or "kubernetes.io/" in name or name.startswith("requests."):
        return False
    prefix, _, part = f"requests.{name}".partition("/")
    return (
        is_dns_subdomain(prefix)
        and len(part) <= 63
        and _QUALIFIED_NAME_PART.fullmatch(part) is not None
    )


class _Report:
    """The errors of one object, as they are found."""

    def __init__(self) -> None:
        self.errors: list[FieldError] = []

    def add(self, path: str, message: str) -> None:
        self.errors.append(FieldError(path, message))

    def at_most(self, items: Sized, limit: int, path: str, why: str = "") -> None:
        if len(items) > limit:
            self.add(path, f"must have at most {limit} items{why}, got {len(items)}")

    def units(self, quantity: str | None, path: str) -> int | None:
        """The quantity in base units; None (and an error unless it is absent) when
        there is none to compare."""
        if quantity is None:
            return None
        try:
            return quantity_units(quantity)
        except ValueError as err:
            self.add(path, str(err))
            return None

    def named(self, name: str, valid: bool, path: str, rule: str) -> None:
        if not name:
            self.add(path, "required")
        elif not valid:
            self.add(path, f"invalid value {name!r}: must be {rule}")

    def unique(self, names: Iterator[tuple[str, str]]) -> None:
        """(path, name) pairs: each name after its first use is a duplicate."""
        seen: set[str] = set()
        for path, name in names:
            if name in seen:
                self.add(path, f"duplicate value {name!r}")
            seen.add(name)


def _metadata(report: _Report, name: str) -> None:
    if not name:
        report.add("metadata.name", "name or generateName is required")


# ----- ResourceSlice


def validate_resource_slice(
    resource_slice: ResourceSlice, gates: ApiGates = DEFAULT_GATES
) -> list[FieldError]:
    report = _Report()
    _metadata(report, resource_slice.metadata.name)
    spec = resource_slice.spec
    report.named(
        spec.driver,
        is_dns_subdomain(spec.driver, 63),
        "spec.driver",
        f"{DNS_SUBDOMAIN_RULE} of at most 63 characters",
    )
    pool_ok = len(spec.pool.name) <= 253 and all(
        is_dns_subdomain(part) for part in spec.pool.name.split("/")
    )
    report.named(
        spec.pool.name,
        pool_ok,
        "spec.pool.name",
        "at most 253 characters of lowercase RFC 1123 subdomains joined by '/'",
    )
    if spec.pool.generation < 0:
        report.add("spec.pool.generation", "must be greater than or equal to 0")
    if spec.pool.resource_slice_count <= 0:
        report.add("spec.pool.resourceSliceCount", "must be greater than zero")
    chosen = [
        bool(spec.node_name),
        spec.node_selector is not None,
        bool(spec.all_nodes),
        bool(spec.per_device_node_selection),
    ]
    if chosen.count(True) != 1:
        report.add(
            "spec",
            "exactly one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection is "
            f"required, got {chosen.count(True)}",
        )
    _devices(report, resource_slice, gates.release)
    return report.errors


def validate_resource_slice_update(
    new: ResourceSlice, old: ResourceSlice, gates: ApiGates = DEFAULT_GATES
) -> list[FieldError]:
    """`new` as a replacement of `old`: valid, and its driver, pool and node unchanged."""
    errors = validate_resource_slice(new, gates)
    for path, before, after in (
        ("spec.driver", old.spec.driver, new.spec.driver),
        ("spec.pool.name", old.spec.pool.name, new.spec.pool.name),
        ("spec.nodeName", old.spec.node_name, new.spec.node_name),
    ):
        if after != before:
            errors.append(FieldError(path, "field is immutable"))
    return errors


def _devices(report: _Report, resource_slice: ResourceSlice, release: ApiRelease) -> None:
    spec = resource_slice.spec
    counted = release.minor >= 35 and any(d.taints or d.consumes_counters for d in spec.devices)
    if counted:
        report.at_most(
            spec.devices,
            MAX_DEVICES_WITH_TAINTS_OR_COUNTERS,
            "spec.devices",
            " when a device has taints or consumesCounters",
        )
    else:
        report.at_most(spec.devices, MAX_DEVICES, "spec.devices")
    if release.minor >= 35 and spec.devices and spec.shared_counters:
        report.add("spec", "devices and sharedCounters cannot be set in the same slice")
    report.unique((f"spec.devices[{i}].name", d.name) for i, d in enumerate(spec.devices))
    for i, device in enumerate(spec.devices):
        path = f"spec.devices[{i}]"
        report.named(device.name, is_dns_label(device.name), f"{path}.name", DNS_LABEL_RULE)
        entries = len(device.attributes) + len(device.capacity)
        if entries > MAX_ATTRIBUTES_AND_CAPACITIES:
            report.add(
                path,
                f"attributes and capacity must have at most {MAX_ATTRIBUTES_AND_CAPACITIES} "
                f"entries together, got {entries}",
            )
        _attributes(report, device.attributes, f"{path}.attributes")
        for name, capacity in device.capacity.items():
            entry = f"{path}.capacity.{name}"
            if not is_attribute_name(name):
                report.add(entry, f"invalid name: must be {ATTRIBUTE_NAME_RULE}")
            value = report.units(capacity.value, f"{entry}.value")
            policy = capacity.request_policy
            if policy is None:
                continue
            if not device.allow_multiple_allocations:
                report.add(
                    f"{entry}.requestPolicy", "only allowed when allowMultipleAllocations is true"
                )
            elif value is not None:
                _request_policy(report, policy, value, f"{entry}.requestPolicy")


def _attributes(report: _Report, attributes: Mapping[str, Any], path: str) -> None:
    for name, attribute in attributes.items():
        entry = f"{path}.{name}"
        if not is_attribute_name(name):
            report.add(entry, f"invalid name: must be {ATTRIBUTE_NAME_RULE}")
        values = {
            "int": attribute.int_,
            "bool": attribute.bool_,
            "string": attribute.string,
            "version": attribute.version,
        }
        if sum(v is not None for v in values.values()) != 1:
            report.add(entry, "exactly one of int, bool, string, version is required")
        for key in ("string", "version"):
            text = values[key]
            if isinstance(text, str) and len(text) > MAX_ATTRIBUTE_STRING:
                report.add(
                    f"{entry}.{key}",
                    f"must be at most {MAX_ATTRIBUTE_STRING} characters, got {len(text)}",
                )


def _request_policy(report: _Report, policy: CapacityRequestPolicy, value: int, path: str) -> None:
    default = report.units(policy.default, f"{path}.default")
    if default is not None and default > value:
        report.add(f"{path}.default", "must be at most the capacity's value")
    if policy.valid_values and policy.valid_range is not None:
        report.add(path, "validValues and validRange cannot both be set")
    elif policy.valid_values:
        _valid_values(report, policy.valid_values, default, value, path)
    elif policy.valid_range is not None:
        _valid_range(report, policy.valid_range, default, value, path)


def _valid_values(
    report: _Report, values: Sequence[str], default: int | None, value: int, path: str
) -> None:
    report.at_most(values, MAX_VALID_VALUES, f"{path}.validValues")
    allowed: list[int] = []
    for i, text in enumerate(values):
        entry = f"{path}.validValues[{i}]"
        units = report.units(text, entry)
        if units is None:
            continue
        if allowed and units <= allowed[-1]:
            report.add(entry, "must be in ascending order without duplicates")
        if units > value:
            report.add(entry, "must be at most the capacity's value")
        allowed.append(units)
    if default is not None and default not in allowed:
        report.add(f"{path}.default", "must be one of validValues")


def _valid_range(
    report: _Report,
    limits: CapacityRequestPolicyRange,
    default: int | None,
    value: int,
    path: str,
) -> None:
    within = f"{path}.validRange"
    if limits.min is None:
        report.add(f"{within}.min", "required")
    low = report.units(limits.min, f"{within}.min")
    high = report.units(limits.max, f"{within}.max")
    step = report.units(limits.step, f"{within}.step")
    if low is None:
        return
    if low > value:
        report.add(f"{within}.min", "must be at most the capacity's value")
    if high is not None and high < low:
        report.add(f"{within}.max", "must be at least min")
    if high is not None and high > value:
        report.add(f"{within}.max", "must be at most the capacity's value")
    if step is not None and step <= 0:
        report.add(f"{within}.step", "must be greater than zero")
    elif step is not None and low + step > value:
        report.add(f"{within}.step", "min plus one step must be at most the capacity's value")
    if default is None:
        return
    if default < low or (high is not None and default > high):
        report.add(f"{path}.default", "must be within validRange")
    elif step and (default - low) % step:
        report.add(f"{path}.default", "must be min plus a multiple of step")


# ----- ResourceClaim, ResourceClaimTemplate


def validate_resource_claim(claim: ResourceClaim) -> list[FieldError]:
    report = _Report()
    _metadata(report, claim.metadata.name)
    _claim_spec(report, claim.spec, "spec")
    _claim_status(report, claim.status)
    return report.errors


def validate_resource_claim_template(template: ResourceClaimTemplate) -> list[FieldError]:
    report = _Report()
    _metadata(report, template.metadata.name)
    _claim_spec(report, template.spec.spec, "spec.spec")
    return report.errors


def _claim_spec(report: _Report, spec: ResourceClaimSpec, path: str) -> None:
    requests = spec.devices.requests
    path = f"{path}.devices"
    report.at_most(requests, MAX_REQUESTS, f"{path}.requests")
    report.unique((f"{path}.requests[{i}].name", r.name) for i, r in enumerate(requests))
    for i, request in enumerate(requests):
        entry = f"{path}.requests[{i}]"
        report.named(request.name, is_dns_label(request.name), f"{entry}.name", DNS_LABEL_RULE)
        if (request.exactly is None) == (not request.first_available):
            report.add(entry, "exactly one of exactly, firstAvailable is required")
        if request.exactly is not None:
            _exact(report, request.exactly, f"{entry}.exactly")
        alternatives = request.first_available
        report.at_most(alternatives, MAX_FIRST_AVAILABLE, f"{entry}.firstAvailable")
        report.unique(
            (f"{entry}.firstAvailable[{j}].name", s.name) for j, s in enumerate(alternatives)
        )
        for j, alternative in enumerate(alternatives):
            sub = f"{entry}.firstAvailable[{j}]"
            report.named(
                alternative.name, is_dns_label(alternative.name), f"{sub}.name", DNS_LABEL_RULE
            )
            _exact(report, alternative, sub)
    report.at_most(spec.devices.constraints, MAX_CONSTRAINTS, f"{path}.constraints")
    for i, constraint in enumerate(spec.devices.constraints):
        entry = f"{path}.constraints[{i}]"
        named = {
            "matchAttribute": constraint.match_attribute,
            "distinctAttribute": constraint.distinct_attribute,
        }
        if sum(v is not None for v in named.values()) != 1:
            report.add(entry, "exactly one of matchAttribute, distinctAttribute is required")
        for key, attribute in named.items():
            if attribute is not None and not is_attribute_name(attribute, qualified=True):
                report.add(
                    f"{entry}.{key}",
                    f"invalid value {attribute!r}: must be fully qualified, domain/name",
                )


def _exact(report: _Report, request: ExactDeviceRequest | DeviceSubRequest, path: str) -> None:
    report.named(
        request.device_class_name,
        is_dns_subdomain(request.device_class_name),
        f"{path}.deviceClassName",
        DNS_SUBDOMAIN_RULE,
    )
    mode = request.allocation_mode
    if mode not in (None, "ExactCount", "All"):
        report.add(f"{path}.allocationMode", f"invalid value {mode!r}: must be ExactCount or All")
    elif mode == "All" and request.count is not None:
        report.add(f"{path}.count", "must not be set when allocationMode is All")
    elif request.count is not None and request.count <= 0:
        report.add(f"{path}.count", "must be greater than zero")
    if request.capacity is not None:
        for name, quantity in request.capacity.requests.items():
            report.units(quantity, f"{path}.capacity.requests.{name}")


def _claim_status(report: _Report, status: ResourceClaimStatus) -> None:
    report.at_most(status.reserved_for, MAX_RESERVED_FOR, "status.reservedFor")
    if status.allocation is not None:
        results = status.allocation.devices.results
        report.at_most(results, MAX_RESULTS, "status.allocation.devices.results")


# ----- DeviceClass


def validate_device_class(device_class: DeviceClass) -> list[FieldError]:
    report = _Report()
    _metadata(report, device_class.metadata.name)
    spec = device_class.spec
    report.at_most(spec.selectors, MAX_SELECTORS, "spec.selectors")
    name = spec.extended_resource_name
    if name is not None and not is_extended_resource_name(name):
        report.add(
            "spec.extendedResourceName",
            f"invalid value {name!r}: must be an extended resource name, domain/name "
            "outside kubernetes.io",
        )
    return report.errors


# ----- what the server changes: gated fields, defaults

_CLAIM_SPEC_FIELDS: Final = {
    Gate.PRIORITIZED_LIST: ("devices.requests[].firstAvailable",),
    Gate.ADMIN_ACCESS: ("devices.requests[].exactly.adminAccess",),
    Gate.CONSUMABLE_CAPACITY: (
        "devices.requests[].exactly.capacity",
        "devices.requests[].firstAvailable[].capacity",
        "devices.constraints[].distinctAttribute",
    ),
    Gate.DEVICE_TAINTS: (
        "devices.requests[].exactly.tolerations",
        "devices.requests[].firstAvailable[].tolerations",
    ),
}
_RESULTS = "status.allocation.devices.results[]"
_CLAIM_STATUS_FIELDS: Final = {
    Gate.ADMIN_ACCESS: (f"{_RESULTS}.adminAccess",),
    Gate.CONSUMABLE_CAPACITY: (
        f"{_RESULTS}.shareID",
        f"{_RESULTS}.consumedCapacity",
        "status.devices[].shareID",
    ),
    Gate.DEVICE_TAINTS: (f"{_RESULTS}.tolerations",),
    Gate.DEVICE_STATUS: ("status.devices",),
    Gate.BINDING_CONDITIONS: (
        f"{_RESULTS}.bindingConditions",
        f"{_RESULTS}.bindingFailureConditions",
    ),
}


def _within(prefix: str, fields: Mapping[Gate, tuple[str, ...]]) -> dict[Gate, tuple[str, ...]]:
    return {gate: tuple(f"{prefix}.{path}" for path in paths) for gate, paths in fields.items()}


def _merged(*tables: Mapping[Gate, tuple[str, ...]]) -> dict[Gate, tuple[str, ...]]:
    merged: dict[Gate, tuple[str, ...]] = {}
    for table in tables:
        for gate, paths in table.items():
            merged[gate] = merged.get(gate, ()) + paths
    return merged


GATED_FIELDS: Final[Mapping[str, Mapping[Gate, tuple[str, ...]]]] = {
    "ResourceSlice": {
        Gate.CONSUMABLE_CAPACITY: (
            "spec.devices[].allowMultipleAllocations",
            "spec.devices[].capacity.*.requestPolicy",
        ),
        Gate.PARTITIONABLE_DEVICES: (
            "spec.sharedCounters",
            "spec.perDeviceNodeSelection",
            "spec.devices[].consumesCounters",
            "spec.devices[].nodeName",
            "spec.devices[].nodeSelector",
            "spec.devices[].allNodes",
        ),
        Gate.DEVICE_TAINTS: ("spec.devices[].taints",),
        Gate.BINDING_CONDITIONS: (
            "spec.devices[].bindsToNode",
            "spec.devices[].bindingConditions",
            "spec.devices[].bindingFailureConditions",
        ),
    },
    "ResourceClaim": _merged(_within("spec", _CLAIM_SPEC_FIELDS), _CLAIM_STATUS_FIELDS),
    "ResourceClaimTemplate": _within("spec.spec", _CLAIM_SPEC_FIELDS),
    "DeviceClass": {Gate.EXTENDED_RESOURCE: ("spec.extendedResourceName",)},
}
"""Per kind, per gate: the JSON paths of the fields the API server drops while the gate
is off (DRA-INTERFACES §5). `[]`: each item of a list; `*`: each value of a map."""

_Object = TypeVar("_Object", ResourceSlice, ResourceClaim, ResourceClaimTemplate, DeviceClass)


def drop_disabled_fields(obj: _Object, gates: ApiGates, stored: _Object | None = None) -> _Object:
    """`obj` without the fields of the gates that are off: silently, as the API server
    drops them, unless `stored` (the object it replaces) already used that gate's
    fields, which an update then keeps."""
    document = obj.to_api()
    before = stored.to_api() if stored is not None else {}
    for gate, paths in GATED_FIELDS[obj.kind].items():
        if gate in gates.enabled or any(_holds(before, path) for path in paths):
            continue
        for path in paths:
            steps = path.split(".")
            for holder in _holders(document, steps[:-1]):
                holder.pop(steps[-1], None)
    return type(obj).model_validate(document)


def _holds(document: dict[str, Any], path: str) -> bool:
    steps = path.split(".")
    return any(steps[-1] in holder for holder in _holders(document, steps[:-1]))


def _holders(node: Any, steps: Sequence[str]) -> Iterator[dict[str, Any]]:
    """The maps at the end of `steps` in a JSON document."""
    if not isinstance(node, dict):
        return
    if not steps:
        yield node
        return
    step, rest = steps[0], steps[1:]
    if step == "*":
        for value in node.values():
            yield from _holders(value, rest)
    elif step.endswith("[]"):
        for item in node.get(step[:-2]) or ():
            yield from _holders(item, rest)
    else:
        yield from _holders(node.get(step), rest)


def with_defaults(spec: ResourceClaimSpec) -> ResourceClaimSpec:
    """The spec as the API server stores it: a request without allocationMode is
    ExactCount, an ExactCount request without count asks 1 device."""
    requests = []
    for request in spec.devices.requests:
        exactly = None if request.exactly is None else _defaulted(request.exactly)
        alternatives = [_defaulted(s) for s in request.first_available]
        requests.append(
            request.model_copy(update={"exactly": exactly, "first_available": alternatives})
        )
    devices = spec.devices.model_copy(update={"requests": requests})
    return spec.model_copy(update={"devices": devices})


_Request = TypeVar("_Request", ExactDeviceRequest, DeviceSubRequest)


def _defaulted(request: _Request) -> _Request:
    mode = request.allocation_mode or "ExactCount"
    count = request.count if request.count is not None or mode != "ExactCount" else 1
    return request.model_copy(update={"allocation_mode": mode, "count": count})
