"""The scheduler cache's rooms on their own: what the mirror tells its listener as
the watch changes it, what the answer engine reads of it, and the book of pods
filter saw. (tests/extender/test_cache.py holds them together through the cache.)"""

from collections.abc import Iterable

from gpushare import annotation
from gpushare.allocation import PodAllocation
from gpushare.cluster import EventType
from gpushare.extender.cache import SchedulerCache
from gpushare.extender.engine import AnswerEngine
from gpushare.extender.inspect import cluster_report
from gpushare.extender.mirror import ClusterMirror
from gpushare.extender.pendingpod import PendingPod
from gpushare.extender.policychoice import PolicyChoice
from gpushare.extender.waiting import FilteredPods
from gpushare.labels import LABEL_PLACEMENT
from gpushare.placement.fit import Assignment, to_allocation
from tests.builders import T0, node, pod, request

DAMAGED = {"gpushare.io/allocation": "{"}


class Told:
    """A listener that writes down what the mirror tells it."""

    def __init__(self) -> None:
        self.said: list[tuple] = []

    def node_changed(self, name: str) -> None:
        self.said.append(("changed", name))

    def rebuilt(self) -> None:
        self.said.append(("rebuilt",))

    def room_appeared(self, names: Iterable[str]) -> None:
        self.said.append(("room", tuple(sorted(names))))

    def record_damaged(self, key: str, uid: str, problem: str) -> None:
        self.said.append(("damaged", key, uid))

    def record_gone(self, key: str) -> None:
        self.said.append(("gone", key))

    def take(self) -> list[tuple]:
        said, self.said = self.said, []
        return said


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def mirror(told: Told, clock: Clock | None = None) -> ClusterMirror:
    made = ClusterMirror(PolicyChoice(), 4, 60.0, told, clock or Clock())
    made.replace_nodes([node("a", "1x16GiB"), node("b", "1x16GiB")])
    made.replace_pods([])
    told.take()
    return made


def allocation(m: ClusterMirror, name: str, mem: int, on: str = "a") -> PodAllocation:
    """The pod placed on GPU 0 of the node, as bind would record it."""
    placed = Assignment(gpus=((0,),), added=((0, mem, 0),))
    return to_allocation(request(mem=mem), placed, m.state.nodes[on].inventory, T0)


def test_a_listing_rebuilds_and_offers_room_on_every_node():
    told = Told()
    m = ClusterMirror(PolicyChoice(), 4, 60.0, told)
    m.replace_nodes([node("a", "1x16GiB"), node("b", "1x16GiB")])
    assert told.take() == [("rebuilt",), ("room", ("a", "b"))]
    assert not m.synced  # pods not listed yet
    m.replace_pods([])
    assert m.synced and told.take() == [("rebuilt",), ("room", ("a", "b"))]


def test_a_node_update_that_changes_nothing_placement_reads_tells_nothing():
    told = Told()
    m = mirror(told)
    m.apply_node(EventType.MODIFIED, node("a", "1x16GiB"))
    assert told.take() == []
    m.apply_node(EventType.MODIFIED, node("a", "1x16GiB", **{LABEL_PLACEMENT: "spread"}))
    assert told.take() == [("changed", "a")]
    assert m.node_policy("a") == "spread" and set(m.policies_in_use()) == {
        "spread",
        PolicyChoice().default,
    }


def test_a_bigger_gpu_is_room_and_a_deleted_node_is_a_change():
    told = Told()
    m = mirror(told)
    m.apply_node(EventType.MODIFIED, node("a", "1x24GiB"))
    assert told.take() == [("room", ("a",)), ("changed", "a")]
    m.apply_node(EventType.DELETED, node("a", "1x24GiB"))
    assert told.take() == [("changed", "a")]
    assert "a" not in m.state.nodes and m.node_count == 1


def test_a_pod_leaving_its_gpu_makes_room_there():
    told = Told()
    m = mirror(told)
    bound = pod("p", mem=4, node="a", annotations=_encoded(m, "p", 4))
    m.apply_pod(EventType.ADDED, bound)
    assert ("changed", "a") in told.take()
    assert m.apply_pod(EventType.DELETED, bound) is None
    assert told.take() == [("gone", "default/p"), ("room", ("a",)), ("changed", "a")]


def test_a_damaged_record_is_told_once_per_problem_and_gone_when_repaired():
    told = Told()
    m = mirror(told)
    m.apply_pod(EventType.ADDED, pod("p", mem=1, annotations=DAMAGED))
    m.apply_pod(EventType.MODIFIED, pod("p", mem=1, annotations=DAMAGED))
    assert [said for said in told.take() if said[0] == "damaged"] == [
        ("damaged", "default/p", "uid-p")
    ]
    assert list(m.pod_problems) == ["default/p"]
    m.apply_pod(EventType.MODIFIED, pod("p", mem=1))
    assert ("gone", "default/p") in told.take() and not m.pod_problems


def test_an_assumed_bind_is_kept_until_the_watch_shows_it_or_it_expires():
    told, clock = Told(), Clock()
    m = mirror(told, clock)
    m.assume("default/p", "uid-p", allocation(m, "p", 4))
    assert m.assumed == ("default/p",) and m.pod_uid("default/p") == "uid-p"
    m.apply_pod(EventType.ADDED, pod("p", mem=4))  # from before the bind
    assert m.assumed == ("default/p",)
    clock.now = 61.0
    assert m.expire() == ["default/p"] and m.assumed == ()
    assert ("room", ("a",)) in told.take()


def test_forget_undoes_only_the_reservation_of_that_uid():
    told = Told()
    m = mirror(told)
    m.assume("default/p", "uid-p", allocation(m, "p", 4))
    m.forget("default/p", "uid-other")
    assert m.assumed == ("default/p",)
    m.forget("default/p", "uid-p")
    assert m.assumed == () and m.state.allocation("default/p") is None


def test_moved_on_means_bound_deleting_or_made_again():
    m = mirror(Told())
    m.apply_pod(EventType.ADDED, pod("p", mem=4))
    assert not m.moved_on("default/p", "uid-p")
    assert m.moved_on("default/p", "uid-older")
    m.apply_pod(EventType.MODIFIED, pod("p", mem=4, node="b"))
    assert m.moved_on("default/p", "uid-p")
    assert not m.moved_on("default/never-seen", "uid")


def test_the_engine_places_by_the_pods_policy_before_the_nodes():
    told = Told()
    m = mirror(told)
    m.apply_node(EventType.MODIFIED, node("a", "1x16GiB", **{LABEL_PLACEMENT: "spread"}))
    engine = AnswerEngine(PolicyChoice(), m)
    assert engine.policy_on("a", None).name == "spread"
    assert engine.policy_on("a", "binpack").name == "binpack"
    assert engine.policy_on("b", None).name == PolicyChoice().default


def test_the_engine_says_why_a_node_it_cannot_read_refuses():
    m = mirror(Told())
    engine = AnswerEngine(PolicyChoice(), m)
    fit = engine.evaluate("nowhere", request(mem=1), None)
    assert fit.placement is None and fit.refusal is not None
    assert "not known to the gpushare extender" in fit.refusal.message


def test_the_engine_reads_each_policys_epoch_by_name():
    m = mirror(Told())
    choice = PolicyChoice()
    engine = AnswerEngine(choice, m)
    before = engine.epochs()
    assert len(before) == len(choice.names)
    engine.observe("uid-1", request(mem=3), None)  # the default learns of the pod
    engine.observe("uid-1", request(mem=3), None)  # once per pod
    after = engine.epochs()
    default_at = sorted(choice.names).index(choice.default)
    assert after[default_at] >= before[default_at]
    assert [a for i, a in enumerate(after) if i != default_at] == [
        b for i, b in enumerate(before) if i != default_at
    ]


def test_filter_remembers_each_pod_by_uid_for_bind():
    book = FilteredPods()
    seen = PendingPod("default/p", "uid-p", request(mem=1), None, 0)
    book.saw(seen)
    book.saw(PendingPod("default/q", "", request(mem=1), None, 0))  # no UID: never looked up
    assert len(book) == 1
    assert book.get("default/p", "uid-p") is seen
    assert book.get("default/other", "uid-p") is None  # the UID of another pod's name
    assert book.get("default/p", "uid-q") is None


def test_inspect_lists_the_pods_waiting_for_room():
    cache = SchedulerCache()
    cache.replace_nodes([node("n", "1x16GiB")])
    cache.replace_pods([])
    huge = PendingPod("default/huge", "uid-huge", request(mem=20), None, 0)
    cache.filter(huge, ["n"])
    assert cluster_report(cache)["waitingPods"] == ["default/huge"]
    cache.filter(PendingPod("default/huge", "uid-huge", request(mem=2), None, 0), ["n"])
    assert cluster_report(cache)["waitingPods"] == []


def _encoded(m: ClusterMirror, name: str, mem: int) -> dict[str, str]:
    return annotation.encode(allocation(m, name, mem))


def test_a_damaged_record_wakes_its_worker_once_with_what_is_wrong():
    cache = SchedulerCache()
    woken: list[int] = []
    cache.on_damaged = lambda: woken.append(1)
    cache.replace_nodes([node("n", "1x16GiB")])
    cache.replace_pods([])
    cache.apply_pod(EventType.ADDED, pod("p", mem=1, annotations=DAMAGED))
    cache.apply_pod(EventType.MODIFIED, pod("p", mem=1, annotations=DAMAGED))
    [(key, uid, problem)] = cache.take_damaged()
    assert (key, uid, woken) == ("default/p", "uid-p", [1])
    assert "not a JSON object" in problem
    cache.apply_pod(EventType.MODIFIED, pod("p", mem=1))  # repaired
    cache.apply_pod(EventType.MODIFIED, pod("p", mem=1, annotations=DAMAGED))
    assert [k for k, _, _ in cache.take_damaged()] == ["default/p"] and woken == [1, 1]


def test_a_refused_pod_the_api_says_is_gone_waits_no_more():
    cache = SchedulerCache()
    cache.replace_nodes([node("n", "1x16GiB")])
    cache.replace_pods([])
    cache.filter(PendingPod("default/huge", "uid-huge", request(mem=20), None, 0), ["n"])
    cache.forget_refused("default/huge", "uid-other")  # another pod of that name
    assert cache.details().waiting == ("default/huge",)
    cache.forget_refused("default/huge", "uid-huge")
    assert cache.details().waiting == ()


def test_node_details_are_those_of_a_known_node_or_none():
    cache = SchedulerCache()
    cache.replace_nodes([node("n", "2x16GiB"), node("broken", "2x16GiB")])
    cache.replace_pods([])
    broken = node("broken", "2x16GiB")
    broken.metadata.annotations["gpushare.io/gpus"] = "{"
    cache.apply_node(EventType.MODIFIED, broken)
    details = cache.node_details("n")
    assert details is not None and details.name == "n" and len(details.gpus) == 2
    unreadable = cache.node_details("broken")
    assert unreadable is not None and unreadable.problem and not unreadable.gpus
    assert cache.node_details("nowhere") is None
