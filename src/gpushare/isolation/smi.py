"""`cgpu-smi`: the GPUs of a node and the containers on each, as the isolation agent sees them.

Reads only the control tree (the agent's directory mirroring cGPU's procfs), so
it runs anywhere that directory is visible: in the agent's container or on the
node. The files are decoded by the same codec the agent encodes them with
(`gpushare.isolation.treecodec`); gpushare's own read-only files (pod, util,
limit, ...) are optional, so a tree without them still lists every container.
"""

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from gpushare.commandline import InputFileError, add_version_flag, check_directory, exit_status
from gpushare.isolation.backends.port import GIB
from gpushare.isolation.control import read_files
from gpushare.isolation.treecodec import ContainerEntry, GpuEntry, decode
from gpushare.table import render

DEFAULT_CONTROL_DIR = "/run/gpushare/cgpu"


@dataclass(frozen=True, slots=True)
class ProcessRow:
    pid: int
    memory_bytes: int


@dataclass(frozen=True, slots=True)
class ContainerRow:
    id: str
    pod: str
    container: str
    utilization_percent: float | None
    compute_limit_percent: float | None
    """None: not time-sliced (native policy, or isolation off)."""
    weight: int
    high_priority: bool
    memory_used_bytes: int
    memory_allocated_bytes: int
    memory_free_bytes: int
    cap_violations: int
    processes: tuple[ProcessRow, ...]


@dataclass(frozen=True, slots=True)
class GpuRow:
    index: int
    uuid: str
    model: str
    memory_total_bytes: int
    policy: int
    policy_name: str
    max_inst: int
    prio_ratio: int
    free_weight: int
    utilization_percent: float | None
    containers: tuple[ContainerRow, ...]


@dataclass(frozen=True, slots=True)
class Report:
    control_dir: str
    version: str
    gpus: tuple[GpuRow, ...]


class NoControlTree(Exception):
    pass


_RUNNING = (
    "is gpushare-isolation running on this node? Pass --control-dir or set GPUSHARE_CONTROL_DIR"
)


def read_report(root: Path) -> Report:
    """The tree at `root`; NoControlTree saying why there is none there."""
    try:
        content = decode(read_files(check_directory(root, "--control-dir")))
    except InputFileError as err:
        raise NoControlTree(f"{err}; {_RUNNING}") from None
    except ValueError as err:  # no version file, or one of its top-level values garbled
        raise NoControlTree(f"no control tree at {root} ({err}); {_RUNNING}") from None
    return Report(str(root), content.version, tuple(_gpu_row(gpu) for gpu in content.gpus))


def _gpu_row(gpu: GpuEntry) -> GpuRow:
    containers = sorted(
        (_container_row(c) for c in gpu.containers), key=lambda c: (c.pod, c.container, c.id)
    )
    return GpuRow(
        index=gpu.index,
        uuid=gpu.uuid,
        model=gpu.model,
        memory_total_bytes=gpu.mem_bytes,
        policy=int(gpu.policy),
        policy_name=gpu.policy.label,
        max_inst=gpu.max_inst,
        prio_ratio=gpu.prio_ratio,
        free_weight=gpu.free_weight,
        utilization_percent=gpu.util,
        containers=tuple(containers),
    )


def _container_row(c: ContainerEntry) -> ContainerRow:
    return ContainerRow(
        id=c.id,
        pod=c.pod,
        container=c.name,
        utilization_percent=c.util,
        compute_limit_percent=c.limit,
        weight=c.weight,
        high_priority=c.highprio,
        memory_used_bytes=c.mem_used,
        memory_allocated_bytes=c.memsize,
        memory_free_bytes=c.mem_free,
        cap_violations=c.violations,
        processes=tuple(ProcessRow(p.pid, p.mem_bytes) for p in c.processes),
    )


def render_text(report: Report) -> str:
    lines = [f"cgpu-smi  {report.version}  control tree {report.control_dir}"]
    if not report.gpus:
        lines.append("no GPUs")
    for gpu in report.gpus:
        lines.append("")
        lines.append(
            f"GPU {gpu.index}  {gpu.model}  {gpu.uuid}  {_gib(gpu.memory_total_bytes)} GiB  "
            f"policy {gpu.policy} ({gpu.policy_name})  max_inst {gpu.max_inst}  "
            f"prio_ratio {gpu.prio_ratio}  free_weight {gpu.free_weight}  "
            f"util {_show_percent(gpu.utilization_percent)}"
        )
        if not gpu.containers:
            lines.append("  no containers")
            continue
        rows = [
            [
                c.id[:12],
                c.pod,
                c.container,
                c.weight,
                "high" if c.high_priority else "-",
                _show_percent(c.utilization_percent),
                _show_percent(c.compute_limit_percent, none="none"),
                f"{_gib(c.memory_used_bytes)} / {_gib(c.memory_allocated_bytes)}",
                c.cap_violations,
            ]
            for c in gpu.containers
        ]
        header = ["CONTAINER", "POD", "NAME", "WEIGHT", "PRIO", "UTIL", "LIMIT"]
        table = render([*header, "MEM GiB used / alloc", "OVER CAP"], rows)
        lines.extend("  " + line for line in table.splitlines())
    return "\n".join(lines)


def to_json(report: Report) -> str:
    return json.dumps(asdict(report), indent=2)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cgpu-smi",
        description="Show each GPU of this node and its containers: pod, utilisation, compute "
        "limit and memory used / allocated, read from gpushare-isolation's control tree.",
    )
    parser.add_argument(
        "--control-dir",
        type=Path,
        default=Path(os.environ.get("GPUSHARE_CONTROL_DIR") or DEFAULT_CONTROL_DIR),
        help="the agent's control tree (env GPUSHARE_CONTROL_DIR; default %(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    add_version_flag(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return exit_status(parser, lambda: show(args))


def show(args: argparse.Namespace) -> int:
    try:
        report = read_report(args.control_dir)
    except NoControlTree as missing:
        print(f"cgpu-smi: {missing}", file=sys.stderr)
        return 1
    print(to_json(report) if args.json else render_text(report))
    return 0


def _gib(value: int) -> str:
    return f"{value / GIB:.2f}"


def _show_percent(value: float | None, none: str = "-") -> str:
    return none if value is None else f"{value:.1f}%"


if __name__ == "__main__":
    sys.exit(main())
