"""`gpushare-isolation`: the node agent that enforces GPU memory caps and compute time slices.

Runs beside the device plugin on every GPU node (privileged, host PID
namespace, the host's /proc and cgroup tree mounted). Each slice it reads the
GPU processes and the limits in their environment, kills (or reports) those
over their memory cap, and freezes the containers whose turn it is not, per
each GPU's cGPU policy. Settings and state live in the control tree, which
`cgpu-smi` reads.
"""

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Final

from gpushare.commandline import (
    InputFileError,
    UsageError,
    add_version_flag,
    check_directory,
    exit_status,
    package_version,
)
from gpushare.inventory import parse_layout
from gpushare.isolation.agent import AgentConfig, IsolationAgent
from gpushare.isolation.backends.mock import MockBackend, discovered_containers, mock_devices
from gpushare.isolation.backends.nvml import NvmlBackend
from gpushare.isolation.backends.port import IsolationBackend
from gpushare.isolation.backends.procfs import ProcessTable
from gpushare.isolation.clock import Clock, SystemClock
from gpushare.isolation.control import ControlTree
from gpushare.isolation.interposer.build import BuildFailed, CompilerMissing
from gpushare.isolation.interposer.install import install
from gpushare.isolation.memory import MIB, SLACK_MOST_BYTES, SLACK_PER_PROCESS_BYTES, MemoryAction
from gpushare.isolation.metrics import AgentMetrics
from gpushare.isolation.policy import (
    DEFAULT_MAX_INST,
    DEFAULT_PRIO_RATIO,
    InvalidSetting,
    parse_max_inst,
    parse_policy,
    parse_prio_ratio,
)
from gpushare.isolation.smi import DEFAULT_CONTROL_DIR
from gpushare.nodeflags import add_node_flags, check_node_flags
from gpushare.nodeflags.serving import start_metrics
from gpushare.nvmllib import bindings

log = logging.getLogger("gpushare.isolation")

METRICS_PORT: Final = 9402
"""The device plugin's is 9401: both listen in the node pod's one network namespace."""


def agent_version() -> str:
    return f"gpushare-isolation {package_version()}"


def build_parser() -> argparse.ArgumentParser:
    env = os.environ
    parser = argparse.ArgumentParser(
        prog="gpushare-isolation",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_node_flags(parser, METRICS_PORT)
    parser.add_argument(
        "--control-dir",
        type=Path,
        default=Path(env.get("GPUSHARE_CONTROL_DIR") or DEFAULT_CONTROL_DIR),
        help="the control tree mirroring cGPU's procfs (env GPUSHARE_CONTROL_DIR; "
        "default %(default)s)",
    )
    parser.add_argument(
        "--proc-root",
        type=Path,
        default=Path("/proc"),
        help="the host's /proc, for process environments and cgroups (default %(default)s)",
    )
    parser.add_argument(
        "--cgroup-root",
        type=Path,
        default=Path("/sys/fs/cgroup"),
        help="the host's cgroup tree, for freezing containers (default %(default)s)",
    )
    parser.add_argument(
        "--memory-action",
        choices=[a.value for a in MemoryAction],
        default=MemoryAction.KILL.value,
        help="what to do with a container over its GPU memory cap: kill the process holding "
        "the most memory, or report it in the log and metrics only (default %(default)s)",
    )
    parser.add_argument(
        "--backstop-slack-per-process-mib",
        type=int,
        default=SLACK_PER_PROCESS_BYTES // MIB,
        help="GPU memory a container paced by the CUDA interposer may hold over its cap, per "
        "process on a GPU, before the memory action applies: the CUDA contexts and modules "
        "the library does not count (default %(default)s)",
    )
    parser.add_argument(
        "--backstop-slack-max-mib",
        type=int,
        default=SLACK_MOST_BYTES // MIB,
        help="the most that slack comes to on one GPU, whatever its processes "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--slice-ms",
        type=int,
        default=100,
        help="length of one time slice in milliseconds: how often the agent observes, "
        "enforces and switches who runs (default %(default)s)",
    )
    parser.add_argument(
        "--default-policy",
        default="auto",
        help="policy of each GPU until one is written to <control-dir>/<gpu>/policy: 0..5, or "
        "auto for 3 (fixed) on GPUs whose containers carry a compute percentage and 5 "
        "(native) elsewhere (default %(default)s)",
    )
    parser.add_argument(
        "--max-inst",
        default=str(DEFAULT_MAX_INST),
        help="max_inst of each GPU at start, 1..25 (default %(default)s)",
    )
    parser.add_argument(
        "--prio-ratio",
        default=str(DEFAULT_PRIO_RATIO),
        help="prio_ratio of each GPU at start, 20..99: the percent of compute high-priority "
        "containers may take (default %(default)s)",
    )
    add_version_flag(parser)
    return parser


def config_from(args: argparse.Namespace, parser: argparse.ArgumentParser) -> AgentConfig:
    if args.slice_ms < 1:
        parser.error(f"--slice-ms must be at least 1; got {args.slice_ms}")
    for flag, value in (
        ("--backstop-slack-per-process-mib", args.backstop_slack_per_process_mib),
        ("--backstop-slack-max-mib", args.backstop_slack_max_mib),
    ):
        if value < 0:
            parser.error(f"{flag} must be at least 0; got {value}")
    try:
        policy = None if args.default_policy == "auto" else parse_policy(args.default_policy)
        max_inst = parse_max_inst(args.max_inst)
        prio_ratio = parse_prio_ratio(args.prio_ratio)
    except InvalidSetting as invalid:
        parser.error(str(invalid))
    return AgentConfig(
        version=agent_version(),
        slice_s=args.slice_ms / 1000,
        memory_action=MemoryAction(args.memory_action),
        default_policy=policy,
        max_inst=max_inst,
        prio_ratio=prio_ratio,
        interposer_dir=args.interposer_dir,
        slack_per_process_bytes=args.backstop_slack_per_process_mib * MIB,
        slack_most_bytes=args.backstop_slack_max_mib * MIB,
    )


def install_interposer(directory: Path | None) -> str:
    """Puts the CUDA interposer where Allocate mounts it from; what the start line says
    of it. Without it the node still works: enforcement after the fact, logged why."""
    if directory is None:
        return "off"
    try:
        install(directory)
    except (CompilerMissing, BuildFailed, OSError) as err:
        log.error(
            "the CUDA interposer is not installed in %s (%s): containers start without it, "
            "memory caps are enforced after the fact and compute shares by freezing",
            directory,
            err,
        )
        return f"{directory} (not installed)"
    return str(directory)


def build_backend(args: argparse.Namespace, clock: Clock) -> IsolationBackend:
    """The backend the flags ask for; UsageError naming a flag that cannot work,
    RuntimeError saying what to fix when the GPUs cannot be read."""
    if args.backend == "mock":
        if not args.mock_gpus:
            raise UsageError("--backend mock needs --mock-gpus (e.g. 2x16GiB)")
        try:
            gpus = parse_layout(args.mock_gpus, args.node_name)
        except ValueError as err:
            raise UsageError(f"--mock-gpus: {err}") from None
        processes = ProcessTable(args.proc_root)
        return MockBackend(
            mock_devices(gpus),
            clock,
            discover=lambda: discovered_containers(processes.contract_processes()),
        )
    return NvmlBackend(
        bindings(),
        args.proc_root,
        args.cgroup_root,
        clock,
        memory_rounding=args.gpu_memory_rounding,
    )


def check_directories(args: argparse.Namespace) -> None:
    """The host trees the agent reads must be there; the control tree it makes, unless a
    file stands in its place. InputFileError names the flag otherwise."""
    check_directory(args.proc_root, "--proc-root")
    if args.backend == "nvml":
        check_directory(args.cgroup_root, "--cgroup-root")
    control: Path = args.control_dir
    if os.path.lexists(control) and not control.is_dir():
        raise InputFileError("--control-dir", control, "exists and is not a directory")


def summary(args: argparse.Namespace, config: AgentConfig, backend: IsolationBackend) -> str:
    devices = backend.devices()
    gpus = ",".join(f"{d.index}:{d.mem_gib}GiB" for d in devices) or "none"
    policy = "auto" if config.default_policy is None else str(int(config.default_policy))
    return (
        f"{config.version} node={args.node_name} backend={backend.name} gpus={gpus} "
        f"gpu-memory-rounding={args.gpu_memory_rounding} "
        f"control-dir={args.control_dir} proc-root={args.proc_root} "
        f"cgroup-root={args.cgroup_root} metrics-port={args.metrics_port or 'off'} "
        f"memory-action={config.memory_action} slice={round(config.slice_s * 1000)}ms "
        f"default-policy={policy} max-inst={config.max_inst} prio-ratio={config.prio_ratio} "
        f"backstop-slack={config.slack_per_process_bytes // MIB}MiB/process,"
        f"{config.slack_most_bytes // MIB}MiB-max"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_node_flags(parser, args)
    config = config_from(args, parser)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return exit_status(parser, lambda: run(args, config))


def run(args: argparse.Namespace, config: AgentConfig) -> int:
    """Enforces until SIGTERM or SIGINT; 1 when the GPUs or the metrics port cannot be had."""
    check_directories(args)
    clock = SystemClock()
    try:
        backend = build_backend(args, clock)
    except RuntimeError as err:
        log.error("cannot start: %s", err)
        return 1
    interposer = install_interposer(args.interposer_dir)
    log.info("%s interposer-dir=%s", summary(args, config, backend), interposer)
    metrics = AgentMetrics(node=args.node_name)
    if not start_metrics(args.metrics_port, metrics.registry, log):
        return 1
    stop = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        log.info("%s: thawing every container and stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    agent = IsolationAgent(backend, ControlTree(args.control_dir), clock, config, metrics)
    agent.run(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
