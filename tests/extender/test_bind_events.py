"""bind's GpuAllocated event, posted after bind answers: bind never waits for it nor
fails with it, a queue the API server cannot keep up with drops and counts, and
stopping posts what is queued first, for a bounded while."""

import logging
import threading
import time

import httpx

from gpushare.cluster import EventSeverity, ObjectRef
from gpushare.cluster.memory import MemoryCluster
from gpushare.extender.cache import SchedulerCache
from gpushare.extender.eventqueue import PodEventQueue
from gpushare.extender.metrics import ExtenderMetrics
from tests.builders import node, pod
from tests.extender.harness import RefusingEvents, Scheduler

DROPPED = "gpushare_extender_events_dropped_total"


class _HeldEvents(MemoryCluster):
    """An API server that holds each event until `release` is set (5 s at most)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def record_event(
        self, ref: ObjectRef, severity: EventSeverity, reason: str, message: str
    ) -> None:
        self.entered.set()
        self.release.wait(5)
        super().record_event(ref, severity, reason, message)


class _SlowEvents(MemoryCluster):
    """An API server that takes `delay_s` per event."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s

    def record_event(
        self, ref: ObjectRef, severity: EventSeverity, reason: str, message: str
    ) -> None:
        time.sleep(self.delay_s)
        super().record_event(ref, severity, reason, message)


def _queue(cluster: MemoryCluster, capacity: int = 10) -> tuple[PodEventQueue, ExtenderMetrics]:
    metrics = ExtenderMetrics(SchedulerCache())
    return PodEventQueue(cluster, metrics.events_dropped, capacity), metrics


def _post(queue: PodEventQueue, *numbers: int) -> None:
    for i in numbers:
        ref = ObjectRef("Pod", f"p{i}", "default", f"uid-{i}")
        queue.post(ref, EventSeverity.NORMAL, "GpuAllocated", f"event {i}")


def _messages(cluster: MemoryCluster) -> list[str]:
    return [e.message for e in cluster.events]


def _dropped(metrics: ExtenderMetrics, reason: str) -> float | None:
    return metrics.registry.get_sample_value(DROPPED, {"reason": reason})


# ----- through the extender, as kube-scheduler binds


def test_bind_answers_before_its_event_is_posted():
    cluster = _HeldEvents()
    cluster.add_node(node("n", "1x16GiB"))
    s = Scheduler(cluster)
    try:
        p = s.submit(pod("p", mem=4))
        assert s.bind(p, "n") == ""
        assert cluster.get_pod("default", "p").spec.node_name == "n"
        assert cluster.entered.wait(5), "the event was never posted"
        assert cluster.events == []  # bind answered while its event waits on the API server
        cluster.release.set()
        [event] = s.posted_events("GpuAllocated")
        assert event.ref == ObjectRef.of_pod(p)
        assert event.message.startswith("node n: ") and "on GPU 0 (" in event.message
    finally:
        cluster.release.set()
        s.close()


def test_an_event_the_api_refuses_is_logged_and_the_bind_still_succeeds(caplog):
    cluster = RefusingEvents("p")
    cluster.add_node(node("n", "1x16GiB"))
    caplog.set_level(logging.WARNING, logger="gpushare.extender")
    s = Scheduler(cluster)
    try:
        p, q = s.submit(pod("p", mem=4)), s.submit(pod("q", mem=4))
        assert s.bind(p, "n") == ""
        assert s.bind(q, "n") == ""
        assert [e.ref.name for e in s.posted_events("GpuAllocated")] == ["q"]  # it went on
        metrics = httpx.get(f"{s.server.url}/metrics").text
    finally:
        s.close()
    assert cluster.get_pod("default", "p").spec.node_name == "n"
    assert 'gpushare_extender_binds_total{result="bound"} 2.0' in metrics
    assert [r.getMessage() for r in caplog.records] == [
        "could not post the GpuAllocated event of pod default/p: events is forbidden"
    ]


def test_a_clean_shutdown_posts_the_events_binds_just_queued():
    cluster = _SlowEvents(0.05)
    cluster.add_node(node("n", "1x16GiB"))
    s = Scheduler(cluster)
    try:
        binds = [s.submit(pod(f"p{i}", mem=1)) for i in range(5)]
        assert [s.bind(p, "n") for p in binds] == [""] * 5
    finally:
        s.close()
    assert [e.ref.name for e in cluster.events] == [f"p{i}" for i in range(5)]


# ----- the queue alone


def test_a_full_queue_drops_new_events_counts_them_and_logs_once_per_burst(caplog):
    cluster = MemoryCluster()
    queue, metrics = _queue(cluster, capacity=3)  # not started: nothing is posted meanwhile
    assert _dropped(metrics, "queue-full") == 0
    with caplog.at_level(logging.WARNING, logger="gpushare.extender.eventqueue"):
        _post(queue, 0, 1, 2, 3, 4)
        assert _dropped(metrics, "queue-full") == 2
        assert len(caplog.records) == 1
        assert queue.work() == 3  # the oldest, in order
        _post(queue, 5, 6, 7, 8)  # room again, then a second burst
        assert _dropped(metrics, "queue-full") == 3
        assert len(caplog.records) == 2
    assert queue.work() == 3
    assert _messages(cluster) == [f"event {i}" for i in (0, 1, 2, 5, 6, 7)]


def test_stop_posts_what_is_queued_first_in_order():
    cluster = _SlowEvents(0.01)
    queue, metrics = _queue(cluster, capacity=100)
    queue.start()
    _post(queue, *range(20))
    queue.stop()
    assert _messages(cluster) == [f"event {i}" for i in range(20)]
    assert _dropped(metrics, "stopped") == 0


def test_stop_gives_up_after_its_timeout_and_counts_what_is_left():
    cluster = _HeldEvents()
    queue, metrics = _queue(cluster)
    queue.start()
    try:
        _post(queue, 0, 1, 2)
        assert cluster.entered.wait(5)
        started = time.monotonic()
        queue.stop(0.2)
        assert time.monotonic() - started < 1.0
        assert _dropped(metrics, "stopped") == 2  # event 0 is with the API server
        _post(queue, 3)  # a bind after stop: nobody would ever post it
        assert _dropped(metrics, "stopped") == 3
    finally:
        cluster.release.set()
    assert queue.flush(5)
    assert _messages(cluster) == ["event 0"]
