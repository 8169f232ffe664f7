"""How ACK's `aliyun.com/gpu-mem: N` can reach DRA, measured
(docs/dra.md#the-mechanism-and-what-the-other-one-would-cost).

(a) ours: the webhook rewrites the pod to a claim asking N GiB of `memory` capacity on
    one shareable device per GPU;
(b) KEP-5004: a DeviceClass with extendedResourceName aliyun.com/gpu-mem maps the
    quantity to a device COUNT (DRA-INTERFACES §7), so each GPU would be published as
    one device per GiB and a pod asking N GiB gets N such devices, chosen by the
    allocator with no constraint that they be on one GPU.

On the openb trace's sharing pods (one GPU, a fraction of it; GiB = the fraction of the
GPU's memory, rounded up), allocated in trace order on nodes of one type until one is
full, then a fresh node: how many devices and slices a node publishes, the slice's
size, the allocator's time per claim (`dra.allocator`, first eligible device in slice
order), and how many pods (b) gives memory on two GPUs, which one CUDA allocation
cannot use (a 10 GiB tensor does not fit in 6 + 4 GiB of two GPUs).

Run: .venv/bin/python bench/dra_mechanism_bench.py [--pods N]
"""

import argparse
import csv
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path

from gpushare.dra.allocator import (
    Allocation,
    Device,
    DeviceClaim,
    DeviceLedger,
    DeviceRequest,
)
from gpushare.dra.capacity import Capacity, RequestPolicy, ValidRange
from gpushare.dra.claims import DRIVER, MEMORY, SHARES
from gpushare.dra.objects import Device as SliceDevice
from gpushare.dra.objects import (
    DeviceAttribute,
    DeviceCapacity,
    ObjectMeta,
    ResourcePool,
    ResourceSlice,
    ResourceSliceSpec,
)
from gpushare.dra.slices import NodeRef, node_slice
from gpushare.inventory import Gpu
from gpushare.labels import NodeMode

ROOT = Path(__file__).resolve().parents[1]
PODS = ROOT / "data/openb/openb_pod_list_default.csv"
GIB = 1024**3
NODE_TYPES = {"2x T4 (15 GiB)": (2, 15), "8x V100 (32 GiB)": (8, 32), "8x A100 (80 GiB)": (8, 80)}
MAX_DEVICES_PER_SLICE = 128


def sharing_fractions(limit: int) -> list[float]:
    """The openb pods that share one GPU, as the fraction of it each asks."""
    fractions = []
    with PODS.open() as rows:
        for row in csv.DictReader(rows):
            if row["num_gpu"] == "1" and 0 < int(row["gpu_milli"]) < 1000:
                fractions.append(int(row["gpu_milli"]) / 1000)
            if len(fractions) == limit:
                break
    return fractions


def ours(gpus: int, gib: int) -> list[Device]:
    memory = Capacity(gib * GIB, RequestPolicy(gib * GIB, valid_range=ValidRange(GIB, None, GIB)))
    shares = Capacity(20, RequestPolicy(1, valid_values=(1, 20)))
    return [
        Device(DRIVER, "node", f"gpu-{i}", {"index": i}, {MEMORY: memory, SHARES: shares}, True)
        for i in range(gpus)
    ]


def per_gib(gpus: int, gib: int) -> list[Device]:
    return [
        Device(DRIVER, "node", f"gpu-{i}-gib-{k}", {"index": i})
        for i in range(gpus)
        for k in range(gib)
    ]


def _any(device: Device) -> bool:
    return True


def claims(fractions: list[float], gib: int, mechanism: str) -> Iterator[tuple[int, DeviceClaim]]:
    for fraction in fractions:
        asked = max(1, math.ceil(fraction * gib))
        if mechanism == "ours":
            request = DeviceRequest("main", _any, 1, {MEMORY: asked * GIB})
        else:
            request = DeviceRequest("container-0-request-0", _any, asked)
        yield asked, DeviceClaim((request,))


def run(fractions: list[float], gpus: int, gib: int, mechanism: str) -> dict[str, float]:
    devices = ours(gpus, gib) if mechanism == "ours" else per_gib(gpus, gib)
    ledger = DeviceLedger(devices)
    placed = split = 0
    seconds = 0.0
    nodes = 1
    for _, claim in claims(fractions, gib, mechanism):
        started = time.perf_counter()
        result = ledger.allocate(claim)
        seconds += time.perf_counter() - started
        if not isinstance(result, Allocation):
            ledger, nodes = DeviceLedger(devices), nodes + 1
            started = time.perf_counter()
            result = ledger.allocate(claim)
            seconds += time.perf_counter() - started
            if not isinstance(result, Allocation):
                continue  # larger than a node
        placed += 1
        by_gpu = {r.device.split("-")[1] for r in result.results}
        split += len(by_gpu) > 1
    return {
        "devices": len(devices),
        "slices": math.ceil(len(devices) / MAX_DEVICES_PER_SLICE),
        "placed": placed,
        "split": split,
        "nodes": nodes,
        "us_per_claim": seconds / max(1, placed) * 1e6,
    }


def slice_bytes(gpus: int, gib: int, mechanism: str) -> int:
    """Bytes of the node's slice(s) as JSON."""
    if mechanism == "ours":
        published = node_slice(
            NodeRef("gpu-node-0001", "00000000-0000-4000-8000-000000000001"),
            tuple(
                Gpu(i, f"GPU-{i:08x}-0000-0000-0000-000000000000", gib, "A100") for i in range(gpus)
            ),
            NodeMode.CORE_MEM,
            sharing=True,
        )
        return len(json.dumps(published.to_api()))
    devices = [
        SliceDevice(
            name=f"gpu-{i}-gib-{k}",
            attributes={
                "uuid": DeviceAttribute.of(f"GPU-{i:08x}"),
                "index": DeviceAttribute.of(i),
            },
            capacity={MEMORY: DeviceCapacity(value="1Gi")},
        )
        for i in range(gpus)
        for k in range(gib)
    ]
    total = 0
    for start in range(0, len(devices), MAX_DEVICES_PER_SLICE):
        part = ResourceSlice(
            metadata=ObjectMeta(name="gpu-node-0001-gpu.gpushare.io-x"),
            spec=ResourceSliceSpec(
                driver=DRIVER,
                pool=ResourcePool(name="gpu-node-0001", resource_slice_count=1),
                node_name="gpu-node-0001",
                devices=devices[start : start + MAX_DEVICES_PER_SLICE],
            ),
        )
        total += len(json.dumps(part.to_api()))
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=3000, help="openb sharing pods to allocate")
    args = parser.parse_args()
    fractions = sharing_fractions(args.pods)
    print(f"openb sharing pods: {len(fractions)} (one GPU, a fraction of it)")
    header = (
        f"{'node':<18} {'mechanism':<10} {'devices':>7} {'slices':>6} {'slice KiB':>9} "
        f"{'nodes':>5} {'split':>12} {'us/claim':>9}"
    )
    print(header)
    for label, (gpus, gib) in NODE_TYPES.items():
        for mechanism in ("ours", "kep-5004"):
            figures = run(fractions, gpus, gib, mechanism)
            kib = slice_bytes(gpus, gib, mechanism) / 1024
            share = figures["split"] / max(1, figures["placed"]) * 100
            print(
                f"{label:<18} {mechanism:<10} {figures['devices']:>7.0f} {figures['slices']:>6.0f} "
                f"{kib:>9.1f} {figures['nodes']:>5.0f} "
                f"{figures['split']:>5.0f} ({share:4.1f}%) {figures['us_per_claim']:>9.1f}"
            )


if __name__ == "__main__":
    main()
