"""Resource names, labels and the units the Kubernetes-facing model counts in."""

from typing import Final

GPU_MEM: Final = "aliyun.com/gpu-mem"
"""GPU memory in GiB on one GPU (or split over M GPUs with the pod label below)."""

GPU_COUNT: Final = "aliyun.com/gpu-count"
"""As a resource limit: whole GPUs, exclusive. As a pod label: split gpu-mem over M GPUs."""

GPU_CORE: Final = "aliyun.com/gpu-core.percentage"
"""Compute share of one GPU in percent, a multiple of 5 in 5..100."""

MANAGED_RESOURCES: Final = (GPU_MEM, GPU_COUNT, GPU_CORE)

POD_LABEL_GPU_COUNT: Final = "aliyun.com/gpu-count"

CORE_STEP: Final = 5
CORE_PER_GPU: Final = 100
DEFAULT_MAX_PODS_PER_GPU: Final = 20

SCHEDULER_NAME: Final = "gpushare-scheduler"

ACK_SCHEDULER_NAME: Final = "ack-co-scheduler"
"""The scheduler name ACK's documentation writes into GPU-sharing pods (its sample Job
gpu-share-sample); gpushare serves it too by default, so those pods run unchanged."""

GIB: Final = 1024**3
