"""The requeue nudge: once the extender sees room appear, the pods its filter refused
everywhere get an annotation, an update kube-scheduler requeues them on (it may have
retried them before the extender's watch showed the change)."""

import logging
import re
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace

import pytest

from gpushare.cluster import NotFound
from gpushare.cluster.memory import MemoryCluster, gpu_node
from gpushare.extender.requeue import LINGER_S, REQUEUED_AT_ANNOTATION
from gpushare.inventory import NODE_GPUS_ANNOTATION, encode_gpus, parse_layout
from gpushare.labels import LABEL_PLACEMENT
from gpushare.objects import Pod
from tests.builders import pod
from tests.extender.harness import Scheduler, wait_until

QUIET_S = LINGER_S + 0.5
"""Long enough for a nudge to have happened, had one been due."""
RFC3339_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


class CountingCluster(MemoryCluster):
    """Counts the requeue patches per pod; pods named in `missing` answer 404."""

    def __init__(self) -> None:
        super().__init__()
        self.requeued: Counter[str] = Counter()
        self.missing: set[str] = set()

    def patch_pod_annotations(
        self,
        namespace: str,
        name: str,
        annotations: Mapping[str, str | None],
        resource_version: str | None = None,
    ) -> Pod:
        if REQUEUED_AT_ANNOTATION in annotations:
            self.requeued[name] += 1
            if name in self.missing:
                raise NotFound(f'pods "{name}" not found in namespace "{namespace}"')
        return super().patch_pod_annotations(namespace, name, annotations, resource_version)


@pytest.fixture
def cluster() -> CountingCluster:
    return CountingCluster()


def full_node(cluster: CountingCluster, scheduler_for, layout: str = "2x16GiB,1x24GiB"):
    """Node n1 with every GPU taken by one pod (fill-0, fill-1, …)."""
    gpus = parse_layout(layout, "n1")
    cluster.add_node(gpu_node("n1", gpus))
    scheduler = scheduler_for()
    for gpu in gpus:
        filler = scheduler.submit(pod(f"fill-{gpu.index}", mem=gpu.mem))
        assert scheduler.schedule(filler) == "n1"
    wait_until(
        lambda: not list(scheduler.service.cache.details().assumed),
        what="the watch to show the binds",
    )
    return scheduler


def refused(scheduler: Scheduler, name: str, mem: int = 16, nodes=("n1",)) -> Pod:
    waiter = scheduler.submit(pod(name, mem=mem))
    answer = scheduler.filter(waiter, nodes)
    assert answer["NodeNames"] == [], answer
    return waiter


def requeued_at(cluster: MemoryCluster, name: str) -> str | None:
    return cluster.get_pod("default", name).metadata.annotations.get(REQUEUED_AT_ANNOTATION)


def wait_requeued(cluster: CountingCluster, *names: str) -> None:
    wait_until(lambda: all(cluster.requeued[n] for n in names), what=f"{names} requeued")


@pytest.mark.parametrize("how", ["deleted", "finished"])
def test_a_pod_refused_everywhere_is_requeued_once_a_gpu_pod_leaves(
    cluster, scheduler_for, caplog, how
):
    scheduler = full_node(cluster, scheduler_for)
    waiter = refused(scheduler, "waiter")
    answer = scheduler.filter(waiter)
    assert "[insufficient-gpu-memory]" in answer["FailedNodes"]["n1"]
    caplog.set_level(logging.INFO, logger="gpushare.extender.requeue")

    cluster.begin_pod_deletion("default", "fill-0")  # still runs on its GPU: no room yet
    time.sleep(QUIET_S)
    assert cluster.requeued == {}
    if how == "deleted":
        cluster.delete_pod("default", "fill-0")
    else:
        cluster.set_pod_phase("default", "fill-0", "Succeeded")

    wait_requeued(cluster, "waiter")
    assert RFC3339_MS.match(requeued_at(cluster, "waiter") or "")
    # The log line and the count follow the annotation's write, in the requeuer's thread.
    said = "requeued 1 pods refused earlier after GPU capacity freed on node n1"
    wait_until(lambda: said in caplog.text, what="the requeue logged")
    assert scheduler.filter(waiter)["NodeNames"] == ["n1"]  # the retry it makes now fits
    assert "default/waiter" not in list(scheduler.service.cache.details().waiting)
    metrics = scheduler.service.metrics.registry
    requeued = {"result": "requeued"}
    wait_until(lambda: metrics.get_sample_value("gpushare_extender_requeues_total", requeued))
    assert metrics.get_sample_value("gpushare_extender_requeues_total", requeued) == 1


def test_a_gpu_healthy_again_requeues(cluster, scheduler_for):
    gpus = parse_layout("1x16GiB", "n1")
    sick = tuple(replace(gpu, healthy=False) for gpu in gpus)
    cluster.add_node(gpu_node("n1", sick))
    scheduler = scheduler_for()
    waiter = refused(scheduler, "waiter", mem=8)
    assert "[unhealthy-gpus]" in scheduler.filter(waiter)["FailedNodes"]["n1"]

    cluster.patch_node_annotations("n1", {NODE_GPUS_ANNOTATION: encode_gpus(gpus)})

    wait_requeued(cluster, "waiter")
    assert scheduler.filter(waiter)["NodeNames"] == ["n1"]


def test_changes_that_free_nothing_requeue_nobody(cluster, scheduler_for):
    scheduler = full_node(cluster, scheduler_for)
    refused(scheduler, "waiter")
    plain = cluster.create_pod(pod("plain"))  # no GPU: the extender does not keep it
    cluster.bind_pod("default", "plain", "n1", plain.metadata.uid)
    cluster.delete_pod("default", "plain")
    cluster.add_node(cluster.get_node("n1"))  # a heartbeat: nothing placement reads
    cluster.set_node_labels("n1", {LABEL_PLACEMENT: "spread"})  # orders nodes, fits no more
    gpus = parse_layout("2x16GiB,1x24GiB", "n1")
    worse = (*gpus[:2], replace(gpus[2], healthy=False))
    cluster.patch_node_annotations("n1", {NODE_GPUS_ANNOTATION: encode_gpus(worse)})
    scheduler.submit(pod("newcomer", mem=4))  # a new pod takes room, frees none
    time.sleep(QUIET_S)
    assert cluster.requeued == {}
    assert "default/waiter" in list(scheduler.service.cache.details().waiting)


def test_pods_bound_deleted_or_admitted_meanwhile_are_not_patched(cluster, scheduler_for):
    scheduler = full_node(cluster, scheduler_for)
    cluster.add_node(gpu_node("n2", parse_layout("1x16GiB", "n2")))
    cache = scheduler.service.cache
    wait_until(lambda: cache.counts().nodes == 2, what="the watch to show n2")
    bound = refused(scheduler, "bound")
    refused(scheduler, "deleted")
    admitted = refused(scheduler, "admitted")
    refused(scheduler, "waiter")
    cluster.bind_pod("default", "bound", "n2", bound.metadata.uid)  # by hand, say
    cluster.delete_pod("default", "deleted")
    assert scheduler.filter(admitted, ["n1", "n2"])["NodeNames"] == ["n2"]
    wait_until(
        lambda: list(cache.details().waiting) == ["default/waiter"], what="the watch to catch up"
    )

    cluster.delete_pod("default", "fill-0")

    wait_requeued(cluster, "waiter")
    time.sleep(QUIET_S)
    assert cluster.requeued == {"waiter": 1}


def test_a_burst_of_deletions_makes_one_nudge(cluster, scheduler_for):
    scheduler = full_node(cluster, scheduler_for, layout="10x8GiB")
    waiters = [f"waiter-{i}" for i in range(3)]
    for name in waiters:
        refused(scheduler, name, mem=8)
    for i in range(10):  # back to back: well within the worker's linger
        cluster.delete_pod("default", f"fill-{i}")

    wait_requeued(cluster, *waiters)
    time.sleep(QUIET_S)
    assert cluster.requeued == dict.fromkeys(waiters, 1)


def test_a_pod_gone_from_the_api_is_forgotten_quietly(cluster, scheduler_for, caplog):
    scheduler = full_node(cluster, scheduler_for)
    refused(scheduler, "ghost")
    refused(scheduler, "waiter")
    cluster.missing.add("ghost")  # deleted, and the watch has not said so yet
    caplog.set_level(logging.INFO, logger="gpushare.extender.requeue")

    cluster.delete_pod("default", "fill-0")
    wait_requeued(cluster, "ghost", "waiter")
    wait_until(lambda: "default/ghost" not in list(scheduler.service.cache.details().waiting))
    cluster.delete_pod("default", "fill-1")
    wait_until(lambda: cluster.requeued["waiter"] == 2, what="the second nudge")

    assert cluster.requeued["ghost"] == 1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    metrics = scheduler.service.metrics.registry
    assert metrics.get_sample_value("gpushare_extender_requeues_total", {"result": "gone"}) == 1


def named(p: Pod, scheduler_name: str) -> Pod:
    return p.model_copy(
        update={"spec": p.spec.model_copy(update={"scheduler_name": scheduler_name})}
    )


def test_pods_already_waiting_when_the_extender_starts_are_nudged(cluster, caplog):
    """A new scheduler pod's kube-scheduler can lead before its extender serves (or the
    extender restarts after a crash): filter calls fail meanwhile and kube-scheduler
    1.28 parks the pod for up to five minutes. Once the extender has listed the pods,
    it nudges those waiting for our scheduler, and no others."""
    from gpushare.extender.service import ExtenderConfig

    cluster.add_node(gpu_node("n1", parse_layout("1x16GiB", "n1")))
    cluster.create_pod(named(pod("early", mem=4), "gpushare-scheduler"))
    cluster.create_pod(named(pod("ack-early", mem=4), "ack-co-scheduler"))
    cluster.create_pod(named(pod("not-ours", mem=4), "default-scheduler"))
    cluster.create_pod(named(pod("no-gpu"), "gpushare-scheduler"))
    cluster.create_pod(named(pod("placed", mem=4, node="n1"), "gpushare-scheduler"))
    cluster.create_pod(named(pod("leaving", mem=4), "gpushare-scheduler"))
    cluster.begin_pod_deletion("default", "leaving")
    caplog.set_level(logging.INFO, logger="gpushare.extender.requeue")

    scheduler = Scheduler(cluster, ExtenderConfig())
    try:
        wait_requeued(cluster, "early", "ack-early")
        time.sleep(QUIET_S)
        assert cluster.requeued == {"early": 1, "ack-early": 1}
        assert "requeued 2 pods waiting for our scheduler" in caplog.text
        # Afterwards only freed capacity nudges again, as before.
        assert scheduler.filter(scheduler.cluster.get_pod("default", "early"))["NodeNames"] == [
            "n1"
        ]
        assert "default/early" not in list(scheduler.service.cache.details().waiting)
    finally:
        scheduler.close()
