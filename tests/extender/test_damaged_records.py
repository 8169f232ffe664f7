"""A damaged allocation record never turns into an over-committed GPU (issue 39): the
pod stays in the books, charged as ACK's keys say, or its node holds an unknown
allocation and takes no new GPU pod, with a reason in filter, a gauge and an event on
the pod, until the record is repaired or the pod goes."""

import json

import pytest

from gpushare import annotation
from gpushare.cluster.memory import MemoryCluster
from gpushare.extender.damaged import ALLOCATION_RECORD_DAMAGED, DamagedRecords
from gpushare.objects import Pod
from tests.builders import node, pod
from tests.extender.harness import Scheduler, wait_until


def bound(s: Scheduler, name: str, mem: int) -> Pod:
    """A pod of `mem` GiB bound to node n by the extender, as the API shows it after."""
    created = s.submit(pod(name, mem=mem))
    assert s.bind(created, "n") == ""
    return s.cluster.get_pod("default", name)


def damage(s: Scheduler, name: str, annotations: dict[str, str]) -> None:
    """Writes `annotations` over the pod's and waits for the extender to see them."""
    s.cluster.patch_pod_annotations("default", name, annotations)
    wait_until(
        lambda: s.service.cache.details().pod_problems.get(f"default/{name}") is not None, what=name
    )


def reasons(s: Scheduler, asking: Pod) -> str:
    answer = s.filter(asking, ["n"])
    return str({**answer["FailedNodes"], **answer["FailedAndUnresolvableNodes"]})


def legacy(record: str, **changes: int) -> str:
    """Our record as gpushare wrote it before it had a check, with `changes` to its
    first slice (a hand edit)."""
    document = json.loads(record)
    del document[annotation.CHECK]
    document["containers"][0]["gpus"][0].update(changes)
    return json.dumps(document)


@pytest.fixture
def s(cluster: MemoryCluster, scheduler_for) -> Scheduler:
    cluster.add_node(node("n", "1x16GiB"))
    return scheduler_for()


def test_one_stray_character_keeps_the_gpu_charged_from_the_ack_keys(s):
    held = bound(s, "held", 8)
    record = held.metadata.annotations[annotation.ALLOCATION]
    damage(s, "held", {annotation.ALLOCATION: record[:20] + "x" + record[20:]})
    assert s.service.cache.snapshot().gpus["n"][0][:2] == (8, 0)
    assert "[insufficient-gpu-memory]" in reasons(s, pod("big", mem=14))
    assert s.filter(pod("small", mem=8), ["n"])["NodeNames"] == ["n"]


def test_a_digit_changed_in_a_record_is_refused_not_read(s):
    held = bound(s, "held", 8)
    record = held.metadata.annotations[annotation.ALLOCATION]
    changed = record.replace('"memGiB":8', '"memGiB":0')
    assert changed != record
    damage(s, "held", {annotation.ALLOCATION: changed})
    assert "fails its check" in str(s.service.cache.details().pod_problems.get("default/held"))
    assert "[insufficient-gpu-memory]" in reasons(s, pod("big", mem=14))


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"memGiB": -8}, "greater than or equal to 0"),
        ({"index": -1}, "greater than or equal to 0"),
        ({"corePercent": 500}, "500 percent compute"),
        ({"memGiB": 17}, "more than the GPU's 16 GiB"),
    ],
)
def test_a_record_that_breaks_a_rule_is_damaged_and_charged_from_the_ack_keys(s, changes, problem):
    held = bound(s, "held", 8)
    damage(
        s,
        "held",
        {
            annotation.ALLOCATION: legacy(
                held.metadata.annotations[annotation.ALLOCATION], **changes
            )
        },
    )
    assert problem in str(s.service.cache.details().pod_problems.get("default/held"))
    assert s.service.cache.snapshot().gpus["n"][0][:2] == (8, 0)
    assert "[insufficient-gpu-memory]" in reasons(s, pod("full", mem=16))


def test_a_record_and_ack_keys_both_unreadable_close_the_node_until_repaired(s):
    held = bound(s, "held", 8)
    good = {
        k: held.metadata.annotations[k]
        for k in annotation.ALL_KEYS
        if k in held.metadata.annotations
    }
    damage(
        s,
        "held",
        {
            annotation.ALLOCATION: "{oops",
            annotation.ACK_V2_ALLOCATION: '{"0":{"0":x}}',
            "ALIYUN_COM_GPU_MEM_IDX": "zero",
        },
    )
    refused = reasons(s, pod("tiny", mem=1))
    assert "[unknown-allocation]" in refused and "default/held" in refused
    assert "[unknown-allocation]" in reasons(s, pod("whole", count=1))
    assert gauges(s) == (1, 1)
    wait_until(lambda: events(s, "held"), what="the event on held")
    (event,) = events(s, "held")
    assert "not a JSON object" in event.message and "takes no new GPU pod" in event.message

    s.cluster.patch_pod_annotations("default", "held", good)  # repaired
    wait_until(
        lambda: s.service.cache.details().pod_problems.get("default/held") is None, what="repaired"
    )
    assert s.filter(pod("tiny", mem=1), ["n"])["NodeNames"] == ["n"]
    assert s.service.cache.snapshot().gpus["n"][0][:2] == (8, 0)
    assert gauges(s) == (0, 0)


def test_the_node_takes_pods_again_once_the_damaged_pod_is_deleted(s):
    bound(s, "held", 8)
    damage(
        s, "held", {annotation.ALLOCATION: "{oops", annotation.ACK_V2_ALLOCATION: '{"0":{"0":-8}}'}
    )
    assert "[unknown-allocation]" in reasons(s, pod("tiny", mem=1))
    s.cluster.delete_pod("default", "held")
    wait_until(lambda: s.service.cache.pod("default/held") is None, what="held gone")
    assert s.filter(pod("full", mem=16), ["n"])["NodeNames"] == ["n"]


def test_one_event_per_problem(s):
    held = bound(s, "held", 8)
    record = held.metadata.annotations[annotation.ALLOCATION]
    damage(s, "held", {annotation.ALLOCATION: record + " "})
    s.cluster.patch_pod_annotations("default", "held", {"touched": "1"})  # same problem
    wait_until(lambda: events(s, "held"), what="the event on held")
    s.cluster.patch_pod_annotations("default", "held", {annotation.ALLOCATION: "{oops"})
    wait_until(lambda: len(events(s, "held")) == 2, what="the second event")
    first, second = events(s, "held")
    assert "fails its check" in first.message and "not a JSON object" in second.message
    assert all(e.reason == ALLOCATION_RECORD_DAMAGED for e in events(s, "held"))


def events(s: Scheduler, name: str) -> list:
    return [
        e for e in s.cluster.events if e.reason == ALLOCATION_RECORD_DAMAGED and e.ref.name == name
    ]


def gauges(s: Scheduler) -> tuple[float | None, float | None]:
    """The node's unknown allocations and the damaged records, as /metrics says."""
    sample = s.service.metrics.registry.get_sample_value
    return (
        sample("gpushare_scheduler_node_unknown_allocations", {"node": "n"}),
        sample("gpushare_extender_damaged_allocation_records"),
    )


def test_the_book_tells_each_problem_once_and_forgets_pods_a_listing_shows_sound():
    book = DamagedRecords()
    assert book.note("default/a", "uid-a", "bad") and not book.note("default/a", "uid-a", "bad")
    assert book.note("default/b", "uid-b", "worse")
    assert book.take() == [("default/a", "uid-a", "bad"), ("default/b", "uid-b", "worse")]
    assert book.take() == []
    book.relisted({"default/b": "worse"})
    assert book.note("default/a", "uid-a", "bad") and not book.note("default/b", "uid-b", "worse")
    book.gone("default/a")
    assert book.take() == []
