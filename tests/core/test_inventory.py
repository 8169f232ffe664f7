"""What counts as room added on a node: the requeue nudge's trigger for node changes."""

from dataclasses import replace

import pytest

from gpushare.inventory import adds_room
from gpushare.labels import NodeMode, PlacementMode
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
        (inventory("2x16GiB", placement=PlacementMode.SPREAD, unhealthy=(1,)), False),
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
