"""Cluster state: nodes, pods and their allocations, rebuilt from objects alone."""

from gpushare import annotation
from gpushare.inventory import NODE_GPUS_ANNOTATION, node_gpus
from gpushare.objects import Node, ObjectMeta, PodStatus
from gpushare.placement.fit import Placement, evaluate, to_allocation
from gpushare.placement.policies import BinpackPolicy
from gpushare.state import ClusterState
from tests.builders import T0, being_deleted, node, pod, request


def test_node_inventory_comes_from_the_plugin_annotation():
    inventory = node_gpus(node("n1", "1x16GiB,1x80GiB", mode="core_mem"))
    assert [g.mem for g in inventory.gpus] == [16, 80]
    assert inventory.mode == "core_mem"


def test_without_the_annotation_memory_is_split_evenly_like_ack():
    bare = Node.model_validate(
        {
            "metadata": {"name": "ack", "labels": {"gpushare": "true"}},
            "status": {"allocatable": {"aliyun.com/gpu-mem": "60", "aliyun.com/gpu-count": "4"}},
        }
    )
    inventory = node_gpus(bare)
    assert [g.mem for g in inventory.gpus] == [15, 15, 15, 15]


def test_rebuild_reads_allocations_from_pod_annotations():
    n1 = node("n1", "2x16GiB")
    state, problems = ClusterState.rebuild([n1], [])
    view = state.nodes["n1"].view()
    req = request(mem=5)
    result = evaluate(view, req, BinpackPolicy())
    assert isinstance(result, Placement)
    allocation = to_allocation(req, result.assignment, state.nodes["n1"].inventory, T0)
    placed = pod("a", mem=5, node="n1", annotations=annotation.encode(allocation))
    rebuilt, problems = ClusterState.rebuild([n1], [placed, pod("unplaced", mem=1)])
    assert problems == []
    assert rebuilt.nodes["n1"].used(0) == (5, 0, 1)
    assert rebuilt.allocation("default/a") == allocation


def test_finished_pods_hold_nothing():
    n1 = node("n1", "1x16GiB")
    keys = {"ALIYUN_COM_GPU_MEM_IDX": "0", "ALIYUN_COM_GPU_MEM_POD": "4"}
    done = pod("done", mem=4, node="n1", annotations=keys).model_copy(
        update={"status": PodStatus(phase="Succeeded")}
    )
    state, _ = ClusterState.rebuild([n1], [done])
    assert state.nodes["n1"].used(0) == (0, 0, 0)


def test_pods_being_deleted_still_hold_their_gpus():
    n1 = node("n1", "1x16GiB")
    keys = {"ALIYUN_COM_GPU_MEM_IDX": "0", "ALIYUN_COM_GPU_MEM_POD": "4"}
    leaving = being_deleted(pod("leaving", mem=4, node="n1", annotations=keys))
    state, _ = ClusterState.rebuild([n1], [leaving])
    assert state.nodes["n1"].used(0) == (4, 0, 1)


def test_unreadable_objects_are_reported_and_left_out():
    bad_pod = pod("bad", mem=1, node="n1", annotations={annotation.ALLOCATION: "{"})
    bad_node = node("n2").model_copy(
        update={"metadata": ObjectMeta(name="n2", annotations={NODE_GPUS_ANNOTATION: "oops"})}
    )
    state, problems = ClusterState.rebuild([node("n1"), bad_node], [bad_pod])
    assert set(state.nodes) == {"n1"}
    assert len(problems) == 2
    assert any("pod default/bad" in p for p in problems)
    assert any("node n2" in p for p in problems)


def test_pods_of_a_node_that_appears_later_are_counted_when_it_does():
    allocation_pod = pod(
        "early",
        mem=3,
        node="late",
        annotations={"ALIYUN_COM_GPU_MEM_IDX": "0", "ALIYUN_COM_GPU_MEM_POD": "3"},
    )
    state, _ = ClusterState.rebuild([], [allocation_pod])
    assert "default/early" in state.unplaced
    state.set_node(node_gpus(node("late", "1x16GiB")))
    assert state.nodes["late"].used(0)[0] == 3


def test_relabelling_a_node_keeps_what_runs_on_it():
    state, _ = ClusterState.rebuild([node("n1", "1x16GiB")], [])
    req = request(mem=4)
    result = evaluate(state.nodes["n1"].view(), req, BinpackPolicy())
    assert isinstance(result, Placement)
    state.add_pod(
        "default/a", to_allocation(req, result.assignment, state.nodes["n1"].inventory, T0)
    )
    state.set_node(node_gpus(node("n1", "1x16GiB", mode="core_mem")))
    assert state.nodes["n1"].inventory.mode == "core_mem"
    assert state.nodes["n1"].used(0)[0] == 4


def test_rebuild_reads_every_node_and_pod_past_unreadable_and_finished_ones():
    bad_node = node("bad").model_copy(
        update={"metadata": ObjectMeta(name="bad", annotations={NODE_GPUS_ANNOTATION: "oops"})}
    )
    keys = {"ALIYUN_COM_GPU_MEM_IDX": "0", "ALIYUN_COM_GPU_MEM_POD": "4"}
    done = pod("done", mem=4, node="n1", annotations=keys).model_copy(
        update={"status": PodStatus(phase="Succeeded")}
    )
    broken = pod("broken", mem=1, node="n1", annotations={annotation.ALLOCATION: "{"})
    running = pod("running", mem=4, node="n1", annotations=keys)
    state, problems = ClusterState.rebuild(
        [bad_node, node("n1", "1x16GiB")], [done, broken, running], max_pods_per_gpu=2
    )
    assert set(state.nodes) == {"n1"} and len(problems) == 2
    assert state.nodes["n1"].used(0) == (4, 0, 1)
    assert state.nodes["n1"].view().gpus[0].slots == 1  # 2 pods per GPU, one there
