"""The tree view on its own: the control tree's content put together from the agent's parts."""

from gpushare.isolation.backends.port import GIB, GpuDevice
from gpushare.isolation.memory import MemoryAction, MemoryCapEnforcer
from gpushare.isolation.policy import Policy
from gpushare.isolation.roster import ContainerRoster
from gpushare.isolation.settings import SettingsStore
from gpushare.isolation.treeview import TreeView
from tests.isolation.parts import Saved, observed, process


def test_the_view_shows_grants_promises_usage_and_memory():
    device = GpuDevice(0, "GPU-0", 16 * GIB, model="Tesla-T4")
    roster = ContainerRoster([0], forget_after_s=30.0, util_window_s=5.0)
    settings = SettingsStore(
        [0], Saved(), default_policy=Policy.WEIGHTED, max_inst=4, prio_ratio=50
    )
    memory = MemoryCapEnforcer(MemoryAction.REPORT, lambda pid: None)
    view = TreeView("v1", [device], settings, roster, memory)
    observation = {
        "a": observed("a", process(1, mem_bytes=5 * GIB, sm=25.0), weight=1),
        "b": observed("b", process(2, mem_bytes=GIB, sm=75.0), weight=3, mem_gib=(0,)),
    }
    for tick in range(11):
        changes = roster.update(tick * 0.1, 0.0 if tick == 0 else 0.1, observation, frozenset())
        for gpu, container in changes.joined:
            settings.join(gpu, container)
    roster.refresh_utilisation()
    memory.enforce(observation)
    [gpu] = view.content().gpus
    assert (gpu.policy, gpu.max_inst, gpu.free_weight, gpu.mem_bytes) == (
        Policy.WEIGHTED,
        4,
        0,
        16 * GIB,
    )
    a, b = gpu.containers
    assert (a.weight, a.limit, a.memsize, a.violations) == (1, 25.0, 4 * GIB, 1)
    assert (b.weight, b.limit, b.memsize, b.violations) == (3, 75.0, 0, 0)
    assert a.util is not None and round(a.util) == 25
    assert gpu.util is not None and round(gpu.util) == 100
    assert [p.pid for p in a.processes] == [1]
