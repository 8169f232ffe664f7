"""BestFit: the node left with the least free CPU and GPU after the pod lands.

The FGD paper's strongest packing baseline: score = floor(100 * (1 - 1/2 * CPU
left / 128 cores - 1/2 * GPU left / 8 GPUs)), the pod's slice going to the
fullest GPU it fits on. Where CPU is not tracked (Kubernetes nodes) only the GPU
term counts. GPU left is in fractions of a GPU, so GiB and milli-GPU nodes compare.
"""

import math

from gpushare.placement.fit import Assignment, PlacementPolicy
from gpushare.placement.fragmentation import devices_after
from gpushare.placement.workload import MILLI
from gpushare.request import PodRequest
from gpushare.state import GpuView, NodeView

CPU_SCALE = 128_000
"""milli-CPU of the largest node the paper's formula normalises by."""
GPU_SCALE = 8 * MILLI
"""milli-GPU of the largest node (8 GPUs)."""


class BestFitPolicy(PlacementPolicy):
    name = "bestfit"
    nameless = True

    def gpu_key(self, gpu: GpuView, mem_after: int, core_after: int) -> tuple[int, ...]:
        return (mem_after, core_after, gpu.index)

    def score(self, view: NodeView, request: PodRequest, assignment: Assignment) -> float:
        gpu_left = sum(d[0] for d in devices_after(view, assignment))
        # Summed in the paper simulator's order (CPU, then GPU), so truncation agrees.
        cpu_left = None if view.cpu_free is None else view.cpu_free - (request.cpu_milli or 0)
        waste = 0.0 if cpu_left is None else cpu_left / CPU_SCALE * 0.5
        waste += gpu_left / GPU_SCALE * 0.5
        # Never above 100: the pod fits, so no term is negative. Below 0 on nodes
        # larger than the paper's scales (more than 8 GPUs or 128 cores left).
        return float(max(math.floor((1.0 - waste) * 100), 0))
