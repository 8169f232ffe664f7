"""The resource.k8s.io/v1 models read the API's JSON and give it back unchanged, unknown
fields included (DRA-INTERFACES §4), and Quantity strings read as exact base units."""

import copy

import pytest
from pydantic import ValidationError

from gpushare.dra.objects import (
    Counter,
    DeviceAttribute,
    DeviceClass,
    ResourceClaim,
    ResourceClaimTemplate,
    ResourceSlice,
    format_quantity,
    quantity_units,
)

GIB = 1024**3

SLICE = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceSlice",
    "metadata": {
        "name": "n1-gpu.gpushare.io-x7k2p",
        "generateName": "n1-gpu.gpushare.io-",
        "uid": "6c1e5d0a-0000-4000-8000-000000000001",
        "resourceVersion": "4711",
        "creationTimestamp": "2026-01-02T03:04:05Z",
        "ownerReferences": [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "name": "n1",
                "uid": "node-uid",
                "controller": True,
            }
        ],
        "managedFields": [{"manager": "gpushare-dra-plugin", "operation": "Update"}],
    },
    "spec": {
        "driver": "gpu.gpushare.io",
        "pool": {"name": "n1", "generation": 0, "resourceSliceCount": 1},
        "nodeName": "n1",
        "devices": [
            {
                "name": "gpu-0",
                "attributes": {
                    "uuid": {"string": "GPU-0f7e"},
                    "index": {"int": 0},
                    "healthy": {"bool": False},
                    "driverVersion": {"version": "550.54.15"},
                    "gpu.gpushare.io/mode": {"string": "share"},
                },
                "capacity": {
                    "memory": {
                        "value": "16Gi",
                        "requestPolicy": {
                            "default": "16Gi",
                            "validRange": {"min": "1Gi", "step": "1Gi"},
                        },
                    },
                    "cores": {
                        "value": "100",
                        "requestPolicy": {
                            "default": "0",
                            "validRange": {"min": "0", "max": "100", "step": "5"},
                        },
                    },
                    "shares": {
                        "value": "20",
                        "requestPolicy": {"default": "1", "validValues": ["1", "20"]},
                    },
                },
                "allowMultipleAllocations": True,
                "bindsToNode": True,
                "futureDeviceField": {"nested": [1, None, {"x": "y"}]},
            },
            {"name": "gpu-1", "capacity": {"memory": {"value": "16Gi"}}},
        ],
        "futureSpecField": "kept",
    },
}

CLAIM = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {
        "name": "p-gpushare-abcde",
        "namespace": "team",
        "uid": "claim-uid",
        "resourceVersion": "12",
        "annotations": {"resource.kubernetes.io/pod-claim-name": "gpushare"},
        "finalizers": ["resource.kubernetes.io/delete-protection"],
    },
    "spec": {
        "devices": {
            "requests": [
                {
                    "name": "main",
                    "exactly": {
                        "deviceClassName": "gpu.gpushare.io",
                        "selectors": [
                            {"cel": {"expression": "device.allowMultipleAllocations == true"}}
                        ],
                        "allocationMode": "ExactCount",
                        "count": 1,
                        "capacity": {"requests": {"memory": "4Gi", "cores": "20"}},
                    },
                },
                {
                    "name": "side",
                    "firstAvailable": [
                        {"name": "big", "deviceClassName": "gpu.gpushare.io", "count": 2},
                        {"name": "small", "deviceClassName": "gpu.gpushare.io"},
                    ],
                },
            ],
            "constraints": [{"requests": ["main"], "distinctAttribute": "gpu.gpushare.io/uuid"}],
            "config": [
                {
                    "requests": ["main"],
                    "opaque": {"driver": "gpu.gpushare.io", "parameters": {"k": [1, 2]}},
                }
            ],
        }
    },
    "status": {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "main",
                        "driver": "gpu.gpushare.io",
                        "pool": "n1",
                        "device": "gpu-0",
                        "shareID": "4a3c8a0e-52c6-4a0e-9a79-7b8a2a0c1d11",
                        "consumedCapacity": {"memory": "4Gi", "cores": "20", "shares": "1"},
                    },
                    {
                        "request": "side/small",
                        "driver": "other.example.com",
                        "pool": "n1",
                        "device": "nic-0",
                        "adminAccess": False,
                    },
                ],
                "config": [
                    {
                        "source": "FromClaim",
                        "requests": ["main"],
                        "opaque": {"driver": "gpu.gpushare.io", "parameters": {}},
                    },
                    {
                        "source": "FromClass",
                        "opaque": {"driver": "other.example.com", "parameters": {"a": 1}},
                    },
                ],
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
                ]
            },
            "allocationTimestamp": "2026-01-02T03:04:06Z",
        },
        "reservedFor": [
            {"resource": "pods", "name": "p", "uid": "pod-uid"},
            {"apiGroup": "apps", "resource": "pods", "name": "not-a-pod", "uid": "odd-uid"},
            {"apiGroup": "batch", "resource": "jobs", "name": "j", "uid": "job-uid"},
            {"resource": "workloads", "name": "w", "uid": "workload-uid"},
        ],
        "devices": [
            {
                "driver": "gpu.gpushare.io",
                "pool": "n1",
                "device": "gpu-0",
                "shareID": "4a3c8a0e-52c6-4a0e-9a79-7b8a2a0c1d11",
                "conditions": [{"type": "Ready", "status": "True"}],
                "data": {"anything": True},
            }
        ],
    },
}


def test_a_slice_with_consumable_capacity_round_trips_field_for_field():
    read = ResourceSlice.model_validate(copy.deepcopy(SLICE))
    assert read.to_api() == SLICE
    gpu = read.spec.devices[0]
    assert gpu.allow_multiple_allocations is True
    memory = gpu.capacity["memory"]
    assert memory.request_policy is not None and memory.request_policy.valid_range is not None
    assert (memory.value, memory.request_policy.valid_range.step) == ("16Gi", "1Gi")
    assert gpu.capacity["shares"].request_policy.valid_values == ["1", "20"]
    assert read.metadata.owner_references[0].uid == "node-uid"


def test_a_claim_with_its_allocation_round_trips_field_for_field():
    read = ResourceClaim.model_validate(copy.deepcopy(CLAIM))
    assert read.to_api() == CLAIM
    (ours,) = read.results_for("gpu.gpushare.io")
    assert ours.share_id == "4a3c8a0e-52c6-4a0e-9a79-7b8a2a0c1d11"
    assert ours.consumed_capacity == {"memory": "4Gi", "cores": "20", "shares": "1"}
    assert read.spec.devices.requests[1].first_available[0].count == 2
    assert read.status.devices[0].share_id == ours.share_id


def test_templates_and_device_classes_round_trip():
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "gpushare-0123456789", "namespace": "team"},
        "spec": {"metadata": {"labels": {"app": "x"}}, "spec": CLAIM["spec"]},
    }
    assert ResourceClaimTemplate.model_validate(copy.deepcopy(template)).to_api() == template
    device_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "gpu.gpushare.io"},
        "spec": {
            "selectors": [{"cel": {"expression": 'device.driver == "gpu.gpushare.io"'}}],
            "config": [{"opaque": {"driver": "gpu.gpushare.io", "parameters": {"a": 1}}}],
            "extendedResourceName": "example.com/gpu",
        },
    }
    assert DeviceClass.model_validate(copy.deepcopy(device_class)).to_api() == device_class


def test_a_read_modify_write_keeps_the_fields_gpushare_does_not_know():
    read = ResourceSlice.model_validate(copy.deepcopy(SLICE))
    pool = read.spec.pool.model_copy(update={"generation": 1})
    written = read.model_copy(update={"spec": read.spec.model_copy(update={"pool": pool})})
    api = written.to_api()
    assert api["spec"]["pool"]["generation"] == 1
    assert api["spec"]["futureSpecField"] == "kept"
    assert api["spec"]["devices"][0]["futureDeviceField"] == {"nested": [1, None, {"x": "y"}]}
    assert api["spec"]["devices"][0]["bindsToNode"] is True
    assert api["metadata"]["managedFields"] == SLICE["metadata"]["managedFields"]


def test_objects_built_in_code_write_what_the_api_omits_as_absent():
    built = ResourceSlice.model_validate(
        {"metadata": {"name": "s"}, "spec": {"driver": "d", "pool": {"name": "p"}}}
    )
    assert built.to_api() == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "s"},
        "spec": {"driver": "d", "pool": {"name": "p", "generation": 0, "resourceSliceCount": 0}},
    }
    claim = ResourceClaim.model_validate({"metadata": {"generateName": "c-"}})
    assert claim.to_api() == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"generateName": "c-"},
        "spec": {"devices": {}},
        "status": {},
    }


def test_models_take_python_names_and_numbers_for_quantities():
    slice_ = ResourceSlice.model_validate(
        {
            "metadata": {"name": "s"},
            "spec": {
                "driver": "d",
                "pool": {"name": "p", "resource_slice_count": 1},
                "node_name": "n1",
                "devices": [{"name": "gpu-0", "capacity": {"cores": {"value": 100}}}],
            },
        }
    )
    assert slice_.spec.pool.resource_slice_count == 1
    assert slice_.spec.node_name == "n1"
    assert slice_.spec.devices[0].capacity["cores"].value == "100"
    with pytest.raises(ValidationError):
        Counter(value=True)


def test_models_are_immutable():
    read = ResourceSlice.model_validate(copy.deepcopy(SLICE))
    with pytest.raises(ValidationError):
        read.spec.driver = "other"


@pytest.mark.parametrize(
    ("value", "attribute"),
    [
        (3, {"int": 3}),
        (True, {"bool": True}),
        (False, {"bool": False}),
        ("GPU-1", {"string": "GPU-1"}),
    ],
)
def test_an_attribute_holds_its_value_under_the_key_of_its_type(value, attribute):
    made = DeviceAttribute.of(value)
    assert made.to_api() == attribute
    assert made.value == value and type(made.value) is type(value)


def test_a_version_attribute_reads_as_its_text_and_types_are_strict():
    assert DeviceAttribute.model_validate({"version": "1.2.3"}).value == "1.2.3"
    assert DeviceAttribute.model_validate({}).value is None
    with pytest.raises(ValidationError):
        DeviceAttribute.model_validate({"int": True})
    with pytest.raises(ValidationError):
        DeviceAttribute.model_validate({"string": 5})


def test_results_and_config_are_those_of_one_driver_and_none_before_allocation():
    claim = ResourceClaim.model_validate(copy.deepcopy(CLAIM))
    assert [r.device for r in claim.results_for("other.example.com")] == ["nic-0"]
    assert [c.source for c in claim.config_for("gpu.gpushare.io")] == ["FromClaim"]
    assert [c.source for c in claim.config_for("other.example.com")] == ["FromClass"]
    unallocated = ResourceClaim.model_validate({"metadata": {"name": "c"}})
    assert unallocated.results_for("gpu.gpushare.io") == []
    assert unallocated.config_for("gpu.gpushare.io") == []


def test_a_claim_without_opaque_config_has_none_for_any_driver():
    doc = copy.deepcopy(CLAIM)
    doc["status"]["allocation"]["devices"]["config"] = [{"source": "FromClaim"}]
    assert ResourceClaim.model_validate(doc).config_for("gpu.gpushare.io") == []


def test_only_core_pods_count_as_the_pods_a_claim_is_reserved_for():
    claim = ResourceClaim.model_validate(copy.deepcopy(CLAIM))
    assert claim.reserved_pod_uids() == frozenset({"pod-uid"})
    assert claim.key == "team/p-gpushare-abcde"


@pytest.mark.parametrize(
    ("quantity", "units"),
    [
        ("0", 0),
        ("20", 20),
        ("+7", 7),
        ("1k", 1000),
        ("2M", 2 * 10**6),
        ("3G", 3 * 10**9),
        ("4T", 4 * 10**12),
        ("5P", 5 * 10**15),
        ("6E", 6 * 10**18),
        ("1Ki", 1024),
        ("2Mi", 2 * 1024**2),
        ("16Gi", 16 * GIB),
        ("4Ti", 4 * 1024**4),
        ("5Pi", 5 * 1024**5),
        ("6Ei", 6 * 1024**6),
        ("1.5Gi", 3 * GIB // 2),
        ("1.5k", 1500),
        (".5Ki", 512),
        ("2.", 2),
    ],
)
def test_quantities_read_as_exact_base_units(quantity, units):
    assert quantity_units(quantity) == units


@pytest.mark.parametrize("quantity", ["", "Gi", "-1", "1e3", "500m", "1 Gi", "1gi", "1K", "x1"])
def test_what_is_not_a_quantity_of_whole_units_is_refused_by_name(quantity):
    with pytest.raises(ValueError, match=f"quantity '{quantity}' is not a number"):
        quantity_units(quantity)


@pytest.mark.parametrize("quantity", ["1.5", "0.1Ki", "1.0001k"])
def test_a_fraction_of_a_unit_is_refused(quantity):
    with pytest.raises(ValueError, match=f"quantity '{quantity}' is not a whole number"):
        quantity_units(quantity)


@pytest.mark.parametrize(
    ("units", "binary", "written"),
    [
        (0, True, "0"),
        (0, False, "0"),
        (16 * GIB, True, "16Gi"),
        (1536, True, "1536"),
        (1024**2 * 3, True, "3Mi"),
        (1000, True, "1000"),
        (100, False, "100"),
        (1000, False, "1k"),
        (1500, False, "1500"),
        (2 * 10**9, False, "2G"),
        (7 * 1024**6, True, "7Ei"),
        (8 * 10**18, False, "8E"),
        (1024, False, "1024"),
    ],
)
def test_units_are_written_with_the_largest_exact_suffix(units, binary, written):
    assert format_quantity(units, binary) == written
    assert quantity_units(written) == units


def test_units_are_written_decimal_unless_asked_binary():
    assert format_quantity(2048) == "2048"
    assert format_quantity(2000) == "2k"
