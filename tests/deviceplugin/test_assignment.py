"""Writing `assigned` back: resourceVersion preconditions and retries on Conflict."""

import logging
import threading

from gpushare import annotation, environment
from gpushare.cluster.memory import MemoryCluster, gpu_node
from gpushare.deviceplugin.assignment import AssignmentWriter, patch_allocation
from gpushare.inventory import node_gpus, parse_layout
from gpushare.placement.fit import Assignment, to_allocation
from gpushare.request import parse_pod_request
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


def _cluster(cluster_type: type[MemoryCluster] = MemoryCluster) -> MemoryCluster:
    cluster = cluster_type()
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


class _BusyCluster(MemoryCluster):
    """Another writer changes the pod just before each of our conditional patches."""

    def __init__(self) -> None:
        super().__init__()
        self.tries = 0

    def patch_pod_annotations(self, namespace, name, annotations, resource_version=None):
        if resource_version is not None:
            self.tries += 1
            super().patch_pod_annotations(namespace, name, {"other-writer": str(self.tries)})
        return super().patch_pod_annotations(namespace, name, annotations, resource_version)


def _mark(allocation):
    return allocation.with_assigned(["main"])


def test_a_pod_changed_before_every_patch_is_given_up_after_five_tries(caplog):
    cluster = _cluster(_BusyCluster)
    bound = _bound(cluster, "p")

    with caplog.at_level(logging.WARNING, logger="gpushare.deviceplugin"):
        assert patch_allocation(cluster, bound, _mark) is None

    assert cluster.tries == 5
    assert not annotation.decode(cluster.get_pod("default", "p")).assigned
    assert caplog.messages == ["gave up updating the allocation of default/p after 5 conflicts"]


def test_an_allocation_that_cannot_be_read_is_left_as_it_is(caplog):
    cluster = _cluster()
    _bound(cluster, "p")
    broken = cluster.patch_pod_annotations("default", "p", {annotation.ALLOCATION: "{oops"})

    with caplog.at_level(logging.WARNING, logger="gpushare.deviceplugin"):
        assert patch_allocation(cluster, broken, _mark) is None

    assert cluster.get_pod("default", "p").metadata.annotations[annotation.ALLOCATION] == "{oops"
    [message] = caplog.messages
    assert message.startswith(
        "cannot update the allocation of default/p: gpushare.io/allocation is not a JSON object: "
    )


def test_a_repair_that_moves_a_container_rewrites_every_key_of_the_allocation():
    cluster = _cluster()
    bound = _bound(cluster, "p")
    assert bound.metadata.annotations[environment.MEM_IDX] == "0"

    def to_gpu_1(allocation):
        [main] = allocation.containers
        moved = tuple(s.model_copy(update={"index": 1}) for s in main.gpus)
        return allocation.model_copy(
            update={"containers": (main.model_copy(update={"gpus": moved}),)}
        )

    patched = patch_allocation(cluster, bound, to_gpu_1)

    assert patched is not None
    assert patched.metadata.annotations[environment.MEM_IDX] == "1"
    assert [s.index for s in annotation.decode(patched).containers[0].gpus] == [1]


def test_marking_a_pod_acks_scheduler_placed_leaves_its_placement_keys_alone():
    cluster = _cluster()
    cluster.create_pod(pod("ack", mem=3))
    ack_keys = {
        environment.MEM_IDX: "0",
        environment.MEM_POD: "3",
        environment.MEM_DEV: "16",
        annotation.ACK_ASSUME_TIME: "1700000000000000000",
        annotation.ACK_ASSIGNED: "false",
    }
    cluster.bind_pod("default", "ack", "n1", annotations=ack_keys)

    patched = patch_allocation(cluster, cluster.get_pod("default", "ack"), _mark)

    assert patched is not None
    written = patched.metadata.annotations
    assert {key: written[key] for key in ack_keys} == {**ack_keys, annotation.ACK_ASSIGNED: "true"}
    assert annotation.ACK_V2_ALLOCATION not in written
    assert annotation.decode(patched).assigned


class _SlowCluster(MemoryCluster):
    """Each patch waits until the test lets it through."""

    def __init__(self) -> None:
        super().__init__()
        self.writing = threading.Event()
        self.release = threading.Event()

    def patch_pod_annotations(self, *args, **kwargs):
        self.writing.set()
        assert self.release.wait(5)
        return super().patch_pod_annotations(*args, **kwargs)


def test_flush_waits_for_a_write_under_way():
    cluster = _cluster(_SlowCluster)
    writer = AssignmentWriter(cluster)
    writer.start()
    try:
        writer.queue(_bound(cluster, "a"), "main")
        writer.wake()
        assert cluster.writing.wait(5)
        assert not writer.flush(0.1)
        cluster.release.set()
        assert writer.flush(5)
        assert annotation.decode(cluster.get_pod("default", "a")).assigned
    finally:
        cluster.release.set()
        writer.stop()


class _FailingOnceCluster(MemoryCluster):
    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def patch_pod_annotations(self, *args, **kwargs):
        if not self.failed:
            self.failed = True
            raise RuntimeError("connection reset")
        return super().patch_pod_annotations(*args, **kwargs)


def test_a_batch_that_fails_is_logged_and_the_writer_goes_on(caplog):
    cluster = _cluster(_FailingOnceCluster)
    writer = AssignmentWriter(cluster)
    writer.start()
    try:
        with caplog.at_level(logging.ERROR, logger="gpushare.deviceplugin"):
            writer.queue(_bound(cluster, "a"), "main")
            writer.wake()
            assert writer.flush(5)
        writer.queue(_bound(cluster, "b"), "main")
        writer.wake()
        assert writer.flush(5)
    finally:
        writer.stop()

    assert caplog.messages == ["marking containers assigned failed"]
    assert "RuntimeError: connection reset" in caplog.text
    assert not annotation.decode(cluster.get_pod("default", "a")).assigned
    assert annotation.decode(cluster.get_pod("default", "b")).assigned


class _Fatal(BaseException):
    """An error no loop catches (as MemoryError or an interpreter exit would be)."""


class _FatalCluster(MemoryCluster):
    def patch_pod_annotations(self, *args, **kwargs):
        raise _Fatal("out of memory")


def test_a_writer_thread_that_dies_says_so_by_name(caplog):
    cluster = _cluster(_FatalCluster)
    writer = AssignmentWriter(cluster)
    with caplog.at_level(logging.CRITICAL, logger="gpushare.deviceplugin"):
        writer.start()
        writer.queue(_bound(cluster, "a"), "main")
        writer.wake()
        assert writer.flush(5)
        writer.stop()

    assert caplog.messages == [
        "background thread assignment-writer died; what it keeps current stays as it is "
        "until the plugin restarts"
    ]
