"""The admission queue's records and refusals: who counts as answered, what a
re-asked call gets, what a refusal says, and allocations that do not line up
with the pod's spec (docs/contracts.md#matching-allocate-to-a-container)."""

import threading

import pytest

from gpushare import annotation, environment
from gpushare.deviceplugin.admission import AdmissionQueue, CallEnded, NoMatch, QueueBusy
from gpushare.deviceplugin.deadline import Deadline
from gpushare.errors import AnnotationError
from gpushare.objects import Pod
from gpushare.resources import GPU_COUNT, GPU_MEM
from tests.builders import being_deleted, container, pod
from tests.deviceplugin.test_admission import ALL, NODE, bound

MEM_AND_COUNT = (GPU_MEM, GPU_COUNT)


def _annotated(spec: Pod, annotations: dict[str, str]) -> Pod:
    meta = spec.metadata.model_copy(
        update={"annotations": {**spec.metadata.annotations, **annotations}}
    )
    return spec.model_copy(update={"metadata": meta})


def assigned(spec: Pod, *names: str) -> Pod:
    """The pod once the plugin's patch marking `names` assigned came back."""
    allocation = annotation.decode(spec)
    assert allocation is not None
    return _annotated(spec, annotation.assigned_annotations(allocation.with_assigned(names)))


def relabelled(spec: Pod) -> Pod:
    """The same pod as the watch delivers it again after a change elsewhere."""
    meta = spec.metadata.model_copy(update={"labels": {"touched": "yes"}})
    return spec.model_copy(update={"metadata": meta})


def unreadable_reason(spec: Pod) -> str:
    """What the extender says of the pod's record too (one codec: annotation.read)."""
    with pytest.raises(AnnotationError):
        annotation.decode(spec)
    problem = annotation.read(spec).problem
    assert problem is not None
    return problem


def names(waiting) -> tuple[str, str]:
    return (waiting.pod.metadata.name, waiting.container.name)


# ----- who counts as answered


def test_a_container_answered_before_its_mark_comes_back_is_not_answered_twice():
    queue = AdmissionQueue(NODE)
    first = bound("first", [[0]], second=1, mem=2)
    other = bound("other", [[1]], second=2, mem=2)
    later = bound("later", [[1]], second=3, mem=2)
    queue.replace([first, other, later])

    assert names(queue.take(GPU_MEM, 2, MEM_AND_COUNT).waiting) == ("first", "main")
    queue.remove(other)  # another pod leaving changes nothing about `first`

    assert names(queue.take(GPU_MEM, 2, MEM_AND_COUNT).waiting) == ("later", "main")


def test_a_relist_keeps_the_answers_already_given():
    """A watch that expired lists every pod again: a container answered before the
    relist, its mark not back yet, is still answered and is not given out twice."""
    queue = AdmissionQueue(NODE)
    first = bound("first", [[0]], second=1, mem=2)
    later = bound("later", [[1]], second=2, mem=2)
    queue.replace([first, later])
    assert names(queue.take(GPU_MEM, 2, MEM_AND_COUNT).waiting) == ("first", "main")

    queue.replace([first, later])

    assert names(queue.take(GPU_MEM, 2, MEM_AND_COUNT).waiting) == ("later", "main")


def test_a_relist_without_the_pod_forgets_its_answers():
    queue = AdmissionQueue(NODE)
    again = bound("again", [[0]], mem=2)
    queue.replace([again])
    queue.take(GPU_MEM, 2, MEM_AND_COUNT)

    queue.replace([])
    queue.upsert(again)  # deleted and created again under the same UID: it waits afresh

    assert names(queue.take(GPU_MEM, 2, MEM_AND_COUNT).waiting) == ("again", "main")


def test_a_pod_the_watch_reported_gone_is_forgotten_entirely():
    queue = AdmissionQueue(NODE)
    again = bound("again", [[0]], mem=2)
    queue.replace([again])
    queue.take(GPU_MEM, 2, MEM_AND_COUNT)

    queue.remove(again)
    queue.upsert(again)  # listed once more, still unmarked: it waits afresh

    assert names(queue.take(GPU_MEM, 2, MEM_AND_COUNT).waiting) == ("again", "main")


def test_once_the_annotation_says_assigned_it_alone_decides():
    queue = AdmissionQueue(NODE)
    queue.upsert(assigned(bound("running", [[1]], mem=2), "main"))  # e.g. after a restart
    spec = bound("p", [[0]], second=1, mem=2)
    queue.upsert(spec)
    queue.take(GPU_MEM, 2, MEM_AND_COUNT)
    queue.upsert(assigned(spec, "main"))

    # Un-marked again (a repair by another plugin instance, an operator's edit):
    # the container waits again, and the next call of its size is its own.
    queue.upsert(spec)

    assert names(queue.take(GPU_MEM, 2, MEM_AND_COUNT).waiting) == ("p", "main")


def test_a_repair_that_forgets_an_answer_lets_the_container_be_answered_again():
    queue = AdmissionQueue(NODE)
    queue.replace([bound("p", [[0]], mem=2)])
    queue.take(GPU_MEM, 2, MEM_AND_COUNT)
    with pytest.raises(NoMatch):
        queue.take(GPU_MEM, 2, MEM_AND_COUNT)

    # The reconciler found the kubelet never kept that answer.
    queue.forget_served("uid-p", "main")

    assert names(queue.take(GPU_MEM, 2, MEM_AND_COUNT).waiting) == ("p", "main")


def test_a_pod_delivered_again_with_the_same_allocation_is_not_parsed_again(monkeypatch):
    parsed: list[str] = []
    decode = annotation.decode

    def counting(spec: Pod):
        parsed.append(spec.key)
        return decode(spec)

    spec = bound("p", [[0], [0]], containers=[container("a", 2), container("b", 2)])
    marked = assigned(spec, "a")
    monkeypatch.setattr(annotation, "decode", counting)
    queue = AdmissionQueue(NODE)
    queue.upsert(spec)
    queue.upsert(relabelled(spec))  # status and label changes come often on a busy node

    assert parsed == ["default/p"]
    assert names(queue.take(GPU_MEM, 2, MEM_AND_COUNT).waiting) == ("p", "a")

    queue.upsert(marked)  # a changed allocation is read

    assert parsed == ["default/p", "default/p"]
    assert [w.container.name for w in queue.waiting(GPU_MEM)] == ["b"]


# ----- calls asked again, calls that end, a locked list


def test_a_call_repeating_an_earlier_answer_goes_to_that_same_container():
    queue = AdmissionQueue(NODE)
    spec = bound("p", [[0], [1]], containers=[container("x", 2), container("y", 2)])
    leaving = being_deleted(assigned(bound("leaving", [[0]], second=1, mem=2), "main"))
    queue.replace([assigned(spec, "x", "y"), leaving])

    # After a node reboot the kubelet asks again with y's IDs from its checkpoint.
    again = queue.take(GPU_MEM, 2, MEM_AND_COUNT, answered=("uid-p", "y"))

    assert names(again.waiting) == ("p", "y")
    assert [s.index for s in again.waiting.container.gpus] == [1]
    assert again.reallocation is True
    # IDs once answered for a pod now gone or being deleted are no such request.
    for gone in (("uid-gone", "main"), ("uid-leaving", "main")):
        with pytest.raises(NoMatch):
            queue.take(GPU_MEM, 2, MEM_AND_COUNT, answered=gone)


def test_an_ordinary_answer_is_no_reallocation():
    queue = AdmissionQueue(NODE)
    queue.replace([bound("p", [[0]], mem=2)])

    assert queue.take(GPU_MEM, 2, MEM_AND_COUNT).reallocation is False


def test_a_call_that_ended_takes_nothing_and_says_so():
    queue = AdmissionQueue(NODE)
    queue.replace([bound("p", [[0]], mem=2)])

    with pytest.raises(CallEnded) as ended:
        queue.take(GPU_MEM, 2, MEM_AND_COUNT, active=lambda: False)

    assert str(ended.value) == "the call for 2 aliyun.com/gpu-mem ended before it was answered"
    assert names(queue.take(GPU_MEM, 2, MEM_AND_COUNT).waiting) == ("p", "main")


def test_calls_give_up_on_a_pod_list_locked_past_their_deadline_and_say_so():
    queue = AdmissionQueue(NODE)
    listing, release = threading.Event(), threading.Event()

    def stuck_list():
        listing.set()
        release.wait(3.0)  # the watch holding the list, far beyond any deadline
        yield bound("p", [[0]], mem=2)

    watch = threading.Thread(target=queue.replace, args=(stuck_list(),))
    watch.start()
    try:
        assert listing.wait(3.0)
        calls = (
            lambda d: queue.take(GPU_MEM, 2, MEM_AND_COUNT, deadline=d),
            lambda d: queue.peek(GPU_MEM, 2, d),
        )
        for call in calls:
            with pytest.raises(QueueBusy) as busy:
                call(Deadline.after(0.1))
            assert str(busy.value) == (
                "the list of pods bound to node n1 stayed locked until its deadline (0.1 s)"
            )
    finally:
        release.set()
        watch.join()


# ----- what a refusal says


def test_a_refusal_names_each_waiting_container_and_counts_those_beyond_eight():
    queue = AdmissionQueue(NODE)
    queue.replace([bound(f"p{i}", [[0]], second=i, mem=1) for i in range(8)])
    listed = ", ".join(f"default/p{i} container main (1)" for i in range(8))
    asked = "Allocate asked for 3 aliyun.com/gpu-mem on node n1, but no waiting container"

    with pytest.raises(NoMatch) as eight:
        queue.take(GPU_MEM, 3, ALL, deadline=Deadline.after(0))  # no time to wait
    queue.upsert(bound("p8", [[0]], second=8, mem=1))
    with pytest.raises(NoMatch) as nine:
        queue.take(GPU_MEM, 3, ALL)

    assert str(eight.value) == f"{asked} asks for 3; waiting for aliyun.com/gpu-mem: {listed}"
    assert str(nine.value) == (
        f"{asked} asks for 3; waiting for aliyun.com/gpu-mem: {listed} and 1 more"
    )


def test_a_refusal_with_nothing_waiting_points_at_the_scheduler_extender():
    queue = AdmissionQueue(NODE)

    with pytest.raises(NoMatch) as refused:
        queue.take(GPU_MEM, 2, ALL)

    assert str(refused.value) == (
        "Allocate asked for 2 aliyun.com/gpu-mem on node n1, but no container bound to this "
        "node waits for aliyun.com/gpu-mem; pods get shared GPUs only when the gpushare "
        "scheduler extender placed them (schedulerName gpushare-scheduler, annotation "
        "gpushare.io/allocation)"
    )


def test_a_refusal_gives_each_unreadable_allocation_with_its_reason_while_it_lasts():
    queue = AdmissionQueue(NODE)
    bad_json = pod("a", mem=1, node=NODE, annotations={annotation.ALLOCATION: "{not json"})
    too_new = pod("b", mem=1, node=NODE, annotations={annotation.ALLOCATION: '{"version": 99}'})
    queue.replace([bad_json, too_new])

    with pytest.raises(NoMatch) as refused:
        queue.take(GPU_MEM, 2, ALL)
    assert str(refused.value).endswith(
        f"; unreadable allocations: default/a: {unreadable_reason(bad_json)}; "
        f"default/b: {unreadable_reason(too_new)}"
    )

    queue.upsert(bound("a", [[0]], mem=1))  # the extender rewrote it
    queue.remove(too_new)
    with pytest.raises(NoMatch) as later:
        queue.take(GPU_MEM, 2, ALL)
    assert "unreadable" not in str(later.value)


def test_a_record_changed_after_it_was_written_is_not_matched_at_its_new_size():
    # Issue 39: one codec with the extender. A digit changed from 2 to 1 GiB was read as
    # a 1 GiB container; now the record fails its check and nothing is matched to it.
    queue = AdmissionQueue(NODE)
    held = bound("a", [[0]], mem=2)
    record = held.metadata.annotations[annotation.ALLOCATION]
    queue.replace(
        [_annotated(held, {annotation.ALLOCATION: record.replace('"memGiB":2', '"memGiB":1')})]
    )

    with pytest.raises(NoMatch) as refused:
        queue.take(GPU_MEM, 1, ALL)
    assert "default/a: gpushare.io/allocation fails its check" in str(refused.value)


# ----- the order and the counts the kubelet asks with


def test_every_init_container_comes_before_the_first_app_container():
    queue = AdmissionQueue(NODE)
    queue.replace(
        [
            bound(
                "p",
                [[0], [0], [1]],
                init_containers=[container("init0", 2), container("init1", 2)],
                containers=[container("main", 2)],
            )
        ]
    )

    order = [queue.take(GPU_MEM, 2, ALL).waiting.container.name for _ in range(3)]

    assert order == ["init0", "init1", "main"]


def test_a_zero_limit_is_no_request():
    queue = AdmissionQueue(NODE)
    queue.replace([bound("p", [[0]], containers=[container("main", 2, count=0)])])

    assert queue.waiting(GPU_COUNT) == []
    # Memory alone completes it: the kubelet makes no call for a zero limit.
    assert queue.take(GPU_MEM, 2, ALL).complete


def test_a_container_is_found_by_name_when_its_recorded_index_points_elsewhere():
    spec = bound("p", [[0], [1]], containers=[container("a", 4), container("b", 2)])
    allocation = annotation.decode(spec)
    assert allocation is not None
    a, b = allocation.containers
    shifted = allocation.model_copy(update={"containers": (a, b.model_copy(update={"index": 0}))})
    queue = AdmissionQueue(NODE)
    queue.replace([_annotated(spec, annotation.encode(shifted))])

    assert names(queue.take(GPU_MEM, 2, ALL).waiting) == ("p", "b")
    assert names(queue.take(GPU_MEM, 4, ALL).waiting) == ("p", "a")


def test_an_ack_allocation_naming_a_container_the_pod_lacks_leaves_it_out():
    # ACK's scheduler recorded GPUs for container index 1; the pod has one container.
    ack = pod(
        "ack",
        mem=2,
        node=NODE,
        annotations={
            annotation.ACK_V2_ALLOCATION: '{"0":{"0":2},"1":{"1":2}}',
            environment.MEM_IDX: "0,1",
            environment.MEM_DEV: "16",
            annotation.ACK_ASSUME_TIME: "1",
        },
    )
    queue = AdmissionQueue(NODE)
    queue.replace([ack, bound("later", [[1]], second=5, mem=4)])

    assert names(queue.take(GPU_MEM, 2, ALL).waiting) == ("ack", "main")
    with pytest.raises(NoMatch):
        queue.take(GPU_MEM, 2, ALL)
    assert names(queue.take(GPU_MEM, 4, ALL).waiting) == ("later", "main")
