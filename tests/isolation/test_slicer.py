"""The node slicer on its own: each GPU decides, a container runs only where all let it."""

from gpushare.isolation.clock import SimulatedClock
from gpushare.isolation.policy import GpuSettings, Policy
from gpushare.isolation.roster import ContainerRoster
from gpushare.isolation.settings import SettingsStore
from gpushare.isolation.slicer import NodeSlicer, frozen, tenants
from gpushare.isolation.timeslice import Tenant
from tests.isolation.parts import Saved, observed, process

PREEMPTIVE = GpuSettings(Policy.PREEMPTIVE)


def test_a_container_on_two_gpus_is_frozen_when_either_holds_it():
    clock = SimulatedClock()
    slicer = NodeSlicer([0, 1], 0.1, clock.now)
    gpus = {0: (PREEMPTIVE, [Tenant("a"), Tenant("split")]), 1: (PREEMPTIVE, [Tenant("split")])}
    seen = []
    for _ in range(10):
        seen.append(frozen(slicer.held(gpus)))
        clock.advance(0.1)
    # Alone on GPU 1, but GPU 0 takes turns: split is frozen every other slice.
    assert seen.count(frozenset({"split"})) == 5
    assert seen.count(frozenset({"a"})) == 5


def test_each_gpu_holds_only_what_its_own_scheduler_holds():
    """What the interposer's gates follow: a container on two GPUs is held at its
    launches only on the GPU whose turn it is not."""
    clock = SimulatedClock()
    slicer = NodeSlicer([0, 1], 0.1, clock.now)
    gpus = {0: (PREEMPTIVE, [Tenant("a"), Tenant("split")]), 1: (PREEMPTIVE, [Tenant("split")])}
    seen = []
    for _ in range(4):
        seen.append(slicer.held(gpus))
        clock.advance(0.1)
    assert all(held[1] == frozenset() for held in seen)
    assert sorted(tuple(held[0]) for held in seen) == [("a",), ("a",), ("split",), ("split",)]


def test_native_gpus_freeze_nobody():
    clock = SimulatedClock()
    slicer = NodeSlicer([0], 0.1, clock.now)
    gpus = {0: (GpuSettings(Policy.NATIVE), [Tenant("a"), Tenant("b")])}
    assert frozen(slicer.held(gpus)) == frozenset()


def test_each_gpus_scheduler_sees_its_containers_settings_and_what_they_did():
    settings = SettingsStore([0], Saved(), default_policy=Policy.SOFT, max_inst=4, prio_ratio=50)
    roster = ContainerRoster([0], forget_after_s=60, util_window_s=5)
    containers = {
        "busy": observed("busy", process(1, sm=50.0), weight=3, core=(30,)),
        "quiet": observed("quiet", process(2, sm=0.0), weight=2, high_priority=True),
        "off": observed("off", process(3), disabled=True),
    }
    for c in containers.values():
        settings.join(0, c)
    roster.update(0.0, 0.0, containers, frozenset())
    roster.update(2.0, 2.0, containers, frozenset())

    assert tenants(0, settings, roster) == [
        Tenant("busy", weight=3, core_percent=30, active=True, used_s=1.0),
        Tenant("quiet", weight=1, high_priority=True, active=False, used_s=0.0),
    ]
