"""What counts as room added on a node: the requeue nudge's trigger for node changes."""

from dataclasses import replace

import pytest

from gpushare.inventory import Gpu, adds_room, node_gpus
from gpushare.labels import NodeMode
from gpushare.objects import Node, NodeStatus, ObjectMeta
from gpushare.resources import GPU_COUNT, GPU_MEM
from tests.builders import inventory

BEFORE = inventory("2x16GiB", unhealthy=(1,))


@pytest.mark.parametrize(
    ("after", "room"),
    [
        (BEFORE, False),
        (inventory("2x16GiB"), True),  # GPU 1 healthy again
        (inventory("3x16GiB", unhealthy=(1,)), True),  # a GPU added
        (inventory("2x24GiB", unhealthy=(1,)), True),  # the device plugin saw more memory
        (inventory("2x16GiB", unhealthy=(0, 1)), False),  # one more GPU unhealthy
        (inventory("1x16GiB"), False),  # the unhealthy GPU removed
        (inventory("2x16GiB", mode=NodeMode.CORE_MEM, unhealthy=(1,)), True),
        (inventory("2x16GiB", max_pods_per_gpu=30, unhealthy=(1,)), True),
        (None, False),  # the node left, or its annotation became unreadable
    ],
)
def test_room_is_added_when_some_pod_may_fit_that_did_not(after, room):
    assert adds_room(BEFORE, after) is room


def test_a_node_seen_for_the_first_time_adds_room():
    assert adds_room(None, BEFORE)


def test_a_smaller_gpu_adds_no_room():
    smaller = replace(BEFORE, gpus=(replace(BEFORE.gpus[0], mem=8), BEFORE.gpus[1]))
    assert not adds_room(BEFORE, smaller)


def _ack_node(allocatable: dict[str, str]) -> Node:
    """A node as ACK's own device plugin leaves it: totals in allocatable, no per-GPU
    annotation."""
    return Node(metadata=ObjectMeta(name="ack-1"), status=NodeStatus(allocatable=allocatable))


def test_a_node_without_the_gpu_annotation_splits_its_memory_evenly():
    gpus = node_gpus(_ack_node({GPU_COUNT: "2", GPU_MEM: "31"})).gpus
    # whole GiB per GPU, rounded down: a slice never asks for memory a GPU lacks
    assert gpus == (Gpu(index=0, uuid="", mem=15), Gpu(index=1, uuid="", mem=15))


def test_a_node_with_one_gpu_and_no_annotation_has_that_gpu():
    assert node_gpus(_ack_node({GPU_COUNT: "1", GPU_MEM: "16"})).gpus == (
        Gpu(index=0, uuid="", mem=16),
    )


@pytest.mark.parametrize(
    "allocatable",
    [
        {},
        {GPU_COUNT: "0", GPU_MEM: "0"},
        {GPU_MEM: "32"},  # memory but no count
        {GPU_COUNT: "2"},  # a count but no memory
        {GPU_COUNT: "two", GPU_MEM: "32"},
        {GPU_COUNT: "2", GPU_MEM: "32Gi"},
    ],
    ids=["nothing", "zeros", "no-count", "no-memory", "count-unreadable", "memory-unreadable"],
)
def test_a_node_without_readable_gpu_totals_has_no_gpus(allocatable):
    assert node_gpus(_ack_node(allocatable)).gpus == ()
