"""The flags both node binaries take, defined once: gpushare-device-plugin and
gpushare-isolation run side by side in the node DaemonSet's pod, and the chart hands
both the same --node-name, --backend, --mock-gpus, --gpu-memory-rounding and
--log-level, so each flag means the same in both, with the same default.

--metrics-port is shared too, but its default is each binary's own: the two share
the pod's network namespace, so they cannot listen on one port.
"""

import argparse
import os
from pathlib import Path
from typing import Final

from gpushare.commandline import InputFileError, read_text
from gpushare.inventory import MemoryRounding

BACKENDS: Final = ("nvml", "mock")
INTERPOSER_DIR: Final = Path("/var/lib/gpushare/interposer")
LOG_LEVELS: Final = ("debug", "info", "warning", "error")


def add_node_flags(parser: argparse.ArgumentParser, metrics_port: int) -> None:
    """Adds the shared flags to `parser`, their defaults read from the environment where
    an env variable is named; `metrics_port` is the binary's own. Run `check_node_flags`
    on what the parser returns."""
    env = os.environ
    parser.add_argument(
        "--node-name",
        default=env.get("NODE_NAME", ""),
        help="this node's name, as the API server knows it: the device plugin follows that "
        "Node and its pods, both binaries name their logs, metrics and mock GPU UUIDs after "
        "it (env NODE_NAME, which the chart sets from spec.nodeName; required)",
    )
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default=env.get("GPUSHARE_BACKEND") or "nvml",
        help="where GPUs come from: nvml (the node's NVIDIA GPUs, through the driver) or "
        "mock (simulated GPUs from --mock-gpus) (env GPUSHARE_BACKEND; default %(default)s)",
    )
    parser.add_argument(
        "--mock-gpus",
        metavar="LAYOUT",
        type=layout_or_file,
        default=env.get("GPUSHARE_MOCK_GPUS", ""),
        help="mock backend: its GPUs as COUNTxSIZEGiB[:MODEL],..., e.g. 2x16GiB,1x80GiB:A100, "
        "or a file holding such a layout (env GPUSHARE_MOCK_GPUS; needed with --backend mock)",
    )
    parser.add_argument(
        "--gpu-memory-rounding",
        type=MemoryRounding,
        choices=list(MemoryRounding),
        default=env.get("GPUSHARE_GPU_MEMORY_ROUNDING") or MemoryRounding.UP.value,
        help="nvml backend: how a GPU's memory becomes whole GiB. up counts as ACK does (a "
        "Tesla T4's 15,109 MiB is 15 GiB, an A10's 22,731 MiB 23), so the last slice of a "
        "full GPU may hold up to 1 GiB less than it says; down never promises more than "
        "the GPU has (T4 14, A10 22). Give both binaries of a node the same value (env "
        "GPUSHARE_GPU_MEMORY_ROUNDING; default %(default)s)",
    )
    parser.add_argument(
        "--interposer-dir",
        type=directory_or_off,
        default=directory_or_off(env.get("GPUSHARE_INTERPOSER_DIR", str(INTERPOSER_DIR))),
        help="the node directory (a hostPath both node containers mount at this same path) "
        "where the isolation agent puts the CUDA interposer and an ld.so.preload naming it, "
        "and the device plugin makes each container's accounting directory; Allocate loads "
        "the interposer into containers of cgpu and core_mem nodes once the agent has put "
        "it there. An empty value turns the interposer off on this node: memory caps and "
        "compute shares are then enforced by the agent alone, after the fact (env "
        "GPUSHARE_INTERPOSER_DIR; default %(default)s)",
    )
    parser.add_argument(
        "--metrics-port",
        type=port,
        default=metrics_port,
        help="port of the Prometheus /metrics endpoint; 0 turns it off (default %(default)s)",
    )
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default="info",
        help="log level (default %(default)s)",
    )


def check_node_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exits through parser.error (status 2) when no node name was given."""
    if not args.node_name:
        parser.error("--node-name (or env NODE_NAME) is required")


def layout_or_file(value: str) -> str:
    """The layout itself, or the content of the file `value` names (a ConfigMap mount):
    a path that exists is read as such, so a directory or an unreadable file is said."""
    if not (value and os.path.lexists(value)):
        return value
    try:
        return read_text(value, "file").strip()
    except InputFileError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def port(value: str) -> int:
    number = int(value)
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0..65535, got {number}")
    return number


def directory_or_off(value: str) -> Path | None:
    """A directory flag whose empty value turns its feature off."""
    return Path(value) if value.strip() else None
