"""The interposer over a real GPU and PyTorch (marker `gpu`; skipped, saying why, without
one): a program allocating past its cap gets torch.cuda.OutOfMemoryError, with and without
expandable segments (cuMemCreate), PyTorch and NVML see the cap as the GPU's total, and
two processes whose gates follow a 30/70 fixed-share schedule get 30/70 of the GPU.

Each figure is printed (run with -s) and, where GPUSHARE_GPU_FIGURES names a file,
appended to it as a JSON line.
"""

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpushare.isolation.interposer.build import build_library
from gpushare.isolation.interposer.region import Region

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
