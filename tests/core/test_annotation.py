"""The allocation annotation: our JSON round-trips, ACK's keys are written and read."""

import json
from datetime import UTC, datetime

import pytest

from gpushare import annotation
from gpushare.allocation import ContainerAllocation, GpuSlice, PodAllocation
from gpushare.errors import AnnotationError
from gpushare.labels import NodeMode
from gpushare.placement.fit import Placement, evaluate, to_allocation
from gpushare.placement.policies import BinpackPolicy
from gpushare.request import ContainerRole
from tests.builders import T0, container, node_state, pod, request


def allocate(req, layout="4x16GiB", mode: NodeMode = NodeMode.CGPU) -> PodAllocation:
    state = node_state(layout, mode=mode)
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


# --- What ACK's tools read from a pod we placed -------------------------------------------


def slice_on(gpu: int, mem: int, gpu_mem: int) -> GpuSlice:
    return GpuSlice(index=gpu, uuid=f"GPU-{gpu}", mem=mem, gpu_mem=gpu_mem)


def test_the_ack_v2_key_names_app_containers_only_in_gos_compact_json():
    req = request(
        containers=[container("app", mem=4), container("other", mem=3)],
        init_containers=[
            container("init", mem=1),
            container("sidecar", mem=2, restart_policy="Always"),
        ],
    )
    keys = annotation.encode(allocate(req, layout="1x16GiB"))
    # Init and sidecar indices count spec.initContainers: listing them would put their
    # memory on the app containers of the same index.
    assert keys["scheduler.framework.gpushare.allocation"] == '{"0":{"0":4},"1":{"0":3}}'
    assert keys["ALIYUN_COM_GPU_MEM_POD"] == "9"  # the sidecar runs with the apps, init does not


def test_mem_dev_is_the_size_of_the_gpu_the_first_app_container_holds():
    allocation = PodAllocation(
        node="n1",
        bound_at=T0,
        containers=(
            ContainerAllocation(
                name="init", role=ContainerRole.INIT, index=0, gpus=(slice_on(0, 1, 16),)
            ),
            ContainerAllocation(
                name="app", role=ContainerRole.APP, index=0, gpus=(slice_on(1, 4, 24),)
            ),
            ContainerAllocation(
                name="app2", role=ContainerRole.APP, index=1, gpus=(slice_on(2, 4, 32),)
            ),
        ),
    )
    keys = annotation.encode(allocation)
    assert keys["ALIYUN_COM_GPU_MEM_DEV"] == "24"
    assert keys["ALIYUN_COM_GPU_MEM_IDX"] == "0,1,2"
    assert json.loads(keys["scheduler.framework.gpushare.allocation"]) == {
        "0": {"1": 4},
        "1": {"2": 4},
    }


def test_a_pod_whose_only_gpu_user_is_an_init_container_still_names_its_gpu_size():
    req = request(containers=[container("app")], init_containers=[container("init", mem=2)])
    keys = annotation.encode(allocate(req, layout="1x24GiB"))
    assert keys["ALIYUN_COM_GPU_MEM_DEV"] == "24"
    assert keys["ALIYUN_COM_GPU_MEM_POD"] == "0"
    assert keys["scheduler.framework.gpushare.allocation"] == "{}"


def test_a_multi_gpu_pod_names_every_gpu():
    allocation = allocate(request(mem=4, labels={"aliyun.com/gpu-count": "2"}))
    keys = annotation.encode(allocation)
    assert keys["ALIYUN_COM_GPU_MEM_IDX"] == "0,1"
    assert keys["ALIYUN_COM_GPU_MEM_POD"] == "4"
    assert json.loads(keys["scheduler.framework.gpushare.allocation"]) == {"0": {"0": 2, "1": 2}}


def test_removal_is_a_merge_patch_that_deletes_every_key():
    patch = annotation.removal()
    assert set(patch) == set(annotation.encode(allocate(request(mem=2))))
    assert all(value is None for value in patch.values())


# --- Reading a pod back -------------------------------------------------------------------


def ack_pod(annotations: dict[str, str], containers=None, node: str | None = "ack-node"):
    return pod(
        containers=containers or [container("a", mem=2, core=20)],
        node=node,
        annotations=annotations,
    )


def test_our_annotation_wins_over_the_ack_keys():
    allocation = allocate(request(mem=2))
    keys = annotation.encode(allocation) | {
        "scheduler.framework.gpushare.allocation": '{"0":{"3":9}}',
        "ALIYUN_COM_GPU_MEM_IDX": "3",
    }
    assert annotation.decode(pod(node="n1", annotations=keys)) == allocation


def test_a_pod_that_lost_our_annotation_is_read_back_from_the_ack_keys():
    req = request(containers=[container("a", mem=3, core=20), container("b", mem=5, core=30)])
    allocation = allocate(req, layout="2x24GiB", mode=NodeMode.CORE_MEM)
    keys = annotation.encode(allocation)
    del keys[annotation.ALLOCATION]
    decoded = annotation.decode(
        pod(
            node="n1",
            containers=[container("a", mem=3, core=20), container("b", mem=5, core=30)],
            annotations=keys,
        )
    )
    assert decoded is not None
    assert decoded.bound_at == T0
    assert decoded.node == "n1"
    assert [
        (c.name, c.index, [(s.index, s.mem, s.core, s.gpu_mem) for s in c.gpus])
        for c in decoded.containers
    ] == [
        (c.name, c.index, [(s.index, s.mem, s.core, s.gpu_mem) for s in c.gpus])
        for c in allocation.containers
    ]


@pytest.mark.parametrize(
    "key", ["ALIYUN_COM_GPU_MEM_ASSUME_TIME", "scheduler.framework.gpushare.assume-time"]
)
def test_the_bind_time_is_read_from_either_ack_key(key):
    decoded = annotation.decode(
        ack_pod(
            {"scheduler.framework.gpushare.allocation": '{"0":{"0":2}}', key: "1700000000123456000"}
        )
    )
    assert decoded is not None
    assert decoded.bound_at == datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=UTC)


def test_without_a_bind_time_the_pod_counts_as_bound_at_the_epoch():
    decoded = annotation.decode(ack_pod({"scheduler.framework.gpushare.allocation": '{"0":{}}'}))
    assert decoded is not None
    assert decoded.bound_at == datetime(1970, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("flags", "assigned"),
    [
        ({"ALIYUN_COM_GPU_MEM_ASSIGNED": "true"}, True),
        ({"scheduler.framework.gpushare.assigned": "true"}, True),
        ({"scheduler.framework.gpushare.assigned": "True"}, True),
        ({"ALIYUN_COM_GPU_MEM_ASSIGNED": "false"}, False),
        ({}, False),
    ],
)
def test_assigned_is_read_from_either_ack_key(flags, assigned):
    decoded = annotation.decode(
        ack_pod({"scheduler.framework.gpushare.allocation": '{"0":{"0":2}}'} | flags)
    )
    assert decoded is not None
    assert decoded.assigned is assigned


def test_ack_keys_on_a_pod_without_a_node_are_an_error_naming_the_pod():
    with pytest.raises(AnnotationError, match=r"default/p has ACK allocation keys but no node"):
        annotation.decode(ack_pod({"ALIYUN_COM_GPU_MEM_IDX": "0"}, node=None))


@pytest.mark.parametrize(
    "keys",
    [
        {"scheduler.framework.gpushare.allocation": "not json"},
        {"scheduler.framework.gpushare.allocation": "[]"},
        {"scheduler.framework.gpushare.allocation": '{"0": 2}'},
        {"scheduler.framework.gpushare.allocation": '{"main": {"0": 2}}'},
        {"scheduler.framework.gpushare.allocation": '{"0": {"0": "2Gi"}}'},
        {"scheduler.framework.gpushare.allocation": '{"0": {"0": null}}'},
        {"ALIYUN_COM_GPU_MEM_IDX": "GPU-1"},
        {"ALIYUN_COM_GPU_MEM_IDX": "0", "ALIYUN_COM_GPU_MEM_ASSUME_TIME": "yesterday"},
        {"ALIYUN_COM_GPU_MEM_IDX": "0", "scheduler.framework.gpushare.assume-time": "1.5e18"},
        # a bind time past year 9999 or past what a float holds: an error, not a crash
        {"ALIYUN_COM_GPU_MEM_IDX": "0", "ALIYUN_COM_GPU_MEM_ASSUME_TIME": "9" * 23},
        {"ALIYUN_COM_GPU_MEM_IDX": "0", "ALIYUN_COM_GPU_MEM_ASSUME_TIME": "1" + "0" * 30},
        {"ALIYUN_COM_GPU_MEM_IDX": "0", "ALIYUN_COM_GPU_MEM_ASSUME_TIME": "1" + "0" * 400},
        {"ALIYUN_COM_GPU_MEM_IDX": "0", "ALIYUN_COM_GPU_MEM_DEV": "16GiB"},
    ],
)
def test_malformed_ack_keys_are_an_error_naming_the_pod(keys):
    with pytest.raises(
        AnnotationError, match=r"ACK allocation keys of pod default/p are malformed"
    ):
        annotation.decode(ack_pod(keys))


def test_an_empty_ack_v2_key_without_a_gpu_index_is_an_error_not_a_crash():
    with pytest.raises(
        AnnotationError,
        match=r"malformed: scheduler.framework.gpushare.allocation is empty and there is no "
        r"ALIYUN_COM_GPU_MEM_IDX",
    ):
        annotation.decode(ack_pod({"scheduler.framework.gpushare.allocation": ""}))


def test_an_ack_container_index_the_pod_does_not_have_still_holds_its_memory():
    decoded = annotation.decode(
        ack_pod(
            {"scheduler.framework.gpushare.allocation": '{"0":{"0":2},"1":{"0":3},"4":{"1":1}}'}
        )
    )
    assert decoded is not None
    assert [
        (c.name, c.index, c.gpus[0].index, c.gpus[0].mem, c.gpus[0].core)
        for c in decoded.containers
    ] == [
        ("a", 0, 0, 2, 20),
        ("container-1", 1, 0, 3, 0),
        ("container-4", 4, 1, 1, 0),
    ]
    assert decoded.total_mem == 6


def test_acks_first_version_reads_the_first_of_several_indices():
    decoded = annotation.decode(ack_pod({"ALIYUN_COM_GPU_MEM_IDX": "1,3"}))
    assert decoded is not None
    assert decoded.gpu_indices == (1,)


def test_acks_first_version_reads_memory_and_size_per_container():
    decoded = annotation.decode(
        ack_pod(
            {"ALIYUN_COM_GPU_MEM_IDX": "2", "ALIYUN_COM_GPU_MEM_DEV": "16"},
            containers=[container("a", mem=3), container("web"), container("b", mem=5)],
        )
    )
    assert decoded is not None
    assert [(c.name, c.index, c.gpus) for c in decoded.containers] == [
        ("a", 0, (GpuSlice(index=2, mem=3, gpu_mem=16),)),
        ("b", 2, (GpuSlice(index=2, mem=5, gpu_mem=16),)),
    ]


def test_a_limit_ack_admitted_but_that_is_not_a_whole_number_counts_as_none():
    # The API server admits "2Gi" for an extended resource (it is an integer quantity);
    # gpushare's webhook refuses it, but a pod ACK placed before a migration may have it.
    v1 = annotation.decode(
        ack_pod(
            {"ALIYUN_COM_GPU_MEM_IDX": "0"},
            containers=[container("a", mem=3), container("b", mem="2Gi")],
        )
    )
    assert v1 is not None
    assert [(c.name, tuple(s.mem for s in c.gpus)) for c in v1.containers] == [("a", (3,))]
    v2 = annotation.decode(
        ack_pod(
            {"scheduler.framework.gpushare.allocation": '{"0":{"0":3}}'},
            containers=[container("a", mem=3, core="1k")],
        )
    )
    assert v2 is not None
    assert v2.containers[0].gpus[0].core == 0


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("", "is not a JSON object"),
        ("not json", "is not a JSON object"),
        ("[]", "is not a JSON object"),
        ('{"version": 1, "node": "n"}', "is malformed"),
        (
            '{"version": "2", "node": "n", "boundAt": "2026-01-01T00:00:00Z", "containers": []}',
            "is malformed",
        ),
        ('{"version": null}', "is malformed"),
    ],
)
def test_an_unreadable_annotation_says_what_is_wrong(value, problem):
    with pytest.raises(AnnotationError, match=rf"^gpushare\.io/allocation {problem}"):
        annotation.decode(pod(mem=2, annotations={annotation.ALLOCATION: value}))


def test_the_next_version_is_refused_with_both_versions_named():
    with pytest.raises(
        AnnotationError,
        match=r"has version 2, newer than this gpushare understands \(1\); upgrade gpushare",
    ):
        annotation.decode(pod(mem=2, annotations={annotation.ALLOCATION: '{"version": 2}'}))
