"""The kubelet stand-in's DRA side against our servers and against scripted drivers:
pre-checks, one call per driver with the claims not yet prepared, the response rules,
the CDI hand-off, slice wiping and restarts (DRA-INTERFACES §1, §3)."""

import json
import time
from collections.abc import Callable

import grpc
import pytest

from gpushare.draplugin.registration import RegistrationServer
from gpushare.draplugin.server import ClaimRef, PreparedDevice, PrepareResult
from gpushare.draplugin.unixserver import UnixServer
from gpushare.kubeletapi.dra.v1 import api_pb2 as dra1
from gpushare.kubeletapi.dra.v1 import api_pb2_grpc as dra1_grpc
from gpushare.standins.cdi import CdiError
from gpushare.standins.drakubelet import ClaimView, PodClaim, PrepareFailed, UnprepareFailed
from tests.draplugin.rig import DRIVER, NODE, WAIT, DraNode, eventually

POD_1, POD_2 = "pod-uid-1", "pod-uid-2"
KIND = f"{DRIVER}/gpu"


def _device(name: str, requests=("main",), share_id: str | None = None) -> PreparedDevice:
    return PreparedDevice(tuple(requests), NODE, name, (f"{KIND}=claim-{name}",), share_id)


def _prepared(node: DraNode, claim: PodClaim, *devices: PreparedDevice) -> None:
    node.preparer.results[claim.uid] = PrepareResult(devices)


def _refs(calls: list[list[ClaimRef]]) -> list[list[str]]:
    return [[claim.name for claim in call] for call in calls]


# ----- prepare and unprepare


def test_a_shared_claim_is_prepared_once_and_unprepared_after_its_last_pod(node):
    kubelet = node.started()
    claim = node.claim("shared", pods=[POD_1, POD_2])
    _prepared(node, claim, _device("gpu-0", share_id="share-1"))

    kubelet.prepare(POD_1, [claim])
    kubelet.prepare(POD_2, [claim])

    assert _refs(node.preparer.prepared) == [["shared"]]
    [device] = kubelet.devices(claim.uid)
    assert (device.device_name, device.share_id) == ("gpu-0", "share-1")
    assert kubelet.pods_of(claim.uid) == {POD_1, POD_2}

    kubelet.unprepare(POD_1)
    assert node.preparer.unprepared == []
    kubelet.unprepare(POD_2)
    assert _refs(node.preparer.unprepared) == [["shared"]]
    assert kubelet.pods_of(claim.uid) == set()


def test_one_call_per_driver_with_only_the_claims_not_yet_prepared(node):
    kubelet = node.started()
    first = node.claim("first", pods=[POD_1, POD_2])
    second = node.claim("second", pods=[POD_2])
    third = node.claim("third", pods=[POD_2])
    for claim in (first, second, third):
        _prepared(node, claim, _device(f"gpu-{claim.name}"))

    kubelet.prepare(POD_1, [first])
    kubelet.prepare(POD_2, [first, second, third])

    assert _refs(node.preparer.prepared) == [["first"], ["second", "third"]]


def test_a_1_34_kubelet_gets_no_share_id(node):
    kubelet = node.started(versions=("v1beta1.DRAPlugin",))
    claim = node.claim("shared", pods=[POD_1])
    _prepared(node, claim, _device("gpu-0", share_id="share-1"))

    kubelet.prepare(POD_1, [claim])

    [device] = kubelet.devices(claim.uid)
    assert device.device_name == "gpu-0" and device.share_id is None


def _view(uid="uid-c", allocated=True, drivers=(DRIVER,), pods=(POD_1,)) -> ClaimView:
    return ClaimView(uid, allocated, tuple(drivers), tuple(pods))


@pytest.mark.parametrize(
    ("view", "message"),
    [
        (None, "failed to fetch ResourceClaim default/c: not found"),
        (_view(uid="uid-recreated"), "has UID uid-recreated, the pod's has uid-c"),
        (_view(allocated=False, drivers=()), "ResourceClaim default/c is not allocated"),
        (_view(pods=(POD_2,)), f"pod {POD_1} is not allowed to use ResourceClaim default/c"),
        (_view(drivers=(DRIVER, "other.example.com")), "other.example.com is not registered"),
    ],
)
def test_pre_checks_fail_the_pod_before_any_call(node, view, message):
    kubelet = node.started()
    claim = node.claim("c", pods=[POD_1])
    _prepared(node, claim, _device("gpu-0"))
    node.claims[("default", "c")] = view

    with pytest.raises(PrepareFailed, match=message):
        kubelet.prepare(POD_1, [claim])
    assert node.preparer.prepared == []


def test_a_claim_error_fails_the_pod_and_the_claim_is_tried_again(node):
    kubelet = node.started()
    claim = node.claim("c", pods=[POD_1])
    node.preparer.results[claim.uid] = PrepareResult(error="GPU gpu-0 is unhealthy")

    with pytest.raises(PrepareFailed, match="failed for ResourceClaim c: GPU gpu-0 is unhealthy"):
        kubelet.prepare(POD_1, [claim])
    assert kubelet.devices(claim.uid) == []

    _prepared(node, claim, _device("gpu-1"))
    kubelet.prepare(POD_1, [claim])
    assert [d.device_name for d in kubelet.devices(claim.uid)] == ["gpu-1"]
    assert len(node.preparer.prepared) == 2


def test_an_unprepare_error_keeps_the_claim_until_a_retry_succeeds(node):
    kubelet = node.started()
    claim = node.claim("c", pods=[POD_1])
    _prepared(node, claim, _device("gpu-0"))
    kubelet.prepare(POD_1, [claim])
    node.preparer.errors[claim.uid] = "still in use"

    with pytest.raises(UnprepareFailed, match="still in use"):
        kubelet.unprepare(POD_1)
    assert kubelet.devices(claim.uid) != []

    node.preparer.errors.clear()
    kubelet.unprepare(POD_1)
    assert kubelet.devices(claim.uid) == []
    assert len(node.preparer.unprepared) == 2


# ----- the response rules, against a scripted driver

SCRIPTED = "scripted.example.com"


class _ScriptedDriver(dra1_grpc.DRAPluginServicer):
    def __init__(self, answer: Callable) -> None:
        self.answer = answer

    def NodePrepareResources(self, request, context):
        return self.answer(request, context)


@pytest.fixture
def scripted(node):
    """A DRA driver that answers NodePrepareResources with `driver.answer(request, context)`."""
    driver = _ScriptedDriver(lambda request, context: dra1.NodePrepareResourcesResponse())
    server = UnixServer(node.root / "plugins" / SCRIPTED / "dra.sock", "scripted", 2, 4)
    server.start(lambda s: dra1_grpc.add_DRAPluginServicer_to_server(driver, s))
    registration = RegistrationServer(node.registry, SCRIPTED, server.path)
    registration.start()
    kubelet = node.start_kubelet()
    assert kubelet.wait_for(lambda: SCRIPTED in kubelet.registered(), WAIT)
    yield driver
    registration.stop()
    server.stop(grace=0)


def _answer_each(request, skip: int = 0, extra: str = ""):
    response = dra1.NodePrepareResourcesResponse()
    for claim in list(request.claims)[skip:]:
        response.claims[claim.uid].devices.add(pool_name=NODE, device_name="gpu-0")
    if extra:
        response.claims[extra].devices.add(pool_name=NODE, device_name="gpu-9")
    return response


def _two_claims(node):
    return [node.claim(name, pods=[POD_1], drivers=[SCRIPTED]) for name in ("a", "b")]


def test_an_answer_that_leaves_a_claim_out_fails_the_pod(node, scripted):
    scripted.answer = lambda request, context: _answer_each(request, skip=1)
    claims = _two_claims(node)

    with pytest.raises(PrepareFailed, match="NodePrepareResources skipped 1 ResourceClaims"):
        node.kubelet.prepare(POD_1, claims)
    assert all(node.kubelet.devices(c.uid) == [] for c in claims)


def test_an_answer_for_a_claim_not_sent_fails_the_pod(node, scripted):
    scripted.answer = lambda request, context: _answer_each(request, extra="uid-stranger")

    with pytest.raises(PrepareFailed, match="'uid-stranger', which it was not sent"):
        node.kubelet.prepare(POD_1, _two_claims(node))


def test_a_call_error_fails_the_pod(node, scripted):
    def refuse(request, context):
        context.abort(grpc.StatusCode.UNAVAILABLE, "driver restarting")

    scripted.answer = refuse

    with pytest.raises(
        PrepareFailed, match="NodePrepareResources failed: UNAVAILABLE: driver restarting"
    ):
        node.kubelet.prepare(POD_1, _two_claims(node))


def test_a_complete_answer_prepares_both_claims(node, scripted):
    scripted.answer = lambda request, context: _answer_each(request)
    claims = _two_claims(node)

    node.kubelet.prepare(POD_1, claims)

    assert [len(node.kubelet.devices(c.uid)) for c in claims] == [1, 1]


# ----- the CDI hand-off


def _write_spec(node: DraNode, devices: dict[str, list[str]]) -> None:
    spec = {
        "cdiVersion": "0.5.0",
        "kind": KIND,
        "devices": [{"name": n, "containerEdits": {"env": env}} for n, env in devices.items()],
    }
    (node.cdi_dir / f"{DRIVER}-spec.json").write_text(json.dumps(spec))


def test_a_container_gets_the_edits_of_its_requests_devices(node):
    kubelet = node.started()
    claim = node.claim("c", pods=[POD_1])
    _prepared(
        node,
        claim,
        _device("gpu-0", requests=("main",)),
        _device("gpu-1", requests=("sidecar",)),
        _device("gpu-2", requests=()),  # serves every request
    )
    _write_spec(
        node, {"claim-gpu-0": ["MAIN=1"], "claim-gpu-1": ["SIDE=1"], "claim-gpu-2": ["ALL=1"]}
    )
    kubelet.prepare(POD_1, [claim])

    assert kubelet.container_edits(POD_1, claim.uid, "main").env == {"MAIN": "1", "ALL": "1"}
    assert kubelet.container_edits(POD_1, claim.uid, "sidecar").env == {"SIDE": "1", "ALL": "1"}
    assert kubelet.container_edits(POD_1, claim.uid).env == {"MAIN": "1", "SIDE": "1", "ALL": "1"}


def test_an_id_without_a_spec_fails_the_container(node):
    kubelet = node.started()
    claim = node.claim("c", pods=[POD_1])
    _prepared(node, claim, _device("gpu-0"), _device("gpu-1"))
    _write_spec(node, {"claim-gpu-0": ["A=1"]})
    kubelet.prepare(POD_1, [claim])

    with pytest.raises(CdiError, match=f"unresolvable CDI devices {KIND}=claim-gpu-1"):
        kubelet.container_edits(POD_1, claim.uid, "main")


def test_a_pod_gets_no_edits_of_a_claim_not_prepared_for_it(node):
    kubelet = node.started()
    claim = node.claim("c", pods=[POD_1])
    _prepared(node, claim, _device("gpu-0"))
    _write_spec(node, {"claim-gpu-0": ["A=1"]})
    kubelet.prepare(POD_1, [claim])

    with pytest.raises(CdiError, match=f"not prepared for pod {POD_2}"):
        kubelet.container_edits(POD_2, claim.uid)


# ----- slice wiping and restarts


def test_the_nodes_slices_are_wiped_at_start(node):
    node.start_kubelet()
    assert node.wiped == [(NODE, None)]


def test_a_driver_without_plugin_past_the_grace_loses_its_slices(node):
    kubelet = node.started(disconnect_grace_s=0.3)
    node.registration.stop()
    gone = time.monotonic()
    assert kubelet.wait_for(lambda: kubelet.registered() == {}, WAIT)

    assert eventually(lambda: (NODE, DRIVER) in node.wiped)
    assert time.monotonic() - gone >= 0.3
    assert node.wiped == [(NODE, None), (NODE, DRIVER)]


def test_a_plugin_back_within_the_grace_keeps_the_slices(node):
    grace = 1.0
    kubelet = node.started(disconnect_grace_s=grace)
    node.registration.stop()
    gone = time.monotonic()
    assert kubelet.wait_for(lambda: kubelet.registered() == {}, WAIT)
    node.registration.start()
    assert kubelet.wait_for(lambda: DRIVER in kubelet.registered(), WAIT)

    time.sleep(max(0.0, gone + grace + 0.2 - time.monotonic()))
    assert node.wiped == [(NODE, None)]


def test_a_restart_registers_again_wipes_and_prepares_checkpointed_claims_again(node):
    kubelet = node.started()
    claim = node.claim("c", pods=[POD_1])
    _prepared(node, claim, _device("gpu-0"))
    kubelet.prepare(POD_1, [claim])

    kubelet.restart()

    assert kubelet.wait_for(lambda: len(kubelet.registrations) == 2, WAIT)
    assert kubelet.registered() == {DRIVER: "v1.DRAPlugin"}
    assert node.wiped == [(NODE, None), (NODE, None)]
    assert kubelet.pods_of(claim.uid) == {POD_1}  # the checkpoint stays
    kubelet.prepare(POD_1, [claim])
    assert _refs(node.preparer.prepared) == [["c"], ["c"]]
