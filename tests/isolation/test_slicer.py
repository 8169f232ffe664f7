"""The node slicer on its own: each GPU decides, a container runs only where all let it."""

from gpushare.isolation.clock import SimulatedClock
from gpushare.isolation.policy import GpuSettings, Policy
from gpushare.isolation.slicer import NodeSlicer
from gpushare.isolation.timeslice import Tenant

PREEMPTIVE = GpuSettings(Policy.PREEMPTIVE)


def test_a_container_on_two_gpus_is_frozen_when_either_holds_it():
    clock = SimulatedClock()
    slicer = NodeSlicer([0, 1], 0.1, clock.now)
    gpus = {0: (PREEMPTIVE, [Tenant("a"), Tenant("split")]), 1: (PREEMPTIVE, [Tenant("split")])}
    seen = []
    for _ in range(10):
        seen.append(slicer.frozen(gpus))
        clock.advance(0.1)
    # Alone on GPU 1, but GPU 0 takes turns: split is frozen every other slice.
    assert seen.count(frozenset({"split"})) == 5
    assert seen.count(frozenset({"a"})) == 5


def test_native_gpus_freeze_nobody():
    clock = SimulatedClock()
    slicer = NodeSlicer([0], 0.1, clock.now)
    gpus = {0: (GpuSettings(Policy.NATIVE), [Tenant("a"), Tenant("b")])}
    assert slicer.frozen(gpus) == frozenset()
