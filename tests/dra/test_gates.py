"""The API server drops, silently, the fields of feature gates that are off, except
where the object it replaces used them (DRA-INTERFACES §5)."""

import copy

import pytest

from gpushare.dra.objects import (
    DeviceClass,
    ResourceClaim,
    ResourceClaimSpec,
    ResourceClaimTemplate,
    ResourceSlice,
)
from gpushare.dra.validation import (
    ApiGates,
    ApiRelease,
    Gate,
    drop_disabled_fields,
    with_defaults,
)
from tests.dra.builders import DRIVER, GONE, at, changed, claim_doc, gpu, result, slice_doc

ALL_OFF = ApiGates(ApiRelease.V1_36, frozenset())
TAINT = {"key": "k", "effect": "NoSchedule"}
TOLERATION = {"key": "k", "operator": "Exists"}
COUNTERS = [{"counterSet": "s", "counters": {"mem": {"value": "1Gi"}}}]

EVERY_GATED_SLICE_FIELD = {
    "name": "gpu-0",
    "capacity": {"memory": {"value": "16Gi", "requestPolicy": {"default": "1Gi"}}},
    "allowMultipleAllocations": True,
    "consumesCounters": COUNTERS,
    "nodeName": "n1",
    "nodeSelector": {"nodeSelectorTerms": []},
    "allNodes": True,
    "taints": [TAINT],
    "bindsToNode": True,
    "bindingConditions": ["ready"],
    "bindingFailureConditions": ["failed"],
}


def slice_with_every_gated_field() -> ResourceSlice:
    doc = slice_doc(devices=[EVERY_GATED_SLICE_FIELD])
    doc["spec"]["sharedCounters"] = [{"name": "s", "counters": {"mem": {"value": "8Gi"}}}]
    doc["spec"]["perDeviceNodeSelection"] = True
    return ResourceSlice.model_validate(doc)


def claim_with_every_gated_field() -> ResourceClaim:
    exactly = {
        "deviceClassName": DRIVER,
        "adminAccess": True,
        "tolerations": [TOLERATION],
        "capacity": {"requests": {"memory": "4Gi"}},
    }
    alternative = {
        "name": "a",
        "deviceClassName": DRIVER,
        "tolerations": [TOLERATION],
        "capacity": {"requests": {"memory": "4Gi"}},
    }
    gated_result = {
        **result(),
        "adminAccess": True,
        "tolerations": [TOLERATION],
        "bindingConditions": ["ready"],
        "bindingFailureConditions": ["failed"],
    }
    return ResourceClaim.model_validate(
        {
            "metadata": {"name": "c", "namespace": "default"},
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "one", "exactly": exactly},
                        {"name": "two", "firstAvailable": [alternative]},
                    ],
                    "constraints": [
                        {"matchAttribute": "gpu.gpushare.io/model"},
                        {"distinctAttribute": "gpu.gpushare.io/uuid"},
                    ],
                }
            },
            "status": {
                "allocation": {"devices": {"results": [gated_result]}},
                "devices": [{"driver": DRIVER, "pool": "n1", "device": "gpu-0", "shareID": "s"}],
            },
        }
    )


def test_with_every_gate_off_a_slice_keeps_only_what_needs_none():
    kept = drop_disabled_fields(slice_with_every_gated_field(), ALL_OFF).to_api()
    assert kept["spec"] == {
        "driver": DRIVER,
        "pool": {"name": "n1", "generation": 0, "resourceSliceCount": 1},
        "nodeName": "n1",
        "devices": [{"name": "gpu-0", "capacity": {"memory": {"value": "16Gi"}}}],
    }


def test_with_every_gate_off_a_claim_keeps_only_what_needs_none():
    kept = drop_disabled_fields(claim_with_every_gated_field(), ALL_OFF).to_api()
    assert kept["spec"] == {
        "devices": {
            "requests": [{"name": "one", "exactly": {"deviceClassName": DRIVER}}, {"name": "two"}],
            "constraints": [{"matchAttribute": "gpu.gpushare.io/model"}, {}],
        }
    }
    assert kept["status"] == {
        "allocation": {
            "devices": {
                "results": [{"request": "c0", "driver": DRIVER, "pool": "n1", "device": "gpu-0"}]
            }
        }
    }


def test_with_every_gate_on_nothing_is_dropped():
    every = ApiGates(ApiRelease.V1_36, frozenset(Gate))
    for obj in (slice_with_every_gated_field(), claim_with_every_gated_field()):
        assert drop_disabled_fields(obj, every) == obj


@pytest.mark.parametrize("release", [ApiRelease.V1_34, ApiRelease.V1_35])
def test_before_1_36_consumable_capacity_is_dropped_silently(release):
    gates = ApiGates.of(release)
    published = drop_disabled_fields(ResourceSlice.model_validate(slice_doc()), gates)
    device = published.spec.devices[0]
    assert device.allow_multiple_allocations is None
    assert [c.request_policy for c in device.capacity.values()] == [None, None, None]
    assert device.attributes["uuid"].string == "GPU-gpu-0"
    doc = changed(
        claim_doc(),
        at("spec.devices.constraints", [{"distinctAttribute": "gpu.gpushare.io/uuid"}]),
        at("status.allocation.devices.results", [result()]),
        at("status.devices", [{"driver": DRIVER, "pool": "n1", "device": "gpu-0", "shareID": "s"}]),
    )
    claim = drop_disabled_fields(ResourceClaim.model_validate(doc), gates)
    assert claim.spec.devices.requests[0].exactly.capacity is None
    assert claim.spec.devices.constraints[0].distinct_attribute is None
    (kept,) = claim.status.allocation.devices.results
    assert (kept.share_id, kept.consumed_capacity, kept.device) == (None, {}, "gpu-0")
    assert claim.status.devices[0].share_id is None  # status.devices itself is Beta on


def test_at_1_36_consumable_capacity_is_kept():
    published = ResourceSlice.model_validate(slice_doc())
    assert drop_disabled_fields(published, ApiGates.of(ApiRelease.V1_36)) == published


def test_a_stored_object_that_used_a_gated_field_keeps_it_on_update():
    gates = ApiGates.of(ApiRelease.V1_34)
    stored = ResourceSlice.model_validate(slice_doc())
    update = ResourceSlice.model_validate(changed(slice_doc(), at("spec.pool.generation", 1)))
    assert drop_disabled_fields(update, gates, stored) == update
    # ...but only that gate's fields: the stored slice had no taints.
    tainted = changed(slice_doc(), at("spec.devices.0.taints", [TAINT]))
    kept = drop_disabled_fields(ResourceSlice.model_validate(tainted), gates, stored)
    assert kept.spec.devices[0].taints == []
    assert kept.spec.devices[0].allow_multiple_allocations is True


def test_a_claim_whose_spec_used_consumable_capacity_keeps_its_share_ids():
    gates = ApiGates.of(ApiRelease.V1_35, {Gate.CONSUMABLE_CAPACITY: True})
    stored = ResourceClaim.model_validate(claim_doc())
    allocated = ResourceClaim.model_validate(
        changed(claim_doc(), at("status.allocation.devices.results", [result()]))
    )
    off = ApiGates.of(ApiRelease.V1_35)
    assert drop_disabled_fields(allocated, off, stored) == allocated
    assert drop_disabled_fields(allocated, gates) == allocated
    bare = ResourceClaim.model_validate(
        changed(claim_doc(), at("spec.devices.requests.0.exactly.capacity", GONE))
    )
    dropped = drop_disabled_fields(allocated, off, bare)
    assert dropped.status.allocation.devices.results[0].share_id is None


def test_gates_can_be_switched_from_a_releases_defaults():
    assert Gate.CONSUMABLE_CAPACITY not in ApiGates.of(ApiRelease.V1_35).enabled
    switched_on = ApiGates.of(ApiRelease.V1_35, {Gate.CONSUMABLE_CAPACITY: True})
    assert Gate.CONSUMABLE_CAPACITY in switched_on.enabled
    assert Gate.PRIORITIZED_LIST in switched_on.enabled
    switched_off = ApiGates.of(ApiRelease.V1_36, {Gate.CONSUMABLE_CAPACITY: False})
    assert switched_off.enabled == frozenset(Gate) - {Gate.CONSUMABLE_CAPACITY}
    assert ApiGates.of().release is ApiRelease.V1_36 and ApiGates.of().enabled == frozenset(Gate)


@pytest.mark.parametrize("release", [ApiRelease.V1_34, ApiRelease.V1_35])
def test_before_1_36_only_prioritized_list_admin_access_and_device_status_are_on(release):
    assert ApiGates.of(release).enabled == {
        Gate.PRIORITIZED_LIST,
        Gate.ADMIN_ACCESS,
        Gate.DEVICE_STATUS,
    }


def test_gates_carry_the_names_the_api_server_knows_them_by():
    assert [g.value for g in Gate] == [
        "DRAPrioritizedList",
        "DRAAdminAccess",
        "DRAResourceClaimDeviceStatus",
        "DRAConsumableCapacity",
        "DRAPartitionableDevices",
        "DRAExtendedResource",
        "DRADeviceTaints",
        "DRADeviceBindingConditions",
    ]


def test_releases_order_by_their_minor_version():
    assert [r.minor for r in ApiRelease] == [34, 35, 36]


def test_a_device_class_loses_its_extended_resource_name_while_that_gate_is_off():
    doc = {"metadata": {"name": "gpu"}, "spec": {"extendedResourceName": "example.com/gpu"}}
    named = DeviceClass.model_validate(doc)
    assert (
        drop_disabled_fields(named, ApiGates.of(ApiRelease.V1_35)).spec.extended_resource_name
        is None
    )
    assert drop_disabled_fields(named, ApiGates.of(ApiRelease.V1_36)) == named


def test_a_template_loses_the_claim_fields_of_gates_that_are_off():
    template = ResourceClaimTemplate.model_validate(
        {"metadata": {"name": "t"}, "spec": {"spec": claim_with_every_gated_field().spec.to_api()}}
    )
    kept = drop_disabled_fields(template, ALL_OFF).to_api()["spec"]["spec"]
    assert kept == drop_disabled_fields(claim_with_every_gated_field(), ALL_OFF).to_api()["spec"]


def test_the_server_defaults_a_requests_mode_and_count():
    spec = ResourceClaimSpec.model_validate(
        {
            "devices": {
                "requests": [
                    {"name": "a", "exactly": {"deviceClassName": DRIVER}},
                    {"name": "b", "exactly": {"deviceClassName": DRIVER, "count": 3}},
                    {"name": "c", "exactly": {"deviceClassName": DRIVER, "allocationMode": "All"}},
                    {"name": "d", "firstAvailable": [{"name": "x", "deviceClassName": DRIVER}]},
                ]
            }
        }
    )
    requests = with_defaults(spec).devices.requests
    modes = [(r.exactly.allocation_mode, r.exactly.count) for r in requests[:3]]
    assert modes == [("ExactCount", 1), ("ExactCount", 3), ("All", None)]
    alternative = requests[3].first_available[0]
    assert (alternative.allocation_mode, alternative.count) == ("ExactCount", 1)
    assert requests[3].exactly is None


def test_dropping_leaves_the_object_passed_in_as_it_was():
    original = slice_with_every_gated_field()
    before = copy.deepcopy(original.to_api())
    drop_disabled_fields(original, ALL_OFF)
    assert original.to_api() == before


def test_a_gated_device_in_a_slice_keeps_its_other_devices():
    doc = slice_doc(devices=[gpu("gpu-0"), {**EVERY_GATED_SLICE_FIELD, "name": "gpu-1"}])
    kept = drop_disabled_fields(ResourceSlice.model_validate(doc), ApiGates.of(ApiRelease.V1_34))
    assert [d.name for d in kept.spec.devices] == ["gpu-0", "gpu-1"]
    assert kept.spec.devices[1].taints == []
