"""The scheduler cache: the API's allocations plus binds the watch has not shown yet."""

import pytest

from gpushare import annotation
from gpushare.allocation import PodAllocation
from gpushare.cluster import EventType
from gpushare.errors import Refusal
from gpushare.extender.cache import CacheCounts, SchedulerCache
from gpushare.extender.inspect import cluster_report
from gpushare.extender.mirror import GpuShape, interesting
from gpushare.extender.pendingpod import PendingPod
from gpushare.extender.policychoice import PolicyChoice
from gpushare.inventory import NODE_GPUS_ANNOTATION, parse_layout
from gpushare.labels import NodeMode
from gpushare.objects import Node, PodStatus
from gpushare.placement.lookahead import LookaheadFgdPolicy
from gpushare.placement.policies import POLICIES, BinpackPolicy
from gpushare.placement.workload import TaskShape
from gpushare.request import PodRequest
from gpushare.state import NodeState
from tests.builders import T0, being_deleted, node, pod, request


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def started(clock: Clock | None = None) -> SchedulerCache:
    cache = SchedulerCache(assume_ttl_s=60, clock=clock or Clock())
    cache.replace_nodes([node("n", "1x16GiB")])
    cache.replace_pods([])
    return cache


def assume(cache: SchedulerCache, name: str, mem: int, node: str = "n") -> PodAllocation:
    """Reserves what bind would for the pod (its allocation assumed)."""
    allocation = cache.reserve(asking(name, mem), node, T0)
    assert isinstance(allocation, PodAllocation), allocation
    return allocation


def asking(
    name: str, mem: int, policy: str | None = None, uid: str | None = None, priority: int = 0
) -> PendingPod:
    """Pod `name` (UID uid-<name> unless given) as the verbs hand it to the cache."""
    uid = f"uid-{name}" if uid is None else uid
    return PendingPod(f"default/{name}", uid, request(mem=mem), policy, priority)


def answer(cache: SchedulerCache, mem: int) -> tuple:
    """What filter and prioritize would send about node n (the table's entry)."""
    return cache.answers(asking("p", mem), ["n"]).entries[0]


def refusal(cache: SchedulerCache, mem: int) -> str:
    """Node n's reason in FailedNodes or FailedAndUnresolvableNodes, "" when it fits."""
    _, _, failed, unresolvable, *_ = answer(cache, mem)
    return failed or unresolvable or ""


def used(cache: SchedulerCache) -> int:
    return cache.snapshot().gpus["n"][0][0]


def test_an_event_from_before_the_bind_does_not_drop_the_reservation():
    cache = started()
    assume(cache, "p", 10)
    cache.apply_pod(EventType.ADDED, pod("p", mem=10))  # created, not yet bound
    assert used(cache) == 10
    assert "[insufficient-gpu-memory]" in refusal(cache, 8)


def test_the_watch_showing_the_bind_replaces_the_reservation():
    cache = started()
    allocation = assume(cache, "p", 10)
    bound = pod("p", mem=10, node="n", annotations=annotation.encode(allocation))
    cache.apply_pod(EventType.MODIFIED, bound)
    assert not list(cache.details().assumed)
    assert used(cache) == 10 and cache.snapshot().pods == {"default/p": allocation}


def test_a_deleted_pod_frees_its_reservation():
    cache = started()
    assume(cache, "p", 10)
    cache.apply_pod(EventType.DELETED, pod("p", mem=10))
    assert not list(cache.details().assumed) and used(cache) == 0


def test_a_reservation_the_watch_never_confirms_expires(caplog):
    clock = Clock()
    cache = started(clock)
    assume(cache, "p", 10)
    cache.apply_pod(EventType.ADDED, pod("p", mem=10))
    clock.now = 30
    assert cache.expire() == []
    clock.now = 61
    assert cache.expire() == ["default/p"]
    assert used(cache) == 0
    assert caplog.messages == ["dropped the assumed bind of default/p: the watch never showed it"]


def bound_pod(cache: SchedulerCache, name: str, mem: int, node: str = "n"):
    """A pod the API shows bound to n with its allocation, applied to the cache."""
    allocation = assume(cache, name, mem, node)
    bound = pod(name, mem=mem, node=node, annotations=annotation.encode(allocation))
    cache.apply_pod(EventType.MODIFIED, bound)
    return bound


def test_a_pod_being_deleted_holds_its_gpu_until_the_watch_shows_it_gone():
    cache = started()
    old = being_deleted(bound_pod(cache, "old", 16))
    cache.apply_pod(EventType.MODIFIED, old)
    assert "[insufficient-gpu-memory]" in refusal(cache, 16)
    cache.replace_pods([old])  # a relisting counts it too
    assert "[insufficient-gpu-memory]" in refusal(cache, 16)
    cache.apply_pod(EventType.DELETED, old)
    assert refusal(cache, 16) == "" and used(cache) == 0


def test_a_finished_pod_lets_its_gpu_go():
    cache = started()
    done = bound_pod(cache, "done", 16)
    cache.apply_pod(
        EventType.MODIFIED, done.model_copy(update={"status": PodStatus(phase="Succeeded")})
    )
    assert refusal(cache, 16) == "" and used(cache) == 0


def test_a_relisting_keeps_reservations_the_listing_does_not_show_yet():
    cache = started()
    allocation = assume(cache, "p", 10)
    cache.replace_pods([pod("p", mem=10)])
    assert used(cache) == 10
    cache.replace_pods([pod("p", mem=10, node="n", annotations=annotation.encode(allocation))])
    assert not list(cache.details().assumed) and used(cache) == 10


def test_results_are_reused_until_the_node_changes():
    cache = started()
    first = answer(cache, 10)
    assert answer(cache, 10) is first
    assume(cache, "p", 10)
    assert "[insufficient-gpu-memory]" in refusal(cache, 10)
    smaller = cache.answers(asking("p", 4), ["n"])  # a shape first asked after the change
    assert cache.answers(asking("p", 4), ["n"]) is smaller


def test_a_node_status_update_that_changes_nothing_keeps_the_results():
    cache = started()
    first = answer(cache, 10)
    cache.apply_node(EventType.MODIFIED, node("n", "1x16GiB"))
    assert answer(cache, 10) is first
    cache.apply_node(EventType.MODIFIED, node("n", "1x8GiB"))
    assert "[gpu-too-small]" in refusal(cache, 10)


def test_a_node_with_an_unreadable_gpu_annotation_is_refused_with_why():
    cache = started()
    broken = node("n", "1x16GiB")
    broken = broken.model_copy(
        update={
            "metadata": broken.metadata.model_copy(
                update={"annotations": {"gpushare.io/gpus": "not json"}}
            )
        }
    )
    cache.apply_node(EventType.MODIFIED, broken)
    reason = refusal(cache, 1)
    assert "gpushare.io/gpus is malformed" in reason and "device plugin" in reason


def test_a_pod_with_an_unreadable_allocation_is_left_out_and_reported():
    cache = started()
    cache.apply_pod(
        EventType.ADDED, pod("p", mem=1, node="n", annotations={"gpushare.io/allocation": "{oops"})
    )
    assert used(cache) == 0
    assert "not a JSON object" in cache.details().pod_problems.get("default/p")


@pytest.mark.parametrize(
    ("names", "before", "after"),
    [
        (["n0", "n1", "n2", "n3"], '["n0","n1","n2","n3"]', '["n0","n2","n3"]'),
        (["n3", "n1", "n0", "n1"], '["n3","n1","n0","n1"]', '["n3","n0"]'),
    ],
)
def test_a_candidate_list_asked_again_is_patched_where_nodes_changed(names, before, after):
    cache = SchedulerCache()
    cache.replace_nodes([node(f"n{i}", "1x16GiB") for i in range(4)])
    cache.replace_pods([])
    first = cache.answers(asking("p", 10), names)
    assert first.passed_json() == before
    assume(cache, "p", 10, node="n1")
    again = cache.answers(asking("p", 10), list(names))
    assert again.passed_json() == after
    assert '"n1":' in again.failed_json()
    assert first.passed_json() == before  # an answer already given stays as it was


def learns_on_filter() -> LookaheadFgdPolicy:
    """Our policy learning online: forty pods of one shape move its epoch."""
    return LookaheadFgdPolicy()


def teach(cache: SchedulerCache, policy: str | None, pods: int = 40) -> None:
    for i in range(pods):
        cache.filter(asking(f"p{i}", 4, policy), ["n"])


def test_another_policy_learning_keeps_the_results_of_this_one():
    learning = learns_on_filter()
    cache = SchedulerCache(PolicyChoice({**POLICIES, learning.name: lambda: learning}, "binpack"))
    cache.replace_nodes([node("n", "1x16GiB")])
    cache.replace_pods([])
    packed = cache.answers(asking("p", 10), ["n"])
    ours = cache.answers(asking("p", 10, learning.name), ["n"])
    teach(cache, learning.name)
    assert learning.epoch > 0
    assert cache.answers(asking("p", 10), ["n"]) is packed
    assert cache.answers(asking("p", 10, learning.name), ["n"]) is not ours  # evaluated again


def test_each_cache_teaches_policy_objects_of_its_own():
    made: list[LookaheadFgdPolicy] = []

    def fresh() -> LookaheadFgdPolicy:
        made.append(learns_on_filter())
        return made[-1]

    registry = {**POLICIES, "fgd-lookahead": fresh}
    first, second = (SchedulerCache(PolicyChoice(registry, "fgd-lookahead")) for _ in range(2))
    for cache in (first, second):
        cache.replace_nodes([node("n", "1x16GiB")])
        cache.replace_pods([])
    teach(first, None)
    assert len(made) == 2
    assert made[0].epoch > 0 and made[1].epoch == 0


def test_the_policies_are_told_of_every_node_as_it_joins_changes_and_leaves():
    # Nodes in the same state are evaluated once for all of them: what a learning policy
    # weighs rare shapes by (placement/supply.py) comes from the listing and the watch.
    learning = learns_on_filter()
    cache = SchedulerCache(PolicyChoice({**POLICIES, learning.name: lambda: learning}, "binpack"))
    cache.replace_nodes([node(f"n{i}", "8x16GiB") for i in range(3)] + [node("small", "1x16GiB")])
    cache.replace_pods([])
    eight = TaskShape(gpus=8, exclusive=True)
    assert len(learning.supply) == 4 and learning.supply.share(eight) == 1.0
    cache.apply_node(EventType.MODIFIED, node("n0", "4x16GiB"))
    assert len(learning.supply) == 4 and learning.supply.share(TaskShape(gpus=4)) == 1.0
    cache.apply_node(EventType.DELETED, node("n1", "8x16GiB"))
    cache.apply_node(EventType.ADDED, node("late", "2x16GiB"))
    assert len(learning.supply) == 4
    cache.replace_nodes([node("n2", "8x16GiB")])  # a relisting forgets the nodes not in it
    cache.replace_pods([])
    assert len(learning.supply) == 1


def test_a_pod_bound_or_gone_tells_the_policies_nothing_of_its_node(monkeypatch):
    told: list[str] = []
    seen = LookaheadFgdPolicy.node_seen
    monkeypatch.setattr(
        LookaheadFgdPolicy, "node_seen", lambda self, n: told.append(n.node) or seen(self, n)
    )
    cache = SchedulerCache(PolicyChoice(POLICIES, "fgd-lookahead"), assume_ttl_s=60, clock=Clock())
    cache.replace_nodes([node("n", "1x16GiB")])
    cache.replace_pods([])
    told.clear()
    gone = bound_pod(cache, "p", 10)
    cache.apply_pod(EventType.DELETED, gone)
    assert told == [] and used(cache) == 0
    cache.apply_node(EventType.MODIFIED, node("n", "2x16GiB"))
    assert told == ["n"]


def test_a_bind_reserves_only_what_still_fits():
    cache = started()
    assume(cache, "p", 10)
    refused = cache.reserve(asking("q", 10), "n", T0)
    assert isinstance(refused, Refusal) and "insufficient-gpu-memory" in str(refused)
    assert list(cache.details().assumed) == ["default/p"] and used(cache) == 10


def test_a_deleted_node_is_refused_and_stays_gone_after_a_relist():
    cache = started()
    cache.apply_node(EventType.DELETED, node("n", "1x16GiB"))
    assert refusal(cache, 1) == (
        '"n":"node n is not known to the gpushare extender (yet) [node-unknown]"'
    )
    cache.replace_pods([])  # the pods listed again: the node must not come back with them
    assert "[node-unknown]" in refusal(cache, 1)
    cache.apply_node(EventType.DELETED, node("n", "1x16GiB"))  # told twice: nothing more to do
    assert cache.counts().nodes == 0


def test_a_node_changed_by_the_watch_keeps_its_new_gpus_through_a_relist():
    cache = started()
    cache.apply_node(EventType.MODIFIED, node("n", "1x8GiB"))
    cache.replace_pods([])
    assert "[gpu-too-small]" in refusal(cache, 10)
    assert refusal(cache, 8) == ""


def test_a_node_that_leaves_and_comes_back_still_carries_its_pods():
    cache = started()
    bound_pod(cache, "p", 10)
    cache.apply_node(EventType.DELETED, node("n", "1x16GiB"))
    cache.apply_node(EventType.ADDED, node("n", "1x16GiB"))
    assert used(cache) == 10
    assert "[insufficient-gpu-memory]" in refusal(cache, 8)
    cache.apply_pod(EventType.DELETED, pod("p", mem=10))
    assert used(cache) == 0


def test_a_pod_deleted_while_its_node_is_away_is_not_counted_when_the_node_returns():
    cache = started()
    gone = bound_pod(cache, "p", 10)
    cache.apply_node(EventType.DELETED, node("n", "1x16GiB"))
    cache.apply_pod(EventType.DELETED, gone)
    cache.apply_node(EventType.ADDED, node("n", "1x16GiB"))
    assert used(cache) == 0 and refusal(cache, 16) == ""


def test_a_pod_deleted_after_its_node_got_more_gpus_frees_its_gpu():
    cache = started()
    gone = bound_pod(cache, "p", 10)
    cache.apply_node(EventType.MODIFIED, node("n", "2x16GiB"))
    on_gpu0 = frozenset({"default/p"})
    assert cache.snapshot().gpus["n"] == {0: (10, 0, on_gpu0), 1: (0, 0, frozenset())}
    cache.apply_pod(EventType.DELETED, gone)
    assert cache.snapshot().gpus["n"] == {0: (0, 0, frozenset()), 1: (0, 0, frozenset())}


def test_preempt_never_evicts_a_pod_whose_bind_the_watch_has_not_shown():
    """kube-scheduler may offer a pod it assumed itself: its priority is not known
    here yet, so our set leaves it alone and frees the room elsewhere."""
    cache = started()
    assume(cache, "new", 4)
    bound_pod(cache, "low", 10)
    offered = ["uid-new", "uid-low"]
    assert cache.victims("n", asking("high", 10, priority=100), offered) == ["uid-low"]


def unserved_pods(count: int) -> list:
    """Pods asking for GPUs under a schedulerName nobody serves."""
    built = pod("p", mem=1)
    return [
        built.model_copy(
            update={
                "metadata": built.metadata.model_copy(update={"name": f"p{i}", "uid": f"u{i}"}),
                "spec": built.spec.model_copy(update={"scheduler_name": "nobody-scheduler"}),
            }
        )
        for i in range(count)
    ]


def test_a_pod_told_about_is_told_about_again_only_after_10000_newer_ones():
    cache = SchedulerCache(served_schedulers=("gpushare-scheduler",))
    cache.replace_nodes([])
    pods = unserved_pods(10_001)
    cache.replace_pods(pods)
    assert len(cache.take_unserved()) == 10_001
    cache.replace_pods(pods)  # a relist: only the oldest is not remembered any more
    assert cache.take_unserved() == [("default/p0", "u0", "nobody-scheduler")]


def unreadable(name: str) -> Node:
    """A node whose GPU annotation the extender cannot read."""
    broken = node(name, "1x16GiB")
    meta = broken.metadata.model_copy(update={"annotations": {NODE_GPUS_ANNOTATION: "not json"}})
    return broken.model_copy(update={"metadata": meta})


def test_inspect_shows_each_gpu_node_pod_by_pod_and_each_unreadable_one():
    cache = SchedulerCache()
    spread = node("a", "1x16GiB", **{"ack.node.gpu.placement": "spread"})
    cpu_only = Node.model_validate({"metadata": {"name": "c"}})
    cache.replace_nodes([spread, unreadable("b"), cpu_only])
    cache.replace_pods([])
    bound_pod(cache, "p", 4, node="a")
    assume(cache, "q", 2, node="a")
    cache.apply_pod(EventType.ADDED, pod("bad", mem=1, annotations={"gpushare.io/allocation": "{"}))
    report = cluster_report(cache)
    assert report["synced"] is True and report["assumedPods"] == ["default/q"]
    assert list(report["podProblems"]) == ["default/bad"]
    shown, problem = report["nodes"]
    assert shown == {
        "name": "a",
        "mode": "cgpu",
        "placementPolicy": "spread",
        "memGiB": 16,
        "allocatedMemGiB": 6,
        "gpus": [
            {
                "index": 0,
                "uuid": parse_layout("1x16GiB", "a")[0].uuid,
                "model": "Mock-GPU",
                "healthy": True,
                "memGiB": 16,
                "allocatedMemGiB": 6,
                "corePercent": 100,
                "allocatedCorePercent": 0,
                "pods": [
                    {"pod": "default/p", "memGiB": 4, "corePercent": 0, "assumed": False},
                    {"pod": "default/q", "memGiB": 2, "corePercent": 0, "assumed": True},
                ],
            }
        ],
    }
    assert list(problem) == ["name", "problem"] and problem["name"] == "b"
    assert problem["problem"].startswith("gpushare.io/gpus is malformed")


def test_the_watch_keeps_pods_asking_for_gpus_or_carrying_an_allocation_only():
    cpu = [{"name": "nginx", "resources": {"limits": {"cpu": "1"}}}]
    web = pod("web", containers=cpu)
    allocated = pod("left", containers=cpu, annotations={"ALIYUN_COM_GPU_MEM_IDX": "0"})
    assert [interesting(p) for p in (pod("p", mem=1), web, allocated)] == [True, False, True]


def test_a_default_policy_not_in_the_registry_is_refused_by_name():
    with pytest.raises(
        ValueError, match=r"^--default-placement 'tetris' is not a placement policy; known: "
    ):
        SchedulerCache(PolicyChoice(default="tetris"))


def test_a_fresh_cache_takes_watch_events_before_any_listing():
    cache = SchedulerCache(served_schedulers=("gpushare-scheduler",))
    cache.apply_node(EventType.ADDED, node("n", "1x16GiB"))
    cache.apply_node(EventType.ADDED, unreadable("b"))
    cache.apply_pod(EventType.ADDED, pod("bad", mem=1, annotations={"gpushare.io/allocation": "{"}))
    cache.apply_pod(EventType.ADDED, unserved_pods(1)[0])
    assert refusal(cache, 16) == ""
    assert "gpushare.io/gpus is malformed" in cache.answers(asking("p", 1), ["b"]).entries[0][3]
    assert "not a JSON object" in cache.details().pod_problems.get("default/bad")
    assert cache.take_unserved() == [("default/p0", "u0", "nobody-scheduler")]


def test_synced_once_both_nodes_and_pods_were_listed():
    cache = SchedulerCache()
    assert not cache.synced
    cache.replace_pods([])
    assert not cache.synced
    cache.replace_nodes([])
    assert cache.synced


def test_a_listing_without_pods_waiting_asks_for_no_nudge():
    cache = SchedulerCache(served_schedulers=("gpushare-scheduler",))
    cache.replace_nodes([node("n", "1x16GiB")])
    cache.replace_pods([pod("elsewhere", mem=1, node="n")])
    assert cache.take_listed_waiting() is False


def test_with_a_ttl_of_zero_an_unconfirmed_reservation_goes_at_the_first_expiry():
    cache = SchedulerCache(assume_ttl_s=0, clock=Clock())
    cache.replace_nodes([node("n", "1x16GiB")])
    cache.replace_pods([])
    assume(cache, "p", 10)
    assert cache.expire() == ["default/p"]
    assert used(cache) == 0


def test_answers_of_the_last_64_request_shapes_are_kept():
    cache = started()
    first = cache.answers(asking("p", 1), ["n"])
    for mem in range(2, 65):  # 63 more shapes
        cache.answers(asking("p", mem), ["n"])
    assert cache.answers(asking("p", 1), ["n"]) is first
    for mem in range(65, 129):  # 64 more: the first is the least recently used
        cache.answers(asking("p", mem), ["n"])
    assert cache.answers(asking("p", 1), ["n"]) is not first


def test_an_empty_candidate_list_asked_again_after_a_change_is_still_empty():
    cache = started()
    assert cache.answers(asking("p", 1), ["n"]).passed_json() == '["n"]'
    assert cache.answers(asking("p", 1), []).passed_json() == "[]"
    assume(cache, "p", 10)  # n changed
    assert cache.answers(asking("p", 1), []).passed_json() == "[]"


def test_a_relisting_of_the_nodes_nudges_the_pods_refused_everywhere():
    cache = started()
    assume(cache, "big", 16)
    assert cache.filter(asking("p", 8), ["n"]).fits_nowhere()
    cache.replace_nodes([node("n", "1x16GiB")])  # what changed while the watch was away: unknown
    assert cache.take_requeue(10) == ({"n"}, [("default/p", "uid-p")])


def test_the_same_candidates_sent_again_get_the_answer_already_made():
    cache = started()
    first = cache.answers(asking("p", 4), ["n"])
    assert cache.answers(asking("p", 4), ["n"]) is first


def test_a_deleted_pod_leaves_no_problem_and_no_nudge_behind():
    cache = started()
    bad = pod("bad", mem=1, annotations={"gpushare.io/allocation": "{"})
    cache.apply_pod(EventType.ADDED, bad)
    assume(cache, "big", 16)
    cache.apply_pod(EventType.ADDED, pod("waiting", mem=8))
    assert cache.filter(asking("waiting", 8), ["n"]).fits_nowhere()
    cache.apply_pod(EventType.DELETED, bad)
    cache.apply_pod(EventType.DELETED, pod("waiting", mem=8))
    assert (
        cache.details().pod_problems.get("default/bad") is None
        and cluster_report(cache)["podProblems"] == {}
    )
    assert list(cache.details().waiting) == [] and cache.take_requeue(10) == (set(), [])


def test_a_pod_the_watch_shows_bound_waits_for_no_nudge():
    cache = started()
    assume(cache, "big", 16)
    assert cache.filter(asking("p", 8), ["n"]).fits_nowhere()
    assert list(cache.details().waiting) == ["default/p"]
    cache.apply_pod(EventType.MODIFIED, pod("p", mem=8, node="elsewhere"))
    assert list(cache.details().waiting) == [] and cache.counts().refused == 0


def test_a_pod_created_again_under_the_same_name_drops_the_old_ones_reservation():
    cache = started()
    assume(cache, "p", 10)
    again = pod("p", mem=10)
    again = again.model_copy(
        update={"metadata": again.metadata.model_copy(update={"uid": "uid-p-again"})}
    )
    cache.apply_pod(EventType.ADDED, again)  # not bound: the old pod's bind is moot
    assert not list(cache.details().assumed) and used(cache) == 0


def test_a_failed_bind_gives_back_what_the_api_shows_of_the_pod():
    cache = started()
    earlier = assume(cache, "p", 10)
    cache.forget("default/p", "uid-p")
    # The API shows an allocation from an earlier bind that never bound the pod.
    cache.apply_pod(EventType.ADDED, pod("p", mem=10, annotations=annotation.encode(earlier)))
    assume(cache, "p", 6)  # bind tries again
    assert used(cache) == 6
    cache.forget("default/p", "uid-p")  # and fails
    assert used(cache) == 10 and not list(cache.details().assumed)


def test_reservations_expire_by_their_own_age_checked_every_five_seconds():
    clock = Clock()
    clock.now = 100
    cache = started(clock)
    first = assume(cache, "first", 4)
    assume(cache, "second", 4)
    clock.now = 150
    assert assume(cache, "first", 4) == first  # reserved again: younger now
    clock.now = 158
    assert cache.expire() == []  # second is 58 s old
    clock.now = 161
    assert cache.expire() == []  # the last pass was 3 s ago
    clock.now = 163
    assert cache.expire() == ["default/second"]
    assert list(cache.details().assumed) == ["default/first"] and used(cache) == 4


def test_the_watch_showing_a_pod_bound_elsewhere_frees_the_node_reserved():
    cache = SchedulerCache()
    cache.replace_nodes([node("a", "1x16GiB"), node("b", "1x16GiB")])
    cache.replace_pods([])
    on_b = assume(cache, "p", 10, node="b")
    cache.forget("default/p", "uid-p")
    assume(cache, "p", 10, node="a")  # our bind; another one won
    cache.apply_pod(
        EventType.MODIFIED, pod("p", mem=10, node="b", annotations=annotation.encode(on_b))
    )
    assert cache.snapshot().gpus["a"][0][0] == 0 and cache.snapshot().gpus["b"][0][0] == 10


def test_an_old_reservation_of_a_pod_the_api_shows_bound_is_kept():
    clock = Clock()
    cache = started(clock)
    cache.apply_pod(EventType.ADDED, pod("p", mem=10, node="n"))  # bound, allocation not shown yet
    assume(cache, "p", 10)  # a bind for it reserves all the same
    clock.now = 61
    assert cache.expire() == []
    assert list(cache.details().assumed) == ["default/p"] and used(cache) == 10


def test_the_10000_pods_refused_last_are_kept_for_the_nudge():
    cache = started()
    assume(cache, "big", 16)
    for i in range(10_001):
        cache.filter(asking(f"p{i}", 8, uid=f"u{i}"), ["n"])
    waiting = list(cache.details().waiting)
    assert len(waiting) == 10_000 and waiting[0] == "default/p1" and waiting[-1] == "default/p10000"


def test_a_pod_that_fits_again_waits_for_no_nudge():
    cache = started()
    assume(cache, "big", 16)
    assert cache.filter(asking("p", 8), ["n"]).fits_nowhere()
    cache.forget("default/big", "uid-big")
    assert not cache.filter(asking("p", 8), ["n"]).fits_nowhere()
    assert list(cache.details().waiting) == []


def test_the_nudge_skips_pods_bound_leaving_or_created_again_and_keeps_unseen_ones():
    cache = started()
    assume(cache, "big", 16)
    cache.apply_pod(EventType.ADDED, pod("bound", mem=8, node="elsewhere"))
    cache.apply_pod(EventType.ADDED, being_deleted(pod("leaving", mem=8)))
    cache.apply_pod(EventType.ADDED, pod("again", mem=8))  # its UID is uid-again now
    cache.apply_pod(EventType.ADDED, pod("waiting", mem=8))
    for name, uid in [("bound", "uid-bound"), ("leaving", "uid-leaving"), ("again", "old")]:
        cache.filter(asking(name, 8, uid=uid), ["n"])
    for name in ("unseen", "waiting"):
        cache.filter(asking(name, 8), ["n"])
    assert cache.take_requeue(1) == (set(), [("default/unseen", "uid-unseen")])
    assert list(cache.details().waiting) == ["default/unseen", "default/waiting"]
    assert cache.take_requeue(10)[1] == [
        ("default/unseen", "uid-unseen"),
        ("default/waiting", "uid-waiting"),
    ]


def test_a_listing_of_waiting_pods_asks_for_one_nudge():
    cache = SchedulerCache(served_schedulers=("gpushare-scheduler",))
    cache.replace_nodes([node("n", "1x16GiB")])
    waiting = pod("w", mem=1)
    waiting = waiting.model_copy(
        update={"spec": waiting.spec.model_copy(update={"scheduler_name": "gpushare-scheduler"})}
    )
    cache.replace_pods([waiting])
    assert cache.take_listed_waiting() is True
    assert cache.take_listed_waiting() is False


class Counting(BinpackPolicy):
    """binpack that remembers the pods it learned of."""

    name = "counting"

    def __init__(self) -> None:
        self.observed: list[PodRequest] = []

    def observe(self, request: PodRequest) -> None:
        self.observed.append(request)


class NeverPlaces(BinpackPolicy):
    name = "never"

    def place(self, view, request):
        return None


def test_filter_teaches_each_pod_once_by_uid_and_answers_by_the_pods_policy():
    counting = Counting()
    registry = {**POLICIES, "counting": lambda: counting, "never": NeverPlaces}
    cache = SchedulerCache(PolicyChoice(registry, "counting"))
    cache.replace_nodes([node("n", "1x16GiB")])
    cache.replace_pods([])
    for uid in ("uid-1", "uid-1", "uid-2", "", ""):  # the same name, created again
        cache.filter(asking("p", 4, uid=uid), ["n"])
    assert len(counting.observed) == 3
    assert cache.filter(asking("q", 4, "never"), ["n"]).fits_nowhere()
    assert not cache.filter(asking("q", 4), ["n"]).fits_nowhere()


def test_counts_say_what_the_cache_holds():
    cache = SchedulerCache()
    cache.replace_nodes([node("n", "2x16GiB"), unreadable("b")])
    cache.replace_pods([pod("bad", mem=1, annotations={"gpushare.io/allocation": "{"})])
    bound_pod(cache, "p", 4)
    assume(cache, "q", 2)
    assert cache.counts() == CacheCounts(
        nodes=2, gpus=2, pods=2, placed=2, assumed=1, refused=0, problems=2, damaged=1
    )


def test_a_pod_whose_allocation_becomes_readable_has_no_problem_any_more():
    cache = started()
    cache.apply_pod(EventType.ADDED, pod("p", mem=1, annotations={"gpushare.io/allocation": "{"}))
    assert cache.details().pod_problems.get("default/p") is not None
    cache.apply_pod(EventType.MODIFIED, pod("p", mem=1))
    assert cache.details().pod_problems.get("default/p") is None and cache.counts().problems == 0


def test_the_policies_learn_again_of_a_pod_only_after_100000_newer_ones():
    counting = Counting()
    cache = SchedulerCache(PolicyChoice({**POLICIES, "counting": lambda: counting}, "counting"))
    cache.replace_nodes([])
    cache.replace_pods([])
    for i in range(100_001):
        cache.filter(asking(f"p{i}", 4, uid=f"u{i}"), [])
    for uid, mem in (("u1", 5), ("u100000", 6), ("u0", 7)):  # only the oldest was forgotten
        cache.filter(asking("again", mem, uid=uid), [])
    assert [r.total_mem for r in counting.observed[100_001:]] == [7]


def test_an_unreadable_allocation_is_logged_once_until_it_changes(caplog):
    cache = started()
    for value in ("{", "{", "[]"):
        cache.apply_pod(
            EventType.MODIFIED, pod("p", mem=1, annotations={annotation.ALLOCATION: value})
        )
    assert [m.split(":")[0] for m in caplog.messages] == ["pod default/p", "pod default/p"]
    assert caplog.messages[0] != caplog.messages[1]


def test_without_scheduler_names_no_pod_is_looked_at_for_an_unserved_name():
    cache = started()  # no served_schedulers
    woken = []
    cache.on_unserved = lambda: woken.append(1)
    cache.apply_pod(EventType.ADDED, unserved_pods(1)[0])
    assert woken == [] and cache.take_unserved() == []


def test_a_relisting_showing_the_pod_bound_ends_its_reservation():
    cache = started()
    assume(cache, "p", 10)
    cache.replace_pods([pod("p", mem=10, node="n")])  # bound, its allocation not shown
    assert not list(cache.details().assumed) and used(cache) == 0


def test_a_reservation_kept_through_a_relisting_is_freed_when_its_bind_fails():
    cache = started()
    assume(cache, "p", 10)
    cache.replace_pods([pod("p", mem=10)])
    cache.forget("default/p", "uid-p")
    assert used(cache) == 0 and refusal(cache, 16) == ""


def test_an_unreadable_node_told_again_unchanged_is_logged_once(caplog):
    cache = started()
    cache.apply_node(EventType.MODIFIED, unreadable("n"))
    cache.apply_node(EventType.MODIFIED, unreadable("n"))  # a status update
    assert len(caplog.messages) == 1
    assert caplog.messages[0].startswith("node n: gpushare.io/gpus is malformed")
    assert "gpushare.io/gpus is malformed" in refusal(cache, 1)


def test_a_node_relabelled_away_from_a_policy_no_longer_teaches_it():
    counting = Counting()
    cache = SchedulerCache(PolicyChoice({**POLICIES, "counting": lambda: counting}))
    cache.replace_nodes([node("n", "1x16GiB", **{"ack.node.gpu.placement": "counting"})])
    cache.replace_pods([])
    cache.apply_node(
        EventType.MODIFIED, node("n", "1x16GiB", **{"ack.node.gpu.placement": "spread"})
    )
    cache.filter(asking("p", 4), ["n"])
    assert counting.observed == []


def test_a_policy_learns_while_any_node_still_names_it():
    counting = Counting()
    cache = SchedulerCache(PolicyChoice({**POLICIES, "counting": lambda: counting}))
    label = {"ack.node.gpu.placement": "counting"}
    cache.replace_nodes([node("a", "1x16GiB", **label), node("b", "1x16GiB", **label)])
    cache.replace_pods([])
    cache.apply_node(EventType.MODIFIED, node("a", "1x16GiB"))
    cache.filter(asking("p", 4), ["a", "b"])
    assert len(counting.observed) == 1
    cache.apply_node(EventType.MODIFIED, node("b", "1x16GiB"))
    cache.filter(asking("q", 4), ["a", "b"])
    assert len(counting.observed) == 1


def test_a_listing_makes_every_nodes_view_so_the_first_request_does_not(monkeypatch):
    """At 5,000 nodes making the views takes ~80 ms: the listing pays it, not the first
    pod after a start or a relist (bench/extender_bench.py, first pod of a shape)."""
    made: list[str] = []
    make_view = NodeState._make_view
    monkeypatch.setattr(NodeState, "_make_view", lambda s: made.append(s.name) or make_view(s))
    cache = SchedulerCache(assume_ttl_s=60, clock=Clock())
    cache.replace_nodes([node("a", "1x16GiB"), node("b", "2x16GiB")])
    assert made == []  # pods not listed yet: the views would change with them
    cache.replace_pods([])
    assert sorted(made) == ["a", "b"]
    cache.answers(asking("p", 4), ["a", "b"])
    assert sorted(made) == ["a", "b"]
    assume(cache, "p", 4, node="a")
    cache.answers(asking("q", 8), ["a", "b"])
    assert sorted(made) == ["a", "a", "b"]  # a node changed since is made again, alone


def test_bind_gets_the_pod_filter_saw_until_the_watch_shows_it_bound_or_going():
    cache = started()
    filtered = asking("p", 4)
    cache.filter(filtered, ["n"])
    assert cache.filtered("default/p", "uid-p") is filtered
    assert cache.filtered("default/q", "uid-p") is None  # name and UID of different pods
    assert cache.filtered("default/p", "uid-again") is None  # never filtered with this UID

    cache.apply_pod(EventType.ADDED, pod("p", mem=4))
    assert cache.filtered("default/p", "uid-p") is filtered  # seen, still pending
    cache.apply_pod(EventType.MODIFIED, being_deleted(pod("p", mem=4)))
    assert cache.filtered("default/p", "uid-p") is None

    cache.filter(asking("q", 4), ["n"])
    bound_pod(cache, "q", 4)
    assert cache.filtered("default/q", "uid-q") is None

    cache.filter(asking("r", 4), ["n"])
    again = pod("r", mem=4)
    again = again.model_copy(update={"metadata": again.metadata.model_copy(update={"uid": "r2"})})
    cache.apply_pod(EventType.ADDED, again)
    assert cache.filtered("default/r", "uid-r") is None  # made again since


def test_the_gpu_shapes_the_webhook_asks_for_follow_every_node_change():
    cache = started()
    shapes = cache.gpu_shapes()
    assert shapes == {NodeMode.CGPU: GpuShape(16, 1)}
    assert cache.gpu_shapes() is shapes  # kept: the webhook asks for every pod
    cache.apply_node(EventType.ADDED, node("m", "2x24GiB"))
    assert cache.gpu_shapes() == {NodeMode.CGPU: GpuShape(24, 2)}
    cache.apply_node(EventType.MODIFIED, node("m", "4x8GiB"))
    assert cache.gpu_shapes() == {NodeMode.CGPU: GpuShape(16, 4)}
    cache.apply_node(EventType.MODIFIED, node("m", "4x8GiB", mode="share"))
    assert cache.gpu_shapes() == {NodeMode.CGPU: GpuShape(16, 1), NodeMode.SHARE: GpuShape(8, 4)}
    cache.apply_node(EventType.DELETED, node("m", "4x8GiB", mode="share"))
    assert cache.gpu_shapes() == {NodeMode.CGPU: GpuShape(16, 1)}
    cache.replace_nodes([node("k", "8x80GiB")])  # a listing without n
    assert cache.gpu_shapes() == {NodeMode.CGPU: GpuShape(80, 8)}
