"""The DRA node service answers both versions, every claim sent, whatever the preparer
does (DRA-INTERFACES §2, §3)."""

import os
import stat

import grpc
import pytest

from gpushare.draplugin.server import ClaimRef, PreparedDevice, PrepareResult
from gpushare.kubeletapi.dra.v1 import api_pb2 as dra1
from gpushare.kubeletapi.dra.v1 import api_pb2_grpc as dra1_grpc
from gpushare.kubeletapi.dra.v1beta1 import api_pb2 as dra1beta1
from gpushare.kubeletapi.dra.v1beta1 import api_pb2_grpc as dra1beta1_grpc
from tests.draplugin.rig import DRIVER, WAIT

VERSIONS = [(dra1, dra1_grpc), (dra1beta1, dra1beta1_grpc)]


def _device(name: str, share_id: str | None = None, requests=("gpushare",)) -> PreparedDevice:
    cdi = (f"{DRIVER}/gpu=claim-{name}",)
    return PreparedDevice(tuple(requests), "node-a", name, cdi, share_id)


def _call(node, api, stubs, method: str, *claims: tuple[str, str, str]):
    request_type = getattr(api, f"{method}Request")
    request = request_type(claims=[api.Claim(namespace=n, uid=u, name=m) for n, u, m in claims])
    with grpc.insecure_channel(f"unix:{node.dra.socket_path}") as channel:
        return getattr(stubs.DRAPluginStub(channel), method)(request, timeout=WAIT)


def _prepare(node, api, stubs, *claims):
    return _call(node, api, stubs, "NodePrepareResources", *claims)


def _unprepare(node, api, stubs, *claims):
    return _call(node, api, stubs, "NodeUnprepareResources", *claims)


A = ("default", "uid-a", "claim-a")
B = ("default", "uid-b", "claim-b")


def test_the_socket_is_the_drivers_dra_sock_and_goes_with_stop(node):
    node.start_driver()
    assert node.dra.socket_path == node.root / "plugins" / DRIVER / "dra.sock"
    assert stat.S_ISSOCK(os.stat(node.dra.socket_path).st_mode)
    node.dra.stop(grace=0)
    assert not node.dra.socket_path.exists()


def test_v1_echoes_share_id_only_where_the_preparer_has_one(node):
    node.preparer.results = {
        "uid-a": PrepareResult((_device("gpu-0", share_id="8f1c-share"),)),
        "uid-b": PrepareResult((_device("gpu-1"),)),
    }
    node.start_driver()

    response = _prepare(node, dra1, dra1_grpc, A, B)

    [shared] = response.claims["uid-a"].devices
    assert shared.HasField("share_id") and shared.share_id == "8f1c-share"
    assert (shared.pool_name, shared.device_name) == ("node-a", "gpu-0")
    assert list(shared.cdi_device_ids) == [f"{DRIVER}/gpu=claim-gpu-0"]
    assert list(shared.request_names) == ["gpushare"]
    [exclusive] = response.claims["uid-b"].devices
    assert not exclusive.HasField("share_id")
    assert node.preparer.prepared == [[ClaimRef(*A), ClaimRef(*B)]]


def test_v1beta1_answers_the_same_devices_without_share_id(node):
    node.preparer.results = {"uid-a": PrepareResult((_device("gpu-0", share_id="8f1c-share"),))}
    node.start_driver()

    response = _prepare(node, dra1beta1, dra1beta1_grpc, A)

    [device] = response.claims["uid-a"].devices
    assert (device.device_name, list(device.cdi_device_ids)) == (
        "gpu-0",
        [f"{DRIVER}/gpu=claim-gpu-0"],
    )
    # Read as v1: field 5 was never on the wire.
    as_v1 = dra1.NodePrepareResourcesResponse.FromString(response.SerializeToString())
    assert not as_v1.claims["uid-a"].devices[0].HasField("share_id")


@pytest.mark.parametrize(("api", "stubs"), VERSIONS)
def test_every_claim_sent_is_answered_and_no_other(node, api, stubs):
    node.preparer.results = {
        "uid-a": PrepareResult((_device("gpu-0"),)),
        "uid-stranger": PrepareResult((_device("gpu-1"),)),
    }
    node.start_driver()

    response = _prepare(node, api, stubs, A, B)

    assert set(response.claims) == {"uid-a", "uid-b"}
    assert response.claims["uid-a"].error == ""
    assert (
        response.claims["uid-b"].error == "not prepared: the driver gave no result for this claim"
    )
    assert not response.claims["uid-b"].devices


@pytest.mark.parametrize(("api", "stubs"), VERSIONS)
def test_a_raising_preparer_fails_each_claim_not_the_call(node, api, stubs):
    node.preparer.raises = RuntimeError("GPU gpu-0 fell off the bus")
    node.start_driver()

    prepared = _prepare(node, api, stubs, A, B)
    unprepared = _unprepare(node, api, stubs, A)

    for answer in (prepared.claims["uid-a"], prepared.claims["uid-b"], unprepared.claims["uid-a"]):
        assert "RuntimeError: GPU gpu-0 fell off the bus" in answer.error
    assert prepared.claims["uid-a"].error.startswith("not prepared: ")
    assert unprepared.claims["uid-a"].error.startswith("not unprepared: ")


def test_a_failed_claims_devices_are_not_sent(node):
    node.preparer.results = {"uid-a": PrepareResult((_device("gpu-0"),), error="no room")}
    node.start_driver()

    answer = _prepare(node, dra1, dra1_grpc, A).claims["uid-a"]

    assert answer.error == "no room"
    assert not answer.devices


def test_subrequest_names_become_base_request_names(node):
    requests = ("gpushare/large", "gpushare/small", "sidecar", "other/x")
    node.preparer.results = {"uid-a": PrepareResult((_device("gpu-0", requests=requests),))}
    node.start_driver()

    [device] = _prepare(node, dra1, dra1_grpc, A).claims["uid-a"].devices

    assert list(device.request_names) == ["gpushare", "sidecar", "other"]


def test_claims_with_an_empty_field_get_an_error_naming_it(node):
    node.preparer.results = {"uid-a": PrepareResult((_device("gpu-0"),))}
    node.start_driver()

    response = _prepare(
        node, dra1, dra1_grpc, A, ("", "uid-c", "claim-c"), ("default", "", "claim-d")
    )

    assert response.claims["uid-a"].error == ""
    assert "namespace" in response.claims["uid-c"].error
    assert "claim-c" in response.claims["uid-c"].error
    assert "uid" in response.claims[""].error and "claim-d" in response.claims[""].error
    # Only the well-formed claim reaches the preparer.
    assert node.preparer.prepared == [[ClaimRef(*A)]]


def test_a_request_of_only_malformed_claims_does_not_call_the_preparer(node):
    node.start_driver()

    response = _unprepare(node, dra1, dra1_grpc, ("default", "uid-a", ""))

    assert "name" in response.claims["uid-a"].error
    assert node.preparer.unprepared == []


@pytest.mark.parametrize(("api", "stubs"), VERSIONS)
def test_unprepare_answers_every_claim(node, api, stubs):
    node.preparer.errors = {"uid-b": "device busy"}
    node.start_driver()

    response = _unprepare(node, api, stubs, A, B)

    assert {uid: a.error for uid, a in response.claims.items()} == {
        "uid-a": "",
        "uid-b": "device busy",
    }
    assert node.preparer.unprepared == [[ClaimRef(*A), ClaimRef(*B)]]


def test_unprepare_fills_in_a_claim_the_preparer_leaves_out(node):
    node.start_driver()
    node.preparer.unprepare = lambda claims: {}  # type: ignore[method-assign]

    response = _unprepare(node, dra1, dra1_grpc, A)

    assert response.claims["uid-a"].error == (
        "not unprepared: the driver gave no result for this claim"
    )
