"""The extender's metrics that the alerts read: admission errors, expired reservations and
each node's allocatable, each counted where it happens."""

import json

import httpx

from gpushare.cluster.memory import MemoryCluster
from gpushare.extender.binder import Binder
from gpushare.extender.cache import SchedulerCache
from gpushare.extender.metrics import ExtenderMetrics
from gpushare.extender.server import HttpServer
from gpushare.extender.service import ExtenderConfig, ExtenderService
from gpushare.extender.wire import BindingArgs, parse
from gpushare.resources import GPU_CORE, GPU_COUNT, GPU_MEM
from tests.builders import node, pod

JSON = {"Content-Type": "application/json"}


def test_a_malformed_or_oversized_review_counts_as_an_error_not_as_an_answer():
    service = ExtenderService(MemoryCluster(), ExtenderConfig())
    sample = service.metrics.registry.get_sample_value
    server = HttpServer(service.webhook_app()).start()
    try:
        with httpx.Client(base_url=server.url, headers=JSON) as client:
            assert client.post("/validate", content=b"{").status_code == 400
            assert client.post("/validate", content=b"{" * (8 << 20)).status_code == 413
            assert client.post("/mutate", content=b"[]").status_code == 400
    finally:
        server.stop()
    assert sample("gpushare_admission_errors_total", {"webhook": "validate"}) == 2
    assert sample("gpushare_admission_errors_total", {"webhook": "mutate"}) == 1
    assert (
        sample("gpushare_admission_reviews_total", {"webhook": "validate", "allowed": "true"}) == 0
    )


def test_a_reservation_the_watch_never_confirmed_counts_when_it_expires():
    cluster = MemoryCluster()
    cluster.add_node(node("n", "1x16GiB"))
    pods = [cluster.create_pod(pod(name, mem=2)) for name in ("a", "b")]
    cache = SchedulerCache(assume_ttl_s=0, clock=lambda: 100.0)
    cache.replace_nodes(cluster.list_nodes().items)
    cache.replace_pods(pods)  # and no watch: nothing the binds do reaches the cache
    metrics = ExtenderMetrics(cache)
    binder = Binder(cluster, cache, metrics, cluster.record_event)
    expired = "gpushare_extender_assumptions_expired_total"

    def bind(p) -> None:
        args = {"PodName": p.metadata.name, "PodNamespace": "default", "Node": "n"}
        assert binder.bind(parse(BindingArgs, json.dumps(args).encode())) == ""

    bind(pods[0])
    assert metrics.registry.get_sample_value(expired) == 0
    bind(pods[1])  # a bind first drops the reservations past their TTL: a's
    assert metrics.registry.get_sample_value(expired) == 1


def test_each_gpu_nodes_allocatable_is_shown_per_resource_0_when_absent():
    cache = SchedulerCache()
    advertising = node("ok", "2x16GiB", mode="core_mem")
    silent = node("silent", "1x16GiB")
    silent.status.allocatable.clear()  # the kubelet got nothing from its device plugin
    cache.replace_nodes([advertising, silent])
    cache.replace_pods([])
    sample = ExtenderMetrics(cache).registry.get_sample_value
    name = "gpushare_scheduler_node_gpu_allocatable"
    assert [
        sample(name, {"node": "ok", "resource": r}) for r in (GPU_MEM, GPU_COUNT, GPU_CORE)
    ] == [
        32,
        2,
        200,
    ]
    assert [sample(name, {"node": "silent", "resource": r}) for r in (GPU_MEM, GPU_COUNT)] == [0, 0]
