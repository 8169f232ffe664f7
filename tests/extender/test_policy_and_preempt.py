"""Which policy places a pod, and what preempt keeps."""

import pytest

from gpushare.placement.fit import Assignment, Placement, PlacementPolicy
from gpushare.placement.policies import POLICIES
from gpushare.request import PodRequest
from gpushare.state import GpuView, NodeView
from tests.builders import node, pod
from tests.extender.harness import allocation_of, pod_json

SPREAD = {"ack.node.gpu.placement": "spread"}


def with_policy(policy: str, **kwargs):
    return pod(annotations={"gpushare.io/placement-policy": policy}, **kwargs)


def test_the_node_label_chooses_the_policy_inside_the_node(cluster, scheduler_for):
    cluster.add_node(node("packed", "2x16GiB"))
    cluster.add_node(node("spread", "2x16GiB", **SPREAD))
    s = scheduler_for()
    for name in ("a", "b"):
        for target in ("packed", "spread"):
            p = s.submit(pod(f"{name}-{target}", mem=2))
            assert s.bind(p, target) == ""
    assert allocation_of(cluster, "default", "b-packed").gpu_indices == (0,)
    assert allocation_of(cluster, "default", "b-spread").gpu_indices == (1,)


def test_the_pod_annotation_wins_over_the_node_label(cluster, scheduler_for):
    cluster.add_node(node("n", "2x16GiB", **SPREAD))
    s = scheduler_for()
    assert s.schedule(s.submit(pod("first", mem=2))) == "n"
    assert s.schedule(s.submit(with_policy("binpack", name="packed", mem=2))) == "n"
    assert allocation_of(cluster, "default", "packed").gpu_indices == (0,)


def test_the_default_policy_is_a_flag(cluster, scheduler_for):
    cluster.add_node(node("a", "2x16GiB"))
    cluster.add_node(node("b", "2x16GiB"))
    s = scheduler_for(default_placement="spread")
    assert s.schedule(s.submit(pod("p1", mem=8))) == "a"
    assert s.schedule(s.submit(pod("p2", mem=8))) == "b"


def test_an_unknown_default_policy_stops_the_extender(cluster):
    from gpushare.extender.service import ExtenderConfig, ExtenderService

    with pytest.raises(ValueError, match=r"known: .*binpack"):
        ExtenderService(cluster, ExtenderConfig(default_placement="tetris"))


class HighestFirst(PlacementPolicy):
    """A policy the extender has never heard of: highest GPU index first."""

    name = "highest-first"

    def __init__(self) -> None:
        self.observed: list[PodRequest] = []

    def observe(self, request: PodRequest) -> None:
        self.observed.append(request)

    def gpu_key(self, gpu: GpuView, mem_after: int, core_after: int) -> tuple[int, ...]:
        return (-gpu.index,)

    def score(self, view: NodeView, request: PodRequest, assignment: Assignment) -> float:
        return 100.0 if view.name == "z" else 0.0


def with_highest_first(policy: HighestFirst):
    """The standard registry plus HighestFirst, made as this very object (to look into)."""
    return {**POLICIES, HighestFirst.name: lambda: policy}


def test_a_policy_added_to_the_registry_is_usable_by_name(cluster, scheduler_for):
    policy = HighestFirst()
    cluster.add_node(node("a", "4x16GiB"))
    cluster.add_node(node("z", "4x16GiB"))
    s = scheduler_for(policies=with_highest_first(policy))
    p = s.submit(with_policy("highest-first", name="p", mem=2))
    s.filter(p)
    s.filter(p)  # the scheduler retries: the policy learns of each pod once
    assert [r.total_mem for r in policy.observed] == [2]
    assert s.prioritize(p, ["a", "z"]) == {"a": 0, "z": 10}
    assert s.schedule(p) == "z"
    assert allocation_of(cluster, "default", "p").gpu_indices == (3,)


def test_a_policy_named_by_a_node_label_learns_of_pods_too(cluster, scheduler_for):
    policy = HighestFirst()
    cluster.add_node(node("a", "4x16GiB", **{"ack.node.gpu.placement": "highest-first"}))
    s = scheduler_for(policies=with_highest_first(policy))
    assert s.schedule(s.submit(pod("p", mem=2))) == "a"
    assert allocation_of(cluster, "default", "p").gpu_indices == (3,)
    assert len(policy.observed) == 1


@pytest.fixture
def crowded(cluster, scheduler_for):
    """Node n (16 GiB) holds v1 (8 GiB) and v2 (6 GiB); node m (16 GiB) holds w (12 GiB)."""
    cluster.add_node(node("n", "1x16GiB"))
    cluster.add_node(node("m", "1x16GiB"))
    s = scheduler_for()
    victims = {}
    for name, mem, target in (("v1", 8, "n"), ("v2", 6, "n"), ("w", 12, "m")):
        victims[name] = s.submit(pod(name, mem=mem))
        assert s.bind(victims[name], target) == ""
    return s, victims


def test_preempt_keeps_nodes_where_the_victims_make_room(crowded):
    s, v = crowded
    uid = {name: p.metadata.uid for name, p in v.items()}
    body = {
        "Pod": pod_json(pod("big", mem=10, priority=1)),
        "NodeNameToVictims": None,
        "NodeNameToMetaVictims": {
            "n": {"Pods": [{"UID": uid["v1"]}], "NumPDBViolations": 1},
            "m": {"Pods": [{"UID": uid["w"]}], "NumPDBViolations": 0},
            "ghost": {"Pods": [{"UID": "x"}], "NumPDBViolations": 0},
        },
    }
    answer = s.post("preempt", body).json()
    assert answer == {
        "NodeNameToMetaVictims": {
            "n": {"Pods": [{"UID": uid["v1"]}], "NumPDBViolations": 1},
            "m": {"Pods": [{"UID": uid["w"]}], "NumPDBViolations": 0},
        }
    }


def test_preempt_drops_nodes_where_no_lower_priority_pod_makes_room(crowded):
    s, v = crowded
    body = {
        "Pod": pod_json(pod("big", mem=10)),  # priority 0, as every pod there
        "NodeNameToMetaVictims": {
            "n": {"Pods": [{"UID": v["v2"].metadata.uid}], "NumPDBViolations": 0},
            "m": {"Pods": [], "NumPDBViolations": 0},
        },
    }
    assert s.post("preempt", body).json() == {"NodeNameToMetaVictims": {}}


def test_preempt_reads_full_victim_pods_when_not_node_cache_capable(crowded):
    s, v = crowded
    body = {
        "Pod": pod_json(pod("big", mem=10, priority=1)),
        "NodeNameToVictims": {"n": {"Pods": [pod_json(v["v1"])], "NumPDBViolations": 0}},
        "NodeNameToMetaVictims": None,
    }
    answer = s.post("preempt", body).json()
    assert answer["NodeNameToMetaVictims"]["n"]["Pods"] == [{"UID": v["v1"].metadata.uid}]


def test_preempt_keeps_nothing_for_a_pod_that_breaks_a_rule(crowded):
    s, v = crowded
    body = {
        "Pod": pod_json(pod("bad", mem=2, core=33)),
        "NodeNameToMetaVictims": {"n": {"Pods": [{"UID": v["v1"].metadata.uid}]}},
    }
    assert s.post("preempt", body).json() == {"NodeNameToMetaVictims": {}}


def test_preempt_leaves_pods_without_our_resources_to_the_scheduler(crowded):
    s, v = crowded
    plain = pod("web", containers=[{"name": "c", "resources": {"limits": {"cpu": "1"}}}])
    victims = {"n": {"Pods": [{"UID": v["v1"].metadata.uid}], "NumPDBViolations": 2}}
    body = {"Pod": pod_json(plain), "NodeNameToMetaVictims": victims}
    assert s.post("preempt", body).json() == {"NodeNameToMetaVictims": victims}


class LastGpuOnly(HighestFirst):
    """A policy that places pods on the node's last GPU only, keeping the others free."""

    name = "last-gpu-only"

    def place(self, view: NodeView, request: PodRequest) -> Placement | None:
        placement = super().place(view, request)
        last = (view.gpus[-1].index,)
        if placement is None or any(gpus != last for gpus in placement.assignment.gpus):
            return None
        return placement


LAST_GPU_ONLY = {**POLICIES, LastGpuOnly.name: LastGpuOnly}


@pytest.mark.parametrize(
    ("node_labels", "preemptor"),
    [
        ({}, with_policy("last-gpu-only", name="big", mem=10, priority=1)),
        ({"ack.node.gpu.placement": "last-gpu-only"}, pod("big", mem=10, priority=1)),
    ],
    ids=["named-by-the-pod", "named-by-the-node"],
)
def test_preempt_frees_room_where_the_pods_policy_would_place_it(
    cluster, scheduler_for, node_labels, preemptor
):
    cluster.add_node(node("n", "2x16GiB", **node_labels))
    s = scheduler_for(policies=LAST_GPU_ONLY)
    for name, mem in (("a", 8), ("b", 10)):  # binpack: a on GPU 0, b (no room there) on 1
        assert s.bind(s.submit(with_policy("binpack", name=name, mem=mem)), "n") == ""
    assert allocation_of(cluster, "default", "b").gpu_indices == (1,)
    offered = {"n": {"Pods": [{"UID": "uid-a"}], "NumPDBViolations": 0}}
    body = {"Pod": pod_json(preemptor), "NodeNameToMetaVictims": offered}
    answer = s.post("preempt", body).json()
    # Evicting a frees GPU 0, where this policy never places the pod: b must go.
    assert answer == {
        "NodeNameToMetaVictims": {"n": {"Pods": [{"UID": "uid-b"}], "NumPDBViolations": 0}}
    }
