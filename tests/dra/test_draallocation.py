"""The scheduler stand-in for DRA (gpushare.standins.draallocation): it allocates a claim
on a node as kube-scheduler's DRA plugin does and writes the claim's status through the
cluster port (DRA-INTERFACES §4, §6)."""

import uuid
from datetime import UTC, datetime
from itertools import count
from typing import Any

import pytest

from gpushare.cluster.memory import MemoryCluster
from gpushare.dra.allocator import Allocation, Unfit
from gpushare.dra.objects import (
    DeviceClass,
    ResourceClaim,
    ResourceClaimSpec,
    ResourcePool,
    ResourceSlice,
)
from gpushare.dra.slices import NodeRef, node_slice
from gpushare.inventory import Gpu
from gpushare.labels import NodeMode
from gpushare.objects import ObjectMeta, Pod
from gpushare.standins.draallocation import (
    DraAllocationStandIn,
    UnsupportedClaim,
    device_claim,
    node_devices,
    node_selector,
    selector,
)
from tests.dra.gpushapes import DRIVER, shared_gpu

NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)
SHARED = "device.allowMultipleAllocations == true"


def share_id(n: int) -> str:
    return str(uuid.UUID(int=n))


def cluster(sharing: bool = True, gpus: int = 2) -> MemoryCluster:
    """A node n1 with 15Gi GPUs published by our slice, and our device class."""
    memory = MemoryCluster()
    memory.create_device_class(
        DeviceClass.model_validate(
            {
                "metadata": {"name": DRIVER},
                "spec": {
                    "selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}],
                    "config": [{"opaque": {"driver": DRIVER, "parameters": {"from": "class"}}}],
                },
            }
        )
    )
    devices = [Gpu(i, f"GPU-{i}", 15, "Tesla T4") for i in range(gpus)]
    mode = NodeMode.CORE_MEM if sharing else None
    memory.create_resource_slice(node_slice(NodeRef("n1", "uid-n1"), devices, mode, sharing))
    return memory


def stand_in(memory: MemoryCluster) -> DraAllocationStandIn:
    numbers = count(1)
    return DraAllocationStandIn(memory, lambda: share_id(next(numbers)), clock=lambda: NOW)


def request(name: str = "main", shared: bool = True, **capacity: str) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": DRIVER, "count": 1}
    if shared:
        exactly["selectors"] = [{"cel": {"expression": SHARED}}]
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    return {"name": name, "exactly": exactly}


def make_claim(
    memory: MemoryCluster, name: str, *requests: dict[str, Any], **devices: Any
) -> ResourceClaim:
    spec = {"devices": {"requests": list(requests), **devices}}
    return memory.create_resource_claim(
        ResourceClaim.model_validate(
            {"metadata": {"name": name, "namespace": "default"}, "spec": spec}
        )
    )


def pod(name: str) -> Pod:
    return Pod(metadata=ObjectMeta(name=name, namespace="default", uid=f"uid-{name}"))


def status(memory: MemoryCluster, name: str) -> dict[str, Any]:
    return memory.get_resource_claim("default", name).status.to_api()


def test_the_allocation_and_the_pod_are_written_into_the_claims_status():
    memory = cluster()
    make_claim(memory, "a", request(memory="4Gi", cores="30"))
    allocation = stand_in(memory).allocate("default", "a", "n1", pod("a"))
    assert isinstance(allocation, Allocation)
    assert status(memory, "a") == {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "main",
                        "driver": DRIVER,
                        "pool": "n1",
                        "device": "gpu-0",
                        "shareID": share_id(1),
                        "consumedCapacity": {"memory": "4Gi", "cores": "30", "shares": "1"},
                    }
                ],
                "config": [
                    {
                        "source": "FromClass",
                        "requests": ["main"],
                        "opaque": {"driver": DRIVER, "parameters": {"from": "class"}},
                    }
                ],
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
                ]
            },
            "allocationTimestamp": "2025-06-01T12:00:00Z",
        },
        "reservedFor": [{"resource": "pods", "name": "a", "uid": "uid-a"}],
    }


def test_the_claims_own_configuration_follows_the_classes():
    memory = cluster()
    own = [{"requests": ["main"], "opaque": {"driver": DRIVER, "parameters": {"x": 1}}}]
    make_claim(memory, "a", request(memory="1Gi"), config=own)
    stand_in(memory).allocate("default", "a", "n1", pod("a"))
    config = status(memory, "a")["allocation"]["devices"]["config"]
    assert [c["source"] for c in config] == ["FromClass", "FromClaim"]
    assert config[1]["opaque"]["parameters"] == {"x": 1}


def test_what_claims_already_allocated_hold_is_not_free():
    memory = cluster()
    make_claim(memory, "big", request(memory="12Gi"))
    make_claim(memory, "next", request(memory="4Gi", cores="30"))
    stand_in(memory).allocate("default", "big", "n1", pod("big"))
    # A new stand-in knows only what the cluster holds: gpu-0 keeps 3Gi.
    stand_in(memory).allocate("default", "next", "n1", pod("next"))
    devices = status(memory, "next")["allocation"]["devices"]["results"]
    assert [r["device"] for r in devices] == ["gpu-1"]


def test_a_claim_that_does_not_fit_stays_pending():
    memory = cluster(gpus=1)
    make_claim(memory, "big", request(memory="12Gi"))
    make_claim(memory, "next", request(memory="4Gi"))
    stand_in(memory).allocate("default", "big", "n1", pod("big"))
    refused = stand_in(memory).allocate("default", "next", "n1", pod("next"))
    assert isinstance(refused, Unfit)
    assert str(refused).startswith("claim default/next does not fit on node n1: ")
    assert status(memory, "next") == {}


def test_a_whole_gpu_on_a_node_that_does_not_share_has_no_share_id():
    memory = cluster(sharing=False)
    make_claim(memory, "whole", request(shared=False, shares="20"))
    stand_in(memory).allocate("default", "whole", "n1", pod("whole"))
    results = status(memory, "whole")["allocation"]["devices"]["results"]
    assert results == [{"request": "main", "driver": DRIVER, "pool": "n1", "device": "gpu-0"}]
    # The device is held whole: the next whole-GPU claim takes gpu-1.
    make_claim(memory, "other", request(shared=False, shares="20"))
    stand_in(memory).allocate("default", "other", "n1", pod("other"))
    results = status(memory, "other")["allocation"]["devices"]["results"]
    assert [r["device"] for r in results] == ["gpu-1"]


def test_a_slice_claim_is_not_given_a_gpu_of_a_node_that_does_not_share():
    memory = cluster(sharing=False)
    make_claim(memory, "a", request(memory="4Gi"))
    refused = stand_in(memory).allocate("default", "a", "n1", pod("a"))
    assert "no device matches" in str(refused)


def test_a_claim_allocated_on_the_node_is_reserved_for_one_more_pod():
    memory = cluster()
    make_claim(memory, "a", request(memory="4Gi"))
    first = stand_in(memory).allocate("default", "a", "n1", pod("a"))
    again = stand_in(memory).allocate("default", "a", "n1", pod("b"))
    assert again == first
    reserved = status(memory, "a")["reservedFor"]
    assert [r["name"] for r in reserved] == ["a", "b"]
    stand_in(memory).allocate("default", "a", "n1", pod("b"))  # already reserved
    assert len(status(memory, "a")["reservedFor"]) == 2
    elsewhere = stand_in(memory).allocate("default", "a", "n2", pod("c"))
    assert str(elsewhere) == "claim default/a is allocated for another node than n2"


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        (
            {
                "requests": [
                    {"name": "m", "firstAvailable": [request("a")["exactly"] | {"name": "a"}]}
                ]
            },
            "request 'm': firstAvailable is not modelled",
        ),
        (
            {
                "requests": [request(), request("b")],
                "constraints": [{"matchAttribute": "gpu.gpushare.io/uuid"}],
            },
            "only distinctAttribute constraints are modelled",
        ),
        (
            {
                "requests": [
                    {"name": "m", "exactly": {"deviceClassName": DRIVER, "allocationMode": "All"}}
                ]
            },
            "request 'm': only ExactCount is modelled",
        ),
        (
            {"requests": [{"name": "m", "exactly": {"deviceClassName": "nvidia.com"}}]},
            "request 'm': device class 'nvidia.com' not found",
        ),
    ],
)
def test_what_the_model_does_not_cover_is_refused_by_name(spec: dict[str, Any], why: str):
    memory = cluster()
    memory.create_resource_claim(
        ResourceClaim.model_validate(
            {"metadata": {"name": "a", "namespace": "default"}, "spec": {"devices": spec}}
        )
    )
    refused = stand_in(memory).allocate("default", "a", "n1", pod("a"))
    assert str(refused) == f"claim default/a: {why}"
    assert status(memory, "a") == {}


def test_distinct_attribute_constraints_are_honoured():
    memory = cluster()
    uuid_distinct = [{"distinctAttribute": "gpu.gpushare.io/uuid"}]
    make_claim(
        memory,
        "a",
        request("x", memory="1Gi"),
        request("y", memory="1Gi"),
        constraints=uuid_distinct,
    )
    stand_in(memory).allocate("default", "a", "n1", pod("a"))
    results = status(memory, "a")["allocation"]["devices"]["results"]
    assert [r["device"] for r in results] == ["gpu-0", "gpu-1"]


# The slices the allocator reads.


def test_only_a_pools_newest_complete_generation_is_allocatable():
    def piece(generation: int, slices: int, *indices: int, pool_name: str = "n1") -> ResourceSlice:
        made = node_slice(
            NodeRef("n1", "uid"), [Gpu(i, f"GPU-{i}", 15) for i in indices], NodeMode.SHARE, True
        )
        pool = ResourcePool(name=pool_name, generation=generation, resource_slice_count=slices)
        return made.model_copy(update={"spec": made.spec.model_copy(update={"pool": pool})})

    names = lambda slices: [d.name for d in node_devices(slices)]  # noqa: E731
    assert names([piece(0, 1, 0, 1), piece(1, 1, 2)]) == ["gpu-2"]
    assert names([piece(1, 2, 0), piece(1, 2, 1)]) == ["gpu-0", "gpu-1"]
    assert names([piece(1, 2, 0)]) == []  # one of its two slices: incomplete
    assert names([piece(1, 2, 0), piece(0, 1, 5, pool_name="other")]) == ["gpu-5"]


def test_slice_devices_keep_their_capacities_and_policies():
    made = node_slice(
        NodeRef("n1", "uid"), [Gpu(0, "GPU-0", 15, "Tesla T4")], NodeMode.CORE_MEM, True
    )
    (device,) = node_devices([made])
    expected = shared_gpu(0, pool="n1")
    assert device.capacity == expected.capacity
    assert device.allow_multiple_allocations
    assert device.attribute("gpu.gpushare.io/uuid") == "GPU-0"


def test_a_request_without_count_asks_one_device():
    spec = ResourceClaimSpec.model_validate(
        {"devices": {"requests": [{"name": "m", "exactly": {"deviceClassName": DRIVER}}]}}
    )
    classes = {DRIVER: DeviceClass.model_validate({"metadata": {"name": DRIVER}})}
    assert [r.count for r in device_claim(spec, classes).requests] == [1]


def test_the_node_selector_names_the_node():
    assert node_selector("n1") == {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
        ]
    }


# The CEL the stand-in reads.


def test_selectors_compare_driver_sharing_and_attributes_to_literals():
    gpu = shared_gpu(1)
    assert selector([f'device.driver == "{DRIVER}"', SHARED])(gpu)
    assert not selector(['device.driver == "nvidia.com"'])(gpu)
    assert selector(['device.attributes["gpu.gpushare.io"].index == 1'])(gpu)
    assert not selector(['device.attributes["gpu.gpushare.io"].index == 2'])(gpu)
    assert selector(['device.attributes["gpu.gpushare.io"].model != "A100" && ' + SHARED])(gpu)
    assert not selector(["device.allowMultipleAllocations == false"])(gpu)
    assert selector([])(gpu)


def test_a_selector_compares_values_of_the_same_type_only():
    gpu = shared_gpu(1)
    assert not selector(['device.attributes["gpu.gpushare.io"].index == "1"'])(gpu)
    assert not selector(['device.attributes["gpu.gpushare.io"].index == true'])(gpu)


def test_a_selector_on_a_missing_attribute_does_not_select_the_device():
    assert not selector(['device.attributes["example.com"].index == 1'])(shared_gpu(1))
    assert not selector(['device.attributes["example.com"].index != 1'])(shared_gpu(1))


def test_cel_beyond_the_subset_is_refused():
    with pytest.raises(UnsupportedClaim, match="beyond the CEL this stand-in reads"):
        selector(['device.capacity["gpu.gpushare.io"].memory.compareTo(quantity("4Gi")) >= 0'])
