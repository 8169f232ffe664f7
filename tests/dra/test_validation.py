"""The API server's validation of resource.k8s.io/v1 objects (DRA-INTERFACES §4): the
objects gpushare writes pass, and each violation is refused naming its field."""

import pytest

from gpushare.dra.objects import (
    DeviceClass,
    ResourceClaim,
    ResourceClaimTemplate,
    ResourceSlice,
)
from gpushare.dra.validation import (
    ApiGates,
    ApiRelease,
    FieldError,
    validate_device_class,
    validate_resource_claim,
    validate_resource_claim_template,
    validate_resource_slice,
    validate_resource_slice_update,
)
from tests.dra.builders import GONE, at, changed, claim_doc, exact, gpu, result, slice_doc

DEV0 = "spec.devices.0"
MEM = f"{DEV0}.capacity.memory"
POLICY = f"{MEM}.requestPolicy"
RANGE = f"{POLICY}.validRange"
SHARES = f"{DEV0}.capacity.shares.requestPolicy"
ERR_DEV0 = "spec.devices[0]"
ERR_POLICY = f"{ERR_DEV0}.capacity.memory.requestPolicy"
ERR_SHARES = f"{ERR_DEV0}.capacity.shares.requestPolicy"
REQ0 = "spec.devices.requests.0"
ERR_REQ0 = "spec.devices.requests[0]"


def slice_errors(doc, release=ApiRelease.V1_36) -> list[FieldError]:
    return validate_resource_slice(ResourceSlice.model_validate(doc), ApiGates.of(release))


def slice_paths(doc, release=ApiRelease.V1_36) -> list[str]:
    return [e.path for e in slice_errors(doc, release)]


def claim_paths(doc) -> list[str]:
    return [e.path for e in validate_resource_claim(ResourceClaim.model_validate(doc))]


def devices(n: int, **extra) -> list[dict]:
    return [{"name": f"gpu-{i}", **extra} for i in range(n)]


# ----- ResourceSlice


@pytest.mark.parametrize("shared", [True, False], ids=["sharing", "exclusive"])
def test_the_slices_gpushare_publishes_are_valid(shared):
    doc = slice_doc(devices=[gpu("gpu-0", shared), gpu("gpu-1", shared, 1)])
    assert slice_errors(doc) == []


ATTRS = f"{DEV0}.attributes"
ERR_ATTRS = f"{ERR_DEV0}.attributes"
EVERY_POLICY = [ERR_POLICY, f"{ERR_DEV0}.capacity.cores.requestPolicy", ERR_SHARES]


@pytest.mark.parametrize(
    ("changes", "paths"),
    [
        (at("metadata.name", ""), ["metadata.name"]),
        (at("spec.driver", ""), ["spec.driver"]),
        (at("spec.driver", "a" * 64), ["spec.driver"]),
        (at("spec.driver", "GPU.gpushare.io"), ["spec.driver"]),
        (at("spec.pool.name", ""), ["spec.pool.name"]),
        (at("spec.pool.name", "n" * 254), ["spec.pool.name"]),
        (at("spec.pool.name", f"{'n' * 126}/{'n' * 127}"), ["spec.pool.name"]),
        (at("spec.pool.name", "/".join(["n" * 63] * 4)), ["spec.pool.name"]),
        (at("spec.pool.name", "rack-1//n1"), ["spec.pool.name"]),
        (at("spec.pool.name", "Rack/n1"), ["spec.pool.name"]),
        (at("spec.pool.generation", -1), ["spec.pool.generation"]),
        (at("spec.pool.resourceSliceCount", 0), ["spec.pool.resourceSliceCount"]),
        (at("spec.pool.resourceSliceCount", GONE), ["spec.pool.resourceSliceCount"]),
        (at("spec.nodeName", GONE), ["spec"]),
        (at("spec.allNodes", True), ["spec"]),
        (at("spec.nodeSelector", {}), ["spec"]),
        (at("spec.perDeviceNodeSelection", True), ["spec"]),
        (at("spec.sharedCounters", [{"name": "s", "counters": {}}]), ["spec"]),
        (at(f"{DEV0}.name", ""), ["spec.devices[0].name"]),
        (at(f"{DEV0}.name", "GPU_0"), ["spec.devices[0].name"]),
        (at(f"{DEV0}.name", "g" * 64), ["spec.devices[0].name"]),
        (at("spec.devices.1.name", "gpu-0"), ["spec.devices[1].name"]),
        (at(f"{ATTRS}.uuid", {}), [f"{ERR_ATTRS}.uuid"]),
        (at(f"{ATTRS}.uuid", {"string": "a", "int": 1}), [f"{ERR_ATTRS}.uuid"]),
        (at(f"{ATTRS}.uuid", {"bool": True, "version": "1.0.0"}), [f"{ERR_ATTRS}.uuid"]),
        (at(f"{ATTRS}.uuid.string", "u" * 65), [f"{ERR_ATTRS}.uuid.string"]),
        (at(f"{ATTRS}.v", {"version": "1" * 65}), [f"{ERR_ATTRS}.v.version"]),
        (at(ATTRS, {"int": 1}, key="bad-name"), [f"{ERR_ATTRS}.bad-name"]),
        (at(ATTRS, {"int": 1}, key="1st"), [f"{ERR_ATTRS}.1st"]),
        (at(ATTRS, {"int": 1}, key="a" * 33), [f"{ERR_ATTRS}.{'a' * 33}"]),
        (at(ATTRS, {"int": 1}, key=f"{'d' * 64}/a"), [f"{ERR_ATTRS}.{'d' * 64}/a"]),
        (at(ATTRS, {"int": 1}, key="Gpu.io/a"), [f"{ERR_ATTRS}.Gpu.io/a"]),
        (at(ATTRS, {"int": 1}, key="gpu.io/a-b"), [f"{ERR_ATTRS}.gpu.io/a-b"]),
        (at(f"{DEV0}.capacity", {"value": "1"}, key="bad-name"), [f"{ERR_DEV0}.capacity.bad-name"]),
        (at(f"{MEM}.value", "lots"), [f"{ERR_DEV0}.capacity.memory.value"]),
        (at(f"{DEV0}.allowMultipleAllocations", GONE), EVERY_POLICY),
        (at(f"{DEV0}.allowMultipleAllocations", False), EVERY_POLICY),
        (at(f"{POLICY}.default", "17Gi"), [f"{ERR_POLICY}.default"]),
        (at(f"{POLICY}.default", "all"), [f"{ERR_POLICY}.default"]),
        (at(f"{POLICY}.validValues", ["16Gi"]), [ERR_POLICY]),
        (at(f"{SHARES}.validValues", ["20", "1"]), [f"{ERR_SHARES}.validValues[1]"]),
        (at(f"{SHARES}.validValues", ["1", "1", "20"]), [f"{ERR_SHARES}.validValues[1]"]),
        (at(f"{SHARES}.validValues", ["1", "21"]), [f"{ERR_SHARES}.validValues[1]"]),
        (at(f"{SHARES}.validValues", ["1", "x", "20"]), [f"{ERR_SHARES}.validValues[1]"]),
        (
            at(f"{SHARES}.validValues", ["1", "x", "21"]),
            [f"{ERR_SHARES}.validValues[1]", f"{ERR_SHARES}.validValues[2]"],
        ),
        (at(f"{SHARES}.default", "2"), [f"{ERR_SHARES}.default"]),
        ((at(POLICY, GONE), at(f"{SHARES}.default", "2")), [f"{ERR_SHARES}.default"]),
        (
            at(f"{SHARES}.validValues", [str(v) for v in range(1, 12)]),
            [f"{ERR_SHARES}.validValues"],
        ),
        (at(f"{RANGE}.min", GONE), [f"{ERR_POLICY}.validRange.min"]),
        (at(f"{RANGE}.min", "1 Gi"), [f"{ERR_POLICY}.validRange.min"]),
        (
            at(f"{RANGE}.min", "17Gi"),
            [
                f"{ERR_POLICY}.validRange.min",
                f"{ERR_POLICY}.validRange.step",
                f"{ERR_POLICY}.default",
            ],
        ),
        (at(f"{RANGE}.max", "32Gi"), [f"{ERR_POLICY}.validRange.max"]),
        (at(f"{RANGE}.max", "lots"), [f"{ERR_POLICY}.validRange.max"]),
        (
            (at(f"{RANGE}.max", "512Mi"), at(f"{POLICY}.default", GONE)),
            [f"{ERR_POLICY}.validRange.max"],
        ),
        (at(f"{RANGE}.step", "0"), [f"{ERR_POLICY}.validRange.step"]),
        (at(f"{RANGE}.step", "one"), [f"{ERR_POLICY}.validRange.step"]),
        (
            (at(f"{RANGE}.step", "16Gi"), at(f"{POLICY}.default", "1Gi")),
            [f"{ERR_POLICY}.validRange.step"],
        ),
        (at(f"{RANGE}.step", "2Gi"), [f"{ERR_POLICY}.default"]),
        (at(f"{POLICY}.default", "0"), [f"{ERR_POLICY}.default"]),
        (at(f"{POLICY}.default", "1536Mi"), [f"{ERR_POLICY}.default"]),
        (at(f"{RANGE}.max", "8Gi"), [f"{ERR_POLICY}.default"]),
    ],
)
def test_one_violation_names_its_field(changes, paths):
    changes = changes if isinstance(changes, tuple) else (changes,)
    assert slice_paths(changed(slice_doc(), *changes)) == paths


@pytest.mark.parametrize(
    "changes",
    [
        at("spec.pool.name", "rack-1/n1.example.com"),
        at("spec.pool.name", "/".join(["n" * 63] * 3 + ["n" * 61])),
        at("spec.pool.generation", 7),
        (at("spec.allNodes", False)),
        (at("spec.nodeName", GONE), at("spec.allNodes", True)),
        (at("spec.nodeName", GONE), at("spec.nodeSelector", {"nodeSelectorTerms": []})),
        (at("spec.nodeName", GONE), at("spec.perDeviceNodeSelection", True)),
        at(f"{DEV0}.name", "g" * 63),
        at(f"{ATTRS}.uuid.string", "u" * 64),
        at(f"{ATTRS}.v", {"version": "1" * 64}),
        at(ATTRS, {"string": "x"}, key="gpu.gpushare.io/uuid"),
        at(ATTRS, {"version": "1.0.0"}, key=f"{'d' * 63}/{'a' * 32}"),
        at(ATTRS, {"bool": False}, key="_private"),
        at(f"{SHARES}.default", "20"),
        at(f"{SHARES}.default", GONE),
        at(f"{SHARES}.validValues", [str(v) for v in range(1, 11)]),
        at(f"{SHARES}.validValues", ["1", "20"]),
        (at(f"{RANGE}.step", "2Gi"), at(f"{POLICY}.default", "15Gi")),
        (at(f"{RANGE}.step", "15Gi"), at(f"{POLICY}.default", "1Gi")),
        at(f"{DEV0}.capacity.cores.requestPolicy.validRange.step", "1"),
        at(f"{RANGE}.max", "16Gi"),
        (at(f"{RANGE}.min", "16Gi"), at(f"{RANGE}.step", GONE)),
        (at(f"{RANGE}.min", "16Gi"), at(f"{RANGE}.max", "16Gi"), at(f"{RANGE}.step", GONE)),
        (at(f"{RANGE}.step", GONE), at(f"{POLICY}.default", "1536Mi")),
        at(f"{POLICY}.validRange", GONE),
        at(f"{POLICY}.default", "1Gi"),
        (at("spec.devices", GONE), at("spec.sharedCounters", [{"name": "s", "counters": {}}])),
    ],
)
def test_values_at_the_limits_pass(changes):
    changes = changes if isinstance(changes, tuple) else (changes,)
    assert slice_errors(changed(slice_doc(), *changes)) == []


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        (at("metadata", {}), "metadata.name: name or generateName is required"),
        (at("spec.driver", ""), "spec.driver: required"),
        (
            at("spec.driver", "Gpu"),
            "spec.driver: invalid value 'Gpu': must be a lowercase RFC 1123 subdomain of at "
            "most 63 characters",
        ),
        (
            at("spec.pool.name", "Rack/n1"),
            "spec.pool.name: invalid value 'Rack/n1': must be at most 253 characters of "
            "lowercase RFC 1123 subdomains joined by '/'",
        ),
        (
            at("spec.pool.generation", -1),
            "spec.pool.generation: must be greater than or equal to 0",
        ),
        (
            at("spec.pool.resourceSliceCount", 0),
            "spec.pool.resourceSliceCount: must be greater than zero",
        ),
        (
            at("spec.allNodes", True),
            "spec: exactly one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection is "
            "required, got 2",
        ),
        (
            at("spec.nodeName", GONE),
            "spec: exactly one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection is "
            "required, got 0",
        ),
        (
            at("spec.sharedCounters", [{"name": "s", "counters": {}}]),
            "spec: devices and sharedCounters cannot be set in the same slice",
        ),
        (
            at(f"{DEV0}.name", "GPU"),
            "spec.devices[0].name: invalid value 'GPU': must be a lowercase RFC 1123 label of "
            "at most 63 characters",
        ),
        (at("spec.devices.1.name", "gpu-0"), "spec.devices[1].name: duplicate value 'gpu-0'"),
        (
            at(ATTRS, {"int": 1}, key="a-b"),
            f"{ERR_ATTRS}.a-b: invalid name: must be a C identifier of at most 32 characters, "
            "optionally prefixed by a DNS subdomain of at most 63 characters and a slash",
        ),
        (
            at(f"{DEV0}.capacity", {"value": "1"}, key="a-b"),
            f"{ERR_DEV0}.capacity.a-b: invalid name: must be a C identifier of at most 32 "
            "characters, optionally prefixed by a DNS subdomain of at most 63 characters and a "
            "slash",
        ),
        (
            at(f"{ATTRS}.uuid", {}),
            f"{ERR_ATTRS}.uuid: exactly one of int, bool, string, version is required",
        ),
        (
            at(f"{ATTRS}.uuid.string", "u" * 65),
            f"{ERR_ATTRS}.uuid.string: must be at most 64 characters, got 65",
        ),
        (
            at(f"{MEM}.value", "lots"),
            f"{ERR_DEV0}.capacity.memory.value: quantity 'lots' is not a number with an "
            "optional suffix",
        ),
        (
            (
                at(f"{DEV0}.capacity", {"value": "1"}, key="cores"),
                at(f"{DEV0}.capacity", {"value": "1"}, key="shares"),
                at(f"{DEV0}.allowMultipleAllocations", GONE),
            ),
            f"{ERR_POLICY}: only allowed when allowMultipleAllocations is true",
        ),
        (
            at(f"{POLICY}.default", "17Gi"),
            f"{ERR_POLICY}.default: must be at most the capacity's value",
        ),
        (
            at(f"{POLICY}.validValues", ["16Gi"]),
            f"{ERR_POLICY}: validValues and validRange cannot both be set",
        ),
        (
            at(f"{SHARES}.validValues", ["20", "1"]),
            f"{ERR_SHARES}.validValues[1]: must be in ascending order without duplicates",
        ),
        (
            at(f"{SHARES}.validValues", ["1", "21"]),
            f"{ERR_SHARES}.validValues[1]: must be at most the capacity's value",
        ),
        (at(f"{SHARES}.default", "2"), f"{ERR_SHARES}.default: must be one of validValues"),
        (
            at(f"{SHARES}.validValues", [str(v) for v in range(1, 12)]),
            f"{ERR_SHARES}.validValues: must have at most 10 items, got 11",
        ),
        (at(f"{RANGE}.min", GONE), f"{ERR_POLICY}.validRange.min: required"),
        (
            (at(f"{RANGE}.max", "512Mi"), at(f"{POLICY}.default", GONE)),
            f"{ERR_POLICY}.validRange.max: must be at least min",
        ),
        (
            at(f"{RANGE}.max", "32Gi"),
            f"{ERR_POLICY}.validRange.max: must be at most the capacity's value",
        ),
        (at(f"{RANGE}.step", "0"), f"{ERR_POLICY}.validRange.step: must be greater than zero"),
        (
            (at(f"{RANGE}.step", "16Gi"), at(f"{POLICY}.default", "1Gi")),
            f"{ERR_POLICY}.validRange.step: min plus one step must be at most the capacity's value",
        ),
        (at(f"{RANGE}.max", "8Gi"), f"{ERR_POLICY}.default: must be within validRange"),
        (
            at(f"{RANGE}.step", "2Gi"),
            f"{ERR_POLICY}.default: must be min plus a multiple of step",
        ),
    ],
)
def test_each_rule_says_what_it_wants(changes, error):
    changes = changes if isinstance(changes, tuple) else (changes,)
    assert [str(e) for e in slice_errors(changed(slice_doc(), *changes))] == [error]


def test_a_field_error_without_a_path_is_its_message():
    assert str(FieldError("", "the whole object")) == "the whole object"


def test_a_min_above_the_value_is_named():
    errors = slice_errors(changed(slice_doc(), at(f"{RANGE}.min", "17Gi")))
    assert str(errors[0]) == f"{ERR_POLICY}.validRange.min: must be at most the capacity's value"


@pytest.mark.parametrize(
    ("count", "extra", "release", "refused"),
    [
        (128, {}, ApiRelease.V1_36, False),
        (129, {}, ApiRelease.V1_36, True),
        (64, {"taints": [{"key": "k", "effect": "NoSchedule"}]}, ApiRelease.V1_35, False),
        (65, {"taints": [{"key": "k", "effect": "NoSchedule"}]}, ApiRelease.V1_35, True),
        (65, {"consumesCounters": [{"counterSet": "s", "counters": {}}]}, ApiRelease.V1_36, True),
        (65, {"taints": [{"key": "k", "effect": "NoSchedule"}]}, ApiRelease.V1_34, False),
        (129, {"taints": [{"key": "k", "effect": "NoSchedule"}]}, ApiRelease.V1_34, True),
    ],
)
def test_a_slice_holds_at_most_128_devices_or_64_with_taints_or_counters(
    count, extra, release, refused
):
    doc = slice_doc(devices=[*devices(count - 1), {"name": "last", **extra}])
    errors = slice_errors(doc, release)
    assert [e.path for e in errors] == (["spec.devices"] if refused else [])
    if refused:
        limit = 64 if extra and release is not ApiRelease.V1_34 else 128
        why = " when a device has taints or consumesCounters" if limit == 64 else ""
        assert errors[0].message == f"must have at most {limit} items{why}, got {count}"


def test_devices_and_shared_counters_share_no_slice_from_1_35():
    doc = changed(slice_doc(), at("spec.sharedCounters", [{"name": "s", "counters": {}}]))
    assert slice_paths(doc, ApiRelease.V1_35) == ["spec"]
    assert slice_paths(doc, ApiRelease.V1_34) == []


@pytest.mark.parametrize(("entries", "refused"), [(32, False), (33, True)])
def test_a_device_has_at_most_32_attributes_and_capacities_together(entries, refused):
    device = {
        "name": "gpu-0",
        "attributes": {f"a{i}": {"int": i} for i in range(entries - 1)},
        "capacity": {"memory": {"value": "1Gi"}},
    }
    errors = [str(e) for e in slice_errors(slice_doc(devices=[device]))]
    message = "attributes and capacity must have at most 32 entries together, got 33"
    assert errors == ([f"spec.devices[0]: {message}"] if refused else [])


@pytest.mark.parametrize(
    ("field", "value"),
    [("driver", "other.example.com"), ("pool.name", "n2"), ("nodeName", "n2")],
)
def test_a_slices_driver_pool_and_node_are_immutable(field, value):
    old = ResourceSlice.model_validate(slice_doc(node="n1"))
    new = ResourceSlice.model_validate(changed(slice_doc(node="n1"), at(f"spec.{field}", value)))
    errors = validate_resource_slice_update(new, old)
    assert errors == [FieldError(f"spec.{field}", "field is immutable")]


def test_an_update_is_validated_as_a_slice_too():
    old = ResourceSlice.model_validate(slice_doc())
    new = ResourceSlice.model_validate(changed(slice_doc(), at("spec.pool.generation", 1)))
    assert validate_resource_slice_update(new, old) == []
    bad = ResourceSlice.model_validate(changed(slice_doc(), at(f"{DEV0}.name", "")))
    assert [e.path for e in validate_resource_slice_update(bad, old)] == ["spec.devices[0].name"]


def test_an_update_is_validated_under_the_servers_release():
    shared = at("spec.sharedCounters", [{"name": "s", "counters": {}}])
    old = ResourceSlice.model_validate(slice_doc())
    new = ResourceSlice.model_validate(changed(slice_doc(), shared))
    assert validate_resource_slice_update(new, old, ApiGates.of(ApiRelease.V1_34)) == []
    assert [e.path for e in validate_resource_slice_update(new, old)] == ["spec"]


# ----- ResourceClaim


def test_the_claims_gpushare_makes_are_valid():
    whole = changed(claim_doc(), at(f"{REQ0}.exactly.capacity.requests", {"shares": "20"}))
    assert claim_paths(claim_doc()) == []
    assert claim_paths(whole) == []


@pytest.mark.parametrize(
    ("changes", "paths"),
    [
        (at("metadata.name", ""), ["metadata.name"]),
        (at(f"{REQ0}.name", ""), [f"{ERR_REQ0}.name"]),
        (at(f"{REQ0}.name", "Main"), [f"{ERR_REQ0}.name"]),
        (at("spec.devices.requests.1.name", "c0"), ["spec.devices.requests[1].name"]),
        (at(f"{REQ0}.exactly", GONE), [ERR_REQ0]),
        (at(f"{REQ0}.firstAvailable", [{"name": "a", **exact()}]), [ERR_REQ0]),
        (at(f"{REQ0}.exactly.deviceClassName", ""), [f"{ERR_REQ0}.exactly.deviceClassName"]),
        (at(f"{REQ0}.exactly.deviceClassName", "GPU"), [f"{ERR_REQ0}.exactly.deviceClassName"]),
        (at(f"{REQ0}.exactly.deviceClassName", "d" * 254), [f"{ERR_REQ0}.exactly.deviceClassName"]),
        (at(f"{REQ0}.exactly.allocationMode", "Most"), [f"{ERR_REQ0}.exactly.allocationMode"]),
        (at(f"{REQ0}.exactly.allocationMode", "All"), [f"{ERR_REQ0}.exactly.count"]),
        (at(f"{REQ0}.exactly.count", 0), [f"{ERR_REQ0}.exactly.count"]),
        (at(f"{REQ0}.exactly.count", -2), [f"{ERR_REQ0}.exactly.count"]),
        (
            at(f"{REQ0}.exactly.capacity.requests.memory", "4 GiB"),
            [f"{ERR_REQ0}.exactly.capacity.requests.memory"],
        ),
        (
            (at(f"{REQ0}.exactly", GONE), at(f"{REQ0}.firstAvailable", [{"name": "A", **exact()}])),
            [f"{ERR_REQ0}.firstAvailable[0].name"],
        ),
        (
            (
                at(f"{REQ0}.exactly", GONE),
                at(f"{REQ0}.firstAvailable", [{"name": "a", **exact()}, {"name": "a", **exact()}]),
            ),
            [f"{ERR_REQ0}.firstAvailable[1].name"],
        ),
        (
            (
                at(f"{REQ0}.exactly", GONE),
                at(f"{REQ0}.firstAvailable", [{"name": "a", **exact(count=0)}]),
            ),
            [f"{ERR_REQ0}.firstAvailable[0].count"],
        ),
        (
            (
                at(f"{REQ0}.exactly", GONE),
                at(f"{REQ0}.firstAvailable", [{"name": f"a{i}", **exact()} for i in range(9)]),
            ),
            [f"{ERR_REQ0}.firstAvailable"],
        ),
        (at("spec.devices.constraints", [{"requests": ["c0"]}]), ["spec.devices.constraints[0]"]),
        (
            at(
                "spec.devices.constraints",
                [{"matchAttribute": "gpu.gpushare.io/model", "distinctAttribute": "x.io/uuid"}],
            ),
            ["spec.devices.constraints[0]"],
        ),
        (
            at("spec.devices.constraints", [{"matchAttribute": "model"}]),
            ["spec.devices.constraints[0].matchAttribute"],
        ),
        (
            at("spec.devices.constraints", [{"distinctAttribute": "uuid"}]),
            ["spec.devices.constraints[0].distinctAttribute"],
        ),
        (
            at("spec.devices.constraints", [{"matchAttribute": "a"}] * 33),
            ["spec.devices.constraints"]
            + [f"spec.devices.constraints[{i}].matchAttribute" for i in range(33)],
        ),
    ],
)
def test_one_violation_of_a_claim_names_its_field(changes, paths):
    changes = changes if isinstance(changes, tuple) else (changes,)
    assert claim_paths(changed(claim_doc(requests=2), *changes)) == paths


@pytest.mark.parametrize(
    "changes",
    [
        at(f"{REQ0}.exactly.allocationMode", "ExactCount"),
        (at(f"{REQ0}.exactly.allocationMode", "All"), at(f"{REQ0}.exactly.count", GONE)),
        at(f"{REQ0}.exactly.count", GONE),
        at(f"{REQ0}.exactly.capacity", GONE),
        (
            at(f"{REQ0}.exactly", GONE),
            at(f"{REQ0}.firstAvailable", [{"name": f"a{i}", **exact()} for i in range(8)]),
        ),
        at("spec.devices.constraints", [{"distinctAttribute": "gpu.gpushare.io/uuid"}] * 32),
        at("spec.devices.constraints", [{"matchAttribute": "example.com/model"}]),
        at(f"{REQ0}.name", "m" * 63),
        at(f"{REQ0}.exactly.deviceClassName", "d" * 253),
    ],
)
def test_claims_at_the_limits_pass(changes):
    changes = changes if isinstance(changes, tuple) else (changes,)
    assert claim_paths(changed(claim_doc(requests=2), *changes)) == []


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        (at(f"{REQ0}.name", ""), f"{ERR_REQ0}.name: required"),
        (
            at(f"{REQ0}.name", "Main"),
            f"{ERR_REQ0}.name: invalid value 'Main': must be a lowercase RFC 1123 label of at "
            "most 63 characters",
        ),
        (
            (at(f"{REQ0}.exactly", GONE), at(f"{REQ0}.firstAvailable", [{"name": "A", **exact()}])),
            f"{ERR_REQ0}.firstAvailable[0].name: invalid value 'A': must be a lowercase RFC 1123 "
            "label of at most 63 characters",
        ),
        (
            at(f"{REQ0}.exactly", GONE),
            f"{ERR_REQ0}: exactly one of exactly, firstAvailable is required",
        ),
        (
            at(f"{REQ0}.exactly.deviceClassName", "GPU"),
            f"{ERR_REQ0}.exactly.deviceClassName: invalid value 'GPU': must be a lowercase "
            "RFC 1123 subdomain",
        ),
        (
            at(f"{REQ0}.exactly.allocationMode", "Most"),
            f"{ERR_REQ0}.exactly.allocationMode: invalid value 'Most': must be ExactCount or All",
        ),
        (
            at(f"{REQ0}.exactly.allocationMode", "All"),
            f"{ERR_REQ0}.exactly.count: must not be set when allocationMode is All",
        ),
        (at(f"{REQ0}.exactly.count", 0), f"{ERR_REQ0}.exactly.count: must be greater than zero"),
        (
            at("spec.devices.constraints", [{"requests": ["c0"]}]),
            "spec.devices.constraints[0]: exactly one of matchAttribute, distinctAttribute is "
            "required",
        ),
        (
            at("spec.devices.constraints", [{"matchAttribute": "model"}]),
            "spec.devices.constraints[0].matchAttribute: invalid value 'model': must be fully "
            "qualified, domain/name",
        ),
        (
            at("spec.devices.requests.1.name", "c0"),
            "spec.devices.requests[1].name: duplicate value 'c0'",
        ),
    ],
)
def test_each_rule_of_a_claim_says_what_it_wants(changes, error):
    changes = changes if isinstance(changes, tuple) else (changes,)
    doc = changed(claim_doc(requests=2), *changes)
    assert [str(e) for e in validate_resource_claim(ResourceClaim.model_validate(doc))] == [error]


@pytest.mark.parametrize(("requests", "refused"), [(32, False), (33, True)])
def test_a_claim_has_at_most_32_requests(requests, refused):
    paths = claim_paths(claim_doc(requests=requests))
    assert paths == (["spec.devices.requests"] if refused else [])


@pytest.mark.parametrize(
    ("field", "items", "limit"),
    [
        (
            "status.reservedFor",
            lambda i: {"resource": "pods", "name": f"p{i}", "uid": f"u{i}"},
            256,
        ),
        ("status.allocation.devices.results", lambda i: result(device=f"gpu-{i}"), 32),
    ],
)
def test_a_claim_status_has_at_most_256_consumers_and_32_results(field, items, limit):
    for n, refused in ((limit, False), (limit + 1, True)):
        doc = changed(claim_doc(), at(field, [items(i) for i in range(n)]))
        assert claim_paths(doc) == ([field] if refused else [])


def test_a_template_is_validated_as_the_claim_it_makes():
    template = ResourceClaimTemplate.model_validate(
        {
            "metadata": {"name": "gpushare-0123456789", "namespace": "default"},
            "spec": {"spec": claim_doc()["spec"]},
        }
    )
    assert validate_resource_claim_template(template) == []
    broken = changed(template.to_api(), at("spec.spec.devices.requests.0.name", "Main"))
    nameless = changed(broken, at("metadata.name", GONE))
    errors = validate_resource_claim_template(ResourceClaimTemplate.model_validate(nameless))
    assert [e.path for e in errors] == ["metadata.name", "spec.spec.devices.requests[0].name"]


# ----- DeviceClass


def device_class_paths(spec: dict, name: str = "gpu.gpushare.io") -> list[str]:
    device_class = DeviceClass.model_validate({"metadata": {"name": name}, "spec": spec})
    return [e.path for e in validate_device_class(device_class)]


def test_the_device_class_gpushare_installs_is_valid():
    selector = {"cel": {"expression": 'device.driver == "gpu.gpushare.io"'}}
    assert device_class_paths({"selectors": [selector]}) == []
    assert device_class_paths({"selectors": [selector] * 32}) == []
    assert device_class_paths({"selectors": [selector] * 33}) == ["spec.selectors"]
    assert device_class_paths({}, name="") == ["metadata.name"]


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("example.com/gpu", True),
        (f"example.com/{'g' * 63}", True),
        ("example.com/gpu.mem_1", True),
        (f"example.com/{'g' * 64}", False),
        ("gpu", False),
        ("kubernetes.io/gpu", False),
        ("gpu.kubernetes.io/gpu", False),
        ("requests.example.com/gpu", False),
        ("Example.com/gpu", False),
        ("example.com/-gpu", False),
        ("example.com/", False),
        ("example.com/a/b", False),
    ],
)
def test_an_extended_resource_name_is_a_domain_and_a_name_outside_kubernetes_io(name, valid):
    paths = device_class_paths({"extendedResourceName": name})
    assert paths == ([] if valid else ["spec.extendedResourceName"])


def test_a_bad_extended_resource_name_is_named_with_the_rule():
    device_class = DeviceClass.model_validate(
        {"metadata": {"name": "gpu"}, "spec": {"extendedResourceName": "gpu"}}
    )
    assert [str(e) for e in validate_device_class(device_class)] == [
        "spec.extendedResourceName: invalid value 'gpu': must be an extended resource name, "
        "domain/name outside kubernetes.io"
    ]
