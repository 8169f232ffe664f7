"""The isolation stage of `gpushare demo`: the agent on mock GPUs, on a simulated clock.

Four pods are placed on a core_mem node by the core, as the extender would,
and started as mock containers with the device plugin's environment. The agent
runs for a few seconds of simulated time (milliseconds of real time) while an
operator switches GPU 0 to weight-based scheduling through the control tree
and makes one invalid write; one pod allocates past its memory cap. The stage
prints what happened, the shares each pod got, and `cgpu-smi`.
"""

import logging
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from gpushare.isolation import smi
from gpushare.isolation.agent import AgentConfig, IsolationAgent
from gpushare.isolation.backends.mock import MemoryStep, MockBackend
from gpushare.isolation.backends.port import GIB
from gpushare.isolation.clock import SimulatedClock
from gpushare.isolation.control import ControlTree
from gpushare.labels import NodeMode
from gpushare.standins.scenario import Node, Workload, place
from gpushare.table import render

NODE: Final = "gpu-node-1"
LAYOUT: Final = "2x16GiB:Tesla-T4"
WORKLOADS: Final = (
    Workload("train-a", 4, core=50, weight=1, memory=(MemoryStep(0, 3 * GIB),)),
    Workload("train-b", 4, core=50, weight=2, memory=(MemoryStep(0, 3 * GIB + GIB // 2),)),
    Workload("infer", 2, core=30, memory=(MemoryStep(0, GIB + GIB // 2),)),
    Workload("leaky", 2, core=20, memory=(MemoryStep(0, GIB), MemoryStep(3.0, 3 * GIB))),
)
WARM_UP_S: Final = 1.0
MEASURE_S: Final = 9.0
OPERATOR_WRITES: Final = (("0/policy", "2"), ("1/policy", "9"))


def run_stage() -> str:
    """Run the scenario and return its report."""
    node = place(WORKLOADS, layout=LAYOUT, node=NODE, mode=NodeMode.CORE_MEM)
    clock = SimulatedClock()
    backend = MockBackend(node.devices, clock, node.containers)
    with tempfile.TemporaryDirectory(prefix="gpushare-cgpu-") as control:
        root = Path(control)
        agent = IsolationAgent(
            backend, ControlTree(root), clock, AgentConfig(version="gpushare-isolation demo")
        )
        with _events(clock) as events:
            agent.run(duration_s=WARM_UP_S)
            for path, value in OPERATOR_WRITES:
                (root / path).write_text(f"{value}\n")
            start = {w.name: _used(backend, node, w.name) for w in WORKLOADS}
            agent.run(duration_s=MEASURE_S)
        shares = {
            w.name: (_used(backend, node, w.name) - start[w.name]) / MEASURE_S for w in WORKLOADS
        }
        cgpu_smi = smi.render_text(smi.read_report(root))
    return "\n".join(
        [
            f"Isolation agent on {NODE} (core_mem, mock GPUs {LAYOUT}), "
            f"{WARM_UP_S + MEASURE_S:.0f} s of simulated time:",
            *(f"  {_describe(w, node)}" for w in WORKLOADS),
            *(f"  t={WARM_UP_S:.1f}s  $ echo {v} > <control-dir>/{p}" for p, v in OPERATOR_WRITES),
            "",
            "Agent log:",
            *(f"  {line}" for line in events),
            "",
            f"Compute shares over the last {MEASURE_S:.0f} s (target: what the policy promises):",
            _shares_table(agent, backend, node, shares),
            "",
            "$ cgpu-smi",
            cgpu_smi,
        ]
    )


def _describe(workload: Workload, node: Node) -> str:
    memory = ", ".join(f"{s.mem_bytes / GIB:g} GiB from t={s.at_s:g}s" for s in workload.memory)
    return (
        f"pod {workload.name}: gpu-mem {workload.mem}, gpu-core.percentage {workload.core}, "
        f"weight {workload.weight} -> GPU {node.gpu_of[workload.name]}; holds {memory}"
    )


def _shares_table(
    agent: IsolationAgent, backend: MockBackend, node: Node, shares: dict[str, float]
) -> str:
    """Each pod's share against the limit the control tree shows for it."""
    limits = {c.id: (g, c.limit) for g in agent.content().gpus for c in g.containers}
    kills = {k.container_id: k.at for k in backend.kills}
    rows = []
    for w in WORKLOADS:
        key = node.container(w.name).id
        gpu, limit = limits[key]
        note = f" (killed at t={kills[key]:.1f}s)" if key in kills else ""
        rows.append(
            [
                w.name,
                gpu.index,
                f"{int(gpu.policy)} {gpu.policy.label}",
                "-" if limit is None else f"{limit:.1f}%",
                f"{100 * shares[w.name]:.1f}%{note}",
            ]
        )
    table = render(["POD", "GPU", "POLICY", "TARGET", "ACHIEVED"], rows)
    return "\n".join("  " + line for line in table.splitlines())


def _used(backend: MockBackend, node: Node, name: str) -> float:
    return backend.used_s(node.container(name).id, node.gpu_of[name])


@contextmanager
def _events(clock: SimulatedClock) -> Iterator[list[str]]:
    """The agent's log lines, stamped with simulated time."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(f"t={clock.now():.1f}s {record.levelname.lower()}: {record.getMessage()}")

    logger = logging.getLogger("gpushare.isolation")
    handler = Collect(logging.INFO)
    saved = (logger.level, logger.propagate)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.level, logger.propagate = saved
