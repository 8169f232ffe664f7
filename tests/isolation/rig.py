"""The isolation agent on the mock backend and a simulated clock, with its control tree in a
tmp dir: what the agent tests drive."""

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpushare.environment import CONTAINER
from gpushare.isolation.agent import AgentConfig, IsolationAgent
from gpushare.isolation.backends.mock import MockBackend, MockContainer
from gpushare.isolation.clock import SimulatedClock
from gpushare.isolation.control import ControlTree
from gpushare.isolation.metrics import AgentMetrics
from gpushare.labels import NodeMode
from gpushare.standins.scenario import Node, Workload, place

NODE = "gpu-node-1"
"""The node name the rig's agent reports in its metrics."""

SLICE = 0.1


@dataclass
class Rig:
    agent: IsolationAgent
    backend: MockBackend
    clock: SimulatedClock
    root: Path
    node: Node

    def key(self, pod_name: str) -> str:
        return self.node.container(pod_name).id

    def used(self, pod_name: str) -> float:
        """GPU-seconds the pod computed on its GPU so far (the mock's ground truth)."""
        return self.backend.used_s(self.key(pod_name), self.node.gpu_of[pod_name])

    def shares(self, pod_names: Sequence[str], seconds: float) -> dict[str, float]:
        """Run the agent for `seconds` and say what fraction of them each pod computed."""
        before = {name: self.used(name) for name in pod_names}
        self.agent.run(duration_s=seconds)
        return {name: (self.used(name) - before[name]) / seconds for name in pod_names}

    def write(self, relative: str, text: str) -> None:
        (self.root / relative).write_text(text)

    def read(self, relative: str) -> str:
        return (self.root / relative).read_text()

    def container_dir(self, pod_name: str) -> str:
        return f"{self.node.gpu_of[pod_name]}/{self.key(pod_name)}"


def container_labels(r: Rig, pod_name: str) -> dict[str, str]:
    """The labels of the agent's series of the pod's container (in namespace `default`)."""
    container = r.node.container(pod_name)
    return {
        "node": NODE,
        "gpu": str(r.node.gpu_of[pod_name]),
        "namespace": "default",
        "pod": pod_name,
        "container": container.environ[CONTAINER],
        "container_id": container.id,
    }


def rig(
    tmp_path: Path,
    workloads: Sequence[Workload],
    *,
    layout: str = "1x16GiB",
    mode: NodeMode = NodeMode.CGPU,
    extra: Sequence[MockContainer] = (),
    **config: Any,
) -> Rig:
    node = place(workloads, layout=layout, mode=mode)
    node = replace(node, containers=(*node.containers, *extra))
    clock = SimulatedClock()
    backend = MockBackend(node.devices, clock, node.containers)
    root = tmp_path / "cgpu"
    settings = AgentConfig(version="gpushare-isolation test", slice_s=SLICE, **config)
    agent = IsolationAgent(backend, ControlTree(root), clock, settings, AgentMetrics(NODE))
    return Rig(agent, backend, clock, root, node)
