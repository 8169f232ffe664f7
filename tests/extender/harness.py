"""The extender as kube-scheduler meets it: the real HTTP server on loopback over a
MemoryCluster, spoken to with the JSON of the extender API (docs/contracts.md#extender-json)."""

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import httpx

from gpushare import annotation
from gpushare.allocation import PodAllocation
from gpushare.cluster import ClusterError, EventSeverity, ObjectRef
from gpushare.cluster.memory import MemoryCluster, RecordedEvent
from gpushare.extender.server import HttpServer
from gpushare.extender.service import ExtenderConfig, ExtenderService
from gpushare.objects import Pod
from gpushare.placement.policies import POLICIES, PolicyFactory

PREFIX = "/gpushare-scheduler"


def wait_until(condition: Callable[[], object], timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        time.sleep(0.005)


def pod_json(pod: Pod) -> dict[str, Any]:
    """A v1.Pod as the scheduler sends it: camelCase, status present."""
    manifest = pod.to_manifest()
    manifest.setdefault("status", {})
    return manifest


class RefusingEvents(MemoryCluster):
    """Refuses the events of the pod with this name, as an API server whose RBAC or
    admission forbids them; posts the others."""

    def __init__(self, refused: str) -> None:
        super().__init__()
        self.refused = refused

    def record_event(
        self, ref: ObjectRef, severity: EventSeverity, reason: str, message: str
    ) -> None:
        if ref.name == self.refused:
            raise ClusterError("events is forbidden")
        super().record_event(ref, severity, reason, message)


class Scheduler:
    """Speaks to one running extender the way kube-scheduler does."""

    def __init__(
        self,
        cluster: MemoryCluster,
        config: ExtenderConfig | None = None,
        policies: Mapping[str, PolicyFactory] = POLICIES,
    ) -> None:
        self.cluster = cluster
        self.service = ExtenderService(cluster, config or ExtenderConfig(), policies)
        self.service.start_watching()
        assert self.service.wait_synced(10), "the extender did not sync"
        self.server = HttpServer(self.service.app()).start()
        self.http = httpx.Client(base_url=self.server.url + PREFIX, timeout=30)

    def close(self) -> None:
        self.http.close()
        self.server.stop()
        self.service.stop_watching()

    def post(self, verb: str, body: Any) -> httpx.Response:
        return self.http.post(f"/{verb}", json=body)

    def filter(self, pod: Pod, nodes: Iterable[str] | None = None) -> dict[str, Any]:
        names = list(nodes) if nodes is not None else self.node_names()
        response = self.post("filter", {"Pod": pod_json(pod), "Nodes": None, "NodeNames": names})
        assert response.status_code == 200, response.text
        return response.json()

    def prioritize(
        self, pod: Pod, nodes: Iterable[str], verb: str = "prioritize"
    ) -> dict[str, int]:
        """`verb`: prioritize-claims for DRA mode's second extender entry."""
        body = {"Pod": pod_json(pod), "Nodes": None, "NodeNames": list(nodes)}
        response = self.post(verb, body)
        assert response.status_code == 200, response.text
        answer = response.json()
        assert isinstance(answer, list)
        return {item["Host"]: item["Score"] for item in answer}

    def bind(self, pod: Pod, node: str) -> str:
        meta = pod.metadata
        body = {
            "PodName": meta.name,
            "PodNamespace": meta.namespace,
            "PodUID": meta.uid,
            "Node": node,
        }
        response = self.post("bind", body)
        assert response.status_code == 200, response.text
        return response.json()["Error"]

    def schedule(self, pod: Pod) -> str | dict[str, str]:
        """filter → prioritize (best score, ties by name) → bind; the node, or the reasons."""
        answer = self.filter(pod)
        passed = answer["NodeNames"]
        if not passed:
            return {**answer["FailedNodes"], **answer["FailedAndUnresolvableNodes"]}
        scores = self.prioritize(pod, passed) if len(passed) > 1 else {passed[0]: 0}
        node = min(passed, key=lambda n: (-scores[n], n))
        error = self.bind(pod, node)
        assert error == "", error
        return node

    def posted_events(self, reason: str) -> list[RecordedEvent]:
        """The events of `reason` on the cluster, once those the extender queued (bind's,
        posted after it answers) are posted."""
        assert self.service.events.flush(10), "the extender's queued events were not posted"
        return [e for e in self.cluster.events if e.reason == reason]

    def node_names(self) -> list[str]:
        return sorted(node.name for node in self.cluster.list_nodes().items)

    def submit(self, pod: Pod) -> Pod:
        """Creates the pod and waits until the extender's watch has seen it."""
        created = self.cluster.create_pod(pod)
        wait_until(
            lambda: self.service.cache.pod(created.key) is not None, what=f"{created.key} seen"
        )
        return created


def allocation_of(cluster: MemoryCluster, namespace: str, name: str) -> PodAllocation | None:
    return annotation.decode(cluster.get_pod(namespace, name))
