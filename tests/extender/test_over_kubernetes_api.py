"""The same extender over KubeCluster: scheduler JSON in, Kubernetes API calls out."""

import logging
import re
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
from kubernetes import client

from gpushare import annotation
from gpushare.cluster.memory import MemoryCluster
from gpushare.extender.app import BINDS_AT_ONCE
from gpushare.extender.requeue import REQUEUED_AT_ANNOTATION
from gpushare.extender.server import HttpServer
from gpushare.extender.service import API_CONNECTIONS, ExtenderConfig, ExtenderService
from gpushare.kubecluster import KubeCluster
from tests.builders import node, pod
from tests.extender.harness import PREFIX, pod_json, wait_until
from tests.kubecluster.apiserver import ApiServer


@contextmanager
def extender_over(api: ApiServer, kube: KubeCluster) -> Iterator[tuple[ExtenderService, str]]:
    """The extender watching `api` through `kube`, serving on loopback, synced; yields the
    service and its URL, and stops all three afterwards."""
    service = ExtenderService(kube, ExtenderConfig()).start_watching()
    server = HttpServer(service.app()).start()
    try:
        assert service.wait_synced(10)
        yield service, server.url
    finally:
        server.stop()
        service.stop_watching()
        api.close()


def kube_of(api: ApiServer) -> KubeCluster:
    configuration = client.Configuration()
    configuration.host = api.url
    return KubeCluster(client.ApiClient(configuration), watch_timeout_s=30)


def test_filter_and_bind_through_the_kubernetes_api():
    memory = MemoryCluster()
    memory.add_node(node("n1", "2x16GiB"))
    memory.add_node(node("n2", "1x8GiB"))
    api = ApiServer(memory)
    with extender_over(api, kube_of(api)) as (service, url):
        created = memory.create_pod(pod("p", mem=12))
        wait_until(
            lambda: service.cache.pod(created.key) is not None, what="the watch to see the pod"
        )
        with httpx.Client(base_url=url + PREFIX) as http:
            args = {"Pod": pod_json(created), "Nodes": None, "NodeNames": ["n1", "n2"]}
            answer = http.post("/filter", json=args).json()
            assert answer["NodeNames"] == ["n1"]
            assert "[gpu-too-small]" in answer["FailedAndUnresolvableNodes"]["n2"]
            bind = {
                "PodName": "p",
                "PodNamespace": "default",
                "PodUID": created.metadata.uid,
                "Node": "n1",
            }
            assert http.post("/bind", json=bind).json() == {"Error": ""}
        bound = memory.get_pod("default", "p")
        assert bound.spec.node_name == "n1"
        assert annotation.decode(bound).total_mem == 12
        assert api.seen("POST", "/binding")
        assert service.events.flush(10), "the GpuAllocated event was not posted"
        assert api.events[-1]["reason"] == "GpuAllocated"
        wait_until(
            lambda: not list(service.cache.details().assumed), what="the watch to show the bind"
        )


def test_a_burst_of_binds_keeps_every_api_connection(tmp_path, caplog):
    """As many binds as run at once, all waiting on the API server together, beside
    the two watches: the client's pool keeps every connection for reuse."""
    memory = MemoryCluster()
    names = [f"n{i:02}" for i in range(BINDS_AT_ONCE)]
    for name in names:
        memory.add_node(node(name, "1x16GiB"))
    pods = [memory.create_pod(pod(f"p{i:02}", mem=4)) for i in range(BINDS_AT_ONCE)]
    api = ApiServer(memory)
    together = threading.Barrier(BINDS_AT_ONCE, timeout=20)
    handle = api.handle

    def binding_waits_for_the_others(method, path, query, body):
        if path.endswith("/binding"):
            together.wait()
        return handle(method, path, query, body)

    api.handle = binding_waits_for_the_others
    kube = KubeCluster.from_config(
        str(api.write_kubeconfig(tmp_path / "kubeconfig")), connections=API_CONNECTIONS
    )
    caplog.set_level(logging.WARNING, logger="urllib3")
    with extender_over(api, kube) as (service, url):
        wait_until(
            lambda: service.cache.counts().pods == len(pods), what="the watch to see the pods"
        )

        def bind(i: int) -> dict:
            meta = pods[i].metadata
            body = {"PodName": meta.name, "PodNamespace": "default", "PodUID": meta.uid}
            return http.post("/bind", json={**body, "Node": names[i]}).json()

        with (
            httpx.Client(base_url=url + PREFIX, timeout=30) as http,
            ThreadPoolExecutor(BINDS_AT_ONCE) as pool,
        ):
            answers = list(pool.map(bind, range(BINDS_AT_ONCE)))
        assert answers == [{"Error": ""}] * BINDS_AT_ONCE
        assert all(memory.get_pod("default", p.metadata.name).spec.node_name for p in pods)
    assert not [r.getMessage() for r in caplog.records if "pool is full" in r.getMessage()]


def test_the_requeue_nudge_is_a_merge_patch_of_one_annotation():
    memory = MemoryCluster()
    memory.add_node(node("n1", "1x16GiB"))
    api = ApiServer(memory)
    with extender_over(api, kube_of(api)) as (service, url):
        holder = memory.create_pod(pod("holder", mem=16))
        waiter = memory.create_pod(pod("waiter", mem=16))
        wait_until(
            lambda: service.cache.pod(waiter.key) is not None, what="the watch to see the pods"
        )
        with httpx.Client(base_url=url + PREFIX) as http:
            meta = holder.metadata
            bind = {"PodName": "holder", "PodNamespace": "default", "PodUID": meta.uid}
            assert http.post("/bind", json={**bind, "Node": "n1"}).json() == {"Error": ""}
            wait_until(
                lambda: not list(service.cache.details().assumed), what="the watch to show the bind"
            )
            args = {"Pod": pod_json(waiter), "Nodes": None, "NodeNames": ["n1"]}
            assert http.post("/filter", json=args).json()["NodeNames"] == []
        memory.delete_pod("default", "holder")
        wait_until(lambda: api.seen("PATCH"), what="the requeue patch")
        [patch] = api.seen("PATCH")
        assert patch.path == "/api/v1/namespaces/default/pods/waiter"
        assert patch.content_type == "application/merge-patch+json"
        assert list(patch.body) == ["metadata"] and list(patch.body["metadata"]) == ["annotations"]
        [(key, stamp)] = patch.body["metadata"]["annotations"].items()
        assert key == REQUEUED_AT_ANNOTATION == "gpushare.io/requeued-at"
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", stamp)
        assert memory.get_pod("default", "waiter").metadata.annotations[key] == stamp
