"""The interposer over a real GPU and PyTorch (marker `gpu`; skipped, saying why, without
one): a program allocating past its cap gets torch.cuda.OutOfMemoryError, with and without
expandable segments (cuMemCreate), PyTorch and NVML see the cap as the GPU's total, NVML
never lists a process growing expandable segments past its cap with more than its cap plus
the agent's slack, what a memory pool keeps after its frees counts against the cap until
it is trimmed, and two processes whose gates follow a 30/70 fixed-share schedule get 30/70
of the GPU.

Each figure is printed (run with -s) and, where GPUSHARE_GPU_FIGURES names a file,
appended to it as a JSON line.
"""

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from gpushare.isolation.interposer.build import build_library
from gpushare.isolation.interposer.region import Region
from gpushare.isolation.memory import SLACK_PER_PROCESS_BYTES

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the gpu tests drive it")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible to PyTorch"),
]

GIB = 1 << 30
CAP_GIB = 4
SLICE_S = 0.1
SHARE_A = 0.30


def figure(name: str, **values: object) -> None:
    line = json.dumps({"figure": name, **values})
    print(line)
    target = os.environ.get("GPUSHARE_GPU_FIGURES")
    if target:
        with open(target, "a") as out:
            out.write(line + "\n")


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_library(tmp_path_factory.mktemp("interposer"))


@pytest.fixture(scope="module")
def gpu_uuid() -> str:
    listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True)
    return listing.stdout.split("UUID: ", 1)[1].split(")", 1)[0]


def container_env(library: Path, region: Path, uuid: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTORCH_CUDA_ALLOC")}
    env.update(
        LD_PRELOAD=str(library),
        GPUSHARE_CUDA_REGION=str(region),
        ALIYUN_COM_GPU_MEM_CONTAINER=str(CAP_GIB),
        NVIDIA_VISIBLE_DEVICES=uuid,
        **extra,
    )
    return env


TO_THE_CAP = r"""
import json, torch, pynvml
torch.cuda.init()
free, total = torch.cuda.mem_get_info()
pynvml.nvmlInit()
nvml = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0))
blocks, oom = [], None
try:
    while True:
        blocks.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
except torch.cuda.OutOfMemoryError as err:
    oom = str(err).splitlines()[0][:160]
used = torch.cuda.mem_get_info()
print(json.dumps({"total": total, "free": free, "nvml_total": nvml.total,
                  "held": len(blocks) * (256 << 20), "oom": oom,
                  "free_after": used[0], "reserved": torch.cuda.memory_reserved()}))
"""


@pytest.mark.parametrize("expandable", [False, True], ids=["cudaMalloc", "expandable-segments"])
def test_pytorch_gets_out_of_memory_at_its_cap_and_sees_the_cap(
    library: Path, gpu_uuid: str, tmp_path: Path, expandable: bool
) -> None:
    extra = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"} if expandable else {}
    env = container_env(library, tmp_path / "region", gpu_uuid, **extra)
    run = subprocess.run(
        [sys.executable, "-c", TO_THE_CAP], env=env, capture_output=True, text=True, timeout=180
    )
    assert run.returncode == 0, run.stderr[-2000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    figure("to-the-cap", expandable=expandable, cap_gib=CAP_GIB, **seen)

    assert seen["oom"] is not None, "PyTorch allocated past the cap"
    assert seen["total"] == seen["nvml_total"] == CAP_GIB * GIB
    assert CAP_GIB * GIB - GIB <= seen["held"] <= CAP_GIB * GIB
    assert seen["free_after"] < 512 << 20
    with Region.open(tmp_path / "region") as region:
        assert region.gpus()[0].used_bytes == 0  # the process ended: no live slot holds any


WORK = r"""
import json, sys, time, torch
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
for _ in range(20):
    a @ b
torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.readline()
n, start = 0, time.monotonic()
while time.monotonic() - start < float(sys.argv[1]):
    a @ b
    torch.cuda.synchronize()  # a request at a time, as an inference server answers
    n += 1
print(json.dumps({"iterations": n, "seconds": time.monotonic() - start}), flush=True)
"""


class Worker:
    def __init__(self, library: Path, region: Path, uuid: str, seconds: float) -> None:
        self.region = region
        self.process = subprocess.Popen(
            [sys.executable, "-c", WORK, str(seconds)],
            env=container_env(library, region, uuid),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        assert self.process.stdout.readline().strip() == "ready"

    def go(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("go\n")
        self.process.stdin.flush()

    def rate(self) -> float:
        out, _ = self.process.communicate(timeout=120)
        done = json.loads(out.strip().splitlines()[-1])
        return float(done["iterations"]) / float(done["seconds"])


@pytest.fixture
def workers(library: Path, gpu_uuid: str, tmp_path: Path) -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.process.kill()


def test_two_processes_paced_at_30_70_share_the_gpu_30_70(
    library: Path, gpu_uuid: str, tmp_path: Path, workers: list[Worker]
) -> None:
    seconds = 6.0
    alone = Worker(library, tmp_path / "alone", gpu_uuid, 3.0)
    workers.append(alone)
    alone.go()
    solo = alone.rate()

    a = Worker(library, tmp_path / "a", gpu_uuid, seconds)
    b = Worker(library, tmp_path / "b", gpu_uuid, seconds)
    workers.extend([a, b])
    with Region.open(a.region) as gate_a, Region.open(b.region) as gate_b:
        a.go()
        b.go()
        start = time.monotonic()
        while time.monotonic() - start < seconds + 0.5:
            # The agent's fixed policy: A runs the first 30 ms of each 100 ms slice.
            a_turn = (time.monotonic() - start) % SLICE_S < SHARE_A * SLICE_S
            gate_a.set_gate(0, open=a_turn)
            gate_b.set_gate(0, open=not a_turn)
            time.sleep(0.001)
        gate_a.set_gate(0, open=True)
        gate_b.set_gate(0, open=True)
        held = (gate_a.gpus()[0].held_ns / 1e9, gate_b.gpus()[0].held_ns / 1e9)
    rate_a, rate_b = a.rate(), b.rate()
    share = rate_a / (rate_a + rate_b)
    figure(
        "paced-30-70",
        solo_per_s=round(solo, 1),
        a_per_s=round(rate_a, 1),
        b_per_s=round(rate_b, 1),
        share_a=round(share, 3),
        a_of_solo=round(rate_a / solo, 3),
        b_of_solo=round(rate_b / solo, 3),
        held_s=[round(h, 2) for h in held],
    )
    assert share == pytest.approx(SHARE_A, abs=0.05)


GROW_PAST_THE_CAP = r"""
import json, sys, torch
torch.cuda.init()
blocks, oom = [], None
try:
    while True:
        blocks.append(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
except torch.cuda.OutOfMemoryError as err:
    oom = str(err).splitlines()[0][:160]
print(json.dumps({"held": len(blocks) * (64 << 20), "oom": oom,
                  "reserved": torch.cuda.memory_reserved()}), flush=True)
sys.stdin.readline()
"""


@pytest.fixture(scope="module")
def nvml(gpu_uuid: str) -> Iterator[object]:
    """The GPU's NVML handle, in this process (no interposer: what the agent sees)."""
    pynvml.nvmlInit()
    yield pynvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
    pynvml.nvmlShutdown()


class NvmlSampler(threading.Thread):
    """What NVML lists one process as holding on the GPU, every 10 ms until stopped."""

    def __init__(self, handle: object, pid: int) -> None:
        super().__init__(daemon=True)
        self.handle, self.pid = handle, pid
        self.samples: list[int] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            listed = pynvml.nvmlDeviceGetComputeRunningProcesses(self.handle)
            # In a pid namespace NVML names processes by their host pids: then every
            # process on the GPU, which is the child alone while this test runs.
            mine = [p for p in listed if p.pid == self.pid] or listed
            self.samples.extend(p.usedGpuMemory for p in mine if p.usedGpuMemory is not None)
            self.stop.wait(0.01)


def test_expandable_segments_stop_at_the_cap_and_nvml_never_lists_more_than_cap_and_slack(
    library: Path, gpu_uuid: str, nvml: object, tmp_path: Path
) -> None:
    """PyTorch maps its expandable segments with cuMemCreate + cuMemMap, a chunk at a time:
    each chunk is charged, so it gets OutOfMemoryError at 2 GiB, and NVML (the agent's
    backstop) never sees it hold more than the cap plus the slack a context gets."""
    cap = 2 * GIB
    env = container_env(
        library, tmp_path / "region", gpu_uuid, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True"
    )
    env["ALIYUN_COM_GPU_MEM_CONTAINER"] = str(cap // GIB)
    child = subprocess.Popen(
        [sys.executable, "-c", GROW_PAST_THE_CAP],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    sampler = NvmlSampler(nvml, child.pid)
    sampler.start()
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        time.sleep(0.2)  # a few samples at its peak: it holds all it got until told
    finally:
        sampler.stop.set()
        sampler.join()
        _, err = child.communicate("done\n", timeout=60)
    assert line, err[-2000:]
    seen = json.loads(line)
    most = max(sampler.samples, default=None)
    figure("expandable-to-the-cap", cap=cap, nvml_most=most, slack=SLACK_PER_PROCESS_BYTES, **seen)

    assert seen["oom"] is not None, "PyTorch grew its expandable segments past the cap"
    assert seen["held"] <= seen["reserved"] <= cap
    assert most is not None, "NVML never listed the process"
    assert most <= cap + SLACK_PER_PROCESS_BYTES


POOL_KEEPS = r"""
import ctypes, json
cuda = ctypes.CDLL("libcuda.so.1")
MIB = 1 << 20
RELEASE_THRESHOLD = 4  # CU_MEMPOOL_ATTR_RELEASE_THRESHOLD
def check(rc):
    assert rc == 0, rc
def alloc(mib):
    pointer = ctypes.c_ulonglong()
    rc = cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(mib * MIB))
    if rc == 0:
        check(cuda.cuMemFree_v2(pointer))
    return rc
check(cuda.cuInit(0))
device, context, pool = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p()
check(cuda.cuDeviceGet(ctypes.byref(device), 0))
check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device))
check(cuda.cuCtxSetCurrent(context))
check(cuda.cuDeviceGetDefaultMemPool(ctypes.byref(pool), device))
keep_all = ctypes.c_uint64(2**64 - 1)
check(cuda.cuMemPoolSetAttribute(pool, RELEASE_THRESHOLD, ctypes.byref(keep_all)))
pointer = ctypes.c_ulonglong()
took = cuda.cuMemAllocAsync(ctypes.byref(pointer), ctypes.c_size_t(900 * MIB), None)
check(cuda.cuMemFreeAsync(pointer, None))
check(cuda.cuStreamSynchronize(None))  # the pool keeps it: its threshold is above it
kept = alloc(900)
check(cuda.cuMemPoolTrimTo(pool, ctypes.c_size_t(0)))
print(json.dumps([took, kept, alloc(900)]))
"""


def test_what_a_pool_keeps_after_its_free_counts_against_the_cap_until_it_is_trimmed(
    library: Path, gpu_uuid: str, tmp_path: Path
) -> None:
    """900 MiB from the default pool, freed, kept by the driver (release threshold at its
    most): under a 1 GiB cap a plain 900 MiB allocation is refused until the pool is
    trimmed, as the driver still holds the first 900 MiB for this process."""
    env = container_env(library, tmp_path / "region", gpu_uuid)
    env["ALIYUN_COM_GPU_MEM_CONTAINER"] = "1"
    run = subprocess.run(
        [sys.executable, "-c", POOL_KEEPS], env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-2000:]
    took, kept, trimmed = json.loads(run.stdout.strip().splitlines()[-1])
    figure("pool-keeps", took=took, while_kept=kept, after_trim=trimmed)

    out_of_memory = 2  # CUDA_ERROR_OUT_OF_MEMORY
    assert (took, kept, trimmed) == (0, out_of_memory, 0)
