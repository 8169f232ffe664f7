"""Nodes in the same state share one evaluation: their answers are what each node
evaluated on its own would get, a node that changes is answered from its new state,
and a learned workload that moves is answered as if every node were evaluated
afresh under it."""

import json
import random

from gpushare.allocation import PodAllocation
from gpushare.extender.answertable import AnswerTable
from gpushare.extender.cache import SchedulerCache
from gpushare.extender.pendingpod import PendingPod
from gpushare.extender.policychoice import PolicyChoice
from gpushare.placement.fit import Assignment, Placement, PlacementPolicy, relative_score
from gpushare.placement.lookahead import LookaheadFgdPolicy
from gpushare.placement.policies import POLICIES, PolicyFactory
from gpushare.request import PodRequest
from gpushare.state import GpuView, NodeView
from tests.builders import T0, node, request

SHAPES = [
    {"mem": 2},
    {"mem": 5},
    {"count": 2},
    {"mem": 3, "core": 30},
    {"count": 1},
    {"mem": 15},
]
LAYOUTS = [("4x16GiB", "cgpu"), ("8x24GiB", "cgpu"), ("2x16GiB", "core_mem")]


class NodeByNode(PlacementPolicy):
    """The policy, evaluated for each node alone (it does not say it is nameless)."""

    name = LookaheadFgdPolicy.name

    def __init__(self, policy: PlacementPolicy) -> None:
        self.policy = policy

    @property  # type: ignore[override]
    def epoch(self) -> int:
        return self.policy.epoch

    def place(self, view: NodeView, request: PodRequest) -> Placement | None:
        return self.policy.place(view, request)

    def gpu_key(self, gpu: GpuView, mem_after: int, core_after: int) -> tuple[int, ...]:
        raise AssertionError("place() is the policy's")

    def score(self, view: NodeView, request: PodRequest, assignment: Assignment) -> float:
        raise AssertionError("place() is the policy's")


def registry_with(policy: PlacementPolicy) -> dict[str, PolicyFactory]:
    return {**POLICIES, policy.name: lambda: policy}


def pending(name: str, shape: dict, uid: str | None = None) -> PendingPod:
    return PendingPod(f"default/{name}", uid or f"uid-{name}", request(**shape), None, 0)


def cache_of(nodes: list[tuple[str, str, str]], policy: PlacementPolicy) -> SchedulerCache:
    cache = SchedulerCache(PolicyChoice(registry_with(policy), "fgd-lookahead"))
    cache.replace_nodes([node(name, layout, mode=mode) for name, layout, mode in nodes])
    cache.replace_pods([])
    return cache


def said(cache: SchedulerCache, shape: dict, names: list[str]) -> dict[str, object]:
    """Everything filter and prioritize send about these nodes, decoded."""
    answers = cache.answers(pending("asked", shape), names)
    return {
        "passed": json.loads(answers.passed_json()),
        "failed": json.loads(answers.failed_json()),
        "unresolvable": json.loads(answers.unresolvable_json()),
        "priorities": json.loads(answers.priorities_json()),
        "rules": answers.rules(),
    }


class Cluster:
    """Many nodes in a few layouts with pods placed on some, and beside the shared
    cache one cache per node: that node alone, evaluated node by node (the fresh
    evaluation the shared one must agree with)."""

    def __init__(self, policy: LookaheadFgdPolicy, size: int = 36, seed: int = 5) -> None:
        rng = random.Random(seed)
        self.nodes = [(f"n{i:02d}", *LAYOUTS[i % len(LAYOUTS)]) for i in range(size)]
        self.names = [name for name, _, _ in self.nodes]
        self.shared = cache_of(self.nodes, policy)
        self.alone = {n[0]: cache_of([n], NodeByNode(policy)) for n in self.nodes}
        # Few distinct pods, so that many nodes end up in the same state.
        for i in range(size):
            name = self.names[rng.randrange(size) % 12]
            self.place(name, f"q{i}", SHAPES[rng.randrange(2)])

    def place(self, name: str, pod_name: str, shape: dict) -> bool:
        """Whether the pod fits on the node (then it is placed there in both)."""
        pod = pending(pod_name, shape)
        shared = self.shared.reserve(pod, name, T0)
        alone = self.alone[name].reserve(pod, name, T0)
        assert shared == alone  # the same GPUs, or the same refusal
        return isinstance(shared, PodAllocation)

    def fresh(self, shape: dict, names: list[str] | None = None) -> dict[str, object]:
        """What filter and prioritize send about these nodes (every node unless told),
        each evaluated alone; the priorities against the best score among them."""
        parts: dict[str, dict] = {"failed": {}, "unresolvable": {}}
        passed: list[str] = []
        scores: dict[str, float | None] = {}
        rules: dict[str, int] = {}
        for name in self.names if names is None else names:
            one = said(self.alone[name], shape, [name])
            passed += one["passed"]  # type: ignore[operator]
            scores[name] = self.alone[name].answers(pending("asked", shape), [name]).best()
            parts["failed"].update(one["failed"])  # type: ignore[arg-type]
            parts["unresolvable"].update(one["unresolvable"])  # type: ignore[arg-type]
            for rule, count in one["rules"].items():  # type: ignore[attr-defined]
                rules[rule] = rules.get(rule, 0) + count
        best = max((score for score in scores.values() if score is not None), default=0.0)
        priorities = [
            {"Host": name, "Score": 0 if score is None else relative_score(best, score)}
            for name, score in scores.items()
        ]
        return {"passed": passed, **parts, "priorities": priorities, "rules": rules}

    def fresh_priorities(self, shape: dict, names: list[str]) -> list[dict]:
        """What prioritize sends for these nodes, each evaluated alone."""
        return self.fresh(shape, names)["priorities"]  # type: ignore[return-value]


def test_nodes_in_one_state_are_answered_as_each_alone_would_be():
    cluster = Cluster(LookaheadFgdPolicy())
    for shape in SHAPES:
        assert said(cluster.shared, shape, cluster.names) == cluster.fresh(shape), shape


def test_each_refused_node_is_named_in_its_own_reason():
    cluster = Cluster(LookaheadFgdPolicy())
    answer = said(cluster.shared, {"mem": 3, "core": 30}, cluster.names)
    refused = {**answer["failed"], **answer["unresolvable"]}  # type: ignore[dict-item]
    assert len(refused) > 2  # the cgpu nodes: several in one state
    for name, reason in refused.items():
        assert f"node {name} " in reason and "\\x00" not in reason and "\x00" not in reason


def test_a_node_that_changes_is_answered_from_its_new_state():
    cluster = Cluster(LookaheadFgdPolicy())
    shape = {"mem": 15}
    before = said(cluster.shared, shape, cluster.names)
    # Fill n00 up with 14 GiB slices: 2 GiB or less left on each GPU.
    placed = 0
    while cluster.place("n00", f"big{placed}", {"mem": 14}):
        placed += 1
    assert placed
    after = said(cluster.shared, shape, cluster.names)
    assert "n00" in before["passed"] and "n00" not in after["passed"]  # type: ignore[operator]
    assert "node n00 " in after["failed"]["n00"]  # type: ignore[index]
    assert after == cluster.fresh(shape)


def test_a_moved_workload_answers_as_a_fresh_evaluation_would():
    policy = LookaheadFgdPolicy()  # learning, from its prior
    cluster = Cluster(policy)
    asked = [said(cluster.shared, shape, cluster.names) for shape in SHAPES]
    epoch = policy.epoch
    seen: PodRequest = request(mem=11)
    for _ in range(64):  # a workload of 11 GiB slices only
        policy.observe(seen)
    assert policy.epoch > epoch
    moved = [said(cluster.shared, shape, cluster.names) for shape in SHAPES]
    assert moved != asked  # some node's answer did change
    for shape, answer in zip(SHAPES, moved, strict=True):
        assert answer == cluster.fresh(shape), shape


def test_entries_renewed_by_a_move_serve_other_lists_and_follow_later_changes():
    """A move renews the entries of the nodes whose state's answer changed in place:
    a candidate list not asked before reads them, and a node that leaves such a state
    and comes back is answered from the renewed answer."""
    policy = LookaheadFgdPolicy()
    cluster = Cluster(policy)
    for shape in SHAPES:
        said(cluster.shared, shape, cluster.names)
    for _ in range(64):  # a workload of 11 GiB slices only
        policy.observe(request(mem=11))
    every_other = cluster.names[::2]
    for shape in SHAPES:
        expected = cluster.fresh_priorities(shape, every_other)
        assert said(cluster.shared, shape, every_other)["priorities"] == expected, shape
    # Each of these nodes leaves its state for a moment and comes back to it: it is
    # answered from the state's answer under the moved workload, not the one before.
    for name in cluster.names[:6]:
        assert cluster.place(name, f"brief-{name}", {"mem": 2})
        for shape in SHAPES:
            said(cluster.shared, shape, cluster.names)
        for cache in (cluster.shared, cluster.alone[name]):
            cache.forget(f"default/brief-{name}", f"uid-brief-{name}")
        for shape in SHAPES:
            assert said(cluster.shared, shape, cluster.names) == cluster.fresh(shape), shape


class Counted(LookaheadFgdPolicy):
    """fgd-lookahead, counting the nodes it is asked to place a pod on."""

    def __init__(self) -> None:
        super().__init__()
        self.placed = 0

    def place(self, view: NodeView, request: PodRequest) -> Placement | None:
        self.placed += 1
        return super().place(view, request)


def test_nodes_in_one_state_are_evaluated_once_per_shape():
    """What makes the first pod of a shape cheap at 5,000 nodes: a few states, not
    every node, are evaluated; afterwards only a node that changed is."""
    policy = Counted()
    nodes = [(f"a{i:02d}", "4x16GiB", "cgpu") for i in range(20)]
    nodes += [(f"b{i:02d}", "2x16GiB", "core_mem") for i in range(20)]
    cache = cache_of(nodes, policy)
    names = [name for name, _, _ in nodes]
    policy.placed = 0
    said(cache, {"mem": 2}, names)
    assert policy.placed == 2  # one evaluation per state

    assert isinstance(cache.reserve(pending("p", {"mem": 2}), "a00", T0), PodAllocation)
    policy.placed = 0
    answer = said(cache, {"mem": 2}, names)
    assert policy.placed == 1  # a00 alone is in a new state
    assert len(answer["passed"]) == 40  # type: ignore[arg-type]


def test_prioritize_of_the_nodes_filter_passed_is_their_fresh_priority_list():
    """prioritize brings filter's own list of passed nodes: its answer is made from
    filter's kept answer, and stays right when nodes change between the two."""
    cluster = Cluster(LookaheadFgdPolicy())
    shape = {"mem": 15}
    asked = pending("asked", shape)

    filled = 0
    while cluster.place("n01", f"first-{filled}", {"mem": 14}):
        filled += 1
    passed = cluster.shared.filter(asked, cluster.names).passed_names()
    assert 2 < len(passed) < len(cluster.names) and "n01" not in passed
    answer = json.loads(cluster.shared.priorities_json(asked, passed))
    assert answer == cluster.fresh_priorities(shape, passed)
    # A pod lands on a node that passed and changes its score there; the list stays.
    for target in passed:
        assert cluster.place(target, f"between-{target}", {"mem": 9})
        if cluster.fresh_priorities(shape, passed) != answer:
            break
    else:
        raise AssertionError("no 9 GiB pod changed a node's score")
    answer = json.loads(cluster.shared.priorities_json(asked, passed))
    assert answer == cluster.fresh_priorities(shape, passed)
    # Filter again: the node filled up and no longer passes, so the list is new.
    filled = 0
    while cluster.place(target, f"fill-{filled}", {"mem": 14}):
        filled += 1
    again = cluster.shared.filter(asked, cluster.names).passed_names()
    assert target not in again and again is not passed
    assert json.loads(cluster.shared.priorities_json(asked, again)) == cluster.fresh_priorities(
        shape, again
    )
    # The old list, brought by a late prioritize, is still answered for its own nodes.
    assert json.loads(cluster.shared.priorities_json(asked, passed)) == cluster.fresh_priorities(
        shape, passed
    )


def test_prioritize_of_the_nodes_filter_passed_looks_up_no_node(monkeypatch):
    cluster = Cluster(LookaheadFgdPolicy())
    asked = pending("asked", {"mem": 15})
    passed = cluster.shared.filter(asked, cluster.names).passed_names()
    assert cluster.place(passed[1], "between", {"mem": 2})  # one node changed since
    expected = cluster.shared.answers(asked, list(passed)).priorities_json()

    def no_look_up(*args: object) -> None:
        raise AssertionError("looked the nodes up one by one")

    monkeypatch.setattr(AnswerTable, "answers", no_look_up)
    assert cluster.shared.priorities_json(asked, passed) == expected


def test_prioritize_after_a_node_stopped_passing_answers_for_the_list_it_brings():
    """Between filter and prioritize a node of filter's list stops fitting, or the
    workload moves, or many nodes change at once: prioritize still answers every node
    it brings, as a fresh evaluation would (0 where the pod no longer fits)."""
    policy = LookaheadFgdPolicy()
    cluster = Cluster(policy)
    shape = {"mem": 15}
    asked = pending("asked", shape)

    def fill(name: str) -> None:
        filled = 0
        while cluster.place(name, f"fill-{name}-{filled}", {"mem": 14}):
            filled += 1

    passed = cluster.shared.filter(asked, cluster.names).passed_names()
    fill(passed[0])
    answer = json.loads(cluster.shared.priorities_json(asked, passed))
    assert answer == cluster.fresh_priorities(shape, passed) and answer[0]["Score"] == 0

    passed = cluster.shared.filter(asked, cluster.names).passed_names()
    for _ in range(64):  # the learned workload moves: 11 GiB slices only
        policy.observe(request(mem=11))
    assert json.loads(cluster.shared.priorities_json(asked, passed)) == cluster.fresh_priorities(
        shape, passed
    )

    passed = cluster.shared.filter(asked, cluster.names).passed_names()
    for name in passed[:6]:  # more than 1 node in 8 of the list: answered anew, not patched
        fill(name)
    assert json.loads(cluster.shared.priorities_json(asked, passed)) == cluster.fresh_priorities(
        shape, passed
    )


def test_a_policy_asked_node_by_node_answers_a_moved_workload_afresh():
    """Nodes a policy is asked about one by one (it does not say it judges a node by
    its state alone) are evaluated again after its workload moves."""
    policy = LookaheadFgdPolicy()
    nodes = [(f"n{i:02d}", *LAYOUTS[i % len(LAYOUTS)]) for i in range(12)]
    names = [name for name, _, _ in nodes]

    def with_pods() -> SchedulerCache:
        cache = cache_of(nodes, NodeByNode(policy))
        for i, name in enumerate(names[:8]):
            cache.reserve(pending(f"q{i}", SHAPES[i % 2]), name, T0)
        return cache

    by_node = with_pods()
    asked = [said(by_node, shape, names) for shape in SHAPES]
    for _ in range(64):
        policy.observe(request(mem=11))
    moved = [said(by_node, shape, names) for shape in SHAPES]
    assert moved != asked
    fresh = with_pods()  # evaluates every node under the moved workload
    assert moved == [said(fresh, shape, names) for shape in SHAPES]


def test_a_refused_node_named_with_a_percent_sign_is_named_as_the_scheduler_prints_it():
    """kube-scheduler prints reasons as format strings: a '%' in a node's name is
    written "percent" in its reason, also when its state's answer serves other nodes."""
    cache = cache_of([("a%1", "1x8GiB", "cgpu"), ("b1", "1x8GiB", "cgpu")], LookaheadFgdPolicy())
    answer = said(cache, {"mem": 12}, ["a%1", "b1"])
    refused = {**answer["failed"], **answer["unresolvable"]}  # type: ignore[dict-item]
    assert "node a percent1 " in refused["a%1"] and "%" not in refused["a%1"]
    assert "node b1 " in refused["b1"]
