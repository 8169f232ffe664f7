"""The admission webhook over real HTTPS, answering AdmissionReview v1 as the API server
sends it."""

import base64
import json
import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpushare.cluster.memory import MemoryCluster
from gpushare.extender.server import HttpServer
from gpushare.extender.service import ExtenderConfig, ExtenderService
from tests.builders import container, pod
from tests.extender.harness import pod_json
from tests.extender.tls import self_signed


@pytest.fixture(scope="module")
def webhook(tmp_path_factory) -> Iterator[tuple[httpx.Client, str]]:
    cert, key = self_signed(Path(tmp_path_factory.mktemp("tls")))
    config = ExtenderConfig(tls_cert_file=cert, tls_key_file=key)
    service = ExtenderService(MemoryCluster(), config)
    server = HttpServer(service.webhook_app(), tls_cert_file=cert, tls_key_file=key).start()
    assert server.url.startswith("https://127.0.0.1:")
    with httpx.Client(
        base_url=server.url,
        verify=ssl.create_default_context(cafile=cert),
        headers={"Content-Type": "application/json"},
    ) as client:
        yield client, server.url
    server.stop()


def review(obj: dict | None, operation: str = "CREATE", kind: str = "Pod") -> dict:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "default",
            "operation": operation,
            "userInfo": {"username": "admin"},
            "object": obj,
            "dryRun": False,
        },
    }


def test_the_webhook_speaks_tls_only_with_a_certificate_it_was_given(webhook):
    _, url = webhook
    with pytest.raises(httpx.ConnectError):
        httpx.post(url + "/validate", json=review(None))  # not trusted without the CA


def test_a_valid_gpu_pod_is_allowed(webhook):
    client, _ = webhook
    answer = client.post("/validate", json=review(pod_json(pod("ok", mem=2, core=30)))).json()
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    assert answer["response"] == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}


def test_a_pod_that_breaks_a_rule_is_refused_with_every_rule(webhook):
    client, _ = webhook
    bad = pod("core-33", mem=2, core=33, labels={})
    answer = client.post("/validate", json=review(pod_json(bad))).json()["response"]
    assert answer["allowed"] is False
    assert answer["status"]["code"] == 403
    message = answer["status"]["message"]
    assert "default/core-33" in message
    assert "multiple of 5, got 33" in message and "[core-multiple-of-5]" in message


def test_several_broken_rules_are_all_named(webhook):
    client, _ = webhook
    bad = pod(
        "bad",
        containers=[
            {"name": "a", "resources": {"limits": {"aliyun.com/gpu-mem": "1.5"}}},
            {"name": "b", "resources": {"limits": {"aliyun.com/gpu-core.percentage": "120"}}},
        ],
    )
    message = client.post("/validate", json=review(pod_json(bad))).json()["response"]["status"][
        "message"
    ]
    assert "[not-an-integer]" in message
    assert "[core-range]" in message and "[core-needs-gpu-mem]" in message
    # one refusal per rule, each readable on its own in `kubectl apply`'s output
    refusals = message.split(": ", 1)[1].split("; ")
    assert len(refusals) == 3 and all(r.endswith("]") for r in refusals), refusals


def test_an_unknown_placement_policy_is_refused_with_the_known_ones(webhook):
    client, _ = webhook
    p = pod_json(pod("p", mem=1))
    p["metadata"]["annotations"] = {"gpushare.io/placement-policy": "spraed"}
    message = client.post("/validate", json=review(p)).json()["response"]["status"]["message"]
    assert "'spraed'" in message and "binpack" in message and "spread" in message


def test_pods_without_gpus_other_kinds_and_deletes_are_allowed(webhook):
    client, _ = webhook
    plain = {"metadata": {"generateName": "web-"}, "spec": {"containers": [{"name": "c"}]}}
    assert client.post("/validate", json=review(plain)).json()["response"]["allowed"]
    deployment = {"metadata": {"name": "d"}, "spec": {"replicas": "many"}}
    answer = client.post("/validate", json=review(deployment, kind="Deployment")).json()
    assert answer["response"]["allowed"]
    assert client.post("/validate", json=review(None, "DELETE")).json()["response"]["allowed"]


def test_a_gpu_pod_that_kept_the_default_scheduler_is_sent_to_ours(webhook):
    client, _ = webhook
    for scheduler in (None, "default-scheduler"):
        p = pod_json(pod("p", mem=2))
        if scheduler:
            p["spec"]["schedulerName"] = scheduler
        answer = client.post("/mutate", json=review(p)).json()["response"]
        assert answer["allowed"] is True
        assert answer["patchType"] == "JSONPatch"
        patch = json.loads(base64.b64decode(answer["patch"]))
        assert patch == [
            {"op": "add", "path": "/spec/schedulerName", "value": "gpushare-scheduler"}
        ]


def test_mutate_leaves_other_pods_and_chosen_schedulers_alone(webhook):
    client, _ = webhook
    chosen = pod_json(pod("p", mem=2))
    chosen["spec"]["schedulerName"] = "volcano"
    plain = pod_json(pod("web", containers=[{"name": "c"}]))
    for obj in (chosen, plain):
        answer = client.post("/mutate", json=review(obj)).json()["response"]
        assert answer == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"not json", "not valid JSON"),
        (b"{}", "request: Field required"),
        (
            json.dumps(
                {
                    "apiVersion": "admission.k8s.io/v1",
                    "kind": "AdmissionReview",
                    "request": {"object": {}},
                }
            ).encode(),
            "request.uid",
        ),
        (json.dumps(review({"metadata": {"name": 5}})).encode(), "request.object: metadata.name"),
    ],
)
def test_a_malformed_review_is_a_400_naming_the_field(webhook, body, field):
    client, _ = webhook
    for path in ("/validate", "/mutate"):
        response = client.post(path, content=body)
        assert response.status_code == 400
        # A metav1.Status: what the API server's client reads from a non-200 answer.
        status = response.json()
        assert (status["kind"], status["code"], status["reason"]) == ("Status", 400, "BadRequest")
        assert status["message"].startswith(f"{path[1:]}: ")
        assert field in status["message"]


def test_a_workload_pod_is_named_by_its_generate_name(webhook):
    client, _ = webhook
    bad = pod_json(pod("x", mem=2, core=33))
    bad["metadata"] = {"generateName": "trainer-7d9f-", "namespace": "ml"}
    message = client.post("/validate", json=review(bad)).json()["response"]["status"]["message"]
    assert "default/trainer-7d9f-<generated>" in message


def test_mutate_changes_nothing_on_update(webhook):
    client, _ = webhook
    answer = client.post("/mutate", json=review(pod_json(pod("p", mem=2)), "UPDATE")).json()
    assert "patch" not in answer["response"] and answer["response"]["allowed"]


# ----- scheduler names: ours (the main one and the extra ones, ack-co-scheduler by
# default), the default scheduler's, and names nobody serves


def named(p: dict, scheduler: str) -> dict:
    p["spec"]["schedulerName"] = scheduler
    return p


def ack_sample_pod() -> dict:
    """The pod of ACK's sample Job gpu-share-sample, as the Job controller creates it."""
    p = named(pod_json(pod("x", mem=3)), "ack-co-scheduler")
    p["metadata"] = {"generateName": "gpu-share-sample-", "namespace": "default"}
    return p


def test_a_pod_naming_ack_co_scheduler_is_admitted_as_ours_unchanged(webhook):
    client, _ = webhook
    for path in ("/validate", "/mutate"):
        answer = client.post(path, json=review(ack_sample_pod())).json()["response"]
        assert answer == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}


def test_a_pod_naming_ack_co_scheduler_that_breaks_a_rule_is_refused_with_the_rule(webhook):
    client, _ = webhook
    bad = named(pod_json(pod("core-33", mem=2, core=33)), "ack-co-scheduler")
    answer = client.post("/validate", json=review(bad)).json()["response"]
    assert answer["allowed"] is False and "warnings" not in answer
    assert "default/core-33" in answer["status"]["message"]
    assert "[core-multiple-of-5]" in answer["status"]["message"]


UNSERVED = (
    'schedulerName "nobody-scheduler" is not gpushare\'s (gpushare-scheduler, '
    "ack-co-scheduler); Pending unless such a scheduler runs"
)


def test_a_gpu_pod_naming_a_scheduler_nobody_serves_is_admitted_with_a_warning(webhook):
    client, _ = webhook
    for gpu_pod in (
        pod("p", mem=2),
        pod("init", init_containers=[container("setup", mem=1)], containers=[{"name": "c"}]),
    ):
        p = named(pod_json(gpu_pod), "nobody-scheduler")
        answer = client.post("/validate", json=review(p)).json()["response"]
        assert answer["allowed"] is True
        assert answer["warnings"] == [UNSERVED]
        assert len(UNSERVED) < 130  # the API asks for 120 where possible, cuts past 256
        mutated = client.post("/mutate", json=review(p)).json()["response"]
        assert "patch" not in mutated and mutated["allowed"]  # their choice is kept


def test_a_refused_pod_naming_a_scheduler_nobody_serves_gets_the_warning_too(webhook):
    client, _ = webhook
    bad = named(pod_json(pod("core-33", mem=2, core=33)), "nobody-scheduler")
    answer = client.post("/validate", json=review(bad)).json()["response"]
    assert answer["allowed"] is False and "[core-multiple-of-5]" in answer["status"]["message"]
    assert answer["warnings"] == [UNSERVED]


def test_pods_without_gpus_and_default_scheduler_pods_get_no_warning(webhook):
    client, _ = webhook
    plain = named(pod_json(pod("web", containers=[{"name": "c"}])), "nobody-scheduler")
    for obj in (
        plain,
        pod_json(pod("p", mem=2)),
        named(pod_json(pod("p", mem=2)), "default-scheduler"),
    ):
        answer = client.post("/validate", json=review(obj)).json()["response"]
        assert answer == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}


def test_the_webhook_writes_the_main_name_and_accepts_every_configured_one():
    config = ExtenderConfig(
        scheduler_name="gpu-main", extra_scheduler_names=("ack-co-scheduler", "team.gpu")
    )
    extender = ExtenderService(MemoryCluster(), config).extender
    default = json.loads(extender.mutate(json.dumps(review(pod_json(pod("p", mem=2)))).encode()))
    patch = json.loads(base64.b64decode(default["response"]["patch"]))
    assert patch == [{"op": "add", "path": "/spec/schedulerName", "value": "gpu-main"}]
    for name in ("gpu-main", "ack-co-scheduler", "team.gpu"):
        p = named(pod_json(pod("p", mem=2)), name)
        answer = json.loads(extender.validate(json.dumps(review(p)).encode()))["response"]
        assert answer == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}
    # gpushare-scheduler is served only when configured.
    p = named(pod_json(pod("p", mem=2)), "gpushare-scheduler")
    answer = json.loads(extender.validate(json.dumps(review(p)).encode()))["response"]
    assert answer["warnings"] == [
        'schedulerName "gpushare-scheduler" is not gpushare\'s (gpu-main, ack-co-scheduler, '
        "team.gpu); Pending unless such a scheduler runs"
    ]


def _refusal(client: httpx.Client, body: dict) -> dict:
    answer = client.post("/validate", json=body).json()["response"]
    assert answer["allowed"] is False, answer
    return answer["status"]


def test_a_refusal_is_a_403_forbidden_status_as_kubectl_shows_it(webhook):
    client, _ = webhook
    status = _refusal(client, review(pod_json(pod("core-33", mem=2, core=33))))
    assert (status["code"], status["reason"]) == (403, "Forbidden")


def test_an_object_of_another_kind_is_never_judged_as_a_pod(webhook):
    """A Deployment's body could parse as a pod that breaks a rule; it is not ours."""
    client, _ = webhook
    looks_like_a_bad_pod = pod_json(pod("d", mem=2, core=33))
    answer = client.post("/validate", json=review(looks_like_a_bad_pod, kind="Deployment"))
    assert answer.json()["response"]["allowed"] is True


def test_a_review_whose_kind_names_no_kind_is_judged_as_the_pod_it_carries(webhook):
    client, _ = webhook
    body = review(pod_json(pod("core-33", mem=2, core=33)))
    body["request"]["kind"] = {"group": "", "version": "v1"}
    assert "[core-multiple-of-5]" in _refusal(client, body)["message"]


def test_a_review_without_an_operation_is_mutated_as_a_create(webhook):
    client, _ = webhook
    answer = client.post("/mutate", json=review(pod_json(pod("p", mem=2)), operation="")).json()
    assert answer["response"]["patchType"] == "JSONPatch"


def test_the_refused_pod_is_named_by_its_own_namespace_when_the_request_has_none(webhook):
    client, _ = webhook
    bad = pod_json(pod("core-33", mem=2, core=33))
    bad["metadata"]["namespace"] = "team-a"
    body = review(bad)
    body["request"]["namespace"] = ""
    assert "refused pod team-a/core-33:" in _refusal(client, body)["message"]
    del bad["metadata"]["namespace"]
    assert "refused pod default/core-33:" in _refusal(client, body)["message"]


def test_a_pod_with_neither_name_nor_generate_name_is_named_generated(webhook):
    client, _ = webhook
    bad = pod_json(pod("x", mem=2, core=33))
    bad["metadata"] = {}
    assert "refused pod default/<generated>:" in _refusal(client, review(bad))["message"]
