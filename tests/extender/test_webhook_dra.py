"""DRA mode's mutating webhook over real HTTPS: an ACK pod is rewritten to ask for one
resource claim with the same meaning, its template made in the pod's namespace; the
patch is applied as the API server applies it (RFC 6902, jsonpatch)."""

import base64
import json
import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import jsonpatch
import pytest

from gpushare.cluster import ClusterError
from gpushare.cluster.memory import MemoryCluster
from gpushare.dra.ackresources import ACK_RESOURCES, rewritten_request
from gpushare.dra.claims import DEVICE_CLASS, POD_CLAIM
from gpushare.extender.draclaims import TEMPLATE_ANNOTATION
from gpushare.extender.server import HttpServer
from gpushare.extender.service import ExtenderConfig, ExtenderService
from gpushare.objects import Pod
from gpushare.request import parse_pod_request, requests_gpu
from tests.builders import container, pod
from tests.extender.test_webhook import review


class _Store(MemoryCluster):
    """Can be told to fail the template's creation, as an API server that refuses it."""

    fail_templates: ClusterError | None = None

    def create_resource_claim_template(self, template):  # type: ignore[override]
        if self.fail_templates is not None:
            raise self.fail_templates
        return super().create_resource_claim_template(template)


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[httpx.Client, _Store]]:
    from tests.extender.tls import self_signed

    cert, key = self_signed(Path(tmp_path_factory.mktemp("tls")))
    store = _Store()
    config = ExtenderConfig(tls_cert_file=cert, tls_key_file=key, dra_claims=True)
    service = ExtenderService(store, config, dra=store)
    server = HttpServer(service.webhook_app(), tls_cert_file=cert, tls_key_file=key).start()
    with httpx.Client(
        base_url=server.url,
        verify=ssl.create_default_context(cafile=cert),
        headers={"Content-Type": "application/json"},
    ) as client:
        yield client, store
    server.stop()


def _mutate(client: httpx.Client, obj: dict, dry_run: bool = False) -> dict:
    body = review(obj)
    body["request"]["dryRun"] = dry_run
    answer = client.post("/mutate", json=body)
    assert answer.status_code == 200
    return answer.json()["response"]


def _applied(obj: dict, response: dict) -> Pod:
    patch = json.loads(base64.b64decode(response["patch"]))
    return Pod.model_validate(jsonpatch.apply_patch(obj, patch))


def test_an_ack_pod_becomes_a_pod_with_one_claim_of_the_same_meaning(served):
    client, store = served
    obj = pod("train", mem=4, core=30).to_manifest()
    response = _mutate(client, obj)
    assert response["allowed"] and response["patchType"] == "JSONPatch"
    mutated = _applied(obj, response)
    assert not requests_gpu(mutated)  # no aliyun.com quantity left for the device plugin
    (claim,) = mutated.spec.resource_claims
    assert claim.name == POD_CLAIM
    assert [(u.name, u.request) for u in mutated.spec.containers[0].resources.claims] == [
        (POD_CLAIM, "main")
    ]
    template = store.get_resource_claim_template("default", claim.resource_claim_template_name)
    assert mutated.metadata.annotations[TEMPLATE_ANNOTATION] == template.metadata.name
    (request,) = template.spec.spec.devices.requests
    assert request.name == "main"
    assert request.exactly.device_class_name == DEVICE_CLASS
    assert request.exactly.count == 1
    assert request.exactly.capacity.requests == {"memory": "4Gi", "cores": "30"}


def test_other_containers_and_annotations_are_left_alone(served):
    client, _ = served
    obj = pod(
        "mixed",
        containers=[container("gpu", 2), container("sidecar-logger")],
        annotations={"team": "ml"},
    ).to_manifest()
    mutated = _applied(obj, _mutate(client, obj))
    gpu, logger = mutated.spec.containers
    assert [u.request for u in gpu.resources.claims] == ["gpu"]
    assert logger.resources.claims == []
    assert mutated.metadata.annotations["team"] == "ml"
    assert json.loads(mutated.metadata.annotations[ACK_RESOURCES]) == {
        "gpu": {"aliyun.com/gpu-mem": "2"}
    }


def test_the_pod_goes_to_our_scheduler_unless_its_author_chose_one(served):
    """Our scheduler's kube-scheduler allocates the claim and asks our extender to
    score the nodes (docs/dra.md#node-scores-in-dra-mode)."""
    client, _ = served
    obj = pod("ours", mem=2).to_manifest()
    mutated = _applied(obj, _mutate(client, obj))
    assert mutated.spec.scheduler_name == ExtenderConfig().scheduler_names[0]
    assert rewritten_request(mutated) == parse_pod_request(Pod.model_validate(obj))
    chosen = pod("theirs", mem=2).to_manifest()
    chosen["spec"]["schedulerName"] = "volcano"
    assert _applied(chosen, _mutate(client, chosen)).spec.scheduler_name == "volcano"


def test_pods_of_one_shape_share_a_template(served):
    client, _ = served
    first = _applied(o := pod("a", mem=3).to_manifest(), _mutate(client, o))
    second = _applied(o := pod("b", mem=3).to_manifest(), _mutate(client, o))
    other = _applied(o := pod("c", mem=5).to_manifest(), _mutate(client, o))
    name = first.spec.resource_claims[0].resource_claim_template_name
    assert second.spec.resource_claims[0].resource_claim_template_name == name
    assert other.spec.resource_claims[0].resource_claim_template_name != name


def test_a_dry_run_makes_no_template(served):
    client, store = served
    obj = pod("dry", mem=7).to_manifest()
    mutated = _applied(obj, _mutate(client, obj, dry_run=True))
    name = mutated.spec.resource_claims[0].resource_claim_template_name
    with pytest.raises(ClusterError):
        store.get_resource_claim_template("default", name)


def test_a_pod_breaking_a_rule_is_left_for_the_validating_webhook(served):
    client, _ = served
    obj = pod("bad", mem=4, core=7).to_manifest()  # compute in steps of 5
    response = _mutate(client, obj)
    assert response["allowed"] and "patch" not in response


def test_a_pod_with_a_claim_of_our_name_is_refused_naming_it(served):
    client, _ = served
    obj = pod("clash", mem=2).to_manifest()
    obj["spec"]["resourceClaims"] = [{"name": POD_CLAIM, "resourceClaimName": "theirs"}]
    response = _mutate(client, obj)
    assert not response["allowed"]
    assert "already has a resource claim named 'gpushare'" in response["status"]["message"]


def test_a_template_the_api_refuses_refuses_the_pod_with_the_reason(served):
    client, store = served
    store.fail_templates = ClusterError("resourceclaimtemplates is forbidden")
    try:
        response = _mutate(client, pod("denied", mem=9).to_manifest())
    finally:
        store.fail_templates = None
    assert response["allowed"] is False and "patch" not in response
    status = response["status"]
    assert (status["code"], status["reason"]) == (403, "Forbidden")
    assert status["message"] == (
        "gpushare cannot give pod default/denied its GPU claim: resourceclaimtemplates is forbidden"
    )


@pytest.mark.parametrize(
    ("review_namespace", "pod_namespace", "expected"),
    [("ml", "ml", "ml"), ("", "team", "team"), ("", "", "default")],
)
def test_the_template_is_made_in_the_pods_namespace(
    served, review_namespace, pod_namespace, expected
):
    client, store = served
    obj = pod("where", mem=11).to_manifest()
    obj["metadata"]["namespace"] = pod_namespace
    body = review(obj)
    body["request"]["namespace"] = review_namespace
    response = client.post("/mutate", json=body).json()["response"]
    name = _applied(obj, response).spec.resource_claims[0].resource_claim_template_name
    assert store.get_resource_claim_template(expected, name).metadata.namespace == expected


def test_a_pod_asking_no_gpu_memory_is_admitted_unchanged(served):
    client, _ = served
    response = _mutate(client, pod("zero", mem=0).to_manifest())
    assert response["allowed"] is True and "patch" not in response
    assert response["uid"] == review(None)["request"]["uid"]
