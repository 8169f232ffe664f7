"""The NVML backend. Its /proc, cgroup and signal handling runs here against fake trees and a
stand-in for the pynvml module; the tests marked `gpu` drive a real GPU and skip without one."""

import logging
from pathlib import Path

import pytest

from gpushare import environment
from gpushare.isolation.backends.cgroupfs import FreezeMethod
from gpushare.isolation.backends.nvml import NvmlBackend
from gpushare.isolation.backends.port import GIB
from gpushare.isolation.clock import SimulatedClock, SystemClock
from gpushare.isolation.workload import group_containers
from tests.isolation.fakes import (
    CONTAINERD_ID,
    CRIO_ID,
    POD_UID,
    FakeNvml,
    Signals,
    add_cgroup,
    add_process,
    systemd_path,
)


def contract_env(pod: str, mem: str = "4", idx: str = "0") -> dict[str, str]:
    return {
        environment.MEM_CONTAINER: mem,
        environment.MEM_IDX: idx,
        environment.MEM_DEV: "16",
        environment.POD: pod,
        environment.CONTAINER: "main",
        environment.SCHD_WEIGHT: "2",
    }


@pytest.fixture
def node(tmp_path):
    proc = tmp_path / "proc"
    cgroups = tmp_path / "cgroup"
    (proc).mkdir()
    (proc / "devices").write_text("Character devices:\n195 nvidia-frontend\n")
    add_process(proc, 100, f"0::{systemd_path(CONTAINERD_ID)}\n", contract_env("ml/train"))
    add_process(proc, 101, f"0::{systemd_path(CONTAINERD_ID)}\n", contract_env("ml/train"))
    crio = systemd_path(CRIO_ID, "crio-")
    add_process(proc, 200, f"0::{crio}\n", contract_env("ml/infer", mem="2"))
    add_process(proc, 300, "0::/user.slice/session-1.scope\n", {"PATH": "/bin"})
    train = add_cgroup(cgroups, systemd_path(CONTAINERD_ID), [100, 101, 102])
    add_cgroup(cgroups, crio, [200], freeze=False)
    nvml = FakeNvml(
        gpus=[
            {
                "uuid": "GPU-aaaa",
                "name": "NVIDIA A10",
                "mem": 24 * GIB,
                "processes": {100: 3 * GIB, 101: GIB, 200: 3 * GIB, 300: GIB, 999: None},
            }
        ],
        utilisation={0: [(100, 10, 30), (100, 20, 50), (200, 20, 10)]},
    )
    signals = Signals()
    backend = NvmlBackend(nvml, proc, cgroups, SimulatedClock(), send_signal=signals)
    return backend, nvml, signals, train


def test_devices_come_from_nvml(node):
    backend, *_ = node
    [gpu] = backend.devices()
    assert (gpu.index, gpu.uuid, gpu.model, gpu.mem_bytes, gpu.major) == (
        0,
        "GPU-aaaa",
        "NVIDIA A10",
        24 * GIB,
        195,
    )


def test_processes_are_mapped_to_containers_with_their_limits(node):
    backend, *_ = node
    observation = backend.observe()
    by_pid = {p.pid: p for p in observation.processes}
    # 999 has no /proc entry (exited): nothing to enforce on.
    assert sorted(by_pid) == [100, 101, 200, 300]
    assert by_pid[100].container_id == CONTAINERD_ID
    assert by_pid[100].pod_uid == POD_UID
    assert by_pid[100].sm_percent == 40.0
    assert by_pid[101].sm_percent == 0.0
    assert by_pid[200].container_id == CRIO_ID
    containers, unreadable = group_containers(observation.processes)
    assert unreadable == []
    # The host process (no contract environment) is not ours.
    assert set(containers) == {CONTAINERD_ID, CRIO_ID}
    train = containers[CONTAINERD_ID]
    assert train.pod == "ml/train"
    assert train.mem_used(0) == 4 * GIB
    assert train.cap_bytes(0) == 4 * GIB
    assert train.limits.weight == 2
    assert train.utilisation(0) == 40.0


def test_utilisation_without_new_samples_is_unknown(node):
    backend, *_ = node
    backend.observe()
    [process, *_] = backend.observe().processes
    assert process.sm_percent is None


def test_hold_freezes_by_cgroup_and_falls_back_to_signals(node):
    backend, _, signals, train = node
    backend.observe()
    backend.hold(frozenset({CONTAINERD_ID, CRIO_ID}))
    assert (train / "cgroup.freeze").read_text() == "1"
    assert backend.methods[CONTAINERD_ID] is FreezeMethod.CGROUP_V2
    assert backend.methods[CRIO_ID] is FreezeMethod.SIGNAL
    assert signals.sent == [(200, "SIGSTOP")]
    backend.hold(frozenset({CONTAINERD_ID, CRIO_ID}))
    assert signals.sent == [(200, "SIGSTOP")]  # nothing changed: nothing written again
    backend.hold(frozenset())
    assert (train / "cgroup.freeze").read_text() == "0"
    assert signals.sent[-1] == (200, "SIGCONT")


def test_a_frozen_container_whose_gpu_processes_went_is_still_thawed(node):
    backend, nvml, _, train = node
    backend.observe()
    backend.hold(frozenset({CONTAINERD_ID}))
    nvml.gpus[0]["processes"] = {200: GIB}
    backend.observe()
    backend.hold(frozenset())
    assert (train / "cgroup.freeze").read_text() == "0"


def test_kill_sends_sigkill_and_close_thaws_and_shuts_nvml_down(node):
    backend, nvml, signals, train = node
    backend.observe()
    backend.hold(frozenset({CONTAINERD_ID}))
    backend.kill(100)
    assert (100, "SIGKILL") in signals.sent
    backend.close()
    assert (train / "cgroup.freeze").read_text() == "0"
    assert nvml.shut_down


def real_nvml():
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as err:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        pytest.skip(f"NVML/GPU is missing on this machine: {err}")
    return pynvml


@pytest.mark.gpu
def test_real_gpus_are_listed():
    backend = NvmlBackend(real_nvml(), Path("/proc"), Path("/sys/fs/cgroup"), SystemClock())
    try:
        devices = backend.devices()
        assert devices and all(d.mem_bytes > 0 and d.uuid.startswith("GPU-") for d in devices)
        observation = backend.observe()
        assert all(p.gpu_index < len(devices) for p in observation.processes)
    finally:
        backend.close()


def test_a_proc_root_without_the_gpu_processes_is_reported(tmp_path, caplog):
    (tmp_path / "proc").mkdir()
    nvml = FakeNvml(gpus=[{"uuid": "GPU-b", "name": "T4", "mem": GIB, "processes": {77: GIB}}])
    backend = NvmlBackend(nvml, tmp_path / "proc", tmp_path / "cg", SimulatedClock())
    with caplog.at_level(logging.WARNING, logger="gpushare.isolation"):
        backend.observe()
        backend.observe()
    assert caplog.text.count("none of them readable") == 1
    assert "hostPID" in caplog.text
