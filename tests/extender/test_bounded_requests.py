"""Whatever a client sends, every endpoint we serve answers 200 or a 4xx naming the
field or the limit, in the shape its caller reads, and never a 5xx: random JSON in
the shapes of each request, hostile nesting, bad UTF-8, wrong content types,
oversized and truncated bodies. Over the real server on loopback, sent whole: these
are about what the apps make of a body; test_slow_and_large_requests is about how
the server reads one."""

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpushare.cluster.memory import MemoryCluster
from gpushare.extender import limits
from gpushare.extender.server import HttpServer
from gpushare.extender.service import ExtenderConfig, ExtenderService
from tests.builders import node, pod
from tests.extender.harness import PREFIX, pod_json

JSON_HEADERS = {"Content-Type": "application/json"}

# Per endpoint: its path, the body limit it must name, and where its callers read an error.
ENDPOINTS = {
    "filter": (f"{PREFIX}/filter", limits.EXTENDER_ARGS_MAX, "Error"),
    "prioritize": (f"{PREFIX}/prioritize", limits.EXTENDER_ARGS_MAX, "Error"),
    "bind": (f"{PREFIX}/bind", limits.BINDING_ARGS_MAX, "Error"),
    "preempt": (f"{PREFIX}/preempt", limits.PREEMPTION_ARGS_MAX, "Error"),
    "validate": ("/validate", limits.ADMISSION_REVIEW_MAX, "message"),
    "mutate": ("/mutate", limits.ADMISSION_REVIEW_MAX, "message"),
}


@pytest.fixture(scope="module")
def clients() -> Iterator[dict[str, httpx.Client]]:
    cluster = MemoryCluster()
    cluster.add_node(node("n1", "2x16GiB"))
    cluster.create_pod(pod("pending", mem=4))  # a bind naming it binds it
    service = ExtenderService(cluster, ExtenderConfig()).start_watching()
    assert service.wait_synced(10)
    servers = [HttpServer(service.app()).start(), HttpServer(service.webhook_app()).start()]
    extender, webhook = (httpx.Client(base_url=server.url, timeout=30) for server in servers)
    yield {verb: webhook if verb in ("validate", "mutate") else extender for verb in ENDPOINTS}
    for server in servers:
        server.stop()
    service.stop_watching()


def post(clients: dict[str, httpx.Client], verb: str, body: bytes, **headers: str) -> Any:
    path = ENDPOINTS[verb][0]
    return clients[verb].post(path, content=body, headers={**JSON_HEADERS, **headers})


def refusal(response: Any, verb: str) -> str:
    """The error a refused request carries where its caller reads it, checked to be one."""
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])
    key = ENDPOINTS[verb][2]
    message: str = response.json()[key]
    assert message.startswith(f"{verb}: ") and len(message) > len(verb) + 2, message
    if key == "message":  # a metav1.Status, which the API server turns into its error
        assert response.json()["code"] == response.status_code
    return message


def assert_answered(response: Any, verb: str) -> None:
    """200 in the answer shape of the verb, or a 4xx that names a field or the JSON."""
    if response.status_code != 200:
        message = refusal(response, verb)
        assert response.status_code == 400
        assert re.search(r"[\w\]]: |not valid JSON", message), message
        return
    answer = response.json()
    if verb == "filter":
        assert set(answer) >= {"NodeNames", "FailedNodes", "Error"}
    elif verb == "prioritize":
        assert all(set(h) == {"Host", "Score"} and 0 <= h["Score"] <= 10 for h in answer)
    elif verb == "bind":
        assert isinstance(answer["Error"], str)
    elif verb == "preempt":
        assert isinstance(answer["NodeNameToMetaVictims"], dict)
    else:
        assert isinstance(answer["response"]["allowed"], bool)


# ----- random requests in the shapes of each verb's body

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
    | st.sampled_from(["1", "0", "-1", "1.5", "1e3", "50", "100m", "2Gi", "²", "n1", "Pod"])
)
anything = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


def maybe(keys: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """Objects with any subset of `keys`, each either its plausible value or anything."""
    return st.fixed_dictionaries({}, optional={k: v | anything for k, v in keys.items()})


resources = maybe(
    {
        "limits": st.dictionaries(
            st.sampled_from(
                ["aliyun.com/gpu-mem", "aliyun.com/gpu-count", "aliyun.com/gpu-core.percentage"]
            ),
            scalars,
        ),
        "requests": st.dictionaries(st.sampled_from(["aliyun.com/gpu-mem", "cpu"]), scalars),
    }
)
containers = st.lists(maybe({"name": st.text(max_size=5), "resources": resources}), max_size=3)
pods = maybe(
    {
        "metadata": maybe(
            {
                "name": st.text(max_size=8),
                "namespace": st.text(max_size=8),
                "uid": st.text(max_size=8),
                "labels": st.dictionaries(st.sampled_from(["aliyun.com/gpu-count"]), scalars),
                "annotations": st.dictionaries(
                    st.sampled_from(["gpushare.io/placement-policy", "gpushare.io/allocation"]),
                    scalars,
                ),
            }
        ),
        "spec": maybe(
            {
                "containers": containers,
                "initContainers": containers,
                "schedulerName": st.text(max_size=8),
                "priority": scalars,
            }
        ),
        "status": anything,
    }
)
names = st.lists(st.sampled_from(["n1", "n2", ""]) | st.text(max_size=6), max_size=5)
meta_victims = maybe(
    {"Pods": st.lists(maybe({"UID": st.text(max_size=8)}), max_size=3), "NumPDBViolations": scalars}
)
BODIES = {
    "filter": maybe(
        {
            "Pod": pods,
            "NodeNames": names,
            "Nodes": maybe({"items": st.lists(maybe({"metadata": maybe({"name": scalars})}))}),
        }
    ),
    "bind": maybe(
        {
            "PodName": st.sampled_from(["pending", "ghost"]),
            "PodNamespace": st.sampled_from(["default", ""]),
            "PodUID": st.text(max_size=8),
            "Node": st.sampled_from(["n1", "n2"]),
        }
    ),
    "preempt": maybe(
        {
            "Pod": pods,
            "NodeNameToMetaVictims": st.dictionaries(names.map(str), meta_victims, max_size=3),
            "NodeNameToVictims": st.dictionaries(
                st.text(max_size=4), maybe({"Pods": st.lists(pods, max_size=2)}), max_size=2
            ),
        }
    ),
    "validate": maybe(
        {
            "apiVersion": st.just("admission.k8s.io/v1"),
            "kind": st.just("AdmissionReview"),
            "request": maybe(
                {
                    "uid": st.text(max_size=8),
                    "kind": maybe({"kind": st.sampled_from(["Pod", "Node"])}),
                    "operation": st.sampled_from(["CREATE", "UPDATE", "DELETE", ""]),
                    "namespace": st.text(max_size=6),
                    "object": pods,
                }
            ),
        }
    ),
}
BODIES["prioritize"] = BODIES["filter"]
BODIES["mutate"] = BODIES["validate"]

SHAPED_EXAMPLES = 120
"""Per endpoint: six endpoints, about 1.5 s each on this machine."""


@pytest.mark.parametrize("verb", ENDPOINTS)
def test_random_bodies_in_each_verbs_shape_are_answered_or_refused_naming_the_field(clients, verb):
    @settings(
        max_examples=SHAPED_EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(body=BODIES[verb] | anything)
    def check(body: Any) -> None:
        assert_answered(post(clients, verb, json.dumps(body).encode()), verb)

    check()


@pytest.mark.parametrize("verb", ENDPOINTS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.binary(max_size=200))
def test_random_bytes_are_answered_or_refused_naming_the_field(clients, verb, body):
    assert_answered(post(clients, verb, body), verb)


# ----- hostile bodies, each against every endpoint

DEEP = 100_000


@pytest.mark.parametrize("verb", ENDPOINTS)
@pytest.mark.parametrize(
    "body",
    [
        b"[" * DEEP + b"]" * DEEP,
        b'{"Pod":' + b"[" * DEEP + b"]" * DEEP + b"}",
        b'{"Pod":{"metadata":{"name":"p"}},"NodeNames":' + b"[" * DEEP + b"]" * DEEP + b"}",
        b'{"Pod":{"metadata":{"name":"p"}},"NodeNames":' + b"[" * 300 + b"]" * 300 + b"}",
        b'{"request":{"uid":"u","object":' + b'{"a":' * DEEP + b"1" + b"}" * DEEP + b"}}",
    ],
    ids=["lists", "in-pod", "in-node-names", "node-names-300", "objects-in-review"],
)
def test_deep_nesting_is_a_400_naming_the_json(clients, verb, body):
    response = post(clients, verb, body)
    message = refusal(response, verb)
    if len(body) > ENDPOINTS[verb][1]:  # bind's limit is smaller than these bodies
        assert response.status_code == 413 and "limit of" in message
    else:
        assert response.status_code == 400
        assert "not valid JSON" in message and "recursion limit" in message


@pytest.mark.parametrize("verb", ENDPOINTS)
@pytest.mark.parametrize("element", [0, "n1", [], {}])
def test_huge_arrays_are_answered_or_refused_never_a_5xx(clients, verb, element):
    body = json.dumps({"Pod": pod_json(pod("p", mem=1)), "NodeNames": [element] * 20_000})
    response = post(clients, verb, body.encode())
    if len(body) > ENDPOINTS[verb][1]:  # bind's
        assert response.status_code == 413
    else:
        assert_answered(response, verb)


@pytest.mark.parametrize("verb", ENDPOINTS)
@pytest.mark.parametrize(
    "body", [b'{"Pod": "\xff\xfe"}', b'"\xed\xa0\x80"', b'{"NodeNames": ["\\ud800"]}']
)
def test_bad_utf8_and_lone_surrogates_are_a_400(clients, verb, body):
    response = post(clients, verb, body)
    assert response.status_code == 400 or verb in ("bind", "validate", "mutate"), response.text
    assert_answered(response, verb)


@pytest.mark.parametrize("verb", ENDPOINTS)
@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", ""],
)
def test_a_body_that_is_not_declared_json_is_a_415_naming_the_type(clients, verb, content_type):
    response = clients[verb].post(
        ENDPOINTS[verb][0], content=b"{}", headers={"Content-Type": content_type}
    )
    assert response.status_code == 415
    assert "Content-Type must be application/json" in refusal(response, verb)


@pytest.mark.parametrize("verb", ENDPOINTS)
def test_json_with_parameters_is_json(clients, verb):
    response = post(clients, verb, b"{}", **{"Content-Type": "Application/JSON; charset=utf-8"})
    assert response.status_code == 400  # read, and refused for its content


@pytest.mark.parametrize("verb", ENDPOINTS)
def test_a_body_over_the_endpoints_limit_is_a_413_naming_it(clients, verb):
    limit = ENDPOINTS[verb][1]
    response = post(clients, verb, b" " * (limit + 1))
    assert response.status_code == 413
    assert f"limit of {limit} bytes" in refusal(response, verb)
    # Its body was left unread, so the server closes the connection and says so: a
    # pooled client that reused it would see its next request reset.
    assert response.headers["connection"] == "close"
    assert post(clients, verb, b"{}").status_code == 400


@pytest.mark.parametrize("verb", ["filter", "validate"])
def test_a_body_of_the_wrong_type_keeps_the_connection(clients, verb):
    response = post(clients, verb, b"{}", **{"Content-Type": "text/plain"})
    assert response.status_code == 415
    assert response.headers.get("connection") != "close"


@pytest.mark.parametrize("verb", ENDPOINTS)
def test_a_body_at_the_limit_is_read(clients, verb):
    body = b"{}"
    padded = body + b" " * (ENDPOINTS[verb][1] - len(body))  # JSON allows trailing space
    assert post(clients, verb, padded).status_code == 400  # read: refused for what it says


@pytest.mark.parametrize("verb", ENDPOINTS)
def test_a_truncated_body_is_a_400_naming_the_json(clients, verb):
    whole = json.dumps({"Pod": pod_json(pod("p", mem=1)), "NodeNames": ["n1"]}).encode()
    message = refusal(post(clients, verb, whole[: len(whole) // 2]), verb)
    assert "not valid JSON" in message


# ----- the limits are the largest legitimate requests, with room to spare


def test_a_large_realistic_filter_request_is_far_under_its_limit():
    """A pod with 4 containers, 50 environment variables each and managedFields-sized
    metadata, and 5,000 node names of 40 characters: what a big cluster sends."""
    big = pod_json(pod("trainer", mem=8))
    big["metadata"]["annotations"] = {f"example.com/key-{i}": "v" * 200 for i in range(50)}
    big["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:x": {}}}] * 20
    spec = big["spec"]["containers"][0]
    spec["env"] = [{"name": f"VAR_{i}", "value": "x" * 100} for i in range(50)]
    big["spec"]["containers"] = [dict(spec, name=f"c{i}") for i in range(4)]
    node_names = [f"gpu-node-{i:05d}.cluster-a.example.internal"[:40] for i in range(5000)]
    body = json.dumps({"Pod": big, "Nodes": None, "NodeNames": node_names}).encode()
    assert len(body) * 4 < limits.EXTENDER_ARGS_MAX
    largest_names = 5000 * (limits.NAME_MAX + 3)
    assert limits.OBJECT_JSON_MAX + largest_names <= limits.EXTENDER_ARGS_MAX
