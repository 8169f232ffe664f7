"""The agent paces a container's launches through each GPU's gate in the region: while
it is closed every kind of launch waits; while open (as a region no agent touched is)
launches only count."""

import time
from collections.abc import Callable

import pytest

from gpushare.isolation.interposer.region import GpuUsage, Region
from tests.fakecuda import GIB, Container, uuid

LAUNCHES = ("kernel", "kernel_ptsz", "ex", "ex_ptsz", "coop", "coop_ptsz", "graph", "graph_ptsz")
WAIT = 10.0


def created(container: Container) -> Region:
    """The region, as the container's first CUDA process leaves it."""
    container.probe("link", "init", "0", "info")
    assert container.region is not None
    return Region.open(container.region)


def eventually(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.mark.parametrize("mode", ("link", "getproc"))
@pytest.mark.parametrize("kind", LAUNCHES)
def test_a_launch_waits_while_its_gpus_gate_is_closed(
    container: Container, mode: str, kind: str
) -> None:
    with created(container) as region:
        region.set_gate(0, open=False, for_s=WAIT)
        launcher = container.start_probe(mode, "init", "0", "launch", kind, "100")
        eventually(lambda: region.gpus()[0].launches_held == 1)
        time.sleep(0.2)
        still_waiting = launcher.poll() is None
        region.set_gate(0, open=True)
        out, _ = launcher.communicate(timeout=WAIT)
        gpu = region.gpus()[0]

    assert still_waiting
    assert f"launch kind={kind} rc=0" in out
    assert (gpu.launches, gpu.launches_held) == (1, 1)
    assert gpu.held_ns >= 200_000_000


def test_launches_are_never_held_when_no_agent_wrote_the_gate(container: Container) -> None:
    before = time.monotonic_ns()
    lines = container.probe("link", "init", "0", *(["launch", "kernel", "10"] * 5))

    assert [line["rc"] for line in lines if line["op"] == "launch"] == ["0"] * 5
    with Region.open(container.region) as region:  # type: ignore[arg-type]
        gpu: GpuUsage = region.gpus()[0]
        assert (gpu.gate_open, gpu.launches, gpu.launches_held, gpu.held_ns) == (True, 5, 0, 0)
        assert before < gpu.last_launch_ns <= time.monotonic_ns()
        assert before < region.heartbeat_ns <= time.monotonic_ns()


def test_a_gate_the_agent_stopped_writing_opens_by_itself(container: Container) -> None:
    """An agent that died must not hold a container's launches for ever: a closed gate
    holds for the time it was closed for, then launches go."""
    with created(container) as region:
        region.set_gate(0, open=False, for_s=0.5)
        started = time.monotonic()
        lines = container.probe("link", "init", "0", "launch", "kernel", "10")
        took = time.monotonic() - started
        gpu = region.gpus()[0]

    assert [line["rc"] for line in lines if line["op"] == "launch"] == ["0"]
    assert not gpu.gate_open and gpu.launches == 1
    assert took < 0.5 + WAIT / 2
    assert gpu.launches_held <= 1 and gpu.held_ns <= 600_000_000


def test_a_closed_gate_holds_only_its_own_gpu(container: Container) -> None:
    container.devices = ((uuid(1), 4 * GIB), (uuid(2), 4 * GIB))
    with created(container) as region:
        region.set_gate(1, open=False, for_s=WAIT)
        lines = container.probe("link", "init", "0", "launch", "kernel", "10")
        region.set_gate(1, open=True)
        gpus = region.gpus()

    assert [line["rc"] for line in lines if line["op"] == "launch"] == ["0"]
    assert [(g.launches, g.launches_held) for g in gpus] == [(1, 0), (0, 0)]


def test_the_agent_writes_a_share_target_the_library_leaves_alone(container: Container) -> None:
    with created(container) as region:
        region.set_share(0, 40)
        container.probe("link", "init", "0", "launch", "kernel", "10")
        assert region.gpus()[0].share_percent == 40
        with pytest.raises(ValueError, match="percentage"):
            region.set_share(0, 140)
        with pytest.raises(IndexError, match="no GPU 1"):
            region.set_gate(1, open=False)
