"""The cluster port's contract, run over both adapters: `MemoryCluster`, and
`KubeCluster` speaking HTTP with the official client to an API server (the fake one
on loopback here; the real-cluster tier runs the components on a real one).

Each test writes the world through the store behind the adapter (what other clients
of the API server do) and checks what the component-facing port makes of it. What
only one adapter has (the HTTP it sends, MemoryCluster's own conveniences) is tested
beside that adapter: tests/kubecluster/, tests/cluster/test_memory.py.
"""

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from kubernetes import client

from gpushare.cluster import (
    AlreadyBound,
    Cluster,
    Conflict,
    EventSeverity,
    EventType,
    Expired,
    NotFound,
    ObjectRef,
)
from gpushare.cluster.memory import MemoryCluster
from gpushare.kubecluster import KubeCluster
from tests.builders import node, pod
from tests.cluster.watching import take
from tests.kubecluster.apiserver import ApiServer


@dataclass
class Adapter:
    port: Cluster
    """What the components are handed."""
    store: MemoryCluster
    """The state behind it, written as other API clients would."""
    recorded: Callable[[], list[tuple[str, str, str, str]]]
    """(kind, name, reason, message) of every event the port recorded."""


def _memory(store: MemoryCluster) -> Iterator[Adapter]:
    yield Adapter(
        store,
        store,
        lambda: [(e.ref.kind, e.ref.name, e.reason, e.message) for e in store.events],
    )


def _kube(store: MemoryCluster) -> Iterator[Adapter]:
    api = ApiServer(store)
    configuration = client.Configuration()
    configuration.host = api.url
    try:
        yield Adapter(
            KubeCluster(client.ApiClient(configuration)),
            store,
            lambda: [
                (
                    e["involvedObject"]["kind"],
                    e["involvedObject"]["name"],
                    e["reason"],
                    e["message"],
                )
                for e in api.events
            ],
        )
    finally:
        api.close()


@pytest.fixture(params=[_memory, _kube], ids=["MemoryCluster", "KubeCluster"])
def cluster(request: pytest.FixtureRequest) -> Iterator[Adapter]:
    store = MemoryCluster()
    store.add_node(node("n1"))
    store.add_node(node("n2"))
    yield from request.param(store)


def test_missing_objects_are_not_found(cluster):
    with pytest.raises(NotFound, match="ghost"):
        cluster.port.get_pod("default", "ghost")
    with pytest.raises(NotFound):
        cluster.port.get_node("ghost")
    with pytest.raises(NotFound):
        cluster.port.bind_pod("default", "ghost", "n1")


def test_a_patch_on_a_stale_resource_version_conflicts_and_changes_nothing(cluster):
    created = cluster.store.create_pod(pod("a", mem=1))
    cluster.store.patch_pod_annotations("default", "a", {"first": "1"})
    with pytest.raises(Conflict, match="modified"):
        cluster.port.patch_pod_annotations(
            "default", "a", {"second": "2"}, resource_version=created.metadata.resource_version
        )
    assert cluster.store.get_pod("default", "a").metadata.annotations == {"first": "1"}


def test_annotation_patches_merge_and_a_none_value_deletes_a_key(cluster):
    created = cluster.store.create_pod(pod("a", mem=1, annotations={"k": "v", "keep": "1"}))
    patched = cluster.port.patch_pod_annotations(
        "default", "a", {"k": None, "new": "2"}, created.metadata.resource_version
    )
    assert patched.metadata.annotations == {"keep": "1", "new": "2"}
    assert int(patched.metadata.resource_version) > int(created.metadata.resource_version)
    node_patched = cluster.port.patch_node_annotations("n1", {"gpushare.io/test": "y"})
    assert node_patched.metadata.annotations["gpushare.io/test"] == "y"
    assert cluster.store.get_node("n1").metadata.annotations["gpushare.io/test"] == "y"


def test_binding_sets_the_node_and_merges_annotations(cluster):
    created = cluster.store.create_pod(pod("a", mem=1, annotations={"old": "1"}))
    cluster.port.bind_pod("default", "a", "n1", created.metadata.uid, {"alloc": "x"})
    bound = cluster.port.get_pod("default", "a")
    assert bound.spec.node_name == "n1"
    assert bound.metadata.annotations == {"old": "1", "alloc": "x"}
    assert [p.key for p in cluster.port.list_pods("n1").items] == ["default/a"]
    assert cluster.port.list_pods("n2").items == []
    assert len(cluster.port.list_pods().items) == 1


def test_binding_an_already_bound_pod_says_where_it_is(cluster):
    created = cluster.store.create_pod(pod("a", mem=1))
    cluster.store.bind_pod("default", "a", "n2")
    with pytest.raises(AlreadyBound) as refused:
        cluster.port.bind_pod("default", "a", "n1", created.metadata.uid)
    assert refused.value.node == "n2"
    assert 'already assigned to node "n2"' in str(refused.value)
    assert cluster.store.get_pod("default", "a").spec.node_name == "n2"


def test_binding_with_a_stale_uid_is_a_conflict_not_already_bound(cluster):
    cluster.store.create_pod(pod("a", mem=1))
    with pytest.raises(Conflict, match="UID") as conflict:
        cluster.port.bind_pod("default", "a", "n1", "uid-of-a-deleted-pod")
    assert not isinstance(conflict.value, AlreadyBound)
    assert cluster.store.get_pod("default", "a").spec.node_name is None


def test_a_watch_from_a_listing_delivers_every_change_in_order(cluster):
    listing = cluster.port.list_pods()
    watch = cluster.port.watch_pods(listing.resource_version)
    cluster.store.create_pod(pod("a", mem=1))
    cluster.store.patch_pod_annotations("default", "a", {"k": "v"})
    cluster.store.delete_pod("default", "a")
    events = take(watch, 3)
    assert [e.type for e in events] == [EventType.ADDED, EventType.MODIFIED, EventType.DELETED]
    assert events[1].object.metadata.annotations == {"k": "v"}
    versions = [int(e.object.metadata.resource_version) for e in events]
    assert versions == sorted(versions) and versions[0] > int(listing.resource_version)


def test_a_watch_resumes_from_a_past_version(cluster):
    cluster.store.create_pod(pod("a", mem=1))
    middle = cluster.port.list_pods().resource_version
    cluster.store.create_pod(pod("b", mem=1))
    assert [e.object.metadata.name for e in take(cluster.port.watch_pods(middle), 1)] == ["b"]


def test_a_watch_resumes_from_its_last_event_without_a_gap(cluster):
    watch = cluster.port.watch_pods(cluster.port.list_pods().resource_version, node_name="n1")
    assert watch.resume_from == ""
    cluster.store.create_pod(pod("a", mem=1, node="n1"))
    cluster.store.create_pod(pod("elsewhere", mem=1, node="n2"))
    (event,) = take(watch, 1)
    assert event.object.metadata.name == "a"
    assert watch.resume_from == event.object.metadata.resource_version
    cluster.store.create_pod(pod("b", mem=1, node="n1"))
    events = take(cluster.port.watch_pods(watch.resume_from, node_name="n1"), 1)
    assert [e.object.metadata.name for e in events] == ["b"]


def test_a_watch_from_a_compacted_version_is_expired(cluster):
    old = cluster.port.list_nodes().resource_version
    cluster.store.add_node(node("n3"))
    cluster.store.compact()
    with pytest.raises(Expired):
        next(iter(cluster.port.watch_nodes(old)))


def test_one_node_is_listed_and_watched_by_its_name(cluster):
    listing = cluster.port.list_nodes("n2")
    assert [n.name for n in listing.items] == ["n2"]
    cluster.store.patch_node_annotations("n1", {"beat": "1"})
    cluster.store.set_node_labels("n2", {"ack.node.gpu.schedule": "core_mem"})
    (event,) = take(cluster.port.watch_nodes(listing.resource_version, "n2"), 1)
    assert (event.type, event.object.name) == (EventType.MODIFIED, "n2")
    assert event.object.metadata.labels["ack.node.gpu.schedule"] == "core_mem"


def test_stop_ends_a_watch_waiting_for_its_next_event(cluster):
    watch = cluster.port.watch_pods(cluster.port.list_pods().resource_version)
    ended = threading.Event()

    def follow() -> None:
        for _ in watch:
            pass
        ended.set()

    threading.Thread(target=follow, daemon=True).start()
    assert not ended.wait(0.2)
    watch.stop()
    assert ended.wait(5)


def test_events_are_recorded_on_the_object(cluster):
    created = cluster.store.create_pod(pod("a", mem=1))
    ref = ObjectRef.of_pod(created)
    cluster.port.record_event(ref, EventSeverity.WARNING, "GpuRefused", "no GPU has 3 GiB free")
    assert cluster.recorded()[-1] == ("Pod", "a", "GpuRefused", "no GPU has 3 GiB free")
