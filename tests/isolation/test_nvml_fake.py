"""The isolation agent's nvml backend through the real nvidia-ml-py, answered by the fake
libnvidia-ml (tests/fakenvml), on real processes: `sleep` children started with the
contract environment, which the fake reports as GPU processes. They run outside any
container, so the agent groups them by GPUSHARE_POD/GPUSHARE_CONTAINER and freezes them
with SIGSTOP/SIGCONT."""

import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pynvml
import pytest

from gpushare import environment
from gpushare import grant as grants
from gpushare.inventory import MemoryRounding
from gpushare.isolation import smi
from gpushare.isolation.agent import AgentConfig, IsolationAgent
from gpushare.isolation.backends.nvml import NvmlBackend
from gpushare.isolation.backends.port import GIB, container_key
from gpushare.isolation.backends.procfs import parse_cgroup
from gpushare.isolation.clock import SystemClock
from gpushare.isolation.control import ControlTree
from gpushare.isolation.main import build_backend, build_parser, config_from, summary
from gpushare.isolation.metrics import AgentMetrics
from tests.deviceplugin.rig import WAIT, eventually
from tests.fakenvml import (
    MIB,
    Failure,
    FakeDriver,
    FakeGpu,
    FakeProcess,
    World,
    fake_driver,
    fake_nvml_or_skip,
    nvml_env,
    write_world,
)

SLICE = 0.05

if parse_cgroup(Path("/proc/self/cgroup").read_text()) is not None:
    pytest.skip(
        "this test runs inside a container whose ID /proc/self/cgroup shows: the agent would "
        "take it for the children's container and stop the test itself",
        allow_module_level=True,
    )


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[FakeDriver]:
    with fake_driver(tmp_path, World([FakeGpu("GPU-iso-0", total_bytes=15_109 * MIB)])) as driver:
        yield driver


@pytest.fixture
def spawn() -> Iterator[Callable[..., subprocess.Popen]]:
    """Starts `sleep` children as the containers of pods; all of them are gone after the test."""
    children: list[subprocess.Popen] = []

    def start(pod: str | None, cap_gib: int = 4, core: int = 0) -> subprocess.Popen:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        if pod is not None:
            env |= {
                environment.MEM_IDX: "0",
                environment.MEM_CONTAINER: str(cap_gib),
                environment.MEM_DEV: "15",
                environment.CORE_PERCENTAGE: str(core),
                environment.POD: pod,
                environment.CONTAINER: "main",
            }
        child = subprocess.Popen(["sleep", "60"], env=env)
        children.append(child)
        return child

    yield start
    for child in children:
        child.kill()
        child.wait()


def state(child: subprocess.Popen) -> str:
    """R, S, T (stopped), Z ... from /proc/<pid>/stat."""
    return Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def backend(tmp_path: Path, **kwargs) -> NvmlBackend:
    return NvmlBackend(pynvml, Path("/proc"), tmp_path / "cgroup", SystemClock(), **kwargs)


@contextmanager
def running_agent(tmp_path: Path) -> Iterator[IsolationAgent]:
    """The agent on the nvml backend and the system clock, ticking every SLICE on a thread."""
    config = AgentConfig(version="gpushare-isolation test", slice_s=SLICE)
    agent = IsolationAgent(
        backend(tmp_path), ControlTree(tmp_path / "cgpu"), SystemClock(), config, AgentMetrics("n")
    )
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,))
    runner.start()
    try:
        yield agent
    finally:
        stop.set()
        runner.join(WAIT)
        assert not runner.is_alive()


def test_the_gpus_come_from_nvml_in_whole_gib_as_the_flag_says(driver, tmp_path):
    [device] = backend(tmp_path).devices()
    assert (device.index, device.uuid, device.model) == (0, "GPU-iso-0", "Tesla T4")
    assert (device.mem_bytes, device.mem_gib) == (15_109 * MIB, 15)
    args = build_parser().parse_args(
        ["--node-name=n", f"--cgroup-root={tmp_path}", "--gpu-memory-rounding=down"]
    )

    chosen = build_backend(args, SystemClock())

    assert chosen.devices()[0].rounding is MemoryRounding.DOWN
    assert "gpus=0:14GiB gpu-memory-rounding=down" in summary(
        args, config_from(args, build_parser()), chosen
    )
    chosen.close()


def test_cgpu_smi_shows_a_t4_as_the_15_gib_the_node_advertises(driver, tmp_path):
    with running_agent(tmp_path):
        tree = tmp_path / "cgpu"
        assert eventually(lambda: (tree / "0" / "mem_total").exists())
    report = smi.read_report(tree)
    assert report.gpus[0].memory_total_bytes == 15 * GIB


def test_without_a_driver_the_agent_says_what_to_do(driver, tmp_path):
    """The reason is the shared discovery's (tests/nvmllib/test_discovery.py)."""
    driver.world.init_error = "DRIVER_NOT_LOADED"
    driver.write()
    args = build_parser().parse_args(["--node-name=n", f"--cgroup-root={tmp_path}"])

    with pytest.raises(RuntimeError) as refused:
        build_backend(args, SystemClock())

    assert str(refused.value) == (
        "NVML is not available (Driver Not Loaded); run on a node with the NVIDIA driver and its "
        "libraries mounted, or use --backend mock --mock-gpus LAYOUT"
    )


def test_real_processes_are_seen_with_memory_utilisation_and_their_container(
    driver, spawn, tmp_path
):
    a, b, outsider = spawn("ml/a"), spawn("ml/b"), spawn(None)
    gone = spawn("ml/gone")
    gone.kill()
    gone.wait()
    driver.world.gpus[0].processes = [
        FakeProcess(a.pid, 2 * GIB, sm_percent=40),
        FakeProcess(b.pid, None, sm_percent=None),
        FakeProcess(outsider.pid, GIB // 2, sm_percent=10),
        FakeProcess(gone.pid, GIB, sm_percent=90),
    ]
    driver.write()

    seen = {p.pid: p for p in backend(tmp_path).observe().processes}

    assert sorted(seen) == sorted([a.pid, b.pid, outsider.pid])
    assert (seen[a.pid].mem_bytes, seen[a.pid].sm_percent) == (2 * GIB, 40.0)
    assert (seen[b.pid].mem_bytes, seen[b.pid].sm_percent) == (0, 0.0)  # memory not available
    assert seen[a.pid].environ[environment.POD] == "ml/a"
    assert seen[a.pid].container_key == container_key(
        "", {environment.POD: "ml/a", environment.CONTAINER: "main"}, 0
    )
    assert seen[a.pid].container_key != seen[b.pid].container_key
    assert environment.MEM_CONTAINER not in seen[outsider.pid].environ


def test_without_per_process_samples_utilisation_is_unknown(driver, spawn, tmp_path):
    a = spawn("ml/a")
    driver.world.gpus[0].processes = [FakeProcess(a.pid, GIB, sm_percent=40)]
    driver.world.failures.append(Failure("nvmlDeviceGetProcessUtilization", "NOT_SUPPORTED"))
    driver.write()

    [process] = backend(tmp_path).observe().processes

    assert (process.pid, process.mem_bytes, process.sm_percent) == (a.pid, GIB, None)


def test_a_process_over_its_cap_is_killed_and_its_neighbour_at_its_cap_is_not(
    driver, spawn, tmp_path, caplog
):
    """Observed in the next slice and killed; how soon is bench/isolation_bench.py's figure."""
    leaky, neighbour = spawn("ml/leaky", cap_gib=1), spawn("ml/neighbour", cap_gib=2)
    driver.world.gpus[0].processes = [
        FakeProcess(leaky.pid, GIB // 2, sm_percent=20),
        FakeProcess(neighbour.pid, 2 * GIB, sm_percent=20),  # at its cap, not over
    ]
    driver.write()
    with caplog.at_level(logging.WARNING, logger="gpushare.isolation"), running_agent(tmp_path):
        assert eventually(lambda: (tmp_path / "cgpu" / "inst_ctl").exists())
        driver.world.gpus[0].processes[0].used_bytes = 3 * GIB
        driver.write()

        assert leaky.wait(timeout=WAIT) == -signal.SIGKILL  # how soon: bench/isolation_bench.py

    assert neighbour.poll() is None
    assert f"of pod ml/leaky holds 3.00 GiB on GPU 0, cap 1.00 GiB; killed pid {leaky.pid}" in (
        caplog.text
    )


def test_time_slices_stop_containers_and_nothing_stays_stopped_after_the_agent(
    driver, spawn, tmp_path
):
    """30% each on one GPU (core_mem: policy fixed), so at most one runs at a time."""
    a, b = spawn("ml/a", core=30), spawn("ml/b", core=30)
    driver.world.gpus[0].processes = [FakeProcess(a.pid, GIB, 50), FakeProcess(b.pid, GIB, 50)]
    driver.write()
    with running_agent(tmp_path):
        assert eventually(lambda: "T" in (state(a), state(b)))

    assert "T" not in (state(a), state(b))


def test_a_failing_nvml_thaws_everyone_until_it_answers_again(driver, spawn, tmp_path):
    a, b = spawn("ml/a", core=30), spawn("ml/b", core=30)
    driver.world.gpus[0].processes = [FakeProcess(a.pid, GIB, 50), FakeProcess(b.pid, GIB, 50)]
    driver.write()

    def observed() -> int:
        return driver.calls("nvmlDeviceGetComputeRunningProcesses")

    with running_agent(tmp_path):
        assert eventually(lambda: "T" in (state(a), state(b)))
        driver.world.failures.append(Failure("nvmlDeviceGetComputeRunningProcesses", "GPU_IS_LOST"))
        driver.write()
        assert eventually(lambda: "T" not in (state(a), state(b)))
        failing = observed()
        assert eventually(lambda: observed() >= failing + 3)
        assert "T" not in (state(a), state(b))

        driver.world.failures.clear()
        driver.write()
        assert eventually(lambda: "T" in (state(a), state(b)))


def test_an_agent_started_on_its_own_finds_the_fake_through_its_environment(spawn, tmp_path):
    """How the real-cluster tier runs it: `gpushare-isolation --backend nvml` with
    LD_LIBRARY_PATH and FAKE_NVML_CONFIG, and nothing else."""
    world_path = tmp_path / "world"
    world = World([FakeGpu("GPU-iso-0", total_bytes=15_109 * MIB)])
    write_world(world_path, world)
    leaky = spawn("ml/leaky", cap_gib=1)
    control = tmp_path / "cgpu"
    (tmp_path / "cgroup").mkdir()
    command = [
        *(sys.executable, "-m", "gpushare.isolation.main", "--backend", "nvml", "--node-name", "n"),
        *("--control-dir", str(control), "--cgroup-root", str(tmp_path / "cgroup")),
        *("--metrics-port", "0", "--slice-ms", "50"),
    ]
    env = nvml_env(fake_nvml_or_skip(), world_path)
    agent = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert eventually(lambda: (control / "inst_ctl").exists() or agent.poll() is not None)
        world.gpus[0].processes = [FakeProcess(leaky.pid, 2 * GIB, sm_percent=30)]
        write_world(world_path, world)
        assert leaky.wait(timeout=WAIT) == -signal.SIGKILL
    finally:
        agent.send_signal(signal.SIGTERM)
        _, log = agent.communicate(timeout=WAIT)

    assert agent.returncode == 0, log
    assert "backend=nvml gpus=0:15GiB gpu-memory-rounding=up" in log
    assert f"killed pid {leaky.pid}" in log


def _granted_child(tmp_path: Path, grant_file: Path, env: dict[str, str]) -> subprocess.Popen:
    """`sleep` in a mount namespace of its own where the grant is mounted at
    /etc/gpushare/grant, as the kubelet mounts it into a container: its mountinfo says
    which grant it has, and nothing it sets in its environment changes that."""
    etc = tmp_path / f"etc-{len(list(tmp_path.glob('etc-*')))}"
    (etc / "gpushare").mkdir(parents=True)
    (etc / "gpushare" / "grant").touch()
    target = environment.GRANT_IN_CONTAINER
    script = f"mount --bind {etc} /etc && mount --bind -o ro {grant_file} {target} && exec sleep 60"
    return subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script], env=env
    )


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root and unshare(1) to mount a grant in a mount namespace of the child's own",
)
@pytest.mark.parametrize(
    "own_env",
    [
        {},  # started with an empty environment: no contract variables at all
        {environment.MEM_CONTAINER: "1000", environment.MEM_IDX: "0", environment.POD: "x/y"},
    ],
    ids=["no-environment", "its-own-cap"],
)
def test_a_process_is_held_to_its_grant_whatever_its_environment_says(driver, tmp_path, own_env):
    directory = tmp_path / "interposer"
    limits = environment.ContainerLimits(
        pod="ml/granted",
        container="main",
        gpu_uuids=("GPU-iso-0",),
        gpu_indices=(0,),
        mem_gib=(1,),
        dev_mem_gib=(15,),
        core_percent=(0,),
    )
    grant = grants.grant_for("c" * 32, "", limits, "/run/gpushare/cuda-region")
    folder = directory / "grants" / grant.id
    (folder / "region").mkdir(parents=True)
    (folder / "grant").write_bytes(grants.encode(grant))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **own_env}
    child = _granted_child(tmp_path, folder / "grant", env)
    try:
        assert eventually(
            lambda: (
                f"{grant.id}/grant" in Path(f"/proc/{child.pid}/mountinfo").read_text()
                and state(child) in "SR"
            )
        )
        driver.world.gpus[0].processes = [FakeProcess(child.pid, 3 * GIB, sm_percent=20)]
        driver.write()
        config = AgentConfig(version="t", slice_s=SLICE, interposer_dir=directory)
        agent = IsolationAgent(
            backend(tmp_path),
            ControlTree(tmp_path / "cgpu"),
            SystemClock(),
            config,
            AgentMetrics("n"),
        )
        stop = threading.Event()
        runner = threading.Thread(target=agent.run, args=(stop,))
        runner.start()
        try:
            assert child.wait(timeout=WAIT) == -signal.SIGKILL
        finally:
            stop.set()
            runner.join(WAIT)
    finally:
        child.kill()
        child.wait()
