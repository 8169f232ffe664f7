"""The allocation annotation: our JSON round-trips, ACK's keys are written and read."""

import json

import pytest

from gpushare import annotation
from gpushare.allocation import PodAllocation
from gpushare.errors import AnnotationError
from gpushare.placement import Placement, evaluate, to_allocation
from gpushare.policies import BinpackPolicy
from tests.builders import T0, container, node_state, pod, request


def allocate(req, layout="4x16GiB") -> PodAllocation:
    state = node_state(layout)
    result = evaluate(state.view(), req, BinpackPolicy())
    assert isinstance(result, Placement)
    return to_allocation(req, result.assignment, state.inventory, T0)


def annotated_pod(allocation: PodAllocation, **kwargs):
    return pod(node=allocation.node, annotations=annotation.encode(allocation), **kwargs)


def test_our_annotation_round_trips():
    req = request(
        containers=[container("a", mem=3), container("b", mem=5)],
        init_containers=[container("init", mem=1)],
    )
    allocation = allocate(req)
    decoded = annotation.decode(annotated_pod(allocation))
    assert decoded == allocation


def test_the_json_is_versioned_and_names_gpus_by_index_and_uuid():
    allocation = allocate(request(mem=2, labels={"aliyun.com/gpu-count": "2"}))
    document = json.loads(annotation.encode(allocation)[annotation.ALLOCATION])
    assert document["version"] == 1
    assert document["node"] == "n1"
    (main,) = document["containers"]
    assert main["assigned"] is False
    assert [(g["index"], g["memGiB"]) for g in main["gpus"]] == [(0, 1), (1, 1)]
    assert all(g["uuid"].startswith("GPU-") for g in main["gpus"])


def test_ack_compatible_keys_are_written():
    req = request(containers=[container("a", mem=3), container("b", mem=5)])
    allocation = allocate(req, layout="1x16GiB")
    keys = annotation.encode(allocation)
    assert keys["ALIYUN_COM_GPU_MEM_IDX"] == "0"
    assert keys["ALIYUN_COM_GPU_MEM_POD"] == "8"
    assert keys["ALIYUN_COM_GPU_MEM_DEV"] == "16"
    assert keys["ALIYUN_COM_GPU_MEM_ASSIGNED"] == "false"
    assert keys["ALIYUN_COM_GPU_MEM_ASSUME_TIME"] == str(int(T0.timestamp() * 1e9))
    assert json.loads(keys["scheduler.framework.gpushare.allocation"]) == {
        "0": {"0": 3},
        "1": {"0": 5},
    }


def test_marking_assigned_flips_the_ack_flags_too():
    allocation = allocate(request(mem=2)).with_assigned(["main"])
    keys = annotation.assigned_annotations(allocation)
    assert keys["ALIYUN_COM_GPU_MEM_ASSIGNED"] == "true"
    assert keys["scheduler.framework.gpushare.assigned"] == "true"
    decoded = annotation.decode(pod(node="n1", annotations=keys))
    assert decoded is not None and decoded.assigned


def test_a_pod_placed_by_acks_scheduler_is_read():
    ack_pod = pod(
        containers=[container("a", mem=2, core=20), container("b", mem=4, core=20)],
        node="ack-node",
        annotations={
            "scheduler.framework.gpushare.allocation": '{"0":{"1":2},"1":{"1":4}}',
            "ALIYUN_COM_GPU_MEM_ASSUME_TIME": "1700000000000000000",
            "ALIYUN_COM_GPU_MEM_ASSIGNED": "true",
        },
    )
    allocation = annotation.decode(ack_pod)
    assert allocation is not None
    assert allocation.node == "ack-node"
    assert [
        (c.name, c.gpus[0].index, c.gpus[0].mem, c.gpus[0].core) for c in allocation.containers
    ] == [
        ("a", 1, 2, 20),
        ("b", 1, 4, 20),
    ]
    assert allocation.assigned


def test_acks_first_version_keys_are_read():
    old = pod(
        mem=3,
        node="old-node",
        annotations={"ALIYUN_COM_GPU_MEM_IDX": "2", "ALIYUN_COM_GPU_MEM_POD": "3"},
    )
    allocation = annotation.decode(old)
    assert allocation is not None
    assert allocation.gpu_indices == (2,) and allocation.total_mem == 3


def test_pods_without_allocation_decode_to_none():
    assert annotation.decode(pod(mem=2)) is None


@pytest.mark.parametrize(
    "value",
    ["not json", "[]", '{"version": 1, "node": "n"}', '{"version": 1, "containers": "x"}'],
)
def test_a_malformed_annotation_is_an_error_not_a_guess(value):
    with pytest.raises(AnnotationError, match=r"gpushare\.io/allocation"):
        annotation.decode(pod(mem=2, annotations={annotation.ALLOCATION: value}))


def test_an_annotation_from_a_newer_version_says_to_upgrade():
    with pytest.raises(AnnotationError, match="upgrade gpushare"):
        annotation.decode(pod(mem=2, annotations={annotation.ALLOCATION: '{"version": 7}'}))


def test_removal_deletes_every_key_encode_writes():
    allocation = allocate(request(mem=2))
    assert set(annotation.encode(allocation)) <= set(annotation.removal())
