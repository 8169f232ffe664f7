"""The ACK request a DRA-mode pod was rewritten from, read back for the extender's node
scores, and trusted only as far as the claim the pod really has."""

import pytest

from gpushare.dra.ackresources import ACK_RESOURCES, MAX_ANNOTATION, rewritten_request
from gpushare.errors import PodRefused
from gpushare.objects import Pod
from gpushare.request import parse_pod_request, requests_gpu
from tests.builders import container, pod
from tests.dra.rewrite import rewritten


def _annotated(p: Pod, value: str) -> Pod:
    annotations = {**p.metadata.annotations, ACK_RESOURCES: value}
    return p.model_copy(
        update={"metadata": p.metadata.model_copy(update={"annotations": annotations})}
    )


@pytest.mark.parametrize(
    "original",
    [
        pod("slice", mem=4, core=30),
        pod("whole", count=2),
        pod(
            "two",
            containers=[container("gpu-a", 3), container("logger"), container("gpu-b", 5)],
            init_containers=[container("warm", 2)],
        ),
    ],
    ids=["memory-and-cores", "whole-gpus", "several-containers"],
)
def test_the_request_read_back_is_the_one_the_pod_was_made_with(original):
    pod_now = rewritten(original)
    assert not requests_gpu(pod_now)
    assert rewritten_request(pod_now) == parse_pod_request(original)


def test_the_annotation_names_only_what_was_taken_out():
    pod_now = rewritten(pod("p", containers=[container("gpu", 3, 20), container("logger")]))
    # Compact and in a fixed order: one request, one text, well inside the bound.
    assert pod_now.metadata.annotations[ACK_RESOURCES] == (
        '{"gpu":{"aliyun.com/gpu-core.percentage":"20","aliyun.com/gpu-mem":"3"}}'
    )


def test_an_annotation_asking_more_than_the_claim_is_not_believed():
    # The pod's author writes its annotations: 14 GiB said, the claim asks 1.
    forged = _annotated(rewritten(pod("small", mem=1)), '{"main":{"aliyun.com/gpu-mem":"14"}}')
    assert rewritten_request(forged) is None


def test_an_annotation_without_our_claim_is_not_believed():
    plain = _annotated(pod("plain"), '{"main":{"aliyun.com/gpu-mem":"4"}}')
    assert rewritten_request(plain) is None


def test_an_annotation_of_the_largest_length_read_is_still_read():
    pod_now = rewritten(pod("p", mem=4))
    text = pod_now.metadata.annotations[ACK_RESOURCES]
    padded = _annotated(pod_now, text + " " * (MAX_ANNOTATION - len(text)))
    assert rewritten_request(padded) == parse_pod_request(pod("p", mem=4))


@pytest.mark.parametrize(
    "value",
    [
        "not json",
        "[1, 2]",
        '{"main": "4"}',
        '{"main": {"memory": "4"}}',  # not one of our resources
        '{"main": {"aliyun.com/gpu-mem": 4}}',  # a quantity is a string
        '{"main": {"aliyun.com/gpu-mem": "4"}}' + " " * MAX_ANNOTATION,
    ],
    ids=["text", "list", "no-quantities", "other-resource", "number", "too-long"],
)
def test_an_unreadable_annotation_is_no_request(value):
    assert rewritten_request(_annotated(rewritten(pod("p", mem=4)), value)) is None


def test_a_pod_that_also_asks_ack_resources_itself_is_not_a_rewritten_one():
    both = _annotated(pod("both", mem=4), '{"main":{"aliyun.com/gpu-mem":"4"}}')
    assert rewritten_request(both) is None


def test_a_request_that_breaks_a_rule_is_refused_naming_it():
    pod_now = rewritten(pod("p", mem=4, core=30))
    broken = _annotated(
        pod_now, '{"main":{"aliyun.com/gpu-mem":"4","aliyun.com/gpu-core.percentage":"33"}}'
    )
    with pytest.raises(PodRefused, match="multiple of 5"):
        rewritten_request(broken)
