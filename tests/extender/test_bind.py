"""bind over HTTP: idempotent, never over-allocating, and recoverable after a restart."""

import json
import random
import threading
from collections import defaultdict

from gpushare import annotation
from gpushare.cluster import ClusterError, EventSeverity, ObjectRef
from gpushare.cluster.memory import MemoryCluster
from gpushare.inventory import parse_layout
from gpushare.state import ClusterState
from tests.builders import node, pod
from tests.extender.harness import Scheduler, allocation_of, wait_until


def test_binding_writes_the_allocation_and_the_node_at_once(cluster, scheduler_for):
    cluster.add_node(node("n", "2x16GiB"))
    s = scheduler_for()
    p = s.submit(pod("p", mem=4))
    assert s.bind(p, "n") == ""
    bound = cluster.get_pod("default", "p")
    assert bound.spec.node_name == "n"
    allocation = annotation.decode(bound)
    assert allocation.node == "n" and allocation.total_mem == 4
    assert bound.metadata.annotations["ALIYUN_COM_GPU_MEM_POD"] == "4"
    [event] = s.posted_events("GpuAllocated")
    assert event.severity is EventSeverity.NORMAL


def test_binding_again_to_the_same_node_is_success_and_changes_nothing(cluster, scheduler_for):
    cluster.add_node(node("n", "2x16GiB"))
    s = scheduler_for()
    p = s.submit(pod("p", mem=4))
    assert s.bind(p, "n") == ""
    first = cluster.get_pod("default", "p")
    assert s.bind(p, "n") == ""
    assert cluster.get_pod("default", "p").metadata.annotations == first.metadata.annotations
    wait_until(
        lambda: not list(s.service.cache.details().assumed), what="the watch to confirm the bind"
    )
    assert s.service.cache.snapshot().gpus["n"][0][0] == 4  # counted once


def test_binding_to_another_node_than_the_one_bound_is_an_error(cluster, scheduler_for):
    cluster.add_node(node("a", "1x16GiB"))
    cluster.add_node(node("b", "1x16GiB"))
    s = scheduler_for()
    p = s.submit(pod("p", mem=4))
    assert s.bind(p, "a") == ""
    error = s.bind(p, "b")
    assert "already bound to node a" in error
    assert s.service.cache.snapshot().gpus["b"][0][0] == 0


def test_a_recreated_pod_is_not_bound_on_the_old_ones_behalf(cluster, scheduler_for):
    cluster.add_node(node("n", "1x16GiB"))
    s = scheduler_for()
    old = s.submit(pod("p", mem=4))
    cluster.delete_pod("default", "p")
    fresh = old.model_copy(update={"metadata": old.metadata.model_copy(update={"uid": "another"})})
    s.submit(fresh)
    assert "created again" in s.bind(old, "n")
    assert cluster.get_pod("default", "p").spec.node_name is None


def test_a_bind_that_no_longer_fits_is_refused_with_the_reason(cluster, scheduler_for):
    cluster.add_node(node("n", "1x16GiB"))
    s = scheduler_for()
    a = s.submit(pod("a", mem=10))
    b = s.submit(pod("b", mem=10))
    assert s.filter(b)["NodeNames"] == ["n"]  # both fit, one at a time
    assert s.bind(a, "n") == ""
    error = s.bind(b, "n")
    assert "[insufficient-gpu-memory]" in error
    assert cluster.get_pod("default", "b").spec.node_name is None
    assert annotation.ALLOCATION not in cluster.get_pod("default", "b").metadata.annotations


class _FailingBinds(MemoryCluster):
    """An API server that refuses every Binding with a server error."""

    def bind_pod(self, *args, **kwargs) -> None:
        raise ClusterError("the server is unavailable (HTTP 503)")


def test_a_failed_binding_leaves_no_annotation_and_no_reservation():
    failing = _FailingBinds()
    failing.add_node(node("n", "1x16GiB"))
    s = Scheduler(failing)
    try:
        p = s.submit(pod("p", mem=8))
        error = s.bind(p, "n")
        assert "HTTP 503" in error
        assert not list(s.service.cache.details().assumed)
        assert s.service.cache.snapshot().gpus["n"][0][0] == 0
        after = failing.get_pod("default", "p")
        assert after.spec.node_name is None
        assert not set(annotation.ALL_KEYS) & set(after.metadata.annotations)
    finally:
        s.close()


def _recount(cluster: MemoryCluster) -> dict[tuple[str, int], list[int]]:
    """Memory and pods per GPU from the raw annotations, without the core's decoder."""
    used: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
    for p in cluster.list_pods().items:
        raw = p.metadata.annotations.get("gpushare.io/allocation")
        if raw is None:
            continue
        document = json.loads(raw)
        assert p.spec.node_name == document["node"], f"{p.key} annotated but not bound there"
        for container in document["containers"]:
            for gpu in container["gpus"]:
                slot = used[(document["node"], gpu["index"])]
                slot[0] += gpu["memGiB"]
                slot[1] += 1
    return used


def test_a_thousand_binds_from_eight_threads_never_over_allocate(cluster, scheduler_for):
    layouts = {"n1": "2x16GiB", "n2": "2x16GiB", "n3": "1x24GiB", "n4": "4x8GiB"}
    for name, layout in layouts.items():
        cluster.add_node(node(name, layout))
    s = scheduler_for(max_pods_per_gpu=6)
    rng = random.Random(7)
    pods = [cluster.create_pod(pod(f"p{i}", mem=rng.randint(1, 5))) for i in range(1000)]
    wait_until(lambda: s.service.cache.counts().pods == 1000, what="the watch to see 1000 pods")
    names = list(layouts)
    bound: list[str] = []
    failures: list[BaseException] = []

    def worker(share: list) -> None:
        local = random.Random(len(share))
        try:
            for p in share:
                passed = s.filter(p)["NodeNames"] or names
                if s.bind(p, local.choice(passed)) == "":
                    bound.append(p.key)
        except BaseException as err:  # surfaced below
            failures.append(err)

    threads = [threading.Thread(target=worker, args=(pods[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures

    used = _recount(cluster)
    capacity = {(n, g.index): g.mem for n in layouts for g in parse_layout(layouts[n], n)}
    for gpu, (mem, count) in used.items():
        assert mem <= capacity[gpu], f"GPU {gpu} holds {mem} GiB of {capacity[gpu]}"
        assert count <= 6, f"GPU {gpu} holds {count} pods"
    annotated = {
        p.key
        for p in cluster.list_pods().items
        if "gpushare.io/allocation" in p.metadata.annotations
    }
    assert annotated == set(bound)
    assert len(bound) > 30  # the cluster did fill up
    assert sum(mem for mem, _ in used.values()) > 0.8 * sum(capacity.values())
    wait_until(
        lambda: not list(s.service.cache.details().assumed), what="every bind seen by the watch"
    )
    rebuilt, problems = ClusterState.rebuild(cluster.list_nodes().items, cluster.list_pods().items)
    assert not problems
    assert s.service.cache.snapshot() == rebuilt.snapshot()


def test_an_extender_restarted_mid_stream_rebuilds_the_same_state(cluster):
    for name in ("a", "b", "c"):
        cluster.add_node(node(name, "2x16GiB"))
    rng = random.Random(3)
    stream = [cluster.create_pod(pod(f"p{i}", mem=rng.randint(1, 6))) for i in range(60)]
    first = Scheduler(cluster)
    for p in stream[:25]:
        first.schedule(p)
    wait_until(
        lambda: not list(first.service.cache.details().assumed), what="the first extender to settle"
    )
    before = first.service.cache.snapshot()
    first.close()

    second = Scheduler(cluster)
    try:
        assert second.service.cache.snapshot() == before
        for p in stream[25:]:
            second.schedule(p)
        wait_until(
            lambda: not list(second.service.cache.details().assumed), what="the second to settle"
        )
        rebuilt, _ = ClusterState.rebuild(cluster.list_nodes().items, cluster.list_pods().items)
        assert second.service.cache.snapshot() == rebuilt.snapshot()
        for _, gpus in rebuilt.snapshot().gpus.items():
            assert all(mem <= 16 for mem, _, _ in gpus.values())
        assert allocation_of(cluster, "default", "p0") is not None
    finally:
        second.close()


def test_an_extender_stopped_while_binds_are_in_flight_leaves_a_consistent_cluster(cluster):
    for name in ("a", "b"):
        cluster.add_node(node(name, "2x16GiB"))
    rng = random.Random(5)
    stream = [cluster.create_pod(pod(f"p{i}", mem=rng.randint(1, 4))) for i in range(120)]
    first = Scheduler(cluster)
    progress = threading.Semaphore(0)

    def worker(share: list) -> None:
        for p in share:
            try:
                first.schedule(p)
            except Exception:  # the extender went away under us: what kube-scheduler sees
                return
            progress.release()

    threads = [threading.Thread(target=worker, args=(stream[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for _ in range(20):
        assert progress.acquire(timeout=30)
    first.close()  # mid-stream, with binds in flight
    for t in threads:
        t.join()

    second = Scheduler(cluster)
    try:
        rebuilt, _ = ClusterState.rebuild(cluster.list_nodes().items, cluster.list_pods().items)
        assert second.service.cache.snapshot() == rebuilt.snapshot()
        for p in stream:
            if cluster.get_pod("default", p.metadata.name).spec.node_name is None:
                second.schedule(p)
        used = _recount(cluster)
        assert all(mem <= 16 and count <= 20 for mem, count in used.values())
        wait_until(
            lambda: not list(second.service.cache.details().assumed), what="the second to settle"
        )
        rebuilt, _ = ClusterState.rebuild(cluster.list_nodes().items, cluster.list_pods().items)
        assert second.service.cache.snapshot() == rebuilt.snapshot()
    finally:
        second.close()


class _LostAnswers(MemoryCluster):
    """An API server that fails the first Binding without an answer and then cannot
    be read: the extender cannot tell whether the bind happened."""

    def __init__(self) -> None:
        super().__init__()
        self.outage = False
        self.reads = 0

    def bind_pod(self, *args, **kwargs) -> None:
        if self.outage:
            raise ClusterError("timed out waiting for the API server")
        super().bind_pod(*args, **kwargs)

    def get_pod(self, namespace: str, name: str):
        if self.outage and name == "p":
            self.reads += 1
            if self.reads == 2:  # the read after the lost Binding; then the outage ends
                self.outage = False
                raise ClusterError("timed out waiting for the API server")
        return super().get_pod(namespace, name)


def test_an_unanswered_bind_keeps_its_reservation_until_the_pod_is_bound_again():
    cluster = _LostAnswers()
    cluster.add_node(node("n", "1x16GiB"))
    s = Scheduler(cluster)
    try:
        p = s.submit(pod("p", mem=10))
        other = s.submit(pod("other", mem=10))
        cluster.outage = True
        error = s.bind(p, "n")
        assert "timed out" in error
        assert "default/p" in list(
            s.service.cache.details().assumed
        )  # it may have been bound after all
        assert "[insufficient-gpu-memory]" in s.bind(other, "n")
        assert s.bind(p, "n") == ""  # the scheduler retries; our own reservation is no bar
        assert cluster.get_pod("default", "p").spec.node_name == "n"
    finally:
        s.close()


def test_a_pod_being_deleted_holds_its_gpu_until_it_is_gone(cluster, scheduler_for):
    """Graceful termination can take minutes: its containers still use the GPU."""
    cluster.add_node(node("n", "3x16GiB"))
    s = scheduler_for()
    for name in ("old", "other"):
        assert s.schedule(s.submit(pod(name, mem=16))) == "n"
    assert allocation_of(cluster, "default", "old").gpu_indices == (0,)
    cluster.begin_pod_deletion("default", "old")
    new = s.submit(pod("new", mem=16))  # seen after the deletion: one watch, in order

    assert s.schedule(new) == "n"
    assert allocation_of(cluster, "default", "new").gpu_indices == (2,)
    assert "[insufficient-gpu-memory]" in s.filter(s.submit(pod("more", mem=1)))["FailedNodes"]["n"]

    cluster.delete_pod("default", "old")
    wait_until(lambda: s.filter(pod("more", mem=1))["NodeNames"] == ["n"], what="GPU 0 to be free")


class _CountedReads(MemoryCluster):
    """An API server that counts the pod reads made outside its own Binding handling."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []
        self._binding = threading.local()

    def get_pod(self, namespace: str, name: str):
        if not getattr(self._binding, "active", False):
            self.reads.append(f"{namespace}/{name}")
        return super().get_pod(namespace, name)

    def bind_pod(self, *args, **kwargs) -> None:
        self._binding.active = True
        try:
            super().bind_pod(*args, **kwargs)
        finally:
            self._binding.active = False


def test_a_pod_filter_saw_is_bound_without_reading_it_again():
    """One API read less per GPU pod: the Binding's UID precondition guards it instead."""
    cluster = _CountedReads()
    cluster.add_node(node("n", "2x16GiB"))
    s = Scheduler(cluster)
    try:
        seen = s.submit(pod("seen", mem=4))
        assert s.filter(seen)["NodeNames"] == ["n"]
        assert s.bind(seen, "n") == ""
        assert cluster.reads == []
        assert allocation_of(cluster, "default", "seen").total_mem == 4
        [event] = s.posted_events("GpuAllocated")
        assert event.ref == ObjectRef.of_pod(seen)  # the pod, by its UID
        cluster.reads.clear()  # the test's own read just now

        unseen = s.submit(pod("unseen", mem=4))  # bound by a scheduler that did not filter here
        assert s.bind(unseen, "n") == ""
        assert cluster.reads == ["default/unseen"]
    finally:
        s.close()


def test_a_pod_made_again_after_filter_is_not_bound_on_the_old_ones_behalf(cluster, scheduler_for):
    cluster.add_node(node("n", "1x16GiB"))
    s = scheduler_for()
    old = s.submit(pod("p", mem=4))
    assert s.filter(old)["NodeNames"] == ["n"]
    cluster.delete_pod("default", "p")
    cluster.create_pod(
        old.model_copy(update={"metadata": old.metadata.model_copy(update={"uid": "another"})})
    )  # whether or not the watch has shown it yet
    error = s.bind(old, "n")
    assert "created again" in error or "UID in precondition" in error
    assert cluster.get_pod("default", "p").spec.node_name is None
    assert not list(s.service.cache.details().assumed)


def test_a_pod_bound_elsewhere_after_filter_is_not_bound_twice(cluster, scheduler_for):
    cluster.add_node(node("a", "1x16GiB"))
    cluster.add_node(node("b", "1x16GiB"))
    s = scheduler_for()
    p = s.submit(pod("p", mem=4))
    assert s.filter(p)["NodeNames"] == ["a", "b"]
    cluster.bind_pod("default", "p", "a")  # another scheduler was quicker
    assert "already bound to node a" in s.bind(p, "b")
    assert cluster.get_pod("default", "p").spec.node_name == "a"
    assert s.service.cache.snapshot().gpus["b"][0][0] == 0


def test_a_pod_being_deleted_after_filter_is_not_bound(cluster, scheduler_for):
    cluster.add_node(node("n", "1x16GiB"))
    s = scheduler_for()
    p = s.submit(pod("p", mem=4))
    assert s.filter(p)["NodeNames"] == ["n"]
    cluster.begin_pod_deletion("default", "p")
    assert "being deleted" in s.bind(p, "n")
    assert cluster.get_pod("default", "p").spec.node_name is None
    assert not list(s.service.cache.details().assumed)
