"""Writing `assigned` back: resourceVersion preconditions and retries on Conflict."""

from gpushare import annotation
from gpushare.deviceplugin.assignment import AssignmentWriter, patch_allocation
from gpushare.inventory import node_gpus, parse_layout
from gpushare.placement import Assignment, to_allocation
from gpushare.request import parse_pod_request
from gpushare.testing.memorycluster import MemoryCluster, gpu_node
from tests.builders import T0, pod


def _bound(cluster: MemoryCluster, name: str, uid: str = ""):
    spec = pod(name, mem=2)
    if uid:
        spec = spec.model_copy(update={"metadata": spec.metadata.model_copy(update={"uid": uid})})
    created = cluster.create_pod(spec)
    request = parse_pod_request(created)
    allocation = to_allocation(
        request, Assignment(((0,),), ()), node_gpus(cluster.get_node("n1")), T0
    )
    cluster.bind_pod("default", name, "n1", created.metadata.uid, annotation.encode(allocation))
    return cluster.get_pod("default", name)


def _cluster() -> MemoryCluster:
    cluster = MemoryCluster()
    cluster.add_node(gpu_node("n1", parse_layout("1x16GiB", "n1")))
    return cluster


def test_a_stale_copy_conflicts_then_the_fresh_pod_is_patched_keeping_other_writes():
    cluster = _cluster()
    stale = _bound(cluster, "p")
    cluster.patch_pod_annotations("default", "p", {"team": "vision"})

    patched = patch_allocation(cluster, stale, lambda a: a.with_assigned(["main"]))

    assert patched is not None
    assert patched.metadata.annotations["team"] == "vision"
    assert annotation.decode(patched).assigned
    assert patched.metadata.annotations[annotation.ACK_ASSIGNED] == "true"


def test_a_replaced_pod_of_the_same_name_is_left_alone():
    cluster = _cluster()
    old = _bound(cluster, "p")
    cluster.delete_pod("default", "p")
    _bound(cluster, "p", uid="uid-p-again")

    assert patch_allocation(cluster, old, lambda a: a.with_assigned(["main"])) is None
    assert not annotation.decode(cluster.get_pod("default", "p")).assigned


def test_the_writer_marks_in_the_background_and_flushes():
    cluster = _cluster()
    writer = AssignmentWriter(cluster)
    writer.start()
    try:
        writer.queue(_bound(cluster, "a"), "main")
        writer.queue(_bound(cluster, "b"), "main")
        writer.wake()
        assert writer.flush(5)
    finally:
        writer.stop()

    for name in ("a", "b"):
        assert annotation.decode(cluster.get_pod("default", name)).assigned
