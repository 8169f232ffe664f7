"""The committed kubelet API stubs are what the protos generate, and the registration,
DRA and DRA health stubs carry the wire names of DRA-INTERFACES §1 and §2
(docs/contracts.md#proto-files)."""

import filecmp
import inspect
from pathlib import Path
from types import ModuleType

import pytest

from gpushare.kubeletapi import protogen
from gpushare.kubeletapi.dra.health.v1alpha1 import api_pb2 as health
from gpushare.kubeletapi.dra.health.v1alpha1 import api_pb2_grpc as health_grpc
from gpushare.kubeletapi.dra.v1 import api_pb2 as dra1
from gpushare.kubeletapi.dra.v1 import api_pb2_grpc as dra1_grpc
from gpushare.kubeletapi.dra.v1beta1 import api_pb2 as dra1beta1
from gpushare.kubeletapi.dra.v1beta1 import api_pb2_grpc as dra1beta1_grpc
from gpushare.kubeletapi.pluginregistration.v1 import api_pb2 as reg
from gpushare.kubeletapi.pluginregistration.v1 import api_pb2_grpc as reg_grpc

SOURCE_ROOT = Path(protogen.__file__).resolve().parents[2]
STUB_FOLDERS = ("deviceplugin", "podresources", "pluginregistration", "dra")


def test_committed_stubs_equal_a_fresh_generation(tmp_path):
    pytest.importorskip("grpc_tools", reason="grpcio-tools (dev dependency) is not installed")
    generated = protogen.generate(tmp_path)

    committed = sorted(
        p.relative_to(SOURCE_ROOT)
        for folder in STUB_FOLDERS
        for p in (SOURCE_ROOT / "gpushare/kubeletapi" / folder).rglob("*")
        if p.suffix in (".py", ".pyi")
    )
    assert generated == committed
    different = [str(p) for p in generated if not filecmp.cmp(tmp_path / p, SOURCE_ROOT / p, False)]
    assert different == [], "run scripts/gen-protos and commit the result"


def test_each_api_file_is_registered_under_its_own_path():
    assert reg.DESCRIPTOR.name == "gpushare/kubeletapi/pluginregistration/v1/api.proto"
    assert dra1.DESCRIPTOR.name == "gpushare/kubeletapi/dra/v1/api.proto"
    assert dra1beta1.DESCRIPTOR.name == "gpushare/kubeletapi/dra/v1beta1/api.proto"
    assert health.DESCRIPTOR.name == "gpushare/kubeletapi/dra/health/v1alpha1/api.proto"


def _paths(stubs: ModuleType, module: ModuleType, service: str) -> list[str]:
    """The method paths the descriptor forms; each must also be what the stub dials."""
    descriptor = module.DESCRIPTOR.services_by_name[service]
    paths = [f"/{descriptor.full_name}/{m.name}" for m in descriptor.methods]
    source = inspect.getsource(stubs)
    assert all(f"'{path}'" in source for path in paths)
    return paths


def test_registration_method_paths():
    assert _paths(reg_grpc, reg, "Registration") == [
        "/pluginregistration.Registration/GetInfo",
        "/pluginregistration.Registration/NotifyRegistrationStatus",
    ]


@pytest.mark.parametrize(
    ("stubs", "module", "package"),
    [
        (dra1_grpc, dra1, "k8s.io.kubelet.pkg.apis.dra.v1"),
        (dra1beta1_grpc, dra1beta1, "k8s.io.kubelet.pkg.apis.dra.v1beta1"),
    ],
)
def test_dra_method_paths_are_unary(stubs, module, package):
    assert _paths(stubs, module, "DRAPlugin") == [
        f"/{package}.DRAPlugin/NodePrepareResources",
        f"/{package}.DRAPlugin/NodeUnprepareResources",
    ]
    methods = module.DESCRIPTOR.services_by_name["DRAPlugin"].methods
    assert not any(m.client_streaming or m.server_streaming for m in methods)


def test_health_method_path_is_server_streaming():
    assert _paths(health_grpc, health, "DRAResourceHealth") == [
        "/v1alpha1.DRAResourceHealth/NodeWatchResources"
    ]
    method = health.DESCRIPTOR.services_by_name["DRAResourceHealth"].methods[0]
    assert method.server_streaming and not method.client_streaming


def _fields(message) -> dict[str, int]:
    return {f.name: f.number for f in message.DESCRIPTOR.fields}


DRA_FIELDS = [
    ("Claim", {"namespace": 1, "uid": 2, "name": 3}),
    ("NodePrepareResourcesRequest", {"claims": 1}),
    ("NodePrepareResourcesResponse", {"claims": 1}),
    ("NodePrepareResourceResponse", {"devices": 1, "error": 2}),
    ("NodeUnprepareResourcesRequest", {"claims": 1}),
    ("NodeUnprepareResourcesResponse", {"claims": 1}),
    ("NodeUnprepareResourceResponse", {"error": 1}),
]
DEVICE_FIELDS = {"request_names": 1, "pool_name": 2, "device_name": 3, "cdi_device_ids": 4}


@pytest.mark.parametrize(
    ("message", "fields"),
    [
        (reg.InfoRequest, {}),
        (reg.PluginInfo, {"type": 1, "name": 2, "endpoint": 3, "supported_versions": 4}),
        (reg.RegistrationStatus, {"plugin_registered": 1, "error": 2}),
        (reg.RegistrationStatusResponse, {}),
        (dra1.Device, {**DEVICE_FIELDS, "share_id": 5}),
        (dra1beta1.Device, DEVICE_FIELDS),
        *((getattr(dra1, name), fields) for name, fields in DRA_FIELDS),
        *((getattr(dra1beta1, name), fields) for name, fields in DRA_FIELDS),
        (health.NodeWatchResourcesRequest, {}),
        (health.NodeWatchResourcesResponse, {"devices": 1}),
        (health.DeviceIdentifier, {"pool_name": 1, "device_name": 2}),
        (
            health.DeviceHealth,
            {
                "device": 1,
                "health": 2,
                "last_updated_time": 3,
                "health_check_timeout_seconds": 4,
                "message": 5,
            },
        ),
    ],
)
def test_field_names_and_numbers(message, fields):
    assert _fields(message) == fields


@pytest.mark.parametrize("module", [dra1, dra1beta1])
def test_responses_map_claim_uids(module):
    """The responses are maps keyed by claim UID (§2a), not lists."""
    for name in ("NodePrepareResourcesResponse", "NodeUnprepareResourcesResponse"):
        [field] = getattr(module, name).DESCRIPTOR.fields
        assert field.message_type.GetOptions().map_entry
        assert field.message_type.fields_by_name["key"].type == field.TYPE_STRING


def test_repeated_and_typed_fields():
    assert reg.PluginInfo.DESCRIPTOR.fields_by_name["supported_versions"].is_repeated
    assert reg.RegistrationStatus.DESCRIPTOR.fields_by_name["plugin_registered"].type == (
        reg.RegistrationStatus.DESCRIPTOR.fields_by_name["plugin_registered"].TYPE_BOOL
    )
    for module in (dra1, dra1beta1):
        device = module.Device.DESCRIPTOR.fields_by_name
        assert device["request_names"].is_repeated and device["cdi_device_ids"].is_repeated
        assert module.NodePrepareResourcesRequest.DESCRIPTOR.fields_by_name["claims"].is_repeated
    assert [v.name for v in health.HealthStatus.DESCRIPTOR.values] == [
        "UNKNOWN",
        "HEALTHY",
        "UNHEALTHY",
    ]
    assert [v.number for v in health.HealthStatus.DESCRIPTOR.values] == [0, 1, 2]


def test_share_id_is_proto3_optional_in_v1_only():
    """An unset share_id is absent on the wire, not "" (v1 @35+, §2a); v1beta1 has none."""
    device = dra1.Device(pool_name="node-a", device_name="gpu-0")
    assert not device.HasField("share_id")
    assert dra1.Device.FromString(device.SerializeToString()).HasField("share_id") is False
    device.share_id = ""
    assert device.HasField("share_id")
    assert dra1.Device.FromString(device.SerializeToString()).HasField("share_id")

    with pytest.raises(ValueError):
        dra1beta1.Device().HasField("share_id")
    # A v1beta1 reader of a v1 answer: the share_id is an unknown field, nothing breaks.
    shared = dra1.Device(pool_name="node-a", device_name="gpu-0", share_id="u-1")
    assert dra1beta1.Device.FromString(shared.SerializeToString()).device_name == "gpu-0"
