"""KubeCluster speaks to a real HTTP server with the official client, and maps the
API server's answers onto the cluster port's semantics."""

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.config import ConfigException

from gpushare.cluster import (
    ClusterError,
    Conflict,
    EventSeverity,
    EventType,
    Expired,
    ObjectRef,
)
from gpushare.cluster.memory import MemoryCluster
from gpushare.kubecluster import KubeCluster
from tests.builders import node, pod
from tests.kubecluster.apiserver import ApiServer


@pytest.fixture
def memory() -> MemoryCluster:
    cluster = MemoryCluster()
    cluster.add_node(node("n1", "2x16GiB", **{"ack.node.gpu.placement": "spread"}))
    cluster.add_node(node("n2", "1x80GiB", mode="core_mem"))
    return cluster


@pytest.fixture
def api(memory: MemoryCluster) -> Iterator[ApiServer]:
    server = ApiServer(memory)
    yield server
    server.close()


def kube_cluster(api: ApiServer, watch_timeout_s: int = 30) -> KubeCluster:
    configuration = client.Configuration()
    configuration.host = api.url
    return KubeCluster(client.ApiClient(configuration), watch_timeout_s=watch_timeout_s)


@pytest.fixture
def kube(api: ApiServer) -> KubeCluster:
    return kube_cluster(api)


def test_nodes_and_pods_arrive_as_gpushare_objects(memory, api, kube):
    memory.create_pod(pod("a", mem=4, core=20))
    nodes = kube.list_nodes()
    assert [n.name for n in nodes.items] == ["n1", "n2"]
    assert nodes.resource_version == str(memory.list_nodes().resource_version)
    n1 = kube.get_node("n1")
    assert n1.metadata.labels["ack.node.gpu.placement"] == "spread"
    assert n1.status.allocatable["aliyun.com/gpu-mem"] == "32"
    assert "gpushare.io/gpus" in n1.metadata.annotations
    a = kube.get_pod("default", "a")
    assert a.spec.containers[0].resources.limits["aliyun.com/gpu-core.percentage"] == "20"
    assert a.metadata.uid == memory.get_pod("default", "a").metadata.uid
    assert a.metadata.creation_timestamp is not None


def test_pods_of_one_node_are_listed_with_a_field_selector(memory, api, kube):
    memory.create_pod(pod("a", mem=1))
    memory.create_pod(pod("b", mem=1))
    memory.bind_pod("default", "b", "n2")
    assert [p.metadata.name for p in kube.list_pods("n2").items] == ["b"]
    assert api.seen("GET", "/api/v1/pods")[-1].query["fieldSelector"] == ["spec.nodeName=n2"]
    assert len(kube.list_pods().items) == 2


def test_server_errors_and_unreachable_servers_are_cluster_errors(api, kube):
    api.failures.append(500)
    with pytest.raises(ClusterError, match="injected failure 500"):
        kube.list_nodes()
    configuration = client.Configuration()
    configuration.host = "http://127.0.0.1:9"  # nothing listens there
    configuration.retries = 0
    with pytest.raises(ClusterError):
        KubeCluster(client.ApiClient(configuration)).list_nodes()


def test_watch_streams_changes_from_a_version_until_stopped(memory, api, kube):
    start = kube.list_pods().resource_version
    memory.create_pod(pod("a", mem=1))
    memory.patch_pod_annotations("default", "a", {"k": "v"})
    memory.delete_pod("default", "a")
    watch = kube.watch_pods(start)
    events = [next(watch) for _ in range(3)]
    watch.stop()
    assert [e.type for e in events] == [EventType.ADDED, EventType.MODIFIED, EventType.DELETED]
    assert events[1].object.metadata.annotations == {"k": "v"}
    query = api.seen("GET", "/api/v1/pods")[-1].query
    assert query["watch"] == ["true"] and query["resourceVersion"] == [start]


def test_a_watch_from_a_compacted_version_is_expired(memory, api, kube):
    start = kube.list_nodes().resource_version
    memory.add_node(node("n3"))
    memory.compact()
    with pytest.raises(Expired, match="too old"):
        next(kube.watch_nodes(start))


def test_annotation_patches_are_merge_patches_with_a_version_precondition(memory, api, kube):
    created = memory.create_pod(pod("a", mem=1, annotations={"old": "1"}))
    patched = kube.patch_pod_annotations(
        "default", "a", {"new": "2", "old": None}, created.metadata.resource_version
    )
    assert patched.metadata.annotations == {"new": "2"}
    sent = api.seen("PATCH")[-1]
    assert sent.content_type == "application/merge-patch+json"
    assert sent.body["metadata"]["resourceVersion"] == created.metadata.resource_version
    with pytest.raises(Conflict, match="modified"):
        kube.patch_pod_annotations("default", "a", {"late": "x"}, created.metadata.resource_version)
    assert "late" not in memory.get_pod("default", "a").metadata.annotations
    node_patched = kube.patch_node_annotations("n1", {"gpushare.io/test": "y"})
    assert node_patched.metadata.annotations["gpushare.io/test"] == "y"


def test_binding_sets_the_node_and_merges_annotations(memory, api, kube):
    created = memory.create_pod(pod("a", mem=1))
    kube.bind_pod("default", "a", "n1", created.metadata.uid, {"gpushare.io/allocation": "{}"})
    bound = memory.get_pod("default", "a")
    assert bound.spec.node_name == "n1"
    assert bound.metadata.annotations["gpushare.io/allocation"] == "{}"
    sent = api.seen("POST", "/binding")[-1]
    assert sent.path == "/api/v1/namespaces/default/pods/a/binding"
    assert sent.body["metadata"]["uid"] == created.metadata.uid
    assert sent.body["target"] == {"apiVersion": "v1", "kind": "Node", "name": "n1"}
    assert (sent.body["apiVersion"], sent.body["kind"]) == ("v1", "Binding")


def test_a_binding_without_uid_or_annotations_sends_neither(memory, api, kube):
    memory.create_pod(pod("a", mem=1))
    kube.bind_pod("default", "a", "n1")
    meta = api.seen("POST", "/binding")[-1].body["metadata"]
    assert meta == {"name": "a", "namespace": "default"}
    assert memory.get_pod("default", "a").spec.node_name == "n1"


def test_binds_and_events_leave_their_connection_clean_for_the_next_request(memory, api, kube):
    """Their answer is not decoded, but it must be read: a connection handed back with
    the body unread is either dropped (a new connection per bind) or, if the body
    arrives late, gives the next request on it a garbled status line."""
    for i in range(5):
        created = memory.create_pod(pod(f"p{i}", mem=1))
        kube.bind_pod("default", f"p{i}", "n1", created.metadata.uid)
        kube.record_event(ObjectRef.of_pod(created), EventSeverity.NORMAL, "Test", "bound")
        assert kube.get_pod("default", f"p{i}").spec.node_name == "n1"
    assert api.connections == 1


def test_events_are_recorded_on_the_object_and_never_raise(memory, api, kube):
    created = memory.create_pod(pod("a", mem=1))
    ref = ObjectRef.of_pod(created)
    kube.record_event(ref, EventSeverity.WARNING, "GpuRefused", "no GPU has 3 GiB free")
    event = api.events[-1]
    assert event["involvedObject"]["kind"] == "Pod"
    assert event["involvedObject"]["uid"] == created.metadata.uid
    assert event["reason"] == "GpuRefused" and event["type"] == "Warning"
    assert event["message"] == "no GPU has 3 GiB free"
    assert api.seen("POST", "/events")[-1].path == "/api/v1/namespaces/default/events"
    # What `kubectl get events` and describe show: by whom, when (RFC 3339), how often.
    assert event["metadata"] == {"generateName": "a.", "namespace": "default"}
    assert event["source"] == {"component": "gpushare"}
    assert event["reportingComponent"] == "gpushare" and event["count"] == 1
    first = datetime.fromisoformat(event["firstTimestamp"])
    assert first.tzinfo is not None and abs(datetime.now(UTC) - first) < timedelta(minutes=1)
    assert event["lastTimestamp"] == event["firstTimestamp"]
    api.failures.append(500)
    kube.record_event(ref, EventSeverity.NORMAL, "Ignored", "the server is down")


@pytest.fixture
def no_configuration(monkeypatch, tmp_path: Path) -> Path:
    """A shell with no $KUBECONFIG, an empty home and no pod around it; the home."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    return home


def test_from_config_reads_the_kubeconfig_given(memory, api, no_configuration, tmp_path: Path):
    path = api.write_kubeconfig(tmp_path / "kubeconfig")
    kube = KubeCluster.from_config(str(path))
    assert [n.name for n in kube.list_nodes().items] == ["n1", "n2"]


def test_from_config_reads_the_kubeconfig_env_as_kubectl_does(
    memory, api, no_configuration, monkeypatch, tmp_path: Path
):
    path = api.write_kubeconfig(tmp_path / "elsewhere" / "config")
    (no_configuration / ".kube").mkdir()
    (no_configuration / ".kube" / "config").write_text("not: the one\n")  # $KUBECONFIG wins
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'missing'}:{path}")
    kube = KubeCluster.from_config(None)
    assert [n.name for n in kube.list_nodes().items] == ["n1", "n2"]
    assert str(path) in kube.origin


def test_from_config_falls_back_to_the_home_kubeconfig(memory, api, no_configuration):
    api.write_kubeconfig(no_configuration / ".kube" / "config")
    kube = KubeCluster.from_config(None)
    assert [n.name for n in kube.list_nodes().items] == ["n1", "n2"]


def test_from_config_without_any_configuration_names_what_it_tried(no_configuration):
    with pytest.raises(ConfigException) as missing:
        KubeCluster.from_config(None)
    message = str(missing.value)
    assert "~/.kube/config" in message and "in-cluster" in message
    with pytest.raises(ConfigException, match="the kubeconfig /nonexistent/config: does not exist"):
        KubeCluster.from_config("/nonexistent/config")


def test_one_node_is_listed_and_watched_by_its_name(memory, api, kube):
    listing = kube.list_nodes("n2")
    assert [n.name for n in listing.items] == ["n2"]
    assert api.seen("GET", "/api/v1/nodes")[-1].query["fieldSelector"] == ["metadata.name=n2"]
    memory.patch_node_annotations("n1", {"beat": "1"})
    memory.patch_node_annotations("n2", {"beat": "1"})
    watch = kube.watch_nodes(listing.resource_version, "n2")
    event = next(watch)
    watch.stop()
    assert (event.type, event.object.name) == (EventType.MODIFIED, "n2")
    query = api.seen("GET", "/api/v1/nodes")[-1].query
    assert query["watch"] == ["true"] and query["fieldSelector"] == ["metadata.name=n2"]


def test_lists_come_from_the_watch_cache_and_watches_take_bookmarks(memory, api, kube):
    """resourceVersion=0 lists spare etcd; a bookmark moves where the next watch starts,
    so a quiet collection does not fall out of the server's window (410, a full list)."""
    listing = kube.list_pods()
    assert api.seen("GET", "/api/v1/pods")[-1].query["resourceVersion"] == ["0"]
    watch = kube.watch_pods(listing.resource_version)
    memory.create_pod(pod("a", mem=1))
    event = next(watch)
    query = api.seen("GET", "/api/v1/pods")[-1].query
    assert query["watch"] == ["true"] and query["allowWatchBookmarks"] == ["true"]
    assert watch.resume_from == event.object.metadata.resource_version
    api.bookmark("9999")
    api.end_watches()  # the server ends the stream right after the bookmark
    with pytest.raises(StopIteration):
        next(watch)
    assert watch.resume_from == "9999"


def test_a_refused_watch_raises_when_it_is_made(memory, api, kube):
    version = kube.list_pods().resource_version
    api.failures.append(500)
    with pytest.raises(ClusterError, match="watch pods: injected failure 500"):
        kube.watch_pods(version)


def many_pods(memory: MemoryCluster, count: int) -> None:
    for i in range(count):
        memory.create_pod(pod(f"p{i:04}", mem=1, node="n1"))


def pod_lists(api: ApiServer) -> list[dict[str, list[str]]]:
    return [r.query for r in api.seen("GET", "/api/v1/pods") if "watch" not in r.query]


def keys(listing) -> list[str]:
    return [p.key for p in listing.items]


def test_a_list_from_the_watch_cache_comes_whole_in_one_answer(memory, api, kube):
    """The watch cache answers resourceVersion=0 lists whole, ignoring the limit."""
    many_pods(memory, 1200)
    listing = kube.list_pods()
    assert pod_lists(api) == [{"resourceVersion": ["0"], "limit": ["500"]}]
    assert sorted(keys(listing)) == sorted(keys(memory.list_pods()))


def test_a_list_in_pages_arrives_whole(memory, api, kube):
    """Without the watch cache, etcd answers 500 a page: every page is followed."""
    api.watch_cache = False
    many_pods(memory, 1200)
    listing = kube.list_pods("n1")

    first, *rest = pod_lists(api)
    assert first == {
        "resourceVersion": ["0"],
        "limit": ["500"],
        "fieldSelector": ["spec.nodeName=n1"],
    }
    assert len(rest) == 2
    assert all(q["limit"] == ["500"] and "resourceVersion" not in q for q in rest)
    assert all(q["continue"] for q in rest)
    assert len(keys(listing)) == len(set(keys(listing))) == 1200
    assert set(keys(listing)) == set(keys(memory.list_pods()))
    assert listing.resource_version == memory.list_pods().resource_version


def test_an_expired_continue_starts_a_consistent_list_again(memory, api, kube):
    """etcd compacted the first page's version between pages (410): the list starts
    again without a resourceVersion and sees the cluster as it is then, once."""
    api.watch_cache = False
    many_pods(memory, 1200)
    api.expire_continues = 1

    def meanwhile() -> None:
        api.between_pages = None
        memory.delete_pod("default", "p0000")
        memory.create_pod(pod("late", mem=1, node="n1"))

    api.between_pages = meanwhile
    listing = kube.list_pods()

    queries = pod_lists(api)
    assert queries[0]["resourceVersion"] == ["0"]
    assert "continue" in queries[1]  # answered 410
    assert "resourceVersion" not in queries[2] and "continue" not in queries[2]
    assert len(queries) == 5
    assert len(keys(listing)) == len(set(keys(listing))) == 1200
    assert set(keys(listing)) == set(keys(memory.list_pods()))
    assert "default/late" in keys(listing) and "default/p0000" not in keys(listing)
    assert listing.resource_version == memory.list_pods().resource_version


def test_a_list_that_expires_again_is_an_error_not_a_new_list_at_once(memory, api, kube):
    api.watch_cache = False
    many_pods(memory, 600)
    api.expire_continues = 2
    with pytest.raises(ClusterError, match="expired again while paging") as failed:
        kube.list_pods()
    assert not isinstance(failed.value, Expired)
