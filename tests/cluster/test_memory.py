"""What the in-memory cluster adds to the port's contract (tests/cluster/test_port_contract.py):
the API server's defaults on create, its cluster-wide versions, watches that follow a
pod onto a node, and one winner among concurrent binds."""

import threading

import pytest

from gpushare.cluster import (
    AlreadyBound,
    EventType,
)
from gpushare.cluster.memory import MemoryCluster
from tests.builders import node, pod
from tests.cluster.watching import take


@pytest.fixture
def cluster() -> MemoryCluster:
    c = MemoryCluster()
    c.add_node(node("n1"))
    c.add_node(node("n2"))
    return c


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


def test_a_node_watch_sees_pods_arrive_by_binding_and_leave(cluster):
    cluster.create_pod(pod("a", mem=1))
    watch = cluster.watch_pods(cluster.list_pods().resource_version, node_name="n1")
    cluster.create_pod(pod("elsewhere", mem=1))
    cluster.bind_pod("default", "elsewhere", "n2")
    cluster.bind_pod("default", "a", "n1")
    cluster.set_pod_phase("default", "a", "Running")
    cluster.delete_pod("default", "a")
    events = take(watch, 3)
    assert [(e.type, e.object.metadata.name) for e in events] == [
        (EventType.ADDED, "a"),
        (EventType.MODIFIED, "a"),
        (EventType.DELETED, "a"),
    ]


def test_node_watch_and_label_changes(cluster):
    watch = cluster.watch_nodes(cluster.list_nodes().resource_version)
    cluster.set_node_labels("n1", {"ack.node.gpu.schedule": "core_mem"})
    (event,) = take(watch, 1)
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
