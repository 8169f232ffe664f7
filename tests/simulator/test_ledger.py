"""Every placement is checked against an independent ledger of what nodes have left."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpushare.placement.fit import Assignment
from gpushare.placement.fragmentation import device, free_milli
from gpushare.simulator.run import InfeasiblePlacement, Ledger
from gpushare.simulator.trace import TraceNode, TracePod
from gpushare.state import GpuView

NODE = TraceNode("n", cpu_milli=8000, memory_mib=4096, gpus=2, model="T4")


def pod(cpu=1000, memory=1024, gpus=1, milli=500, spec=None) -> TracePod:
    return TracePod("p", cpu, memory, gpus, milli, spec)


def on(*indices: int) -> Assignment:
    return Assignment(gpus=(indices,), added=())


def test_a_feasible_placement_is_charged():
    ledger = Ledger((NODE,))
    ledger.apply(0, pod(milli=600), on(1))
    assert ledger.gpus[0] == [1000, 400] and ledger.cpu[0] == 7000 and ledger.memory[0] == 3072


@pytest.mark.parametrize(
    ("taken", "wrong", "assignment", "reason"),
    [
        (pod(milli=600), pod(milli=500), on(0), "cannot hold 500"),
        (pod(gpus=1, milli=1000), pod(gpus=2, milli=1000), on(0, 1), "cannot hold 1000"),
        (pod(cpu=7500), pod(cpu=1000), on(1), "not enough CPU"),
        (None, pod(gpus=2, milli=1000), on(0), "GPUs (0,)"),
        (None, pod(spec=frozenset({"A100"})), on(0), "GPU model"),
    ],
)
def test_an_infeasible_placement_is_caught(taken, wrong, assignment, reason):
    ledger = Ledger((NODE,))
    if taken is not None:
        ledger.apply(0, taken, on(0))
    with pytest.raises(InfeasiblePlacement, match=reason.replace("(", r"\(").replace(")", r"\)")):
        ledger.apply(0, wrong, assignment)


@given(
    mem_total=st.integers(1, 200),
    core_total=st.integers(0, 200),
    mem_used=st.integers(0, 200),
    core_used=st.integers(0, 200),
)
def test_a_gpus_free_fraction_is_the_scarcer_of_memory_and_compute(
    mem_total, core_total, mem_used, core_used
):
    mem_free, core_free = max(mem_total - mem_used, 0), max(core_total - core_used, 0)
    gpu = GpuView(0, mem_total, core_total, mem_free, core_free, 5, False, True)
    assert device(gpu)[0] == free_milli(mem_free, core_free, mem_total, core_total)
