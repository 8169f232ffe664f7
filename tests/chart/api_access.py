"""What a component asks of the API server, derived from its code.

A component reaches the API only through the cluster ports (`gpushare.cluster.Cluster`
and, for resource.k8s.io, `gpushare.cluster.DraCluster`), whose Kubernetes adapter is
`KubeCluster`. So what it needs is:

- which port methods its package calls: read from its source (every attribute of a
  receiver named `cluster`, `_cluster`, `self.cluster`, or `dra`, `self._dra` ... that
  names a port method, called or handed on, as the watch caches get `cluster.list_pods`);
- which requests the adapter makes for each method: recorded from the adapter itself,
  talking through the official client to a stand-in server that answers every request
  alike, once with each status the adapter treats apart (200, 404, 409, 410), so the
  requests of its error paths count too (a conflicting bind reads the pod again);
- each request as RBAC sees it: (API group, resource[/subresource], verb), resolved
  from its method and path the way the API server does (GET of a collection is list,
  or watch with ?watch=true).
"""

import ast
import contextlib
import inspect
import io
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import parse_qs, urlsplit

import urllib3
from kubernetes import client

from gpushare.cluster import Cluster, ClusterError, DraCluster, EventSeverity, ObjectRef
from gpushare.dra.objects import (
    ObjectMeta,
    ResourceClaimTemplate,
    ResourcePool,
    ResourceSlice,
    ResourceSliceSpec,
)
from gpushare.kubecluster import KubeCluster

SRC = Path(__file__).resolve().parents[2] / "src" / "gpushare"


class Grant(NamedTuple):
    group: str
    resource: str
    """With its subresource, as RBAC names it: pods/binding."""
    verb: str


def _public(cls: type) -> set[str]:
    return {name for name, _ in inspect.getmembers(cls, inspect.isfunction) if name[0] != "_"}


PORT_METHODS = frozenset(_public(Cluster) | _public(DraCluster) | _public(KubeCluster))
"""The ports' methods and the adapter's own (what `uninstall-cleanup` deletes)."""

ANSWERS = (200, 404, 409, 410)

SAMPLE_ARGUMENTS: Mapping[str, Any] = {
    "name": "node-a",
    "namespace": "ns",
    "node_name": "node-a",
    "resource_version": "7",
    "annotations": {"example.com/key": "value"},
    "uid": "uid-1",
    "ref": ObjectRef("Pod", "pod-a", "ns", "uid-1"),
    "severity": EventSeverity.NORMAL,
    "reason": "Reason",
    "message": "message",
    "driver": "gpu.gpushare.io",
    "resource_slice": ResourceSlice(
        metadata=ObjectMeta(name="node-a-gpu.gpushare.io-x"),
        spec=ResourceSliceSpec(
            driver="gpu.gpushare.io",
            pool=ResourcePool(name="node-a", resource_slice_count=1),
            node_name="node-a",
        ),
    ),
    "template": ResourceClaimTemplate(metadata=ObjectMeta(name="gpushare-x", namespace="ns")),
}
"""An argument for each parameter name of a port method. A method with a parameter
not named here fails `adapter_grants`: add it, and the method's requests are derived."""

_ANSWER_BODY = json.dumps(
    {
        "kind": "Status",
        "message": "pod ns/pod-a is already bound",
        "items": [],
        "metadata": {"resourceVersion": "7"},
    }
).encode()
"""One body read as what each call expects: a Status, an empty list, a watch line."""


class _RecordingPool:
    """Stands in for the client's urllib3 pool: records each request, answers `status`."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.requests: list[tuple[str, str]] = []

    def request(self, method: str, url: str, **_: Any) -> urllib3.HTTPResponse:
        self.requests.append((method, url))
        return urllib3.HTTPResponse(
            body=io.BytesIO(_ANSWER_BODY),
            status=self.status,
            headers={"content-type": "application/json"},
            preload_content=False,
        )


def grant_of(method: str, url: str) -> Grant:
    """The RBAC attributes of one request, as the API server resolves them."""
    parts = urlsplit(url)
    segments = [s for s in parts.path.split("/") if s]
    if segments[0] == "api":  # /api/v1/...: the core group
        group, rest = "", segments[2:]
    else:  # /apis/<group>/<version>/...
        group, rest = segments[1], segments[3:]
    if rest[0] == "namespaces" and len(rest) > 2:  # a namespaced resource, not a namespace
        rest = rest[2:]
    resource = "/".join([rest[0], *rest[2:3]])
    named = len(rest) > 1
    if method == "GET":
        watch = parse_qs(parts.query).get("watch") in (["true"], ["1"])
        verb = "get" if named else "watch" if watch else "list"
    elif method == "DELETE":
        verb = "delete" if named else "deletecollection"
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}[method]
    return Grant(group, resource, verb)


def adapter_requests(method: str) -> list[tuple[str, str]]:
    """Every (HTTP method, URL) `KubeCluster.<method>` sends, over all ANSWERS."""
    seen: list[tuple[str, str]] = []
    for status in ANSWERS:
        configuration = client.Configuration()
        configuration.host = "https://api.invalid"
        api = client.ApiClient(configuration)
        pool = _RecordingPool(status)
        api.rest_client.pool_manager = pool
        call = getattr(KubeCluster(api), method)
        parameters = inspect.signature(call).parameters
        missing = set(parameters) - set(SAMPLE_ARGUMENTS)
        assert not missing, f"KubeCluster.{method}: no sample argument for {sorted(missing)}"
        # A refusal ends as the port's error; the requests made are recorded all the same.
        with contextlib.suppress(ClusterError):
            call(**{p: SAMPLE_ARGUMENTS[p] for p in parameters})
        seen.extend(pool.requests)
    return seen


def adapter_grants(method: str) -> frozenset[Grant]:
    return frozenset(grant_of(m, url) for m, url in adapter_requests(method))


def _names_a_cluster(receiver: ast.expr) -> bool:
    """`cluster`, `self._cluster`, `kube_cluster` ...; `dra`, `self._dra` (DraCluster)."""
    if isinstance(receiver, ast.Name):
        name = receiver.id.lower()
    elif isinstance(receiver, ast.Attribute):
        name = receiver.attr.lower()
    else:
        return False
    return name.endswith("cluster") or name.lstrip("_") == "dra"


def port_references(source: str) -> tuple[set[str], set[str]]:
    """(port methods referenced on a cluster, port method names referenced on anything
    else) in one module's source."""
    on_cluster: set[str] = set()
    elsewhere: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in PORT_METHODS:
            (on_cluster if _names_a_cluster(node.value) else elsewhere).add(node.attr)
    return on_cluster, elsewhere


def modules(package: str) -> list[Path]:
    return sorted((SRC / package).rglob("*.py"))


def port_calls(package: str) -> set[str]:
    """The port methods the package `gpushare.<package>` uses."""
    found: set[str] = set()
    for path in modules(package):
        found |= port_references(path.read_text())[0]
    return found


def needed(package: str) -> frozenset[Grant]:
    """What the package's code asks of the API server."""
    return frozenset(g for method in port_calls(package) for g in adapter_grants(method))


def rule_grants(rules: Iterable[Mapping[str, Any]]) -> frozenset[Grant]:
    """What RBAC rules allow, one Grant per group, resource and verb they name."""
    grants: set[Grant] = set()
    for rule in rules:
        assert "resourceNames" not in rule, f"a rule limited by name: {rule}"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                grants |= {Grant(group, resource, verb) for verb in rule["verbs"]}
    return frozenset(grants)


def difference(granted: frozenset[Grant], wanted: frozenset[Grant]) -> str:
    """Says which rules miss a call and which calls miss a rule, for a failing compare."""
    return (
        f"calls without a rule: {sorted(wanted - granted)}; "
        f"rules without a call: {sorted(granted - wanted)}"
    )
