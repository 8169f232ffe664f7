"""Allocate and GetPreferredAllocation as the kubelet drives them
(docs/contracts.md#allocate, docs/contracts.md#matching-allocate-to-a-container)."""

import logging

import grpc
import pytest

from gpushare.deviceplugin.allocator import AllocationRefused
from gpushare.environment import (
    CGPU_DISABLE,
    CONTAINER,
    CORE_PERCENTAGE,
    MEM_CONTAINER,
    MEM_DEV,
    MEM_IDX,
    NVIDIA_VISIBLE_DEVICES,
    POD,
)
from gpushare.kubeletapi.deviceplugin.v1beta1 import api_pb2 as pb
from gpushare.resources import GPU_CORE, GPU_COUNT, GPU_MEM
from gpushare.standins.kubelet import AdmissionFailed
from tests.builders import container
from tests.builders import pod as pod_spec
from tests.deviceplugin.rig import WAIT, allocate, eventually, plugin_client


def _on_gpu(ids, uuid):
    return all(i.startswith(uuid + "-") for i in ids)


def test_five_pods_of_one_size_bound_at_once_get_their_own_slices_in_admission_order(make_rig):
    rig = make_rig(layout="2x16GiB").start()
    gpus = [[0], [1], [0], [1], [0]]
    pods = [rig.bind(f"p{i}", [g], mem=4) for i, g in enumerate(gpus)]

    for pod, gpu in zip(pods, gpus, strict=True):
        [main] = rig.kubelet.admit(pod)
        uuid = rig.allocation(pod.metadata.name).containers[0].gpus[0].uuid
        assert main.envs[POD] == pod.key
        assert main.envs[MEM_IDX] == str(gpu[0])
        assert main.envs[NVIDIA_VISIBLE_DEVICES] == uuid
        assert main.envs[MEM_CONTAINER] == "4"
        # GetPreferredAllocation steered the kubelet to IDs of the extender's GPU.
        assert _on_gpu(main.device_ids[GPU_MEM], uuid)
    for pod in pods:
        assert rig.wait_assigned(pod.metadata.name).assigned


def test_an_init_container_and_two_gpu_containers_in_one_pod(make_rig):
    rig = make_rig(layout="2x16GiB").start()
    pod = rig.bind(
        "web",
        [[0], [0], [1]],
        init_containers=[container("warm", 1)],
        containers=[container("server", 4), container("metrics", 2), container("log")],
    )
    gpu = {s.index: s.uuid for c in rig.allocation("web").containers for s in c.gpus}

    warm, server, metrics, log = rig.kubelet.admit(pod)

    assert (warm.name, warm.init, warm.envs[NVIDIA_VISIBLE_DEVICES]) == ("warm", True, gpu[0])
    assert (server.envs[CONTAINER], server.envs[MEM_CONTAINER]) == ("server", "4")
    assert server.envs[NVIDIA_VISIBLE_DEVICES] == gpu[0]
    assert (metrics.envs[CONTAINER], metrics.envs[NVIDIA_VISIBLE_DEVICES]) == ("metrics", gpu[1])
    assert log.envs == {}
    # The kubelet reused the init container's device for the next container
    # (docs/contracts.md#allocate).
    assert set(warm.device_ids[GPU_MEM]) <= set(server.device_ids[GPU_MEM])
    assert _on_gpu(server.device_ids[GPU_MEM], gpu[0])
    assert _on_gpu(metrics.device_ids[GPU_MEM], gpu[1])
    assert all(c.assigned for c in rig.wait_assigned("web").containers)


def test_sizes_decide_when_the_kubelet_admits_a_younger_pod_first(make_rig):
    rig = make_rig(layout="2x16GiB").start()
    older = rig.bind("older", [[0]], mem=2)
    younger = rig.bind("younger", [[1]], mem=4)

    [first] = rig.kubelet.admit(younger)
    [second] = rig.kubelet.admit(older)

    assert (first.envs[POD], first.envs[MEM_IDX]) == (younger.key, "1")
    assert (second.envs[POD], second.envs[MEM_IDX]) == (older.key, "0")


def test_memory_and_compute_answers_merge_without_colliding_keys(make_rig):
    rig = make_rig(layout="2x16GiB", mode="core_mem").start()
    pods = [rig.bind(f"c{i}", [[i % 2]], mem=2, core=30) for i in range(4)]

    for pod in pods:
        [main] = rig.kubelet.admit(pod)
        assert main.duplicate_envs == []
        assert main.envs[CORE_PERCENTAGE] == "30"
        assert main.envs[MEM_CONTAINER] == "2"
        assert len(main.device_ids[GPU_CORE]) == 30
        uuid = main.envs[NVIDIA_VISIBLE_DEVICES]
        assert _on_gpu(main.device_ids[GPU_CORE] + main.device_ids[GPU_MEM], uuid)
    assert all(rig.wait_assigned(p.metadata.name).assigned for p in pods)


def test_a_memory_only_container_on_a_node_selling_compute_is_told_it_has_no_percentage(
    make_rig,
):
    rig = make_rig(layout="1x16GiB", mode="core_mem").start()
    pod = rig.bind("m", [[0]], mem=2)

    [main] = rig.kubelet.admit(pod)

    assert (main.envs[MEM_CONTAINER], main.envs[CORE_PERCENTAGE]) == ("2", "0")


def test_the_compute_answer_alone_carries_only_the_percentage(make_rig):
    rig = make_rig(layout="1x16GiB", mode="core_mem").start()
    rig.bind("c", [[0]], mem=2, core=30)
    core_ids = sorted(rig.kubelet.devices(GPU_CORE))[:30]
    mem_ids = sorted(rig.kubelet.devices(GPU_MEM))[:2]

    core = allocate(rig, GPU_CORE, core_ids)
    mem = allocate(rig, GPU_MEM, mem_ids)

    assert dict(core.envs) == {CORE_PERCENTAGE: "30"}
    assert CORE_PERCENTAGE not in mem.envs
    assert mem.envs[MEM_CONTAINER] == "2"
    assert rig.wait_assigned("c").assigned


def test_a_container_is_marked_assigned_once_all_its_resources_are_answered(make_rig):
    rig = make_rig(layout="1x16GiB", mode="core_mem").start()
    rig.bind("c", [[0]], mem=2, core=30)
    core_ids = sorted(rig.kubelet.devices(GPU_CORE))[:30]
    mem_ids = sorted(rig.kubelet.devices(GPU_MEM))[:2]

    allocate(rig, GPU_CORE, core_ids)
    assert rig.plugin.assignments.flush(WAIT)
    assert not rig.allocation("c").assigned

    allocate(rig, GPU_MEM, mem_ids)
    assert rig.wait_assigned("c").assigned


def test_a_whole_gpu_container_gets_its_gpu_without_isolation(make_rig):
    rig = make_rig(layout="2x16GiB", mode="core_mem").start()
    pod = rig.bind("whole", [[1]], count=1)

    [main] = rig.kubelet.admit(pod)

    uuid = rig.allocation("whole").containers[0].gpus[0].uuid
    assert main.envs[NVIDIA_VISIBLE_DEVICES] == uuid
    assert main.envs[CGPU_DISABLE] == "true"
    assert main.device_ids[GPU_COUNT] == [f"{uuid}-gpu-0"]


def test_memory_split_over_two_gpus_prefers_ids_of_both(make_rig, caplog):
    caplog.set_level(logging.INFO, logger="gpushare.deviceplugin")
    rig = make_rig(layout="2x16GiB").start()
    pod = rig.bind("split", [[0, 1]], mem=8, labels={"aliyun.com/gpu-count": "2"})

    [main] = rig.kubelet.admit(pod)

    slices = rig.allocation("split").containers[0].gpus
    assert main.envs[MEM_CONTAINER] == "4,4"
    ids = main.device_ids[GPU_MEM]
    assert sum(_on_gpu([i], slices[0].uuid) for i in ids) == 4
    assert sum(_on_gpu([i], slices[1].uuid) for i in ids) == 4
    answered = "Allocate 8 aliyun.com/gpu-mem -> default/split container main on GPU 0,1"
    assert eventually(lambda: answered in caplog.messages)


def test_an_unmatchable_call_fails_saying_what_was_asked_and_what_waits(make_rig):
    rig = make_rig(layout="2x16GiB").start()
    rig.bind("a", [[0]], mem=2)
    rig.bind("b", [[1]], mem=4)
    ids = sorted(rig.kubelet.devices(GPU_MEM))[:3]

    with pytest.raises(grpc.RpcError) as failed:
        allocate(rig, GPU_MEM, ids)

    assert failed.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    message = failed.value.details()
    assert "asked for 3 aliyun.com/gpu-mem on node n1" in message
    assert "default/a container main (2)" in message
    assert "default/b container main (4)" in message
    metrics = rig.plugin.metrics
    failures = "gpushare_device_plugin_allocation_failures_total"
    assert metrics.value(failures, resource=GPU_MEM, reason="no-match") == 1
    assert not rig.allocation("a").assigned and not rig.allocation("b").assigned


def test_a_pod_the_extender_did_not_place_fails_admission_with_a_reason(make_rig):
    rig = make_rig(layout="1x16GiB").start()
    placed = rig.bind("placed", [[0]], mem=1)
    rig.kubelet.admit(placed)
    stray = rig.cluster.create_pod(pod_spec("stray", mem=1))
    rig.cluster.bind_pod("default", "stray", rig.node)

    with pytest.raises(AdmissionFailed) as failed:
        rig.kubelet.admit(rig.cluster.get_pod("default", "stray"))

    assert "no container bound to this node waits for aliyun.com/gpu-mem" in str(failed.value)
    assert "gpushare.io/allocation" in str(failed.value)
    assert stray.key not in {p.key for p, _ in rig.plugin.queue.bound_pods()}


def test_preferred_allocation_never_fails(make_rig):
    rig = make_rig(layout="1x16GiB").start()
    request = pb.PreferredAllocationRequest(
        container_requests=[
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=["nonsense", "GPU-x-mem-1"], allocation_size=7
            )
        ]
    )

    with plugin_client(rig, GPU_MEM) as stub:
        response = stub.GetPreferredAllocation(request, timeout=WAIT)

    assert [list(r.deviceIDs) for r in response.container_responses] == [[]]


def test_a_restarted_plugin_does_not_answer_assigned_containers_twice(make_rig):
    rig = make_rig(layout="2x16GiB").start()
    first = rig.bind("first", [[0]], mem=2)
    second = rig.bind("second", [[1]], mem=2)
    rig.kubelet.admit(first)
    rig.wait_assigned("first")

    rig.plugin.stop()
    rig.plugin = rig.new_plugin()
    rig.plugin.start()
    rig.wait_registered([GPU_MEM, GPU_COUNT])
    assert rig.plugin.wait_synced(WAIT)
    [main] = rig.kubelet.admit(second)

    assert main.envs[POD] == second.key
    assert main.envs[MEM_IDX] == "1"


def test_after_a_node_reboot_the_same_ids_get_the_same_answer_again(make_rig, caplog):
    caplog.set_level(logging.INFO, logger="gpushare.deviceplugin")
    rig = make_rig(layout="2x16GiB").start()
    survivor = rig.bind("survivor", [[1]], mem=3)
    [main] = rig.kubelet.admit(survivor)
    rig.wait_assigned("survivor")
    other = sorted(set(rig.kubelet.devices(GPU_MEM)) - set(main.device_ids[GPU_MEM]))[:3]

    # The node reboots: a new plugin process, the kubelet asks again with the IDs
    # of its checkpoint. Other IDs of the same count are no such request.
    rig.plugin.stop()
    rig.plugin = rig.new_plugin()
    rig.plugin.start()
    rig.wait_registered([GPU_MEM, GPU_COUNT])
    assert rig.plugin.wait_synced(WAIT)
    again = allocate(rig, GPU_MEM, main.device_ids[GPU_MEM])
    with pytest.raises(grpc.RpcError):
        allocate(rig, GPU_MEM, other)

    assert dict(again.envs) == main.envs
    answered = "Allocate 3 aliyun.com/gpu-mem -> default/survivor container main on GPU 1"
    assert eventually(lambda: f"{answered} (asked again with the same IDs)" in caplog.messages)
    assert caplog.messages.count(answered) == 1


def test_answers_of_deleted_pods_are_forgotten(make_rig):
    rig = make_rig(layout="1x16GiB").start()
    gone = rig.bind("gone", [[0]], mem=2)
    [main] = rig.kubelet.admit(gone)
    assert rig.plugin.journal.answered(GPU_MEM, main.device_ids[GPU_MEM])

    rig.cluster.delete_pod("default", "gone")

    assert eventually(lambda: not rig.plugin.journal.answered(GPU_MEM, main.device_ids[GPU_MEM]))
    assert "gone" not in (rig.kubelet.plugin_dir / "gpushare-grants.jsonl").read_text()


def _bind_as_ack(rig, gpu: int, **more: str) -> None:
    """Pod "ack" (3 GiB) bound to `gpu` the way ACK's scheduler writes it."""
    rig.cluster.create_pod(pod_spec("ack", mem=3))
    ack_keys = {
        "ALIYUN_COM_GPU_MEM_IDX": str(gpu),
        "ALIYUN_COM_GPU_MEM_POD": "3",
        "ALIYUN_COM_GPU_MEM_ASSUME_TIME": "1700000000000000000",
        "ALIYUN_COM_GPU_MEM_ASSIGNED": "false",
        **more,
    }
    rig.cluster.bind_pod("default", "ack", rig.node, annotations=ack_keys)


def test_a_pod_placed_by_acks_scheduler_gets_the_uuid_of_its_gpu(make_rig):
    rig = make_rig(layout="2x16GiB").start()
    _bind_as_ack(rig, 1, ALIYUN_COM_GPU_MEM_DEV="16")

    [main] = rig.kubelet.admit(rig.cluster.get_pod("default", "ack"))

    uuid = rig.plugin.node.snapshot().inventory[1].uuid
    assert main.envs[NVIDIA_VISIBLE_DEVICES] == uuid
    assert (main.envs[MEM_IDX], main.envs[MEM_CONTAINER]) == ("1", "3")
    assert _on_gpu(main.device_ids[GPU_MEM], uuid)
    assert rig.wait_assigned("ack").assigned
    assert (
        rig.cluster.get_pod("default", "ack").metadata.annotations["ALIYUN_COM_GPU_MEM_ASSIGNED"]
        == "true"
    )


def test_a_pod_placed_by_acks_scheduler_without_the_gpus_size_gets_it_from_the_node(make_rig):
    rig = make_rig(layout="2x16GiB").start()
    _bind_as_ack(rig, 0)

    [main] = rig.kubelet.admit(rig.cluster.get_pod("default", "ack"))

    gpu = rig.plugin.node.snapshot().inventory[0]
    assert (main.envs[NVIDIA_VISIBLE_DEVICES], main.envs[MEM_DEV]) == (gpu.uuid, "16")


def test_what_can_wait_runs_once_the_answer_has_left(make_rig):
    rig = make_rig(layout="1x16GiB").start()
    pod = rig.bind("later", [[0]], mem=2)
    ids = sorted(rig.kubelet.devices(GPU_MEM))[:2]
    grants = rig.kubelet.plugin_dir / "gpushare-grants.jsonl"
    assert eventually(lambda: rig.plugin.queue.waiting(GPU_MEM))
    steps = []

    answer = rig.plugin.allocator.allocate(GPU_MEM, ids, steps.append)

    assert answer.envs[POD] == pod.key
    assert rig.plugin.journal.answered(GPU_MEM, ids) == (pod.metadata.uid, "main")
    assert not grants.exists() or pod.metadata.uid not in grants.read_text()
    assert not rig.plugin.assignments.flush(0.2)  # marked, but the writer not woken
    assert not rig.allocation("later").assigned

    [step] = steps
    step()

    assert pod.metadata.uid in grants.read_text()
    assert rig.wait_assigned("later").assigned


def test_over_grpc_the_grant_reaches_the_file_and_the_pod_is_marked(make_rig):
    rig = make_rig(layout="1x16GiB").start()
    pod = rig.bind("served", [[0]], mem=2)
    [main] = rig.kubelet.admit(pod)
    grants = rig.kubelet.plugin_dir / "gpushare-grants.jsonl"

    assert eventually(lambda: grants.exists() and pod.metadata.uid in grants.read_text())
    assert rig.wait_assigned("served").assigned
    assert rig.plugin.journal.answered(GPU_MEM, main.device_ids[GPU_MEM])


def test_an_allocate_without_device_ids_is_refused_saying_so(make_rig):
    rig = make_rig(layout="1x16GiB").start()
    pod = rig.bind("waiting", [[0]], mem=2)
    assert eventually(lambda: rig.plugin.queue.waiting(GPU_MEM))

    with pytest.raises(AllocationRefused) as refused:
        rig.plugin.allocator.allocate(GPU_MEM, [])

    assert str(refused.value) == "Allocate for aliyun.com/gpu-mem carried no device IDs"
    failures = "gpushare_device_plugin_allocation_failures_total"
    assert rig.plugin.metrics.value(failures, resource=GPU_MEM, reason="no-devices") == 1
    [main] = rig.kubelet.admit(pod)
    assert main.envs[POD] == pod.key


def test_an_allocate_whose_call_ended_takes_no_container(make_rig):
    rig = make_rig(layout="1x16GiB").start()
    pod = rig.bind("waiting", [[0]], mem=2)
    ids = sorted(rig.kubelet.devices(GPU_MEM))[:2]
    assert eventually(lambda: rig.plugin.queue.waiting(GPU_MEM))

    with pytest.raises(AllocationRefused) as refused:
        rig.plugin.allocator.allocate(GPU_MEM, ids, active=lambda: False)

    assert str(refused.value) == (
        "the call for 2 aliyun.com/gpu-mem ended before it was answered (kubelet restart?); "
        "no container taken"
    )
    [main] = rig.kubelet.admit(pod)
    assert main.envs[POD] == pod.key
