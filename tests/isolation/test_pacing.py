"""The agent paces a container that runs under the CUDA interposer at its launches, through
the gates of its region, instead of freezing it; the rest it keeps freezing (pacing.py).

The region is a real one: the fake-driver probe, with the interposer preloaded, makes it
where Allocate's accounting directory for the container would be, and stays attached; the
mock's process of the container goes by the probe's pid, as the region names it.
"""

import ctypes
import logging
import subprocess
import time
from collections.abc import Iterator

import pytest

from gpushare.environment import CONTAINER, REGION_FILE
from gpushare.isolation.backends.mock import MemoryStep
from gpushare.isolation.backends.port import GIB
from gpushare.isolation.interposer.region import Region, RegionError
from gpushare.isolation.memory import MIB
from gpushare.labels import NodeMode
from gpushare.standins.scenario import Workload
from tests.fakecuda import Container, fake_cuda_or_skip
from tests.isolation.regions import gpu_field, poke
from tests.isolation.rig import SLICE, Rig, container_labels, rig

TICKS = 100


def region_of(r: Rig, pod_name: str):
    container = r.node.container(pod_name)
    directory = r.agent.config.interposer_dir
    assert directory is not None
    name = container.environ[CONTAINER]
    return directory / "regions" / container.pod_uid / name / REGION_FILE


@pytest.fixture
def paced(tmp_path) -> Iterator[tuple[Rig, subprocess.Popen[str]]]:
    """infer (30 percent, under the interposer) and train (70 percent, without it) on one
    GPU of a core_mem node, both always busy. infer holds a little over its cap per NVML
    (within the slack of one process: what the library does not count)."""
    r = rig(
        tmp_path,
        [
            Workload("infer", 2, core=30, memory=(MemoryStep(0, 2 * GIB + 256 * MIB),)),
            Workload("train", 4, core=70),
        ],
        mode=NodeMode.CORE_MEM,
        interposer_dir=tmp_path / "interposer",
    )
    path = region_of(r, "infer")
    path.parent.mkdir(parents=True)
    process = Container(fake_cuda_or_skip(), path, caps="2").start_probe(
        "link", "init", "0", "alloc", "mem", str(1 << 20), "sleep", "60000"
    )
    try:
        _attached(path)
        [pid] = r.backend.pids(r.key("infer"))
        r.backend.set_ns_pid(pid, process.pid)
        yield r, process
    finally:
        process.kill()
        process.wait()


def _attached(path) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if path.exists():
            try:
                with Region.open(path) as region:
                    if region.attached:
                        return
            except RegionError:  # made, its header not written yet
                pass
        time.sleep(0.02)
    raise AssertionError(f"no process attached to {path}")


def ticks(r: Rig, count: int, region: Region) -> tuple[list[bool], list[frozenset[str]]]:
    """Per tick: whether infer's gate on its GPU is open, and who the backend froze."""
    gates, frozen = [], []
    for _ in range(count):
        r.agent.tick()
        gates.append(region.gpus()[0].gate_open)
        frozen.append(r.backend.frozen)
        r.clock.advance(SLICE)
    return gates, frozen


def test_a_container_under_the_interposer_is_held_at_its_gate_not_frozen(paced):
    r, _ = paced
    with Region.open(region_of(r, "infer")) as region:
        gates, frozen = ticks(r, TICKS, region)
        share = region.gpus()[0].share_percent

    infer, train = r.key("infer"), r.key("train")
    assert not any(infer in f for f in frozen)
    assert sum(gates) / TICKS == pytest.approx(0.30, abs=0.05)
    assert sum(train not in f for f in frozen) / TICKS == pytest.approx(0.70, abs=0.05)
    # The two take turns: infer's gate is open exactly in the slices train is frozen.
    assert all(g == (train in f) for g, f in zip(gates, frozen, strict=True))
    assert share == 30


def test_the_tree_the_metrics_and_the_log_say_who_runs_under_it(paced, caplog):
    r, _ = paced
    with caplog.at_level(logging.INFO, logger="gpushare.isolation"):
        r.agent.tick()
    assert r.read(f"{r.container_dir('infer')}/interposer") == "1\n"
    assert r.read(f"{r.container_dir('train')}/interposer") == "0\n"
    sample = r.agent.metrics.registry.get_sample_value
    assert sample("gpushare_isolation_interposer", container_labels(r, "infer")) == 1.0
    assert sample("gpushare_isolation_interposer", container_labels(r, "train")) == 0.0
    assert f"{r.key('infer')} (pod default/infer) runs under the CUDA interposer" in caplog.text
    assert f"{r.key('train')} (pod default/train) runs without the CUDA interposer" in caplog.text


def test_what_the_interposer_counts_in_the_region_becomes_the_containers_counters(paced):
    r, _ = paced
    r.agent.tick()
    labels = container_labels(r, "infer")

    def sample(name: str) -> float | None:
        return r.agent.metrics.registry.get_sample_value(name, labels)

    names = [
        "gpushare_isolation_launches_held_total",
        "gpushare_isolation_allocations_refused_total",
        "gpushare_isolation_held_seconds_total",
    ]
    assert [sample(name) for name in names] == [0, 0, 0]
    path = region_of(r, "infer")
    with Region.open(path) as region:
        for launches, refused in ((3, 1), (5, 2)):  # as the library counts them
            gpu = region.read().gpus[0]
            poke(path, gpu_field(0, "launches_held"), ctypes.c_uint64(gpu.launches_held + launches))
            poke(
                path,
                gpu_field(0, "allocations_refused"),
                ctypes.c_uint64(gpu.allocations_refused + refused),
            )
            poke(path, gpu_field(0, "held_ns"), ctypes.c_uint64(gpu.held_ns + 250_000_000))
            r.clock.advance(SLICE)
            r.agent.tick()
    assert [sample(name) for name in names] == [8, 3, pytest.approx(0.5)]


def test_its_memory_within_the_slack_over_its_cap_is_left_to_the_library(paced):
    r, _ = paced
    r.agent.run(duration_s=1)
    assert r.backend.kills == []


def test_when_its_processes_are_gone_it_is_frozen_again(paced):
    r, process = paced
    r.agent.tick()
    process.kill()
    process.wait()
    r.clock.advance(SLICE)
    with Region.open(region_of(r, "infer")) as region:
        _, frozen = ticks(r, 20, region)
        assert region.processes() == []
        assert region.attached == 1  # the agent writes no slot: the library reaps
    assert any(r.key("infer") in f for f in frozen)
    assert r.read(f"{r.container_dir('infer')}/interposer") == "0\n"


def test_an_agent_that_stops_opens_every_gate(paced):
    r, _ = paced
    with Region.open(region_of(r, "infer")) as region:
        ticks(r, 10, region)
        r.agent.run(duration_s=0.5)
        assert region.gpus()[0].gate_open


def test_a_closed_gate_holds_a_few_slices_at_most(paced):
    """Written each slice with a horizon of a few: an agent that hangs cannot hold the
    container's launches for longer."""
    r, _ = paced
    with Region.open(region_of(r, "infer")) as region:
        gates, _ = ticks(r, 10, region)
        closed_at = next(i for i, g in enumerate(gates) if not g)
        assert closed_at < 10
        until = int(region.read().gpus[0].gate_until_ns)
        assert 0 < until - time.monotonic_ns() <= 5 * SLICE * 1e9
