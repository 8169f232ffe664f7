"""What the cluster's nodes can hold, and how a learned workload weighs rare multi-GPU
shapes by it (placement/supply.py, workload.RARE_DISCOUNT)."""

from dataclasses import replace

import pytest

import gpushare.placement.supply as supply_module
from gpushare.inventory import NodeGpus
from gpushare.placement.fgd import FgdPolicy
from gpushare.placement.lookahead import LookaheadFgdPolicy
from gpushare.placement.supply import NodeSupply, Supply
from gpushare.placement.workload import RARE_FLOOR, LearnedWorkload, TaskShape, Workload
from tests.core.test_host_resources import milli_node, whole

SMALL = TaskShape.of(whole(1, cpu=8_000))
BIG = TaskShape.of(whole(8, cpu=120_000))
"""8 GPUs and 120 cores: only 128-core nodes take it."""


def view(name: str, gpus: int = 8, cpu: int = 96_000, model: str = "V100") -> NodeGpus:
    """A node as the simulator builds it (CPU tracked), named."""
    return replace(milli_node(gpus=gpus, cpu=cpu, model=model).inventory, node=name)


def supply_of(*views: NodeGpus) -> Supply:
    supply = Supply()
    for v in views:
        supply.seen(v)
    return supply


def test_the_share_counts_the_nodes_with_gpus_enough_that_could_take_the_shape():
    supply = supply_of(
        *(view(f"small-cpu-{i}") for i in range(6)),
        view("big-cpu-0", cpu=128_000),
        view("big-cpu-1", cpu=128_000),
        *(view(f"t4-{i}", gpus=2, cpu=128_000, model="T4") for i in range(4)),
    )
    assert len(supply) == 12
    assert supply.share(BIG) == pytest.approx(2 / 8)  # the 2-GPU nodes are not its size
    assert supply.share(TaskShape.of(whole(8, cpu=64_000))) == 1.0
    # Two GPUs and 120 cores: the two big-CPU 8-GPU nodes and the four T4 nodes of 12.
    assert supply.share(TaskShape.of(whole(2, cpu=120_000))) == pytest.approx(6 / 12)
    pinned = TaskShape(gpus=2, exclusive=True, gpu_spec=frozenset({"T4"}))
    assert supply.share(pinned) == pytest.approx(4 / 12)
    # No node that big, or none known at all: nothing says the shape is scarce.
    assert supply.share(TaskShape(gpus=16, exclusive=True)) == 1.0
    assert Supply().share(BIG) == 1.0


def test_a_node_of_mixed_models_takes_a_pinned_shape_only_on_gpus_of_its_models():
    mixed = NodeSupply(models=("A10", "A10", "T4", "T4", "T4", "T4"), cpu_total=None)
    assert mixed.takes(TaskShape(gpus=4, exclusive=True, gpu_spec=frozenset({"T4"})))
    assert not mixed.takes(TaskShape(gpus=4, exclusive=True, gpu_spec=frozenset({"A10"})))
    assert mixed.takes(TaskShape(gpus=6, exclusive=True, gpu_spec=frozenset({"A10", "T4"})))
    assert mixed.takes(TaskShape(gpus=6, exclusive=True))
    assert not mixed.takes(TaskShape(gpus=7, exclusive=True))


def test_where_cpu_is_not_tracked_a_shape_is_not_held_back_by_its_cpu():
    kubernetes = NodeSupply(models=("T4",) * 8, cpu_total=None)
    assert kubernetes.takes(BIG)
    assert NodeSupply(models=("T4",) * 8, cpu_total=120_000).takes(BIG)  # exactly enough
    assert not NodeSupply(models=("T4",) * 8, cpu_total=119_999).takes(BIG)
    assert NodeSupply.of(view("n", cpu=128_000)) == NodeSupply(("V100",) * 8, 128_000)


def test_a_node_that_changes_or_leaves_changes_the_share():
    supply = supply_of(view("a"), view("b", cpu=128_000))
    assert supply.share(BIG) == pytest.approx(1 / 2)
    supply.seen(view("a", cpu=128_000))  # resized: both take it now
    assert supply.share(BIG) == 1.0 and len(supply) == 2
    supply.seen(view("c"))
    assert supply.share(BIG) == pytest.approx(2 / 3)
    supply.gone("c")
    assert len(supply) == 2 and supply.share(BIG) == 1.0
    supply.gone("a")
    supply.gone("never-seen")
    assert len(supply) == 1 and supply.share(BIG) == 1.0


def test_a_share_is_worked_out_once_until_the_nodes_change(monkeypatch):
    # The learned workload asks for every multi-GPU shape at each derivation; the
    # extender tells of a node at every change of what runs on it.
    asked: list[TaskShape] = []
    takes = NodeSupply.takes
    monkeypatch.setattr(NodeSupply, "takes", lambda n, s: asked.append(s) or takes(n, s))
    supply = supply_of(view("a"), view("b", cpu=128_000))
    assert supply.share(BIG) == supply.share(BIG) == pytest.approx(1 / 2)
    assert len(asked) == 2  # once per node, for the first call only
    supply.seen(view("a"))  # told again, unchanged
    supply.share(BIG)
    assert len(asked) == 2
    supply.seen(view("a", cpu=128_000))
    assert supply.share(BIG) == 1.0 and len(asked) == 4
    assert supply.share(TaskShape(gpus=2, exclusive=True)) == 1.0 and len(asked) == 6


def learned(share: float | None, prior: Workload) -> LearnedWorkload:
    """No decay to speak of, a derivation after every pod."""
    return LearnedWorkload(
        prior,
        prior_weight=10,
        half_life=1e12,
        check_every=1,
        tolerance=0,
        share=None if share is None else (lambda shape: share),
    )


@pytest.mark.parametrize(
    ("share", "weight"),
    [
        (None, 3.0),  # no supply known: the raw count
        (1.0, 1.0),  # a shape every node of its size takes: 2 pods off
        (0.05, 2.9),  # one only a few take keeps nearly all
        (0.0, 3.0),
    ],
)
def test_a_multi_gpu_shape_is_discounted_by_the_share_of_nodes_that_take_it(share, weight):
    workload = learned(share, Workload(((SMALL, 1.0),)))
    for _ in range(97):
        workload.observe(SMALL)
    for _ in range(3):
        workload.observe(BIG)
    shares = dict(workload.current.tasks)
    # 10 pods of prior and 97 seen of the small shape, untouched.
    assert shares[BIG] == pytest.approx(weight / (107 + weight))
    assert shares[SMALL] == pytest.approx(107 / (107 + weight))


def test_a_discounted_shape_keeps_a_fifth_of_a_pod_and_never_gains():
    two = TaskShape(gpus=2, exclusive=True)
    # One sighting of each: discounted by 2 pods, down to the floor.
    workload = learned(1.0, Workload(((SMALL, 1.0),)))
    workload.observe(BIG)
    workload.observe(two)
    shares = dict(workload.current.tasks)
    assert shares[BIG] == shares[two] == pytest.approx(RARE_FLOOR / (10 + 2 * RARE_FLOOR))
    # A shape weighing less than the floor (here the prior's tenth of a pod) stays as it is.
    faint = learned(1.0, Workload(((SMALL, 0.99), (BIG, 0.01))))
    faint.observe(SMALL)
    assert dict(faint.current.tasks)[BIG] == pytest.approx(0.1 / 11)


def steered(cpus: list[int], policy: LookaheadFgdPolicy | FgdPolicy) -> bool:
    """Whether the policy judges by the 8-GPU 120-core shape after two such pods among
    200, told of 8-GPU nodes with these CPUs. (The small pods change shape at pod 64, so
    that the workload derived at pod 200 moves enough to be adopted.)"""
    for i, cpu in enumerate(cpus):
        policy.node_seen(view(f"n{i}", cpu=cpu))
    for i in range(200):
        if i in (150, 180):
            policy.observe(whole(8, cpu=120_000))
        else:
            policy.observe(whole(1, cpu=8_000 if i < 64 else 4_000))
    return BIG in dict(policy.workload.tasks)


def test_two_sightings_keep_the_nodes_for_a_shape_only_a_few_nodes_take():
    # 2 of 200 pods ask 8 GPUs: 0.08 GPU per pod, kept (WIDE_SHARE). Discounted by 2 pods
    # where every 8-GPU node takes them, 0.2 of a pod is left, 0.008 GPU per pod: dropped.
    assert not steered([128_000] * 16, LookaheadFgdPolicy())
    # Where one node of 16 takes them the discount is 0.125 pod: kept, and that node with it.
    assert steered([96_000] * 15 + [128_000], LookaheadFgdPolicy())
    assert steered([], LookaheadFgdPolicy()) is False  # no node known: a share of 1


def test_a_policy_keeps_the_nodes_it_is_told_of_only_while_it_learns():
    learning, fixed = LookaheadFgdPolicy(), LookaheadFgdPolicy(Workload(((SMALL, 1.0),)))
    for policy in (learning, fixed):
        policy.node_seen(view("a"))
        policy.node_seen(view("b"))
    assert len(learning.supply) == 2 and len(fixed.supply) == 0
    learning.node_gone("a")
    assert len(learning.supply) == 1


def test_the_discount_counts_in_pods_of_today_however_old_the_counts_are():
    # half_life=1: each pod weighs twice the one before, so the weights kept inside grow
    # as 2^n. The discount and the floor are in pods of the newest pod's weight: an 8-GPU
    # pod that just came, discounted by 2 pods, is down to a fifth of a pod, beside the
    # 20 small pods before it that weigh together just under one.
    workload = LearnedWorkload(
        Workload(((SMALL, 1.0),)),
        prior_weight=1e-9,
        half_life=1,
        check_every=1,
        tolerance=0,
        share=lambda shape: 1.0,
    )
    for _ in range(20):
        workload.observe(SMALL)
    workload.observe(BIG)
    small = sum(0.5**n for n in range(1, 21))
    assert dict(workload.current.tasks)[BIG] == pytest.approx(0.2 / (small + 0.2), rel=1e-6)


def test_the_shares_kept_are_bounded_however_many_shapes_pods_bring(monkeypatch):
    # A tenant picks its pods' CPU, so every pod may bring a shape never seen before.
    monkeypatch.setattr(supply_module, "SHARES_LIMIT", 2)
    asked: list[TaskShape] = []
    takes = NodeSupply.takes
    monkeypatch.setattr(NodeSupply, "takes", lambda n, s: asked.append(s) or takes(n, s))
    supply = supply_of(view("a"))
    shapes = [TaskShape.of(whole(8, cpu=cpu)) for cpu in (1_000, 2_000, 3_000)]
    for shape in shapes:
        assert supply.share(shape) == 1.0
    assert len(supply._shares) == 2
    supply.share(shapes[2])  # kept: not worked out again
    assert len(asked) == 3
    supply.share(shapes[0])  # the oldest went: worked out again
    assert len(asked) == 4
