"""The watch cache lists, follows, re-lists after 410 Gone and reconnects after failures,
over the in-memory cluster and over the Kubernetes API alike."""

import threading
import time
from collections.abc import Callable

import pytest
from kubernetes import client

from gpushare.backoff import Backoff
from gpushare.cluster import ClusterError, EventType
from gpushare.cluster.memory import MemoryCluster, MemoryWatch
from gpushare.kubecluster import KubeCluster, WatchCache
from gpushare.objects import Pod
from tests.builders import node, pod
from tests.kubecluster.apiserver import ApiServer

FAST = Backoff(initial=0.01, maximum=0.05)


def eventually(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


class Mirror:
    """A sink that keeps what it was told, by pod key."""

    def __init__(self) -> None:
        self.pods: dict[str, Pod] = {}
        self.replacements = 0
        self.lock = threading.Lock()

    def replace(self, items: list[Pod]) -> None:
        with self.lock:
            self.pods = {p.key: p for p in items}
            self.replacements += 1

    def apply(self, event_type: EventType, obj: Pod) -> None:
        with self.lock:
            if event_type is EventType.DELETED:
                self.pods.pop(obj.key, None)
            else:
                self.pods[obj.key] = obj

    def annotations(self) -> dict[str, dict[str, str]]:
        with self.lock:
            return {k: dict(p.metadata.annotations) for k, p in self.pods.items()}


class Breakable:
    """A watch that raises `broken` once its stream ends, as a dropped connection does."""

    def __init__(self, inner: MemoryWatch[Pod], cluster: "Interruptible") -> None:
        self._inner = inner
        self._cluster = cluster

    @property
    def resume_from(self) -> str:
        return self._inner.resume_from

    def __iter__(self):
        yield from self._inner
        if self._cluster.broken is not None:
            raise self._cluster.broken

    def stop(self) -> None:
        self._inner.stop()

    def __getattr__(self, name: str):
        return getattr(self._inner, name)  # push(), for the test API server's bookmarks


class Interruptible(MemoryCluster):
    """A MemoryCluster whose watches can be cut or broken, and whose next watches can
    fail; it remembers the version each watch started from."""

    def __init__(self) -> None:
        super().__init__()
        self.open: list[MemoryWatch[Pod]] = []
        self.failing_watches = 0
        self.broken: Exception | None = None
        self.watched_from: list[str] = []
        self.gate = threading.Event()
        """Cleared, new watches wait until it is set again."""
        self.gate.set()

    def watch_pods(self, resource_version: str, node_name: str | None = None) -> Breakable:
        self.gate.wait(10)
        if self.failing_watches:
            self.failing_watches -= 1
            raise ClusterError("connection refused")
        watch = super().watch_pods(resource_version, node_name)
        self.watched_from.append(resource_version)
        self.open.append(watch)
        return Breakable(watch, self)

    def cut(self) -> None:
        for watch in self.open:
            watch.stop()

    def break_watches(self, error: Exception) -> None:
        self.broken = error
        self.cut()


def same_as(cluster: MemoryCluster, mirror: Mirror, keep=lambda p: True) -> bool:
    want = {p.key: dict(p.metadata.annotations) for p in cluster.list_pods().items if keep(p)}
    return mirror.annotations() == want


@pytest.fixture
def memory() -> Interruptible:
    cluster = Interruptible()
    cluster.add_node(node("n"))
    return cluster


def pod_cache(cluster, mirror: Mirror, **kwargs) -> WatchCache[Pod]:
    return WatchCache(
        "pods", cluster.list_pods, cluster.watch_pods, mirror, backoff=FAST, **kwargs
    ).start()


def test_it_lists_then_follows_every_change(memory):
    memory.create_pod(pod("before", mem=1))
    mirror = Mirror()
    cache = pod_cache(memory, mirror)
    try:
        assert cache.synced.wait(5)
        memory.create_pod(pod("after", mem=1))
        memory.patch_pod_annotations("default", "before", {"k": "v"})
        memory.delete_pod("default", "after")
        eventually(lambda: same_as(memory, mirror))
        assert mirror.replacements == 1
    finally:
        cache.stop()


def test_a_watch_resumes_without_relisting_while_its_version_is_kept(memory):
    mirror = Mirror()
    cache = pod_cache(memory, mirror)
    try:
        assert cache.synced.wait(5)
        memory.cut()
        memory.create_pod(pod("p", mem=1))
        eventually(lambda: same_as(memory, mirror))
        assert cache.relists == 0
    finally:
        cache.stop()


def test_an_expired_version_makes_it_list_again(memory):
    mirror = Mirror()
    cache = pod_cache(memory, mirror)
    try:
        assert cache.synced.wait(5)
        memory.gate.clear()
        memory.cut()
        memory.create_pod(pod("missed", mem=1))
        memory.compact()
        memory.gate.set()
        eventually(lambda: same_as(memory, mirror))
        assert cache.relists == 1
    finally:
        cache.stop()


def test_failures_are_retried_with_backoff(memory):
    mirror = Mirror()
    cache = pod_cache(memory, mirror)
    try:
        assert cache.synced.wait(5)
        memory.failing_watches = 3
        memory.cut()
        memory.create_pod(pod("p", mem=1))
        eventually(lambda: same_as(memory, mirror))
        assert cache.reconnects >= 3
    finally:
        cache.stop()


def test_objects_that_stop_being_interesting_leave_the_cache(memory):
    mirror = Mirror()
    cache = pod_cache(memory, mirror, keep=lambda p: "keep" in p.metadata.annotations)
    try:
        assert cache.synced.wait(5)
        memory.create_pod(pod("p", mem=1, annotations={"keep": "1"}))
        eventually(lambda: "default/p" in mirror.pods)
        memory.patch_pod_annotations("default", "p", {"keep": None})
        eventually(lambda: "default/p" not in mirror.pods)
    finally:
        cache.stop()


def test_over_the_kubernetes_api_it_survives_dropped_streams_and_410(memory):
    api = ApiServer(memory)
    configuration = client.Configuration()
    configuration.host = api.url
    kube = KubeCluster(client.ApiClient(configuration), watch_timeout_s=30)
    mirror = Mirror()
    cache = pod_cache(kube, mirror)
    try:
        assert cache.synced.wait(10)
        memory.create_pod(pod("a", mem=1))
        eventually(lambda: same_as(memory, mirror))

        api.failures.append(500)  # the next watch request fails
        api.end_watches()
        memory.create_pod(pod("b", mem=1))
        eventually(lambda: same_as(memory, mirror))
        assert cache.reconnects >= 1

        lists = len([r for r in api.seen("GET", "/api/v1/pods") if "watch" not in r.query])
        api.watch_gate.clear()
        api.end_watches()
        memory.create_pod(pod("c", mem=1))
        memory.compact()  # the resume version is gone: 410 in the stream
        api.watch_gate.set()
        eventually(lambda: same_as(memory, mirror))
        assert cache.relists == 1
        relisted = [r for r in api.seen("GET", "/api/v1/pods") if "watch" not in r.query]
        assert len(relisted) == lists + 1
    finally:
        cache.stop()
        api.close()


def test_over_the_kubernetes_api_it_resumes_from_the_last_bookmark(memory):
    api = ApiServer(memory)
    configuration = client.Configuration()
    configuration.host = api.url
    kube = KubeCluster(client.ApiClient(configuration), watch_timeout_s=30)
    mirror = Mirror()
    cache = pod_cache(kube, mirror)
    try:
        assert cache.synced.wait(10)
        eventually(lambda: any(r.query.get("watch") for r in api.seen("GET", "/api/v1/pods")))
        memory.add_node(node("quiet", "1x16GiB"))  # the version moves; no pod event
        newer = memory.list_nodes().resource_version
        api.bookmark(newer)
        api.end_watches()

        def resumed_at() -> list[str]:
            watches = [r for r in api.seen("GET", "/api/v1/pods") if r.query.get("watch")]
            return watches[-1].query["resourceVersion"] if len(watches) > 1 else []

        eventually(lambda: resumed_at() == [newer])
        assert cache.relists == 0
    finally:
        cache.stop()
        api.close()


def test_a_broken_stream_resumes_from_its_last_event(memory):
    mirror = Mirror()
    cache = pod_cache(memory, mirror)
    try:
        assert cache.synced.wait(5)
        listed_at = memory.watched_from[0]
        memory.create_pod(pod("a", mem=1))
        last = memory.create_pod(pod("b", mem=1)).metadata.resource_version
        eventually(lambda: same_as(memory, mirror))

        memory.break_watches(ClusterError("connection reset by peer"))
        eventually(lambda: len(memory.watched_from) == 2)
        memory.broken = None
        assert memory.watched_from == [listed_at, last]  # no replay of a and b
        assert (cache.relists, cache.reconnects) == (0, 1)
    finally:
        cache.stop()


def test_trouble_says_since_when_and_why_until_the_watch_is_back(memory):
    mirror = Mirror()
    cache = pod_cache(memory, mirror)
    try:
        assert cache.synced.wait(5)
        assert cache.trouble() is None
        memory.failing_watches = 1_000_000
        memory.cut()
        eventually(lambda: cache.trouble() is not None)
        trouble = cache.trouble()
        assert trouble is not None
        assert trouble.startswith("watching pods has failed since ")
        assert trouble.endswith(" UTC: connection refused")

        memory.failing_watches = 0
        eventually(lambda: cache.trouble() is None)
        memory.create_pod(pod("p", mem=1))
        eventually(lambda: same_as(memory, mirror))
    finally:
        cache.stop()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_trouble_says_when_the_thread_has_died(memory):
    class Doomed(Mirror):
        def replace(self, items: list[Pod]) -> None:
            raise SystemExit  # not an error it retries: the thread ends

    cache = pod_cache(memory, Doomed())
    try:
        eventually(lambda: cache.trouble() is not None)
        assert cache.trouble() == "watching pods has stopped (see the log)"
    finally:
        cache.stop()
