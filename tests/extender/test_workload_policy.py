"""The fragmentation-aware policy in the extender's production path: chosen by name
(pod annotation, node label, --default-placement), it decides filter → prioritize →
bind, and it learns the workload from the pods filter sees."""

import pytest

from gpushare.placement.lookahead import LookaheadFgdPolicy
from gpushare.placement.policies import POLICIES, PolicyFactory
from gpushare.placement.workload import TaskShape, Workload
from tests.builders import node, pod
from tests.extender.harness import allocation_of

# Pods of 5 and 11 GiB, equally common, on 16 GiB GPUs. With 13 GiB free on one GPU
# and 16 on another, an 11 GiB pod is best put on the empty one: it leaves 5 GiB, just
# what the next popular pod needs, and the 13 GiB keep room for either shape. Binpack
# takes the fuller GPU and leaves 2 GiB no pod of this workload can use.
FIVES_AND_ELEVENS = Workload(((TaskShape(gpus=1, mem=5), 0.5), (TaskShape(gpus=1, mem=11), 0.5)))


def registry_with(policy: LookaheadFgdPolicy) -> dict[str, PolicyFactory]:
    """The standard registry, with our policy made as this very object (to look into)."""
    return {**POLICIES, policy.name: lambda: policy}


@pytest.fixture
def ours() -> LookaheadFgdPolicy:
    """Our policy, judging against a known workload."""
    return LookaheadFgdPolicy(FIVES_AND_ELEVENS)


def with_policy(name: str, pod_name: str, mem: int):
    return pod(pod_name, mem=mem, annotations={"gpushare.io/placement-policy": name})


# Mostly whole-GPU jobs, some 8 GiB slices: a slice that opens an empty GPU costs a
# whole GPU to the jobs that need one.
MOSTLY_WHOLE_GPUS = Workload(
    ((TaskShape(gpus=1, exclusive=True), 0.7), (TaskShape(gpus=1, mem=8), 0.3))
)


def test_the_pod_annotation_makes_ours_choose_the_node_binpack_would_not(cluster, scheduler_for):
    ours = LookaheadFgdPolicy(MOSTLY_WHOLE_GPUS)
    # Node a: GPU 0 nearly full, GPU 1 empty. Node b: 4 GiB on each GPU. Binpack puts
    # an 8 GiB slice on a (the fuller node), opening its empty GPU; ours keeps that GPU
    # whole and fills one of b's.
    cluster.add_node(node("a", "2x16GiB"))
    cluster.add_node(node("b", "2x16GiB"))
    s = scheduler_for(policies=registry_with(ours))
    for name, mem, target in (("a0", 14, "a"), ("b0", 4, "b")):
        assert s.bind(s.submit(pod(name, mem=mem)), target) == ""
    assert s.bind(s.submit(with_policy("spread", "b1", 4)), "b") == ""
    assert allocation_of(cluster, "default", "b1").gpu_indices == (1,)

    packed = s.submit(with_policy("binpack", "packed", 8))
    packed_scores = s.prioritize(packed, ["a", "b"])
    assert packed_scores["a"] > packed_scores["b"]

    p = s.submit(with_policy(ours.name, "p", 8))
    assert set(s.filter(p)["NodeNames"]) == {"a", "b"}
    scores = s.prioritize(p, ["a", "b"])
    assert scores["b"] > scores["a"]
    assert s.schedule(p) == "b"
    assert len(allocation_of(cluster, "default", "p").gpu_indices) == 1


def test_inside_a_node_ours_picks_the_gpu_that_leaves_a_useful_hole(cluster, scheduler_for, ours):
    cluster.add_node(node("n", "2x16GiB", **{"ack.node.gpu.placement": ours.name}))
    s = scheduler_for(policies=registry_with(ours))
    assert s.schedule(s.submit(pod("small", mem=3))) == "n"
    assert allocation_of(cluster, "default", "small").gpu_indices == (0,)
    assert s.schedule(s.submit(pod("big", mem=11))) == "n"
    assert allocation_of(cluster, "default", "big").gpu_indices == (1,)


def test_the_default_placement_flag_selects_ours_and_filter_teaches_it(cluster, scheduler_for):
    learning = LookaheadFgdPolicy()
    cluster.add_node(node("n", "4x16GiB"))
    s = scheduler_for(default_placement=learning.name, policies=registry_with(learning))
    epoch = learning.epoch
    for i in range(40):
        p = s.submit(pod(f"p{i}", mem=4))
        s.filter(p)
        s.filter(p)  # a retry: each pod is learned once
    assert learning.epoch > epoch
    shapes = dict(learning.workload.tasks)
    assert shapes[TaskShape(gpus=1, mem=4)] > 0.5


def test_the_default_placement_places_10_10_and_20_gib_pods_on_two_t4s_and_an_a10(
    cluster, scheduler_for
):
    # Issue 40: learning from the first pods, the look-ahead kept 14 GiB of the A10 for
    # another 10 GiB pod and the 20 GiB pod stayed Pending. Until the learned workload
    # predicts the pods, a slice takes the fullest GPU it fits on.
    cluster.add_node(node("n", "2x16GiB:T4,1x24GiB:A10"))
    s = scheduler_for(default_placement=LookaheadFgdPolicy.name)
    for name, mem, gpu in (("a", 10, 0), ("b", 10, 1), ("c", 20, 2)):
        assert s.schedule(s.submit(pod(name, mem=mem))) == "n"
        assert allocation_of(cluster, "default", name).gpu_indices == (gpu,)
