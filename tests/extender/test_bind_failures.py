"""bind when the API server misbehaves: lost answers, races with other writers, errors.

Each API server here is a MemoryCluster that does something else than bind pod "p"
(once), or fails to read it; the extender is spoken to over HTTP as kube-scheduler
would, and looked at through /inspect and /metrics."""

import logging
import threading

import httpx
import pytest

from gpushare import annotation
from gpushare.allocation import PodAllocation
from gpushare.cluster import ClusterError
from gpushare.cluster.memory import MemoryCluster
from gpushare.objects import Pod
from tests.builders import container, node, pod
from tests.extender.harness import Scheduler


class _Misbehaving(MemoryCluster):
    """Binding pod "p" runs `on_bind` instead, once; reading "p" fails with
    `read_error` while one is set."""

    def __init__(self) -> None:
        super().__init__()
        self.on_bind = None
        self.read_error: ClusterError | None = None

    def bind_pod(self, namespace, name, node_name, uid="", annotations=None) -> None:
        if name == "p" and self.on_bind is not None:
            on_bind, self.on_bind = self.on_bind, None
            on_bind(namespace, name, node_name, uid, annotations)
            return
        super().bind_pod(namespace, name, node_name, uid, annotations)

    def get_pod(self, namespace: str, name: str) -> Pod:
        if name == "p" and self.read_error is not None:
            raise self.read_error
        return super().get_pod(namespace, name)

    def really_bind(self, *args) -> None:
        MemoryCluster.bind_pod(self, *args)

    def create_again(self, name: str, uid: str, node_name: str | None = None) -> Pod:
        """Deletes the pod and creates it again under a new UID, bound if `node_name`."""
        old = MemoryCluster.get_pod(self, "default", name)
        self.delete_pod("default", name)
        meta = old.metadata.model_copy(update={"uid": uid, "annotations": {}})
        spec = old.spec.model_copy(update={"node_name": node_name})
        return self.create_pod(old.model_copy(update={"metadata": meta, "spec": spec}))


@pytest.fixture
def api() -> _Misbehaving:
    cluster = _Misbehaving()
    cluster.add_node(node("n", "1x16GiB"))
    cluster.add_node(node("m", "1x16GiB"))
    cluster.add_node(node("wide", "4x16GiB"))
    return cluster


@pytest.fixture
def scheduler(api):
    s = Scheduler(api)
    yield s
    s.close()


def _inspect(s: Scheduler, node_name: str) -> dict[int, list[str]]:
    """/inspect/<node>: the pods on each GPU, "(assumed)" after those not seen bound yet."""
    report = httpx.get(f"{s.server.url}/inspect/{node_name}").json()
    return {
        gpu["index"]: [p["pod"] + (" (assumed)" if p["assumed"] else "") for p in gpu["pods"]]
        for gpu in report["gpus"]
    }


def _allocated_events(s: Scheduler, name: str) -> list[str]:
    return [e.message for e in s.posted_events("GpuAllocated") if e.ref.name == name]


def _fits(s: Scheduler, node_name: str, mem: int) -> bool:
    return s.filter(pod("next", mem=mem), [node_name])["NodeNames"] == [node_name]


# ----- the Binding's answer was lost: the pod is read back


def test_a_bind_whose_answer_was_lost_but_that_happened_is_success(api, scheduler):
    p = scheduler.submit(pod("p", mem=16))

    def bound_then_lost(*args) -> None:
        api.really_bind(*args)
        raise ClusterError("the connection was reset (HTTP 502)")

    api.on_bind = bound_then_lost
    assert scheduler.bind(p, "n") == ""
    assert api.get_pod("default", "p").spec.node_name == "n"
    assert _inspect(scheduler, "n") == {0: ["default/p"]}  # as the API shows it, not assumed
    assert not _fits(scheduler, "n", 1)
    assert len(_allocated_events(scheduler, "p")) == 1  # this bind created the Binding


def test_a_lost_answer_then_a_pod_created_again_on_the_node_is_refused(api, scheduler):
    p = scheduler.submit(pod("p", mem=16))

    def recreated_and_bound_by_someone_else(*args) -> None:
        api.create_again("p", "uid-p-2", node_name="n")
        raise ClusterError("the connection was reset (HTTP 502)")

    api.on_bind = recreated_and_bound_by_someone_else
    error = scheduler.bind(p, "n")
    assert error == "bind pod default/p to node n: the connection was reset (HTTP 502)"
    assert _inspect(scheduler, "n") == {0: []}  # the new pod has no allocation of ours
    assert _fits(scheduler, "n", 16)
    assert not _allocated_events(scheduler, "p")


def test_a_lost_answer_not_read_back_keeps_the_reservation_and_says_both(api, scheduler):
    p = scheduler.submit(pod("p", mem=16))

    def lost(*args) -> None:
        api.read_error = ClusterError("the server is unavailable (HTTP 503)")
        raise ClusterError("the connection was reset (HTTP 502)")

    api.on_bind = lost
    error = scheduler.bind(p, "n")
    assert error == (
        "bind pod default/p to node n: the connection was reset (HTTP 502) "
        "(and re-reading it: the server is unavailable (HTTP 503))"
    )
    assert _inspect(scheduler, "n") == {0: ["default/p (assumed)"]}  # it may be bound
    assert not _fits(scheduler, "n", 1)


def test_a_kept_reservation_outlives_updates_of_the_unbound_pod(api, scheduler):
    """kube-scheduler and controllers update a pod while its Binding is on its way: an
    update that shows it unbound says nothing about the Binding."""
    p = scheduler.submit(pod("p", mem=16))

    def updated_then_lost(*args) -> None:
        api.patch_pod_annotations("default", "p", {"example.com/note": "scheduling"})
        api.read_error = ClusterError("the server is unavailable (HTTP 503)")
        raise ClusterError("the connection was reset (HTTP 502)")

    api.on_bind = updated_then_lost
    assert "re-reading it" in scheduler.bind(p, "n")
    scheduler.submit(pod("marker", mem=1))  # the watch is in order: it has shown the update
    assert _inspect(scheduler, "n") == {0: ["default/p (assumed)"]}
    assert not _fits(scheduler, "n", 1)


# ----- someone else bound or re-created the pod meanwhile


def test_a_pod_bound_to_the_same_node_meanwhile_is_success_as_the_api_shows(api, scheduler):
    p = scheduler.submit(pod("p", mem=16))

    def bound_by_another_on_gpu_1(namespace, name, node_name, uid, annotations) -> None:
        api.really_bind(namespace, name, node_name, uid, _moved_to_gpu(annotations, 1))
        api.really_bind(namespace, name, node_name, uid, annotations)  # AlreadyBound

    api.on_bind = bound_by_another_on_gpu_1
    assert scheduler.bind(p, "wide") == ""
    # The API's allocation replaced our reservation (GPU 0) at once.
    assert _inspect(scheduler, "wide") == {0: [], 1: ["default/p"], 2: [], 3: []}
    assert not _allocated_events(scheduler, "p")  # this bind did not create the Binding


def _moved_to_gpu(annotations: dict[str, str], index: int) -> dict[str, str]:
    """The allocation in `annotations` with every slice on GPU `index` instead."""
    allocation = PodAllocation.model_validate_json(annotations[annotation.ALLOCATION])
    containers = tuple(
        c.model_copy(update={"gpus": tuple(s.model_copy(update={"index": index}) for s in c.gpus)})
        for c in allocation.containers
    )
    return annotation.encode(allocation.model_copy(update={"containers": containers}))


def test_a_pod_bound_to_another_node_meanwhile_is_refused_and_its_gpus_freed(api, scheduler):
    p = scheduler.submit(pod("p", mem=16))

    def bound_by_another_to_m(namespace, name, node_name, uid, annotations) -> None:
        api.really_bind(namespace, name, "m", uid, None)
        api.really_bind(namespace, name, node_name, uid, annotations)  # AlreadyBound

    api.on_bind = bound_by_another_to_m
    assert scheduler.bind(p, "n") == "pod default/p is already bound to node m, not n"
    assert _inspect(scheduler, "n") == {0: []}
    assert _fits(scheduler, "n", 16)


def test_a_pod_created_again_while_its_bind_is_in_flight_is_not_bound(api, scheduler):
    p = scheduler.submit(pod("p", mem=16))

    def recreated_first(namespace, name, node_name, uid, annotations) -> None:
        api.create_again("p", "uid-p-2")
        api.really_bind(namespace, name, node_name, uid, annotations)  # UID precondition

    api.on_bind = recreated_first
    error = scheduler.bind(p, "n")
    assert error.startswith("bind pod default/p to node n: Precondition failed for pod default/p")
    assert api.get_pod("default", "p").spec.node_name is None
    assert _fits(scheduler, "n", 16)


# ----- other failures


def test_an_unexpected_error_from_the_binding_frees_the_gpus(api, scheduler):
    p = scheduler.submit(pod("p", mem=16))

    def broken(*args) -> None:
        raise RuntimeError("a bug in the API client")

    api.on_bind = broken
    body = {"PodName": "p", "PodNamespace": "default", "PodUID": p.metadata.uid, "Node": "n"}
    assert scheduler.post("bind", body).status_code == 500
    assert _inspect(scheduler, "n") == {0: []}
    assert _fits(scheduler, "n", 16)
    assert scheduler.bind(p, "n") == ""  # kube-scheduler's retry


def test_a_pod_whose_request_is_invalid_is_refused_with_the_reason(api, scheduler):
    p = api.create_pod(pod("p", containers=[container("main", mem=8, count=2)]))
    error = scheduler.bind(p, "n")
    assert error.startswith("pod default/p: container 'main': aliyun.com/gpu-count asks for")
    assert error.endswith("[exclusive-with-shared]")
    assert api.get_pod("default", "p").spec.node_name is None


def test_a_pod_that_cannot_be_read_is_refused_with_the_apis_error(api, scheduler):
    p = scheduler.submit(pod("p", mem=16))
    api.read_error = ClusterError("the server is unavailable (HTTP 503)")
    error = scheduler.bind(p, "n")
    assert error == "cannot read pod default/p: the server is unavailable (HTTP 503)"


def test_a_pod_that_is_gone_is_refused_as_not_found(api, scheduler):
    p = scheduler.submit(pod("p", mem=16))
    api.delete_pod("default", "p")
    assert scheduler.bind(p, "n") == "pod default/p not found"


def test_a_refused_bind_is_logged_and_counted(api, scheduler, caplog):
    a = scheduler.submit(pod("a", mem=16))
    b = scheduler.submit(pod("b", mem=16))
    assert scheduler.bind(a, "n") == ""
    with caplog.at_level(logging.INFO, logger="gpushare.extender.binder"):
        error = scheduler.bind(b, "n")
    assert error.startswith("pod default/b does not fit any more: ")
    assert f"bind default/b to n refused: {error}" in caplog.messages
    metrics = httpx.get(f"{scheduler.server.url}/metrics").text
    assert 'gpushare_extender_binds_total{result="refused"} 1.0' in metrics


# ----- what a successful bind writes


def test_a_bind_without_a_uid_binds_the_pod_of_that_name(api, scheduler):
    scheduler.submit(pod("p", mem=16))
    body = {"PodName": "p", "PodNamespace": "default", "PodUID": "", "Node": "n"}
    assert scheduler.post("bind", body).json() == {"Error": ""}
    assert api.get_pod("default", "p").spec.node_name == "n"


def test_a_pod_asking_for_no_gpu_is_bound_without_an_allocation(api, scheduler):
    p = api.create_pod(pod("plain", containers=[container("main")]))
    assert scheduler.bind(p, "n") == ""
    bound = api.get_pod("default", "plain")
    assert bound.spec.node_name == "n"
    assert not set(annotation.ALL_KEYS) & set(bound.metadata.annotations)
    assert not _allocated_events(scheduler, "plain")


def test_the_allocation_event_names_each_containers_gpus(api, scheduler):
    two = pod("two", containers=[container("train", count=2), container("log", mem=4)])
    p = scheduler.submit(two)
    assert scheduler.bind(p, "wide") == ""
    allocation = annotation.decode(api.get_pod("default", "two"))
    gpus = {c.name: ",".join(str(s.index) for s in c.gpus) for c in allocation.containers}
    assert len(gpus["train"].split(",")) == 2
    [event] = scheduler.posted_events("GpuAllocated")
    assert (event.ref.kind, event.ref.namespace, event.ref.name) == ("Pod", "default", "two")
    assert event.ref.uid == p.metadata.uid
    assert event.message.startswith(
        f"node wide: train on GPU {gpus['train']}, log on GPU {gpus['log']} ("
    )


def test_binds_to_one_node_wait_for_each_other(api, scheduler):
    """A bind's reservation and its Binding form one step per node: a second bind to
    the node starts its Binding only once the first one's has answered."""
    p = scheduler.submit(pod("p", mem=8))
    q = scheduler.submit(pod("q", mem=8))
    entered, release = threading.Event(), threading.Event()
    order: list[str] = []
    real_bind = api.bind_pod

    def slow(*args) -> None:
        order.append("p starts")
        entered.set()
        release.wait(10)
        api.really_bind(*args)
        order.append("p done")

    def recording(namespace, name, *args) -> None:
        if name == "q":
            order.append("q starts")
        real_bind(namespace, name, *args)

    api.on_bind = slow
    api.bind_pod = recording
    first = threading.Thread(target=scheduler.bind, args=(p, "n"))
    first.start()
    assert entered.wait(10)
    second = threading.Thread(target=scheduler.bind, args=(q, "n"))
    second.start()
    second.join(1.0)  # long enough for q to reach its Binding, were it not held back
    release.set()
    first.join(10)
    second.join(10)
    assert order == ["p starts", "p done", "q starts"]


def test_a_bind_to_another_node_does_not_wait(api, scheduler):
    p = scheduler.submit(pod("p", mem=8))
    q = scheduler.submit(pod("q", mem=8))
    p_binding, q_bound = threading.Event(), threading.Event()
    waited: list[bool] = []
    real_bind = api.bind_pod

    def waits_for_q(*args) -> None:
        p_binding.set()
        waited.append(q_bound.wait(5))
        api.really_bind(*args)

    def recording(namespace, name, *args) -> None:
        real_bind(namespace, name, *args)
        if name == "q":
            q_bound.set()

    api.on_bind = waits_for_q
    api.bind_pod = recording
    first = threading.Thread(target=scheduler.bind, args=(p, "n"))
    first.start()
    assert p_binding.wait(10)
    assert scheduler.bind(q, "m") == ""
    first.join(10)
    assert waited == [True]  # q was bound to m while p's Binding to n was on its way
    assert api.get_pod("default", "p").spec.node_name == "n"
