"""Every GetPreferredAllocation and Allocate is answered within its deadline
(--allocate-timeout): the kubelet calls without one and admits one pod at a
time, so a call left unanswered would stall the node's admissions for good."""

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from gpushare.cluster import ClusterError
from gpushare.cluster.memory import MemoryCluster, MemoryWatch
from gpushare.deviceplugin.plugin import WATCH_BACKOFF
from gpushare.deviceplugin.worker import start_daemon
from gpushare.environment import POD
from gpushare.kubeletapi.deviceplugin.v1beta1 import api_pb2 as pb
from gpushare.kubeletapi.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from gpushare.resources import GPU_COUNT, GPU_MEM
from tests.deviceplugin.rig import WAIT, Rig, allocate, eventually, plugin_client

TIMEOUTS = "gpushare_device_plugin_answer_timeouts_total"


class _BreakableWatch:
    def __init__(self, inner: MemoryWatch) -> None:
        self._inner = inner
        self._error: Exception | None = None

    def __iter__(self):
        yield from self._inner
        if self._error is not None:
            raise self._error

    @property
    def resume_from(self) -> str:
        return self._inner.resume_from

    def stop(self) -> None:
        self._inner.stop()

    def fail(self, error: Exception) -> None:
        self._error = error
        self._inner.stop()


class FlakyCluster(MemoryCluster):
    """Pod lists and watches fail on demand, as they do when the connection to the
    API server drops."""

    def __init__(self) -> None:
        super().__init__()
        self._error: Exception | None = None
        self._pod_watches: list[_BreakableWatch] = []

    def fail(self, error: Exception) -> None:
        self._error = error
        for watch in self._pod_watches:
            watch.fail(error)

    def heal(self) -> None:
        self._error = None

    def list_pods(self, node_name=None):
        if self._error is not None:
            raise self._error
        return super().list_pods(node_name)

    def watch_pods(self, resource_version, node_name=None):
        if self._error is not None:
            raise self._error
        watch = _BreakableWatch(super().watch_pods(resource_version, node_name))
        self._pod_watches.append(watch)
        return watch


def _ids(rig: Rig, count: int) -> list[str]:
    return sorted(rig.kubelet.devices(GPU_MEM))[:count]


def _preferred(rig: Rig, available: list[str], size: int) -> list[str]:
    request = pb.PreferredAllocationRequest(
        container_requests=[
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, allocation_size=size
            )
        ]
    )
    with plugin_client(rig, GPU_MEM) as stub:
        response = stub.GetPreferredAllocation(request, timeout=rig.answer_within + WAIT)
    return list(response.container_responses[0].deviceIDs)


def _allocate_code(rig: Rig, ids: list[str]) -> grpc.StatusCode:
    """The status an Allocate ends with (OK when answered)."""
    with plugin_client(rig, GPU_MEM) as stub:
        request = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)]
        )
        try:
            stub.Allocate(request, timeout=rig.answer_within + WAIT)
        except grpc.RpcError as err:
            return err.code()
    return grpc.StatusCode.OK


def _entries(rig: Rig, method: str) -> threading.Semaphore:
    """Released each time a call enters the plugin's admission queue by `method`."""
    entered = threading.Semaphore(0)
    inner: Callable = getattr(rig.plugin.queue, method)

    def counted(*args, **kwargs):
        entered.release()
        return inner(*args, **kwargs)

    setattr(rig.plugin.queue, method, counted)
    return entered


def test_an_allocate_the_watch_never_shows_a_pod_for_is_refused_at_the_deadline(make_rig, caplog):
    rig = make_rig(layout="2x16GiB", answer_within=1.0).start()
    started = time.monotonic()

    with (
        caplog.at_level(logging.WARNING, logger="gpushare.deviceplugin"),
        pytest.raises(grpc.RpcError) as refused,
    ):
        allocate(rig, GPU_MEM, _ids(rig, 2))

    assert time.monotonic() - started < rig.answer_within + WAIT
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    message = refused.value.details()
    assert message.startswith("Allocate asked for 2 aliyun.com/gpu-mem on node n1, but no ")
    assert "(waited 1 s for the API watch to show one)" in message
    assert "pod watch is not working" not in message  # it is: the pod is not there
    assert f"Allocate refused: {message}" in caplog.text
    metrics = rig.plugin.metrics
    assert metrics.value(TIMEOUTS, call="Allocate", resource=GPU_MEM) == 1


def test_get_preferred_allocation_without_a_pod_answers_no_preference_at_the_deadline(
    make_rig, caplog
):
    rig = make_rig(layout="2x16GiB", answer_within=1.0).start()
    started = time.monotonic()

    with caplog.at_level(logging.WARNING, logger="gpushare.deviceplugin"):
        assert _preferred(rig, _ids(rig, 4), 2) == []

    assert time.monotonic() - started < rig.answer_within + WAIT
    assert (
        "GetPreferredAllocation for 2 aliyun.com/gpu-mem on node n1: no bound pod asks for it "
        "after 1 s of waiting for the API watch; answering without a preference"
    ) in caplog.messages
    metrics = rig.plugin.metrics
    assert metrics.value(TIMEOUTS, call="GetPreferredAllocation", resource=GPU_MEM) == 1


@pytest.mark.parametrize(("count", "waits_again"), [(2, False), (3, True)])
def test_an_allocate_right_after_a_preference_that_waited_in_vain_keeps_its_deadline(
    make_rig, count, waits_again
):
    """The kubelet calls Allocate for the container GetPreferredAllocation was about
    (same resource and count): it gets what is left of that call's deadline, not a
    second one. A call of another count is another container's and waits its own."""
    rig = make_rig(layout="2x16GiB", answer_within=2.0).start()
    assert _preferred(rig, _ids(rig, 4), 2) == []

    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as refused:
        allocate(rig, GPU_MEM, _ids(rig, count))
    waited = time.monotonic() - started

    # A fresh deadline cannot end sooner than its 2 s.
    assert (waited >= rig.answer_within) is waits_again
    # Either way the refusal tells the wait the container had: one deadline of 2 s.
    assert "(waited 2 s for the API watch to show one)" in refused.value.details()


def test_an_allocate_behind_a_pod_list_locked_past_its_deadline_times_out_saying_so(
    make_rig, caplog
):
    """The watch holds the pod list while it applies a relist; an Allocate that
    cannot get it before its deadline ends DEADLINE_EXCEEDED (the kubelet retries),
    not a refusal of the pod, and the metrics count it as a timeout."""
    rig = make_rig(layout="2x16GiB", answer_within=0.2).start()
    rig.bind("p", [[0]], mem=2)
    listing, release = threading.Event(), threading.Event()

    def stuck_relist():
        listing.set()
        release.wait(WAIT)
        yield from rig.cluster.list_pods(rig.node).items

    relist = threading.Thread(target=rig.plugin.queue.replace, args=(stuck_relist(),))
    relist.start()
    try:
        assert listing.wait(WAIT)
        with (
            caplog.at_level(logging.WARNING, logger="gpushare.deviceplugin"),
            pytest.raises(grpc.RpcError) as timed_out,
        ):
            allocate(rig, GPU_MEM, _ids(rig, 2))
    finally:
        release.set()
        relist.join()

    assert timed_out.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert timed_out.value.details() == (
        "Allocate for 2 aliyun.com/gpu-mem on node n1 gave up: the list of pods bound to "
        "node n1 stayed locked until its deadline (0.2 s)"
    )
    metrics = rig.plugin.metrics
    failures = "gpushare_device_plugin_allocation_failures_total"
    assert metrics.value(failures, resource=GPU_MEM, reason="timeout") == 1
    assert metrics.value(TIMEOUTS, call="Allocate", resource=GPU_MEM) == 1
    # The pod is still there for the kubelet's next try.
    assert allocate(rig, GPU_MEM, _ids(rig, 2)).envs[POD] == "default/p"


def test_a_step_after_an_answer_that_hangs_holds_up_no_later_call(make_rig):
    """What follows an answer (here the journal's line, on a disk that hangs) runs
    off gRPC's polling thread, which also hands every new call to a handler."""
    rig = make_rig(layout="2x16GiB").start()
    first = rig.bind("first", [[0]], mem=2)
    second = rig.bind("second", [[1]], mem=2)
    disk = threading.Event()
    write = rig.plugin.journal.write

    def hanging_write() -> None:
        disk.wait()
        write()

    rig.plugin.journal.write = hanging_write
    try:
        rig.kubelet.admit(first)
        [main] = rig.kubelet.admit(second)  # GetPreferredAllocation + Allocate, same server
    finally:
        disk.set()

    assert main.envs[POD] == second.key
    grants = rig.kubelet.plugin_dir / "gpushare-grants.jsonl"
    assert eventually(lambda: grants.exists() and second.metadata.uid in grants.read_text())


def test_an_allocate_waiting_for_the_watch_is_answered_as_soon_as_the_pod_shows(make_rig):
    rig = make_rig(layout="2x16GiB", answer_within=60.0).start()
    entered = _entries(rig, "take")

    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(allocate, rig, GPU_MEM, _ids(rig, 2))
        assert entered.acquire(timeout=WAIT)
        pod = rig.bind("late", [[1]], mem=2)

        assert answer.result(timeout=WAIT).envs[POD] == pod.key


def test_a_preference_waiting_for_the_watch_comes_as_soon_as_the_pod_shows(make_rig):
    rig = make_rig(layout="2x16GiB", answer_within=60.0).start()
    entered = _entries(rig, "peek")
    available = sorted(rig.kubelet.devices(GPU_MEM))

    with ThreadPoolExecutor(1) as pool:
        preferred = pool.submit(_preferred, rig, available, 2)
        assert entered.acquire(timeout=WAIT)
        rig.bind("late", [[1]], mem=2)

        ids = preferred.result(timeout=WAIT)
    uuid = rig.allocation("late").containers[0].gpus[0].uuid
    assert len(ids) == 2 and all(i.startswith(uuid + "-") for i in ids)


def test_calls_left_waiting_by_a_kubelet_restart_take_no_pod_and_the_next_pod_is_answered(
    make_rig,
):
    rig = make_rig(layout="2x16GiB", answer_within=30.0).start()
    entered = _entries(rig, "take")
    ids = _ids(rig, 2)

    with ThreadPoolExecutor(3) as pool:
        stale = [pool.submit(_allocate_code, rig, ids) for _ in range(3)]
        for _ in stale:
            assert entered.acquire(timeout=WAIT)
        rig.kubelet.restart()  # the old servers stop: those calls ended unanswered
        rig.wait_registered([GPU_MEM, GPU_COUNT])
        assert all(call.result(timeout=WAIT) is not grpc.StatusCode.OK for call in stale)

        pod = rig.bind("after", [[1]], mem=2)
        [main] = rig.kubelet.admit(pod)

    assert main.envs[POD] == pod.key
    assert rig.wait_assigned("after").assigned


def test_the_pod_watch_recovers_from_errors_and_refusals_meanwhile_say_it_is_down(make_rig):
    rig = make_rig(layout="2x16GiB", cluster_type=FlakyCluster, answer_within=0.5).start()
    rig.cluster.fail(ClusterError("watch stream failed: Response ended prematurely"))
    assert eventually(lambda: rig.plugin.watch_trouble() is not None)
    pod = rig.bind("unseen", [[0]], mem=2)

    with pytest.raises(grpc.RpcError) as refused:
        allocate(rig, GPU_MEM, _ids(rig, 2))

    message = refused.value.details()
    assert "the pod watch is not working (watching pods has failed since " in message
    assert "Response ended prematurely" in message

    rig.cluster.heal()
    assert eventually(
        lambda: rig.plugin.watch_trouble() is None, timeout=WATCH_BACKOFF.maximum + WAIT
    )
    [main] = rig.kubelet.admit(pod)
    assert main.envs[POD] == pod.key


def test_a_background_thread_that_dies_says_so(caplog):
    def broken() -> None:
        raise RuntimeError("a bug")

    with caplog.at_level(logging.CRITICAL, logger="gpushare.deviceplugin"):
        start_daemon("doomed", broken).join(WAIT)

    assert "background thread doomed died" in caplog.text
    assert "RuntimeError: a bug" in caplog.text


def test_calls_beyond_the_handler_threads_are_refused_at_once(make_rig):
    rig = make_rig(layout="1x16GiB").start()
    socket = rig.kubelet.plugin_dir / "gpushare-mem.sock"
    streams = []
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        stub = pb_grpc.DevicePluginStub(channel)
        # The kubelet's ListAndWatch holds one handler thread; these hold the rest.
        for _ in range(7):
            stream = stub.ListAndWatch(pb.Empty())
            next(stream)
            streams.append(stream)

        with pytest.raises(grpc.RpcError) as refused:
            stub.Allocate(
                pb.AllocateRequest(
                    container_requests=[pb.ContainerAllocateRequest(devices_ids=_ids(rig, 1))]
                ),
                timeout=WAIT,
            )
        for stream in streams:
            stream.cancel()

    assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
