"""Pods asking for GPUs under a schedulerName nobody serves: the webhook's warning
goes to whoever created the pod (a Job's controller, say), so the extender posts one
Warning event on the pod itself, where `kubectl describe pod` shows it."""

import logging

from gpushare.cluster import EventSeverity, EventType, ObjectRef
from gpushare.cluster.memory import MemoryCluster, RecordedEvent
from gpushare.extender.cache import SchedulerCache
from gpushare.extender.unserved import SCHEDULER_NOT_SERVED
from gpushare.objects import Pod, PodStatus
from tests.builders import being_deleted, pod
from tests.extender.harness import RefusingEvents, Scheduler, wait_until

SERVED = ("gpushare-scheduler", "ack-co-scheduler")
FAILED = PodStatus(phase="Failed")


def named(scheduler: str, name: str = "train-7x2kq", mem: int | None = 4, **kw) -> Pod:
    """A pod as a Job's controller creates it, naming `scheduler`."""
    built = pod(name, mem=mem, labels={"job-name": "train"}, **kw)
    spec = built.spec.model_copy(update={"scheduler_name": scheduler})
    return built.model_copy(update={"spec": spec})


def notices(cluster: MemoryCluster) -> list[RecordedEvent]:
    return [e for e in cluster.events if e.reason == SCHEDULER_NOT_SERVED]


def noticed(cluster: MemoryCluster, name: str) -> list[RecordedEvent]:
    return [e for e in notices(cluster) if e.ref.name == name]


def wait_noticed(cluster: MemoryCluster, name: str) -> None:
    wait_until(lambda: noticed(cluster, name), what=f"the event on {name}")


def settle(cluster: MemoryCluster) -> None:
    """Waits for the event on a last pod that needs one: the cache notes pods in the
    watch's order and the worker posts them in that order, so any event due for an
    earlier pod has been posted by then."""
    cluster.create_pod(named("nobody-scheduler", "sentinel"))
    wait_noticed(cluster, "sentinel")


def test_a_job_pod_naming_nobodys_scheduler_gets_one_warning_event(cluster, scheduler_for):
    scheduler_for()
    created = cluster.create_pod(named("nobody-scheduler"))

    wait_noticed(cluster, "train-7x2kq")
    (event,) = notices(cluster)
    assert event.ref == ObjectRef("Pod", "train-7x2kq", "default", created.metadata.uid)
    assert event.severity is EventSeverity.WARNING
    assert event.message == (
        'schedulerName "nobody-scheduler" is not gpushare\'s (gpushare-scheduler, '
        "ack-co-scheduler); Pending unless such a scheduler runs. To have gpushare "
        "schedule it, set spec.schedulerName to gpushare-scheduler in the pod (or its "
        "Job's or Deployment's template) and create it again, or add "
        '"nobody-scheduler" to scheduler.extraSchedulerNames (--extra-scheduler-names)'
    )

    cluster.patch_pod_annotations("default", "train-7x2kq", {"touched": "1"})
    cluster.patch_pod_annotations("default", "train-7x2kq", {"touched": "2"})
    settle(cluster)
    assert len(noticed(cluster, "train-7x2kq")) == 1


def test_the_names_served_come_from_the_configuration(cluster, scheduler_for):
    scheduler_for(scheduler_name="gpu-main", extra_scheduler_names=())
    cluster.create_pod(named("gpushare-scheduler"))

    wait_noticed(cluster, "train-7x2kq")
    (event,) = notices(cluster)
    assert event.message.startswith(
        'schedulerName "gpushare-scheduler" is not gpushare\'s (gpu-main); '
    )
    assert "set spec.schedulerName to gpu-main in the pod" in event.message


def test_pods_some_scheduler_serves_get_none(cluster, scheduler_for):
    scheduler_for()
    cluster.create_pod(named("gpushare-scheduler", "ours"))
    cluster.create_pod(named("ack-co-scheduler", "acks"))
    cluster.create_pod(named("default-scheduler", "default"))
    cluster.create_pod(pod("unnamed", mem=4))  # no schedulerName: the default scheduler's
    cluster.create_pod(named("nobody-scheduler", "no-gpu", mem=None))
    cluster.create_pod(named("nobody-scheduler", "bound", node="n1"))

    settle(cluster)
    assert [e.ref.name for e in notices(cluster)] == ["sentinel"]


def test_an_init_container_asking_counts(cluster, scheduler_for):
    scheduler_for()
    init = {"name": "warmup", "resources": {"limits": {"aliyun.com/gpu-mem": "2"}}}
    cluster.create_pod(named("nobody-scheduler", "init-gpu", mem=None, init_containers=[init]))

    wait_noticed(cluster, "init-gpu")


def test_pods_already_there_at_start_get_one_event(cluster, scheduler_for):
    cluster.create_pod(named("nobody-scheduler", "early"))
    cluster.create_pod(named("gpushare-scheduler", "ours"))

    scheduler_for()

    wait_noticed(cluster, "early")
    settle(cluster)
    assert [e.ref.name for e in notices(cluster)] == ["early", "sentinel"]


def test_a_pod_deleted_and_created_again_gets_a_new_event(cluster, scheduler_for):
    scheduler_for()
    cluster.create_pod(named("nobody-scheduler", "again"))
    wait_noticed(cluster, "again")

    cluster.delete_pod("default", "again")
    cluster.create_pod(named("nobody-scheduler", "again"))  # the same UID, as the builder gives

    wait_until(lambda: len(noticed(cluster, "again")) == 2, what="a second event")


def test_an_event_the_api_refuses_is_logged_and_the_worker_goes_on(caplog):
    refusing = RefusingEvents("refused")
    caplog.set_level(logging.INFO, logger="gpushare.extender.unserved")
    scheduler = Scheduler(refusing)
    try:
        refusing.create_pod(named("nobody-scheduler", "refused"))
        settle(refusing)
    finally:
        scheduler.close()
    assert [e.ref.name for e in notices(refusing)] == ["sentinel"]
    assert (
        "could not post the SchedulerNotServed event of pod default/refused: "
        "events is forbidden" in caplog.text
    )
    assert 'pod default/sentinel names schedulerName "nobody-scheduler"' in caplog.text


# ----- the cache's part, without threads


def test_the_cache_notes_each_pod_once_across_updates_and_relists():
    woken: list[int] = []
    cache = SchedulerCache(served_schedulers=SERVED)
    cache.on_unserved = lambda: woken.append(1)
    early, late = named("nobody-scheduler", "early"), named("nobody-scheduler", "late")

    cache.replace_pods([early])
    cache.apply_pod(EventType.MODIFIED, early)
    assert woken == [1]
    assert cache.take_unserved() == [("default/early", "uid-early", "nobody-scheduler")]
    cache.apply_pod(EventType.MODIFIED, early)
    cache.replace_pods([early])  # a re-list
    assert cache.take_unserved() == []

    cache.apply_pod(EventType.ADDED, late)
    cache.apply_pod(EventType.MODIFIED, being_deleted(late))  # gone before the worker ran
    assert cache.take_unserved() == []
    assert woken == [1, 1]


def test_the_cache_forgets_pods_bound_finished_or_deleted_before_their_event():
    cache = SchedulerCache(served_schedulers=SERVED)
    waiting = named("nobody-scheduler", "waiting")
    cache.replace_pods([waiting])
    cache.apply_pod(EventType.MODIFIED, named("nobody-scheduler", "waiting", node="n1"))
    assert cache.take_unserved() == []

    finished = named("nobody-scheduler", "finished")
    cache.apply_pod(EventType.ADDED, finished)
    cache.apply_pod(EventType.MODIFIED, finished.model_copy(update={"status": FAILED}))
    assert cache.take_unserved() == []


def test_without_served_names_the_cache_looks_for_nothing():
    cache = SchedulerCache()
    cache.replace_pods([named("nobody-scheduler")])
    assert cache.take_unserved() == []
