"""The flags of the GPU backend that both node components take, and the backend they
choose: `gpushare-device-plugin` and `gpushare-dra-plugin` read their GPUs alike
(the shared flags of `gpushare.nodeflags` come first: --node-name, --backend,
--mock-gpus, --gpu-memory-rounding)."""

import argparse
import os
from pathlib import Path
from typing import Final

from gpushare.gpunode.backends.mock import MockBackend
from gpushare.gpunode.backends.nvml import NvmlBackend
from gpushare.gpunode.backends.port import DeviceBackend
from gpushare.nvmllib import bindings

MOCK_HEALTH_FILE: Final = Path("/tmp/gpushare-mock-unhealthy-gpus")
"""Under /tmp: writable in the node pod, whose root filesystem is read-only."""


def add_backend_flags(parser: argparse.ArgumentParser) -> None:
    """--mock-health-file and --dev-root, their defaults read from the environment."""
    env = os.environ
    parser.add_argument(
        "--mock-health-file",
        type=Path,
        default=Path(env.get("GPUSHARE_MOCK_HEALTH_FILE", str(MOCK_HEALTH_FILE))),
        help="mock backend: file listing the indices of GPUs to report Unhealthy, polled "
        "every second (env GPUSHARE_MOCK_HEALTH_FILE)",
    )
    parser.add_argument(
        "--dev-root",
        type=Path,
        default=Path(env.get("GPUSHARE_DEV_ROOT", "/dev")),
        help="nvml backend: where this process sees the node's /dev. The component looks "
        "there for the control device files (nvidiactl, nvidia-uvm, nvidia-uvm-tools, "
        "nvidia-modeset) and hands each GPU container those that exist, as /dev/<name> of "
        "the node (env GPUSHARE_DEV_ROOT)",
    )


def build_backend(args: argparse.Namespace) -> DeviceBackend:
    """The backend the flags choose. Raises ValueError naming the flag that is unusable."""
    if args.backend == "mock":
        if not args.mock_gpus:
            raise ValueError(
                "--backend mock needs --mock-gpus (or GPUSHARE_MOCK_GPUS), e.g. 2x16GiB"
            )
        health = args.mock_health_file
        if os.path.lexists(health) and not health.is_file():
            # It is polled every second: a FIFO there would hang the poll, a directory fail it.
            raise ValueError(f"--mock-health-file {health}: not a regular file")
        return MockBackend.from_layout(args.mock_gpus, args.node_name, health)
    return NvmlBackend(bindings(), dev_root=args.dev_root, memory_rounding=args.gpu_memory_rounding)
