"""The admission queue alone: which waiting container a call goes to."""

from datetime import timedelta

import pytest

from gpushare import annotation
from gpushare.deviceplugin.admission import AdmissionQueue, NoMatch
from gpushare.inventory import NodeGpus, parse_layout
from gpushare.labels import NodeMode
from gpushare.objects import Pod
from gpushare.placement.fit import Assignment, to_allocation
from gpushare.request import parse_pod_request
from gpushare.resources import GPU_CORE, GPU_COUNT, GPU_MEM
from tests.builders import T0, being_deleted, container, pod

NODE = "n1"
INVENTORY = NodeGpus(NODE, NodeMode.CORE_MEM, parse_layout("2x16GiB", NODE))
ALL = (GPU_MEM, GPU_COUNT, GPU_CORE)


def bound(name: str, gpus, second: int = 0, phase: str | None = None, **kwargs) -> Pod:
    spec = pod(name, node=NODE, **kwargs)
    request = parse_pod_request(spec)
    assert request is not None
    allocation = to_allocation(
        request,
        Assignment(tuple(tuple(g) for g in gpus), ()),
        INVENTORY,
        T0 + timedelta(seconds=second),
    )
    meta = spec.metadata.model_copy(update={"annotations": annotation.encode(allocation)})
    status = spec.status.model_copy(update={"phase": phase})
    return spec.model_copy(update={"metadata": meta, "status": status})


def test_oldest_binding_first_and_init_containers_before_app_containers():
    queue = AdmissionQueue(NODE)
    queue.replace(
        [
            bound("young", [[0]], second=5, mem=2),
            bound(
                "old",
                [[1], [1]],
                second=1,
                init_containers=[container("init", 2)],
                containers=[container("app", 2)],
            ),
        ]
    )

    order = [queue.take(GPU_MEM, 2, ALL).waiting for _ in range(3)]

    assert [(w.pod.metadata.name, w.container.name) for w in order] == [
        ("old", "init"),
        ("old", "app"),
        ("young", "main"),
    ]
    with pytest.raises(NoMatch):
        queue.take(GPU_MEM, 2, ALL)


def test_a_pod_under_admission_comes_before_older_pods():
    queue = AdmissionQueue(NODE)
    queue.replace(
        [
            bound("a", [[0], [0]], second=2, containers=[container("x", 4), container("y", 2)]),
            bound("b", [[1]], second=1, mem=2),
        ]
    )

    first = queue.take(GPU_MEM, 4, ALL).waiting  # only a/x asks for 4: a is under way
    second = queue.take(GPU_MEM, 2, ALL).waiting

    assert (first.pod.metadata.name, first.container.name) == ("a", "x")
    assert (second.pod.metadata.name, second.container.name) == ("a", "y")


def test_a_container_is_complete_once_every_advertised_resource_was_answered():
    queue = AdmissionQueue(NODE)
    queue.replace([bound("c", [[0]], mem=2, core=30)])

    assert not queue.take(GPU_CORE, 30, ALL).complete
    assert queue.take(GPU_MEM, 2, ALL).complete

    # Without the core resource on the node, memory alone completes it.
    other = AdmissionQueue(NODE)
    other.replace([bound("c", [[0]], mem=2, core=30)])
    assert other.take(GPU_MEM, 2, (GPU_MEM, GPU_COUNT)).complete


def test_finished_pods_other_nodes_and_unplaced_pods_do_not_wait():
    queue = AdmissionQueue(NODE)
    elsewhere = bound("elsewhere", [[0]], mem=2)
    elsewhere = elsewhere.model_copy(
        update={"spec": elsewhere.spec.model_copy(update={"node_name": "n2"})}
    )
    queue.replace(
        [
            bound("done", [[0]], mem=2, phase="Succeeded"),
            elsewhere,
            pod("unplaced", mem=2, node=NODE),
        ]
    )

    assert queue.waiting(GPU_MEM) == []
    assert queue.peek(GPU_MEM, 2) is None


def test_a_pod_being_deleted_keeps_its_gpus_but_no_call_goes_to_it():
    queue = AdmissionQueue(NODE)
    leaving = being_deleted(bound("leaving", [[0]], second=1, mem=2))
    queue.replace([leaving, bound("young", [[1]], second=5, mem=2)])

    assert queue.take(GPU_MEM, 2, ALL).waiting.pod.metadata.name == "young"
    with pytest.raises(NoMatch):
        queue.take(GPU_MEM, 2, ALL)
    assert queue.waiting(GPU_MEM) == []
    # Still charged on its GPU (metrics, reconciliation) until the watch shows it gone.
    assert [p.metadata.name for p, _ in queue.bound_pods()] == ["leaving", "young"]
    queue.remove(leaving)
    assert [p.metadata.name for p, _ in queue.bound_pods()] == ["young"]


def test_the_refusal_lists_what_waits_and_unreadable_allocations():
    queue = AdmissionQueue(NODE)
    broken = pod("broken", mem=1, node=NODE, annotations={annotation.ALLOCATION: "{not json"})
    queue.replace([bound(f"p{i}", [[0]], second=i, mem=1) for i in range(10)] + [broken])

    with pytest.raises(NoMatch) as refused:
        queue.take(GPU_MEM, 3, ALL)

    message = str(refused.value)
    assert "Allocate asked for 3 aliyun.com/gpu-mem on node n1" in message
    assert "default/p0 container main (1)" in message
    assert "and 2 more" in message
    assert "unreadable allocations: default/broken" in message


def test_assigned_containers_wait_no_more_and_deleted_pods_leave():
    queue = AdmissionQueue(NODE)
    first = bound("first", [[0]], mem=2)
    allocation = annotation.decode(first)
    marked = first.model_copy(
        update={
            "metadata": first.metadata.model_copy(
                update={
                    "annotations": {
                        **first.metadata.annotations,
                        **annotation.assigned_annotations(allocation.with_assigned(["main"])),
                    }
                }
            )
        }
    )
    second = bound("second", [[1]], second=1, mem=2)
    queue.replace([marked, second])

    assert [w.pod.metadata.name for w in queue.waiting(GPU_MEM)] == ["second"]
    queue.remove(second)
    assert queue.waiting(GPU_MEM) == []
