"""The admission webhook refuses what no node could ever give (issue 39): it runs in the
extender's process and asks its cache for the largest GPU and the most GPUs of the
nodes of each mode; it warns when no node of the mode a pod needs exists yet."""

import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpushare.cluster.memory import MemoryCluster
from gpushare.extender import webhook
from gpushare.extender.policychoice import PolicyChoice
from gpushare.extender.server import HttpServer
from gpushare.extender.service import ExtenderConfig, ExtenderService
from gpushare.extender.wire import AdmissionReview
from gpushare.objects import Pod
from tests.builders import container, node, pod
from tests.extender.harness import pod_json
from tests.extender.test_webhook import review
from tests.extender.tls import self_signed

SPLIT = "aliyun.com/gpu-count"


@pytest.fixture(scope="module")
def validate(tmp_path_factory) -> Iterator:
    """POSTs a pod to /validate of an extender over 16 GiB GPUs (4 on one cgpu node, 2
    on a share node); no core_mem node. Returns the response."""
    cluster = MemoryCluster()
    cluster.add_node(node("four", "4x16GiB", mode="cgpu"))
    cluster.add_node(node("two", "2x16GiB", mode="share"))
    cluster.add_node(node("plain", "1x80GiB", mode=None))
    cert, key = self_signed(Path(tmp_path_factory.mktemp("tls")))
    service = ExtenderService(cluster, ExtenderConfig(tls_cert_file=cert, tls_key_file=key))
    service.start_watching()
    assert service.wait_synced(10)
    server = HttpServer(service.webhook_app(), tls_cert_file=cert, tls_key_file=key).start()
    with httpx.Client(
        base_url=server.url, verify=ssl.create_default_context(cafile=cert)
    ) as client:

        def post(asking: Pod) -> dict:
            return client.post("/validate", json=review(pod_json(asking))).json()["response"]

        yield post
    server.stop()
    service.stop_watching()


def refused(response: dict) -> str:
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    return response["status"]["message"]


@pytest.mark.parametrize("mem", ["17", "100000000000000000000000"])
def test_more_memory_than_any_gpu_is_refused_with_the_largest_gpu(validate, mem):
    message = refused(validate(pod("big", mem=mem)))
    assert "[larger-than-any-gpu]" in message
    assert f"container 'main' asks for {mem} GiB on one GPU" in message
    assert "the largest GPU of any node in mode share or cgpu or core_mem has 16 GiB" in message


def test_a_split_larger_than_any_gpu_is_refused(validate):
    message = refused(validate(pod("split", mem=34, labels={SPLIT: "2"})))
    assert "asks for 17 GiB on each of 2 GPUs" in message and "[larger-than-any-gpu]" in message


def test_what_fits_the_largest_gpu_is_allowed(validate):
    assert validate(pod("full", mem=16)) == {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "allowed": True,
    }
    assert validate(pod("split", mem=64, labels={SPLIT: "4"}))["allowed"] is True
    assert validate(pod("whole", count=4))["allowed"] is True


@pytest.mark.parametrize(
    ("asking", "wants"),
    [
        (pod("whole", count=5), "5 whole GPUs"),
        (pod("split", mem=10, labels={SPLIT: "5"}), "2 GiB on each of 5 GPUs"),
    ],
)
def test_more_gpus_than_any_node_has_is_refused(validate, asking, wants):
    message = refused(validate(asking))
    assert f"container 'main' asks for {wants}" in message
    assert "no node in mode share or cgpu or core_mem has more than 4 GPUs" in message
    assert "[more-gpus-than-any-node]" in message


def test_every_container_beyond_every_node_is_named(validate):
    asking = pod("two", containers=[container("a", mem=20), container("b", count=6)])
    message = refused(validate(asking))
    assert "'a' asks for 20 GiB" in message and "'b' asks for 6 whole GPUs" in message


@pytest.mark.parametrize(
    "asking",
    [
        pod("zero", containers=[container("main", mem="0", count=1)]),
        pod("zero", containers=[container("main", mem="0", core=30)]),
    ],
)
def test_gpu_mem_zero_beside_other_gpushare_resources_is_refused(validate, asking):
    message = refused(validate(asking))
    assert "aliyun.com/gpu-mem: 0 asks for no GPU memory" in message
    assert "[gpu-mem-zero]" in message


def test_gpu_mem_zero_alone_asks_for_nothing_and_is_allowed(validate):
    assert validate(pod("zero", mem="0"))["allowed"] is True


def test_a_pod_needing_a_mode_no_node_has_is_admitted_with_a_warning(validate):
    answer = validate(pod("compute", mem=2, core=30))
    assert answer["allowed"] is True
    (warning,) = answer["warnings"]
    assert warning.startswith("no node in mode core_mem is known yet")
    assert "ack.node.gpu.schedule=core_mem" in warning


def test_an_extender_that_has_not_listed_nodes_refuses_nothing_for_want_of_one():
    body = AdmissionReview.model_validate(review(pod_json(pod("big", mem=17))))
    answer = webhook.validate(body, ["gpushare-scheduler"], PolicyChoice(default="binpack"), None)
    assert answer["response"]["allowed"] is True and "warnings" not in answer["response"]
