"""The same extender over KubeCluster: scheduler JSON in, Kubernetes API calls out."""

import httpx
from kubernetes import client

from extender.server import HttpServer
from extender.service import ExtenderConfig, ExtenderService
from gpushare import annotation
from gpushare.cluster.memory import MemoryCluster
from kubecluster import KubeCluster
from tests.builders import node, pod
from tests.extender.harness import PREFIX, pod_json, wait_until
from tests.kubecluster.apiserver import ApiServer


def test_filter_and_bind_through_the_kubernetes_api():
    memory = MemoryCluster()
    memory.add_node(node("n1", "2x16GiB"))
    memory.add_node(node("n2", "1x8GiB"))
    api = ApiServer(memory)
    configuration = client.Configuration()
    configuration.host = api.url
    kube = KubeCluster(client.ApiClient(configuration), watch_timeout_s=30)
    service = ExtenderService(kube, ExtenderConfig()).start_watching()
    server = HttpServer(service.app()).start()
    try:
        assert service.wait_synced(10)
        created = memory.create_pod(pod("p", mem=12))
        wait_until(lambda: created.key in service.cache.pods, what="the watch to see the pod")
        with httpx.Client(base_url=server.url + PREFIX) as http:
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
        assert api.seen("POST", "/binding") and api.events[-1]["reason"] == "GpuAllocated"
        wait_until(lambda: not service.cache.assumed, what="the watch to show the bind")
    finally:
        server.stop()
        service.stop_watching()
        api.close()
