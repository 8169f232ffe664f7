"""The nvml backend through the real nvidia-ml-py, answered by the fake libnvidia-ml
(tests/fakenvml): discovery, what the node advertises, health from the driver's events,
and what happens when NVML is missing or a call is not supported."""

import logging
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pynvml
import pytest

from gpushare.cli.inspect import collect, summary
from gpushare.cluster.memory import MemoryCluster, gpu_node
from gpushare.deviceplugin.main import build_parser, run
from gpushare.environment import MEM_CONTAINER, MEM_DEV, NVIDIA_VISIBLE_DEVICES
from gpushare.gpunode.backendflags import build_backend
from gpushare.gpunode.backends.nvml import NvmlBackend
from gpushare.gpunode.backends.port import HealthChange
from gpushare.inventory import (
    NODE_GPUS_ANNOTATION,
    Gpu,
    MemoryRounding,
    decode_gpus,
    parse_layout,
)
from gpushare.resources import GPU_MEM
from tests.deviceplugin.rig import WAIT, Rig, eventually
from tests.fakenvml import (
    MIB,
    T4_BYTES,
    Event,
    Failure,
    FakeDriver,
    FakeGpu,
    World,
    fake_driver,
    fake_nvml_or_skip,
    nvml_env,
    write_world,
)

QUIET = 0.1
"""Quiet period before a GPU taken out is probed: short, so recovery shows at once."""


def t4s(count: int) -> list[FakeGpu]:
    return [
        FakeGpu(f"GPU-t4-{i}", "Tesla T4", T4_BYTES, minor=(i + 2) % count) for i in range(count)
    ]


@pytest.fixture
def driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDriver]:
    """Two T4s; the health watch waits at most 20 ms for an event between its checks."""
    monkeypatch.setattr("gpushare.gpunode.backends.nvml._WAIT_MS", 20)
    with fake_driver(tmp_path, World(t4s(2))) as driver:
        yield driver


@contextmanager
def watching(driver: FakeDriver, backend: NvmlBackend) -> Iterator[list[HealthChange]]:
    """The backend's health watch on a thread, once it waits for events; the changes it
    reports, as they come."""
    changes: list[HealthChange] = []
    stop = threading.Event()
    watcher = threading.Thread(target=backend.watch_health, args=(changes.append, stop))
    watcher.start()
    try:
        assert eventually(lambda: driver.calls("nvmlEventSetWait_v2") > 0)
        yield changes
    finally:
        stop.set()
        watcher.join(WAIT)
        assert not watcher.is_alive()


# ----- discovery


def test_the_discovered_gpus_count_whole_gib_and_bring_their_minors_device_file(driver, tmp_path):
    driver.world.gpus = t4s(4)
    driver.write()
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "nvidiactl").touch()
    backend = NvmlBackend(pynvml, dev_root=dev)

    found = backend.discover()

    assert [(g.gpu.index, g.gpu.uuid, g.gpu.model, g.gpu.mem) for g in found] == [
        (i, f"GPU-t4-{i}", "Tesla T4", 15) for i in range(4)
    ]
    assert [g.minor for g in found] == [2, 3, 0, 1]
    assert [n.container_path for n in backend.device_nodes(found[:1])] == [
        "/dev/nvidiactl",
        "/dev/nvidia2",
    ]


@pytest.mark.parametrize(
    ("rounding", "gib"),
    [(MemoryRounding.UP, [23, 23, 80, 80, 16]), (MemoryRounding.DOWN, [22, 22, 79, 80, 16])],
)
def test_gpu_memory_is_rounded_as_the_flag_says(driver, rounding, gib):
    sizes = {"A10": 22_731, "A10G": 23_028, "H100 80GB": 81_559, "A100 80GB": 81_920, "16G": 16_384}
    driver.world.gpus = [
        FakeGpu(f"GPU-{i}", name, mib * MIB) for i, (name, mib) in enumerate(sizes.items())
    ]
    driver.write()

    found = NvmlBackend(pynvml, memory_rounding=rounding).discover()

    assert [g.gpu.mem for g in found] == gib


def test_the_rounding_flag_reaches_the_backend(driver):
    args = build_parser().parse_args(["--node-name=n1", "--gpu-memory-rounding=down"])

    backend = build_backend(args)

    assert [g.gpu.mem for g in backend.discover()] == [14, 14]


def annotated_gpus(rig: Rig) -> tuple[Gpu, ...]:
    node = rig.cluster.get_node(rig.node)
    return decode_gpus(node.metadata.annotations[NODE_GPUS_ANNOTATION])


def test_a_node_of_four_t4s_advertises_60_gib_and_a_whole_t4_pod_fits(driver, short_tmp):
    """What ACK shows for such a node: gpu-mem 60, ALIYUN_COM_GPU_MEM_DEV=15, 0/15 per GPU."""
    driver.world.gpus = t4s(4)
    driver.write()

    class FakeDriverGpus(NvmlBackend):
        @classmethod
        def from_layout(cls, *_args, **_kwargs) -> NvmlBackend:
            return cls(pynvml, dev_root=short_tmp)

    # The node starts out annotated with another layout; the plugin publishes what it found.
    rig = Rig(short_tmp / "r", layout="1x8GiB", backend_type=FakeDriverGpus)  # type: ignore[arg-type]
    published = [(f"GPU-t4-{i}", 15) for i in range(4)]
    try:
        rig.start()
        assert rig.kubelet.capacity(GPU_MEM) == (60, 60)
        assert eventually(lambda: [(g.uuid, g.mem) for g in annotated_gpus(rig)] == published)
        shown = summary(collect(rig.cluster)[0])
        assert "0/15" in shown and "0/60" in shown

        whole = rig.bind("whole-t4", [[2]], mem=15)
        [main] = rig.kubelet.admit(whole)

        assert (main.envs[MEM_CONTAINER], main.envs[MEM_DEV]) == ("15", "15")
        assert main.envs[NVIDIA_VISIBLE_DEVICES] == "GPU-t4-2"
        assert [d.container_path for d in main.devices] == ["/dev/nvidia0"]
    finally:
        rig.stop()


# ----- health


def test_a_critical_xid_takes_only_its_gpu_out(driver):
    with watching(driver, NvmlBackend(pynvml)) as changes:
        driver.world.events.append(Event.xid(1, 79))
        driver.write()
        assert eventually(lambda: changes)

    assert changes == [HealthChange(1, False, "critical XID 79")]


def test_a_double_bit_ecc_error_takes_its_gpu_out(driver):
    with watching(driver, NvmlBackend(pynvml)) as changes:
        driver.world.events.append(Event.double_bit_ecc(0))
        driver.write()
        assert eventually(lambda: changes)

    assert changes == [HealthChange(0, False, "double-bit ECC error")]


def test_application_xids_are_logged_and_ignored(driver, caplog):
    with (
        caplog.at_level(logging.INFO, logger="gpushare.gpunode.backends.nvml"),
        watching(driver, NvmlBackend(pynvml)) as changes,
    ):
        driver.world.events += [Event.xid(0, 13), Event.xid(0, 31), Event.xid(1, 43)]
        driver.world.events.append(Event.xid(1, 48))  # delivered after them: a barrier
        driver.write()
        assert eventually(lambda: changes)

    assert changes == [HealthChange(1, False, "critical XID 48")]
    for xid in (13, 31, 43):
        assert f"application XID {xid} ignored" in caplog.text


def test_events_already_in_the_log_when_nvml_started_are_history(driver):
    driver.world.events.append(Event.xid(0, 79))
    driver.write()

    with watching(driver, NvmlBackend(pynvml)) as changes:
        driver.world.events.append(Event.xid(1, 79))
        driver.write()
        assert eventually(lambda: changes)

    assert changes == [HealthChange(1, False, "critical XID 79")]


def test_a_quiet_gpu_that_passes_the_probe_is_healthy_again(driver):
    with watching(driver, NvmlBackend(pynvml, quiet_period=QUIET)) as changes:
        driver.world.events.append(Event.xid(1, 79))
        driver.write()
        assert eventually(lambda: len(changes) == 2)

    assert changes == [
        HealthChange(1, False, "critical XID 79"),
        HealthChange(1, True, "recovered from critical XID 79"),
    ]


@pytest.mark.parametrize(
    ("probe", "blocked"),
    [
        ("nvmlDeviceGetRetiredPagesPendingStatus", {"retired_pages_pending": True}),
        ("nvmlDeviceGetRemappedRows", {"remapped_rows": (0, 1, 1, 0)}),
        ("nvmlDeviceGetRemappedRows", {"remapped_rows": (0, 0, 0, 1)}),
        ("nvmlDeviceGetMemoryInfo", {}),  # the GPU fell off the bus
    ],
    ids=["retired-pages-pending", "rows-pending", "row-remap-failed", "gpu-lost"],
)
def test_a_gpu_stays_out_while_its_probe_fails(driver, probe, blocked):
    healthy = driver.world.gpus[1]
    with watching(driver, NvmlBackend(pynvml, quiet_period=QUIET)) as changes:
        driver.world.gpus[1] = replace(healthy, **blocked)
        if not blocked:
            driver.world.failures.append(Failure("nvmlDeviceGetMemoryInfo", "GPU_IS_LOST", gpu=1))
        driver.world.events.append(Event.xid(1, 48))
        driver.write()
        assert eventually(lambda: changes)
        probed = driver.calls(probe, gpu=1)
        assert eventually(lambda: driver.calls(probe, gpu=1) >= probed + 2)
        assert changes == [HealthChange(1, False, "critical XID 48")]

        driver.world.gpus[1] = healthy
        driver.world.failures.clear()
        driver.write()
        assert eventually(lambda: len(changes) == 2)

    assert changes[1] == HealthChange(1, True, "recovered from critical XID 48")


def test_memory_repair_checks_the_gpu_does_not_support_are_skipped(driver):
    driver.world.failures += [
        Failure("nvmlDeviceGetRetiredPagesPendingStatus", "NOT_SUPPORTED"),
        Failure("nvmlDeviceGetRemappedRows", "NOT_SUPPORTED"),
    ]
    driver.write()
    with watching(driver, NvmlBackend(pynvml, quiet_period=QUIET)) as changes:
        driver.world.events.append(Event.xid(0, 79))
        driver.write()
        assert eventually(lambda: len(changes) == 2)

    assert changes[1] == HealthChange(0, True, "recovered from critical XID 79")


def test_a_gpu_without_health_events_stays_healthy_and_says_so(driver, caplog):
    driver.world.failures.append(Failure("nvmlDeviceRegisterEvents", "NOT_SUPPORTED", gpu=0))
    driver.write()
    with (
        caplog.at_level(logging.WARNING, logger="gpushare.gpunode.backends.nvml"),
        watching(driver, NvmlBackend(pynvml)) as changes,
    ):
        driver.world.events += [Event.xid(0, 79), Event.xid(1, 79)]
        driver.write()
        assert eventually(lambda: changes)

    assert changes == [HealthChange(1, False, "critical XID 79")]
    assert "GPU GPU-t4-0 reports no health events (Not Supported); it stays Healthy" in caplog.text


# ----- no NVML


def test_without_a_driver_the_plugin_refuses_to_start_saying_what_to_do(driver, short_tmp, caplog):
    """The reason is the shared discovery's (tests/nvmllib/test_discovery.py)."""
    driver.world.init_error = "DRIVER_NOT_LOADED"
    driver.write()
    cluster = MemoryCluster()
    cluster.add_node(gpu_node("n1", parse_layout("1x16GiB", "n1")))
    args = build_parser().parse_args(["--node-name=n1", f"--device-plugin-dir={short_tmp}"])

    with caplog.at_level(logging.ERROR, logger="gpushare.deviceplugin"):
        assert run(args, cluster, threading.Event()) == 1

    assert (
        "cannot start: NVML is not available (Driver Not Loaded); run on a node with the NVIDIA "
        "driver and its libraries mounted, or use --backend mock --mock-gpus LAYOUT"
    ) in caplog.text


def test_another_process_finds_the_fake_through_its_environment(tmp_path):
    """How a plugin started on its own (the real-cluster tier) meets the fake: by
    LD_LIBRARY_PATH and FAKE_NVML_CONFIG alone."""
    world = tmp_path / "world"
    write_world(world, World(t4s(4)))
    env = nvml_env(fake_nvml_or_skip(), world)
    program = (
        "from gpushare.gpunode.backends.nvml import NvmlBackend\n"
        "from gpushare.nvmllib import bindings\n"
        "found = NvmlBackend(bindings()).discover()\n"
        "print([(g.gpu.uuid, g.gpu.mem, g.minor) for g in found])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=60
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str([(f"GPU-t4-{i}", 15, (i + 2) % 4) for i in range(4)])
