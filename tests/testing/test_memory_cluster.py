"""The in-memory cluster behaves like the API server where gpushare depends on it."""

import threading

import pytest

from gpushare.cluster import (
    AlreadyBound,
    Conflict,
    EventSeverity,
    EventType,
    Expired,
    NotFound,
    ObjectRef,
)
from gpushare.testing.memorycluster import MemoryCluster
from tests.builders import node, pod


@pytest.fixture
def cluster() -> MemoryCluster:
    c = MemoryCluster()
    c.add_node(node("n1"))
    c.add_node(node("n2"))
    return c


def drain(watch, count: int) -> list:
    events = []
    for event in watch:
        events.append(event)
        if len(events) == count:
            break
    watch.stop()
    return events


def test_created_pods_get_uid_namespace_and_resource_version(cluster):
    created = cluster.create_pod(pod("a", mem=1, namespace=""))
    assert created.metadata.namespace == "default"
    assert created.metadata.uid
    assert int(created.metadata.resource_version) > 0
    assert created.status.phase == "Pending"


def test_every_write_bumps_the_resource_version(cluster):
    a = cluster.create_pod(pod("a", mem=1))
    b = cluster.patch_pod_annotations("default", "a", {"k": "v"})
    assert int(b.metadata.resource_version) > int(a.metadata.resource_version)
    assert b.metadata.annotations == {"k": "v"}


def test_a_patch_on_a_stale_resource_version_conflicts(cluster):
    a = cluster.create_pod(pod("a", mem=1))
    cluster.patch_pod_annotations("default", "a", {"first": "1"})
    with pytest.raises(Conflict, match="modified"):
        cluster.patch_pod_annotations(
            "default", "a", {"second": "2"}, resource_version=a.metadata.resource_version
        )
    assert "second" not in cluster.get_pod("default", "a").metadata.annotations


def test_a_none_value_deletes_an_annotation(cluster):
    cluster.create_pod(pod("a", mem=1, annotations={"k": "v", "keep": "1"}))
    patched = cluster.patch_pod_annotations("default", "a", {"k": None})
    assert patched.metadata.annotations == {"keep": "1"}


def test_binding_sets_the_node_and_merges_annotations(cluster):
    cluster.create_pod(pod("a", mem=1))
    cluster.bind_pod("default", "a", "n1", uid="uid-a", annotations={"alloc": "x"})
    bound = cluster.get_pod("default", "a")
    assert bound.spec.node_name == "n1"
    assert bound.metadata.annotations["alloc"] == "x"
    assert [p.key for p in cluster.list_pods("n1").items] == ["default/a"]
    assert cluster.list_pods("n2").items == []


def test_binding_an_already_bound_pod_is_refused(cluster):
    cluster.create_pod(pod("a", mem=1))
    cluster.bind_pod("default", "a", "n1")
    with pytest.raises(AlreadyBound) as refused:
        cluster.bind_pod("default", "a", "n2")
    assert refused.value.node == "n1"
    assert 'already assigned to node "n1"' in str(refused.value)


def test_binding_checks_the_uid_precondition(cluster):
    cluster.create_pod(pod("a", mem=1))
    with pytest.raises(Conflict, match="UID"):
        cluster.bind_pod("default", "a", "n1", uid="someone-else")


def test_missing_objects_are_not_found(cluster):
    with pytest.raises(NotFound):
        cluster.get_pod("default", "ghost")
    with pytest.raises(NotFound):
        cluster.bind_pod("default", "ghost", "n1")
    with pytest.raises(NotFound):
        cluster.get_node("ghost")


def test_watch_delivers_events_in_order_from_a_listing(cluster):
    listing = cluster.list_pods()
    watch = cluster.watch_pods(listing.resource_version)
    cluster.create_pod(pod("a", mem=1))
    cluster.patch_pod_annotations("default", "a", {"k": "v"})
    cluster.delete_pod("default", "a")
    events = drain(watch, 3)
    assert [e.type for e in events] == [EventType.ADDED, EventType.MODIFIED, EventType.DELETED]
    versions = [int(e.object.metadata.resource_version) for e in events]
    assert versions == sorted(versions)


def test_a_watch_resumes_from_a_past_version(cluster):
    cluster.create_pod(pod("a", mem=1))
    middle = cluster.list_pods().resource_version
    cluster.create_pod(pod("b", mem=1))
    events = drain(cluster.watch_pods(middle), 1)
    assert events[0].object.metadata.name == "b"


def test_a_watch_resumes_from_its_last_event_without_a_gap(cluster):
    watch = cluster.watch_pods(cluster.list_pods().resource_version, node_name="n1")
    assert watch.resume_from == ""
    cluster.create_pod(pod("a", mem=1, node="n1"))
    cluster.create_pod(pod("elsewhere", mem=1, node="n2"))
    (event,) = drain(watch, 1)
    assert watch.resume_from == event.object.metadata.resource_version
    watch.stop()
    cluster.create_pod(pod("b", mem=1, node="n1"))
    events = drain(cluster.watch_pods(watch.resume_from, node_name="n1"), 1)
    assert [e.object.metadata.name for e in events] == ["b"]


def test_a_watch_from_a_compacted_version_is_expired(cluster):
    old = cluster.list_pods().resource_version
    cluster.create_pod(pod("a", mem=1))
    cluster.compact()
    with pytest.raises(Expired):
        cluster.watch_pods(old)


def test_a_node_watch_sees_pods_arrive_by_binding_and_leave(cluster):
    cluster.create_pod(pod("a", mem=1))
    watch = cluster.watch_pods(cluster.list_pods().resource_version, node_name="n1")
    cluster.create_pod(pod("elsewhere", mem=1))
    cluster.bind_pod("default", "elsewhere", "n2")
    cluster.bind_pod("default", "a", "n1")
    cluster.set_pod_phase("default", "a", "Running")
    cluster.delete_pod("default", "a")
    events = drain(watch, 3)
    assert [(e.type, e.object.metadata.name) for e in events] == [
        (EventType.ADDED, "a"),
        (EventType.MODIFIED, "a"),
        (EventType.DELETED, "a"),
    ]


def test_node_watch_and_label_changes(cluster):
    watch = cluster.watch_nodes(cluster.list_nodes().resource_version)
    cluster.set_node_labels("n1", {"ack.node.gpu.schedule": "core_mem"})
    (event,) = drain(watch, 1)
    assert event.type is EventType.MODIFIED
    assert event.object.metadata.labels["ack.node.gpu.schedule"] == "core_mem"


def test_concurrent_binds_of_one_pod_let_exactly_one_win(cluster):
    cluster.create_pod(pod("a", mem=1))
    outcomes: list[str] = []
    lock = threading.Lock()

    def bind(node_name: str) -> None:
        try:
            cluster.bind_pod("default", "a", node_name)
            result = "bound"
        except AlreadyBound:
            result = "refused"
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=bind, args=(f"n{i % 2 + 1}",)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["bound"] + ["refused"] * 15


def test_events_are_recorded(cluster):
    created = cluster.create_pod(pod("a", mem=1))
    cluster.record_event(ObjectRef.of_pod(created), EventSeverity.WARNING, "Repaired", "fixed")
    assert cluster.events[-1].reason == "Repaired"
    assert cluster.events[-1].ref.name == "a"
