"""The HTTP surface: bad bodies are 4xx naming the field, readiness follows the sync,
and the operational endpoints say what is going on."""

import json
import threading

import httpx
import pytest

from gpushare.cluster.memory import MemoryCluster
from gpushare.extender.server import HttpServer
from gpushare.extender.service import ExtenderConfig, ExtenderService
from tests.builders import node, pod
from tests.extender.harness import PREFIX, pod_json

JSON_HEADERS = {"Content-Type": "application/json"}

GOOD_ARGS = {"Pod": pod_json(pod("p", mem=1)), "Nodes": None, "NodeNames": ["n"]}

MALFORMED = [
    (b"", "body is not valid JSON"),
    (b"\xff\xfe garbage \x00", "body is not valid JSON"),
    (b'{"Pod": ', "body is not valid JSON"),
    (b"[]", "body: Input should be an object"),
    (b"null", "body: Input should be an object"),
    (b"{}", "Pod: Field required"),
    (b'{"Pod": "p1", "NodeNames": ["n"]}', "Pod: Input should be an object"),
    (b'{"Pod": {"metadata": {}}, "NodeNames": ["n"]}', "Pod.metadata.name: Field required"),
    (b'{"Pod": {"metadata": {"name": "p"}}, "NodeNames": "n"}', "NodeNames: Input should be"),
    (b'{"Pod": {"metadata": {"name": "p"}}, "NodeNames": [1]}', "NodeNames.0: Input should be"),
    (
        b'{"Pod": {"metadata": {"name": "p"}, "spec": {"containers": {}}}, "NodeNames": []}',
        "Pod.spec.containers: Input should be a valid array",
    ),
    (
        b'{"Pod": {"metadata": {"name": "p"}}, "Nodes": {"items": [{"metadata": {}}]}}',
        "Nodes.items.0.metadata.name",
    ),
    (b'{"Pod": {"metadata": {"name": "p"}}, "Nodes": {"items": 3}}', "Nodes.items"),
]


@pytest.fixture(scope="module")
def running():
    cluster = MemoryCluster()
    cluster.add_node(node("n", "1x16GiB"))
    service = ExtenderService(cluster, ExtenderConfig()).start_watching()
    assert service.wait_synced(10)
    server = HttpServer(service.app()).start()
    with httpx.Client(base_url=server.url, headers=JSON_HEADERS) as client:
        yield client, cluster
    server.stop()
    service.stop_watching()


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
@pytest.mark.parametrize(("body", "field"), MALFORMED)
def test_a_malformed_body_is_a_400_naming_the_field(running, verb, body, field):
    client, _ = running
    response = client.post(f"{PREFIX}/{verb}", content=body)
    assert response.status_code == 400, response.text
    assert response.json()["Error"].startswith(f"{verb}: ")
    assert field in response.json()["Error"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"garbage", "not valid JSON"),
        (b'{"PodName": "p", "PodNamespace": "default", "Node": 7}', "Node: Input should be"),
        (b'{"PodNamespace": "default", "Node": "n"}', "PodName: Field required"),
        (b'{"PodName": "", "PodNamespace": "default", "Node": "n"}', "PodName: String should"),
    ],
)
def test_a_malformed_bind_is_a_400_naming_the_field(running, body, field):
    client, _ = running
    response = client.post(f"{PREFIX}/bind", content=body)
    assert response.status_code == 400
    assert field in response.json()["Error"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"{}", "Pod: Field required"),
        (
            b'{"Pod": {"metadata": {"name": "p"}}, "NodeNameToMetaVictims": {"n": {"Pods": [{}]}}}',
            "NodeNameToMetaVictims.n.Pods.0.UID",
        ),
        (
            b'{"Pod": {"metadata": {"name": "p"}}, "NodeNameToVictims": {"n": {"NumPDBViolations":'
            b" 1.5}}}",
            "NodeNameToVictims.n.NumPDBViolations",
        ),
    ],
)
def test_a_malformed_preempt_is_a_400_naming_the_field(running, body, field):
    client, _ = running
    response = client.post(f"{PREFIX}/preempt", content=body)
    assert response.status_code == 400
    assert field in response.json()["Error"]


def test_a_bind_for_a_pod_that_does_not_exist_is_an_error_not_a_crash(running):
    client, _ = running
    body = {"PodName": "ghost", "PodNamespace": "default", "PodUID": "x", "Node": "n"}
    response = client.post(f"{PREFIX}/bind", json=body)
    assert response.status_code == 200
    assert response.json() == {"Error": "pod default/ghost not found"}


def test_only_post_is_served_on_the_verbs(running):
    client, _ = running
    assert client.get(f"{PREFIX}/filter").status_code == 405


def test_health_version_inspect_and_metrics(running):
    client, cluster = running
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").status_code == 200
    assert "gpushare-extender" in client.get("/version").json()["configuration"]
    assert client.post(f"{PREFIX}/filter", json=GOOD_ARGS).status_code == 200
    p = cluster.create_pod(pod("m", mem=3))
    bind = {"PodName": "m", "PodNamespace": "default", "PodUID": p.metadata.uid, "Node": "n"}
    assert client.post(f"{PREFIX}/bind", json=bind).json() == {"Error": ""}

    report = client.get("/inspect/n").json()
    assert report["gpus"][0]["allocatedMemGiB"] == 3
    assert report["gpus"][0]["pods"][0]["pod"] == "default/m"
    assert client.get("/inspect/nope").status_code == 404
    assert [n["name"] for n in client.get("/inspect").json()["nodes"]] == ["n"]

    text = client.get("/metrics").text
    assert 'gpushare_extender_request_duration_seconds_count{verb="filter"}' in text
    assert 'gpushare_extender_binds_total{result="bound"} 1.0' in text
    assert 'gpushare_scheduler_gpu_memory_allocated_gib{gpu="0",node="n"' in text
    assert "gpushare_scheduler_gpu_core_allocated_percent" in text


class _SlowCluster(MemoryCluster):
    """An API server whose first pod listing waits until the test lets it answer."""

    def __init__(self) -> None:
        super().__init__()
        self.answer = threading.Event()

    def list_pods(self, node_name=None):
        self.answer.wait(10)
        return super().list_pods(node_name)


def test_ready_only_after_the_first_full_sync():
    cluster = _SlowCluster()
    cluster.add_node(node("n", "1x16GiB"))
    service = ExtenderService(cluster, ExtenderConfig()).start_watching()
    server = HttpServer(service.app()).start()
    try:
        with httpx.Client(base_url=server.url) as client:
            assert client.get("/healthz").status_code == 200
            response = client.get("/readyz")
            assert response.status_code == 503
            assert "waiting" in response.json()["status"]
            cluster.answer.set()
            assert service.wait_synced(10)
            assert client.get("/readyz").status_code == 200
    finally:
        cluster.answer.set()
        server.stop()
        service.stop_watching()


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_a_broken_pod_before_a_candidate_list_seen_before_is_a_400(running, verb):
    client, _ = running
    names = ',"NodeNames":["n"]}'
    good = json.dumps({"Pod": pod_json(pod("p", mem=1)), "Nodes": None}, separators=(",", ":"))
    assert client.post(f"{PREFIX}/{verb}", content=good[:-1] + names).status_code == 200
    response = client.post(f"{PREFIX}/{verb}", content='{"Pod":{"metadata":{}}' + names)
    assert response.status_code == 400, response.text
    assert "Pod.metadata.name: Field required" in response.json()["Error"]
