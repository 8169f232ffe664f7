"""The device plugin's and PodResources' stubs carry the wire names the kubelet expects
(docs/contracts.md#proto-files, docs/contracts.md#podresources-api-v1). That the committed
stubs are what the protos generate: tests/kubeletapi/test_protos.py."""

import pytest
from google.protobuf import descriptor_pool

from gpushare.kubeletapi.deviceplugin.v1beta1 import api_pb2 as dp
from gpushare.kubeletapi.podresources.v1 import api_pb2 as pr


def test_the_two_api_files_are_registered_under_distinct_paths():
    assert dp.DESCRIPTOR.name == "gpushare/kubeletapi/deviceplugin/v1beta1/api.proto"
    assert pr.DESCRIPTOR.name == "gpushare/kubeletapi/podresources/v1/api.proto"
    pool = descriptor_pool.Default()
    assert pool.FindMessageTypeByName("v1beta1.TopologyInfo") is not pool.FindMessageTypeByName(
        "v1.TopologyInfo"
    )


def test_packages_and_methods_form_the_kubelet_paths():
    assert dp.DESCRIPTOR.package == "v1beta1"
    assert pr.DESCRIPTOR.package == "v1"
    plugin = dp.DESCRIPTOR.services_by_name["DevicePlugin"]
    assert [m.name for m in plugin.methods] == [
        "GetDevicePluginOptions",
        "ListAndWatch",
        "GetPreferredAllocation",
        "Allocate",
        "PreStartContainer",
    ]
    assert plugin.methods_by_name["ListAndWatch"].server_streaming
    assert [m.name for m in dp.DESCRIPTOR.services_by_name["Registration"].methods] == ["Register"]
    lister = pr.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert [m.name for m in lister.methods] == ["List", "GetAllocatableResources", "Get"]


def _fields(message) -> dict[str, int]:
    return {f.name: f.number for f in message.DESCRIPTOR.fields}


@pytest.mark.parametrize(
    ("message", "fields"),
    [
        (
            dp.DevicePluginOptions,
            {"pre_start_required": 1, "get_preferred_allocation_available": 2},
        ),
        (dp.RegisterRequest, {"version": 1, "endpoint": 2, "resource_name": 3, "options": 4}),
        (dp.Device, {"ID": 1, "health": 2, "topology": 3}),
        (
            dp.ContainerPreferredAllocationRequest,
            {"available_deviceIDs": 1, "must_include_deviceIDs": 2, "allocation_size": 3},
        ),
        (dp.ContainerPreferredAllocationResponse, {"deviceIDs": 1}),
        (dp.ContainerAllocateRequest, {"devices_ids": 1}),
        (
            dp.ContainerAllocateResponse,
            {"envs": 1, "mounts": 2, "devices": 3, "annotations": 4, "cdi_devices": 5},
        ),
        (dp.Mount, {"container_path": 1, "host_path": 2, "read_only": 3}),
        (dp.DeviceSpec, {"container_path": 1, "host_path": 2, "permissions": 3}),
        (dp.PreStartContainerRequest, {"devices_ids": 1}),
        (
            pr.PodResources,
            {"name": 1, "namespace": 2, "containers": 3, "cpu_ids": 4, "memory": 5},
        ),
        (
            pr.ContainerResources,
            {"name": 1, "devices": 2, "cpu_ids": 3, "memory": 4, "dynamic_resources": 5},
        ),
        (pr.ContainerDevices, {"resource_name": 1, "device_ids": 2, "topology": 3}),
        (pr.DynamicResource, {"claim_name": 2, "claim_namespace": 3, "claim_resources": 4}),
        (
            pr.ClaimResource,
            {"cdi_devices": 1, "driver_name": 2, "pool_name": 3, "device_name": 4, "share_id": 5},
        ),
        (pr.GetPodResourcesRequest, {"pod_name": 1, "pod_namespace": 2}),
    ],
)
def test_field_names_and_numbers(message, fields):
    assert _fields(message) == fields
