"""On a real cluster, the code every GPU node runs: the device plugin and the isolation
agent with `--backend nvml`, over a fake libnvidia-ml.so.1 that the unmodified
nvidia-ml-py loads (tests/fakenvml), and device nodes made with mknod for the test.

The node's GPUs become a Tesla T4 (15,109 MiB) and an A10 (23,028 MiB) for this module;
the mock GPUs come back afterwards.
"""

import json
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.checks import assert_env_matches_annotation, env_of
from tests.e2e.kube import run, wait_for
from tests.e2e.local import GPU_SIZES, NODE, HostProcess, LocalCluster
from tests.e2e.workloads import WORKLOAD_LABEL, busybox_pod
from tests.fakecuda import FakeCuda, FakeCudaUnavailable, build_fake_cuda, parse_line
from tests.fakenvml import (
    MIB,
    Event,
    FakeGpu,
    FakeNvmlUnavailable,
    FakeProcess,
    World,
    build_fake_nvml,
    nvml_env,
    write_world,
)

pytestmark = [pytest.mark.realcluster, pytest.mark.timeout(600)]

NVIDIA_MAJOR = 195
T4 = FakeGpu("GPU-7e5e0c5f-0000-4000-8000-00000000a0f4", "Tesla T4", 15_109 * MIB, minor=0)
A10 = FakeGpu("GPU-7e5e0c5f-0000-4000-8000-0000000000a1", "NVIDIA A10", 23_028 * MIB, minor=1)
DEVICES = {"nvidia0": 0, "nvidia1": 1, "nvidiactl": 255}


@dataclass
class NvmlNode:
    world: World
    path: Path

    def write(self) -> None:
        write_world(self.path, self.world)


def _swap(local: LocalCluster, plugin: HostProcess, agent: HostProcess, mem: int) -> None:
    assert local.plugin is not None and local.agent is not None
    local.plugin.stop()
    local.agent.stop()
    local.plugin, local.agent = plugin, agent
    local.agent.start()
    local.start_plugin(expected_mem=mem)


@pytest.fixture(scope="module")
def nvml_node(local: LocalCluster) -> Iterator[NvmlNode]:
    try:
        library = build_fake_nvml(local.our_dir / "fakenvml")
    except FakeNvmlUnavailable as err:
        pytest.skip(str(err))
    node = NvmlNode(World([T4, A10]), local.our_dir / "nvml-world")
    node.write()
    made = []
    for name, minor in DEVICES.items():
        path = Path("/dev") / name
        if not path.exists():
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, minor))
            made.append(path)
    env = nvml_env(library, node.path, base={})
    interposer = ["--interposer-dir", str(local.our_dir / "interposer")]
    mock_plugin, mock_agent = local.plugin, local.agent
    assert mock_plugin is not None and mock_agent is not None
    plugin = HostProcess(
        "device plugin (nvml)",
        [*mock_plugin.args[: mock_plugin.args.index("--backend")],
         "--node-name", NODE, "--backend", "nvml",
         "--kubeconfig", str(local.our_dir / "node.kubeconfig"), "--metrics-port", "0",
         *interposer],
        local.logs / "gpushare-device-plugin-nvml.log",
        env=env,
    )  # fmt: skip
    agent = HostProcess(
        "isolation agent (nvml)",
        [str(local.venv_bin / "gpushare-isolation"), "--node-name", NODE, "--backend", "nvml",
         "--control-dir", str(local.control_dir), "--metrics-port", "0", *interposer],
        local.logs / "gpushare-isolation-nvml.log",
        env=env,
    )  # fmt: skip
    try:
        _swap(local, plugin, agent, 15 + 23)
        yield node
    finally:
        local.kubectl(
            "delete", "pods", "-l", WORKLOAD_LABEL, "--grace-period=0", "--force",
            "--ignore-not-found", "--wait=true", timeout=150,
        )  # fmt: skip
        _swap(local, mock_plugin, mock_agent, sum(GPU_SIZES))
        for path in made:
            path.unlink()


@pytest.fixture(autouse=True)
def clean(request: pytest.FixtureRequest, local: LocalCluster) -> Iterator[None]:
    yield
    if "busy_pair" in request.fixturenames:
        return  # the busy pair lives across the policy tests
    local.kubectl(
        "delete", "pods", "-l", WORKLOAD_LABEL, "--grace-period=0", "--force",
        "--ignore-not-found", "--wait=true", timeout=150,
    )  # fmt: skip


def pod(name: str, mem: int, core: int | None = None, command: str | None = None) -> dict:
    raw = busybox_pod(name, mem, core)
    if command is not None:
        raw["spec"]["containers"][0]["command"] = ["sh", "-c", command]
    return raw


def container_pids(pod_name: str) -> list[int]:
    """Host PIDs of the pod's container processes (found by the HOSTNAME a pod gets)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"HOSTNAME={pod_name}".encode() in environ and b"ALIYUN_COM_GPU_MEM_IDX" in b"".join(
            environ
        ):
            found.append(int(entry.name))
    return sorted(found)


def test_a_t4_counts_as_15_gib_as_on_ack(local: LocalCluster, nvml_node: NvmlNode):
    assert local.allocatable("aliyun.com/gpu-mem") == 15 + 23
    assert local.allocatable("aliyun.com/gpu-count") == 2
    assert local.allocatable("aliyun.com/gpu-core.percentage") == 200


def test_a_pod_asking_a_whole_t4_gets_it_with_its_device_node(
    local: LocalCluster, nvml_node: NvmlNode
):
    command = 'trap "exit 0" TERM; env | sort; ls /dev; while :; do sleep 1; done'
    local.create([pod("whole-t4", 15, command=command)])
    [running] = local.wait_running(WORKLOAD_LABEL, 1, timeout=60)
    assert assert_env_matches_annotation(local, [running]) == 1
    log = local.container_log(running, "app")
    env = env_of(log)
    assert env["ALIYUN_COM_GPU_MEM_DEV"] == "15"
    assert env["NVIDIA_VISIBLE_DEVICES"] == T4.uuid
    listed = set(log.split())
    assert "nvidia0" in listed and "nvidiactl" in listed and "nvidia1" not in listed


def test_a_container_over_its_memory_cap_is_killed(local: LocalCluster, nvml_node: NvmlNode):
    local.create([pod("over-cap", 2)])
    local.wait_running(WORKLOAD_LABEL, 1, timeout=60)
    pids = wait_for("the container's processes", lambda: container_pids("over-cap"), 10, 0.2)
    gpu = next(g for g in nvml_node.world.gpus if g.uuid in _visible(local, "over-cap"))
    gpu.processes = [FakeProcess(pids[0], used_bytes=3 * 1024**3)]
    nvml_node.write()
    written = time.monotonic()
    wait_for(
        "the agent to kill the process over its 2 GiB cap",
        lambda: not Path(f"/proc/{pids[0]}").exists(),
        timeout=10,
        every=0.05,
    )
    print(f"\nover-cap kill {time.monotonic() - written:.2f}s after NVML showed 3 GiB used")
    gpu.processes = []
    nvml_node.write()


def _visible(local: LocalCluster, name: str) -> str:
    raw = local.get("pod", name)
    return env_of(local.container_log(raw, "app"))["NVIDIA_VISIBLE_DEVICES"]


def test_cgpu_smi_shows_nvml_memory_of_each_container(local: LocalCluster, nvml_node: NvmlNode):
    local.create([pod("seen", 4)])
    local.wait_running(WORKLOAD_LABEL, 1, timeout=60)
    pids = wait_for("the container's processes", lambda: container_pids("seen"), 10, 0.2)
    gpu = next(g for g in nvml_node.world.gpus if g.uuid in _visible(local, "seen"))
    gpu.processes = [FakeProcess(pids[0], used_bytes=1024**3)]
    nvml_node.write()

    def shown() -> dict[str, Any] | None:
        out = run([str(local.venv_bin / "cgpu-smi"), "--control-dir", str(local.control_dir),
                   "--json"]).stdout  # fmt: skip
        rows = [c for g in json.loads(out)["gpus"] for c in g["containers"]]
        mine = [c for c in rows if c["pod"] == "default/seen"]
        return mine[0] if mine and mine[0]["memory_used_bytes"] == 1024**3 else None

    row = wait_for("cgpu-smi to show 1 GiB used of 4", shown, timeout=20, every=0.5)
    assert row["memory_allocated_bytes"] == 4 * 1024**3
    out = run([str(local.venv_bin / "cgpu-smi"), "--control-dir", str(local.control_dir),
               "--json"]).stdout  # fmt: skip
    totals = {g["index"]: g["memory_total_bytes"] for g in json.loads(out)["gpus"]}
    assert totals == {0: 15 * 1024**3, 1: 23 * 1024**3}, "the GiB the node advertises"
    gpu.processes = []
    nvml_node.write()


# ----- The CUDA interposer, loaded by our Allocate as on a real node (docs/isolation.md)
#
# The pods run the fake-driver probe (tests/fakecuda) in the busybox image with the host's C
# library mounted in: what /etc/ld.so.preload names then loads into it, as into any
# program of a real GPU image. Its fake libcuda.so.1 has the pod's own GPU (the UUID
# Allocate put in NVIDIA_VISIBLE_DEVICES); the fake libnvidia-ml.so.1 reads the node's world.

HOST_LIBS = ("/lib/x86_64-linux-gnu", "/lib64")
PROBE = "FAKE_CUDA_DEVICES=$NVIDIA_VISIBLE_DEVICES:17179869184 /fake-cuda/probe"


@pytest.fixture(scope="module")
def fake_cuda(local: LocalCluster, nvml_node: NvmlNode) -> FakeCuda:
    if not all(Path(p).is_dir() for p in HOST_LIBS):
        pytest.skip(f"the host has no {' or '.join(HOST_LIBS)} to lend the probe's pods")
    try:
        return build_fake_cuda(local.our_dir / "fakecuda")
    except FakeCudaUnavailable as err:
        pytest.skip(str(err))


def probe_pod(
    local: LocalCluster, name: str, mem: int, core: int | None, probe: str, **env: str
) -> dict:
    command = f"env | sort; {PROBE} {probe}; cat /etc/ld.so.preload; sleep 3600"
    raw = pod(name, mem, core, command=command)
    mounts = {
        "/fake-cuda": (str(local.our_dir / "fakecuda"), "Directory"),
        "/fake-nvml": (str(local.our_dir / "fakenvml"), "Directory"),
        "/nvml-world": (str(local.our_dir / "nvml-world"), "File"),
        "/kernels": (str(local.our_dir / "kernels"), "DirectoryOrCreate"),
        **{path: (path, "Directory") for path in HOST_LIBS},
    }
    names = {path: f"v{i}" for i, path in enumerate(mounts)}
    spec = raw["spec"]
    spec["volumes"] = [
        {"name": names[path], "hostPath": {"path": host, "type": kind}}
        for path, (host, kind) in mounts.items()
    ]
    app = spec["containers"][0]
    app["volumeMounts"] = [
        {"name": names[path], "mountPath": path, "readOnly": path != "/kernels"} for path in mounts
    ]
    app["env"] = [
        {"name": key, "value": value}
        for key, value in {
            "LD_LIBRARY_PATH": "/fake-cuda:/fake-nvml",
            "FAKE_NVML_CONFIG": "/nvml-world",
            "FAKE_CUDA_LOCKS": "/kernels",
            "FAKE_CUDA_KERNELS": "sleep",
            **env,
        }.items()
    ]
    return raw


def probe_lines(local: LocalCluster, name: str, op: str, count: int = 1) -> list[dict[str, str]]:
    """The probe's output lines of `op`, once the container has printed `count` of them."""

    def printed() -> list[dict[str, str]] | None:
        log = local.container_log(local.get("pod", name), "app")
        lines = [parse_line(line) for line in log.splitlines() if line.startswith(f"{op} ")]
        return lines if len(lines) >= count else None

    return wait_for(f"{name} to print {op}", printed, timeout=60, every=0.5)


def test_a_capped_pod_is_refused_at_the_call_and_sees_its_cap(
    local: LocalCluster, nvml_node: NvmlNode, fake_cuda: FakeCuda
):
    gib = 1024**3
    commands = f"dlsym init 0 alloc mem {3 * gib} alloc mem {gib} info nvml $NVIDIA_VISIBLE_DEVICES"
    local.create([probe_pod(local, "capped", 2, None, commands)])
    local.wait_running(WORKLOAD_LABEL, 1, timeout=60)

    over, within = probe_lines(local, "capped", "alloc", 2)
    [info] = probe_lines(local, "capped", "info")
    [nvml] = probe_lines(local, "capped", "nvml")
    log = local.container_log(local.get("pod", "capped"), "app")
    assert over["rc"] == "2" and within["rc"] == "0"  # CUDA_ERROR_OUT_OF_MEMORY, then room
    assert (info["total"], info["free"]) == (str(2 * gib), str(gib))
    assert (nvml["rc"], nvml["total"], nvml["used"]) == ("0", str(2 * gib), str(gib))
    assert "/usr/local/lib/gpushare/libgpushare-cuda.so" in log


def test_a_pod_that_sets_cgpu_disable_is_left_alone(
    local: LocalCluster, nvml_node: NvmlNode, fake_cuda: FakeCuda
):
    gib = 1024**3
    raw = probe_pod(
        local, "free", 2, None, f"link init 0 alloc mem {3 * gib} info", CGPU_DISABLE="true"
    )
    local.create([raw])
    local.wait_running(WORKLOAD_LABEL, 1, timeout=60)

    [alloc] = probe_lines(local, "free", "alloc")
    [info] = probe_lines(local, "free", "info")
    log = local.container_log(local.get("pod", "free"), "app")
    assert alloc["rc"] == "0" and info["total"] == str(16 * gib)  # the fake's whole GPU
    assert "libgpushare-cuda.so" not in log  # no /etc/ld.so.preload was mounted


PACED = ("paced-a", "paced-b")


def test_two_pods_at_30_and_70_percent_are_paced_by_the_agent_at_their_launches(
    local: LocalCluster, nvml_node: NvmlNode, fake_cuda: FakeCuda
):
    """The agent finds each pod's region through Allocate's accounting directory and holds
    its launches at the gate in the slices its policy (fixed, auto on a core_mem GPU with
    compute percentages) gives the other; kernels take their time one at a time on the
    GPU, and each pod's kernel time is its share."""
    loop = "link init 0 alloc mem 1048576 sleep 6000 loop kernel 200 8000"
    local.create(
        [probe_pod(local, "paced-a", 1, 30, loop), probe_pod(local, "paced-b", 1, 70, loop)]
    )
    local.wait_running(WORKLOAD_LABEL, 2, timeout=60)
    pids = {n: wait_for(n, lambda n=n: container_pids(n), 10, 0.2) for n in PACED}
    [gpu_uuid] = {_visible(local, n) for n in pids}
    gpu = next(g for g in nvml_node.world.gpus if g.uuid == gpu_uuid)
    gpu.processes = [
        FakeProcess(pid, used_bytes=0, sm_percent=50) for found in pids.values() for pid in found
    ]
    nvml_node.write()
    tree = local.control_dir / str(nvml_node.world.gpus.index(gpu))

    def under_the_interposer() -> int:
        flags = [p / "interposer" for p in tree.iterdir() if (p / "interposer").is_file()]
        return sum(f.read_text().strip() == "1" for f in flags)

    try:
        # Shown in the control tree while they run (before their loops start).
        wait_for("both pods shown under the interposer", lambda: under_the_interposer() == 2,
                 timeout=5, every=0.2)  # fmt: skip
        # What the policy promises each while both have work (containers of pods deleted
        # less than forget_after_s ago still hold their part under fixed shares).
        entries = {
            (p / "pod").read_text().strip().removeprefix("default/"): p
            for p in tree.iterdir()
            if (p / "pod").is_file()
        }
        promised = {n: float((entries[n] / "limit").read_text()) / 100 for n in PACED}
        done = {n: probe_lines(local, n, "loop")[0] for n in pids}
    finally:
        gpu.processes = []
        nvml_node.write()
    shares = {n: int(d["busy_ns"]) / 1e9 / float(d["seconds"]) for n, d in done.items()}
    print(f"\ninterposer pacing, fixed 30/70: {shares}, promised {promised}")
    assert shares["paced-a"] / (shares["paced-a"] + shares["paced-b"]) == pytest.approx(
        0.30, abs=0.03
    )
    for name, share in shares.items():
        assert share == pytest.approx(promised[name], abs=0.05), (shares, promised)


def probe_pid(pod_name: str) -> int | None:
    """The host pid of the pod's probe (not its shell, nor the shell's sleep)."""
    for pid in container_pids(pod_name):
        try:
            if b"/fake-cuda/probe" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            continue
    return None


def interposer_flags(tree: Path) -> dict[str, str]:
    """Each container's `interposer` file in the GPU's control tree, by pod name."""
    return {
        (p / "pod").read_text().strip().removeprefix("default/"): (p / "interposer")
        .read_text()
        .strip()
        for p in tree.iterdir()
        if (p / "pod").is_file() and (p / "interposer").is_file()
    }


def test_a_tenant_that_truncates_its_region_is_refused_and_its_neighbour_keeps_its_cap(
    local: LocalCluster, nvml_node: NvmlNode, fake_cuda: FakeCuda
):
    """The tenant's first probe makes its region; it truncates /run/gpushare/cuda-region
    (its to write) and allocates 3,000 + 3,000 + 2,000 MiB of its 4 GiB: the library
    fails closed. The agent distrusts that region, and kills the probe when NVML shows it
    holding 8,000 MiB (what it would hold had it got past): it neither crashes nor
    restarts, and the neighbour on the same GPU stays paced under its own 4 GiB."""
    allocations = "alloc mem {} alloc mem {} alloc mem {}"
    tenant = probe_pod(local, "tenant", 4, None, "")
    tenant["spec"]["containers"][0]["command"] = ["sh", "-c", (
        f"env | sort; {PROBE} link init 0 info; : > /run/gpushare/cuda-region; "
        f"{PROBE} link init 0 {allocations.format(3000 * MIB, 3000 * MIB, 2000 * MIB)} "
        "reached 0 sleep 600000; sleep 3600"
    )]  # fmt: skip
    neighbour = probe_pod(
        local, "neighbour", 4, None,
        f"link init 0 {allocations.format(3000 * MIB, 2000 * MIB, 1000 * MIB)} "
        "reached 0 sleep 600000",
    )  # fmt: skip
    assert local.agent is not None and local.agent.process is not None
    agent_pid = local.agent.process.pid
    local.create([tenant, neighbour])
    local.wait_running(WORKLOAD_LABEL, 2, timeout=60)

    refused = probe_lines(local, "tenant", "alloc", 3)
    kept = probe_lines(local, "neighbour", "alloc", 3)
    [tenant_reached] = probe_lines(local, "tenant", "reached")
    [neighbour_reached] = probe_lines(local, "neighbour", "reached")
    assert [a["rc"] for a in refused] == ["2", "2", "2"] and tenant_reached["bytes"] == "0"
    assert "refusing every allocation" in local.container_log(local.get("pod", "tenant"), "app")
    assert [a["rc"] for a in kept] == ["0", "2", "0"]  # 3,000, not 5,000, then 4,000 MiB
    assert neighbour_reached["bytes"] == str(4000 * MIB)

    pids = {n: wait_for(n, lambda n=n: probe_pid(n), 10, 0.2) for n in ("tenant", "neighbour")}
    [gpu_uuid] = {_visible(local, n) for n in pids}
    gpu = next(g for g in nvml_node.world.gpus if g.uuid == gpu_uuid)
    tree = local.control_dir / str(nvml_node.world.gpus.index(gpu))
    gpu.processes = [
        FakeProcess(pids["tenant"], used_bytes=0, sm_percent=50),
        FakeProcess(pids["neighbour"], used_bytes=4000 * MIB, sm_percent=50),
    ]
    nvml_node.write()
    try:
        # (The tree may still show the pods of earlier tests on this GPU, for a while.)
        wait_for("the tenant's region distrusted, the neighbour paced",
                 lambda: interposer_flags(tree).items() >= {("tenant", "0"), ("neighbour", "1")}
                 and "(pod default/tenant): its region" in local.agent.since_start(),
                 timeout=10, every=0.2)  # fmt: skip
        gpu.processes[0] = FakeProcess(pids["tenant"], used_bytes=8000 * MIB, sm_percent=50)
        nvml_node.write()
        wait_for("the agent to kill the tenant's probe over its 4 GiB",
                 lambda: not Path(f"/proc/{pids['tenant']}").exists(),
                 timeout=10, every=0.05)  # fmt: skip
        gpu.processes = gpu.processes[1:]  # as NVML drops a process gone
        nvml_node.write()
        time.sleep(1)  # ten ticks more, the neighbour's process still listed
        assert local.agent.alive and local.agent.process.pid == agent_pid
        assert "tick failed" not in local.agent.since_start()
        assert Path(f"/proc/{pids['neighbour']}").exists()
        assert interposer_flags(tree)["neighbour"] == "1"
    finally:
        gpu.processes = []
        nvml_node.write()


def test_a_critical_xid_takes_the_gpu_out_of_allocatable(local: LocalCluster, nvml_node: NvmlNode):
    nvml_node.world.events.append(Event.xid(1, 79))
    nvml_node.write()
    started = time.monotonic()
    wait_for(
        "the A10 out of allocatable",
        lambda: local.allocatable("aliyun.com/gpu-mem") == 15,
        timeout=30,
        every=0.5,
    )
    print(f"\nXID 79: out of allocatable after {time.monotonic() - started:.1f}s")
    assert local.allocatable("aliyun.com/gpu-count") == 1


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks
    return total / os.sysconf("SC_CLK_TCK")


POLICIES = [
    # policy, max_inst, expected share of the first container (30 percent, weight 1) in
    # the GPU time the two busy containers got, and of the wall time, where fixed
    (0, 4, 0.50, 0.25),  # fair share: 1/max_inst each, idle slots stay idle
    (1, 16, 0.50, None),  # preemptive: 1/N of the N with work
    (2, 16, 0.25, None),  # weight-based: 1 : 3
    (3, 16, 0.30, 0.30),  # fixed: the compute percentage each asked
]


@pytest.fixture(scope="module")
def busy_pair(local: LocalCluster, nvml_node: NvmlNode) -> Iterator[tuple[int, dict]]:
    """Two containers that always have work, on one GPU: 30 percent with weight 1 and
    70 percent with weight 3, each listed by the fake NVML as a GPU process."""
    busy = 'trap "exit 0" TERM; env | sort; while :; do :; done'
    pods = []
    for name, core, weight in (("busy-a", 30, "1"), ("busy-b", 70, "3")):
        raw = pod(name, 2, core, command=busy)
        raw["spec"]["containers"][0]["env"] = [
            {"name": "ALIYUN_COM_GPU_SCHD_WEIGHT", "value": weight}
        ]
        pods.append(raw)
    local.create(pods)
    local.wait_running(WORKLOAD_LABEL, 2, timeout=60)
    pids = {n: wait_for(n, lambda n=n: container_pids(n), 10, 0.2) for n in ("busy-a", "busy-b")}
    [gpu_uuid] = {_visible(local, n) for n in pids}
    [index] = [i for i, g in enumerate(nvml_node.world.gpus) if g.uuid == gpu_uuid]
    gpu = nvml_node.world.gpus[index]
    gpu.processes = [FakeProcess(p[0], used_bytes=1024**3, sm_percent=50) for p in pids.values()]
    nvml_node.write()
    yield index, pids
    gpu.processes = []
    nvml_node.write()
    set_gpu(local, index, "policy", 3)
    set_gpu(local, index, "max_inst", 16)
    local.kubectl("delete", "pods", "busy-a", "busy-b", "--grace-period=0", "--force")


def set_gpu(local: LocalCluster, index: int, setting: str, value: int) -> None:
    """Writes a GPU's setting into the control tree until the agent keeps it: it refuses
    (and restores) a max_inst below the weight its containers hold, which includes
    containers of pods deleted less than forget_after_s ago."""
    path = local.control_dir / str(index) / setting

    def kept() -> bool:
        path.write_text(f"{value}\n")
        time.sleep(0.5)
        return path.read_text().strip() == str(value)

    wait_for(f"GPU {index} {setting}={value} kept", kept, timeout=60, every=1)


@pytest.mark.parametrize(("policy", "max_inst", "ratio", "of_wall"), POLICIES,
                         ids=[f"policy-{p[0]}" for p in POLICIES])  # fmt: skip
def test_compute_shares_follow_the_gpus_policy_on_real_containers(
    local: LocalCluster,
    busy_pair: tuple[int, dict],
    policy: int,
    max_inst: int,
    ratio: float,
    of_wall: float | None,
):
    """The agent slices time by freezing the containers whose turn it is not; CPU time
    of the two busy loops stands in for GPU time."""
    index, pids = busy_pair
    set_gpu(local, index, "max_inst", max_inst)
    set_gpu(local, index, "policy", policy)
    time.sleep(2)  # the agent applies the write and settles into its slices
    before = {n: cpu_seconds(p) for n, p in pids.items()}
    started = time.monotonic()
    time.sleep(8)
    elapsed = time.monotonic() - started
    used = {n: cpu_seconds(p) - before[n] for n, p in pids.items()}
    share = used["busy-a"] / (used["busy-a"] + used["busy-b"])
    print(f"\npolicy {policy}: 30-percent/weight-1 container got {100 * share:.1f} percent "
          f"of the pair's time, {100 * used['busy-a'] / elapsed:.1f} percent of the wall time "
          f"(other: {100 * used['busy-b'] / elapsed:.1f})")  # fmt: skip
    assert abs(share - ratio) <= 0.03
    if of_wall is not None:
        assert abs(used["busy-a"] / elapsed - of_wall) <= 0.03
