"""`gpushare demo`: the example pods placed on an in-memory cluster with mock GPUs.

Every pod of examples/ goes through the same rules and placement policies the
extender uses; the invalid examples show how a pod is refused. Then the
isolation agent runs on mock GPUs and enforces its policies (isolation/demo.py).
"""

import argparse
from datetime import UTC, datetime
from pathlib import Path

import yaml

from deviceplugin import demo as admission
from gpushare import annotation
from gpushare.allocation import PodAllocation
from gpushare.cluster.memory import MemoryCluster, gpu_node
from gpushare.errors import PodRefused
from gpushare.inventory import parse_layout
from gpushare.manifests import pods_from_manifests
from gpushare.objects import Pod
from gpushare.placement import NodeChoice, choose_node, to_allocation
from gpushare.policies import policy_for
from gpushare.request import parse_pod_request
from gpushare.state import ClusterState
from gpushare_cli.table import render
from isolation.demo import run_stage as isolation_stage

DEMO_NODES = (
    ("gpu-node-1", "core_mem", "2x16GiB:Tesla-T4", "10.0.0.11"),
    ("gpu-node-2", "cgpu", "4x24GiB:A10", "10.0.0.12"),
    ("gpu-node-3", "share", "1x80GiB:A100-80GB,1x40GiB:A100-40GB", "10.0.0.13"),
)


def default_examples() -> Path:
    return Path(__file__).resolve().parents[2] / "examples"


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "demo",
        help="place the example pods on an in-memory cluster with mock GPUs",
        description=__doc__,
    )
    parser.add_argument(
        "--examples",
        type=Path,
        default=default_examples(),
        help="directory of pod YAMLs to apply (default: the repository's examples/)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    examples: Path = args.examples
    if not examples.is_dir():
        print(f"gpushare demo: no examples directory at {examples}; pass --examples DIR")
        return 2
    cluster = MemoryCluster()
    for name, mode, layout, ip in DEMO_NODES:
        cluster.add_node(gpu_node(name, parse_layout(layout, name), mode=mode, ip=ip))
    print("Cluster:")
    for name, mode, layout, _ in DEMO_NODES:
        print(f"  {name}  ack.node.gpu.schedule={mode:<9} GPUs {layout}")
    print()
    for path in sorted(examples.rglob("*.yaml")):
        documents = list(yaml.safe_load_all(path.read_text()))
        for pod in pods_from_manifests(documents):
            created = cluster.create_pod(pod)
            print(f"{path.relative_to(examples)}: {schedule(cluster, created)}")
    print()
    print(gpu_table(cluster))
    print()
    layouts = {name: layout for name, _, layout, _ in DEMO_NODES}
    print(admission.render(admission.admit_bound_pods(cluster, layouts)))
    print()
    print(isolation_stage())
    return 0


def schedule(cluster: MemoryCluster, pod: Pod) -> str:
    """Place one pod as the scheduler and extender would, and say what happened."""
    try:
        request = parse_pod_request(pod)
    except PodRefused as refused:
        cluster.delete_pod(pod.metadata.namespace, pod.metadata.name)
        return f"{pod.key} refused: {refused}"
    if request is None:
        return f"{pod.key} asks for no shared GPU; left to the default scheduler"
    state, _ = ClusterState.rebuild(cluster.list_nodes().items, cluster.list_pods().items)
    views = [state.nodes[name].view() for name in sorted(state.nodes)]
    choice = choose_node(views, request, lambda view: policy_for(view.placement))
    if not isinstance(choice, NodeChoice):
        return f"{pod.key} stays Pending: " + "; ".join(
            f"{node}: {reason}" for node, reason in choice.items()
        )
    inventory = state.nodes[choice.node].inventory
    allocation = to_allocation(request, choice.placement.assignment, inventory, datetime.now(UTC))
    cluster.bind_pod(
        pod.metadata.namespace,
        pod.metadata.name,
        choice.node,
        uid=pod.metadata.uid,
        annotations=annotation.encode(allocation),
    )
    gpus = ",".join(str(i) for i in allocation.gpu_indices)
    return f"{pod.key} -> {choice.node} GPU {gpus} ({request.describe()})"


def gpu_table(cluster: MemoryCluster) -> str:
    state, problems = ClusterState.rebuild(cluster.list_nodes().items, cluster.list_pods().items)
    rows = []
    for name in sorted(state.nodes):
        node = state.nodes[name]
        inventory = node.inventory
        for gpu in inventory.gpus:
            mem, core, _ = node.used(gpu.index)
            pods = sorted(node.pods_on(gpu.index))
            slices = [_slice_label(key, node.pods[key], gpu.index) for key in pods]
            rows.append(
                [
                    name,
                    inventory.mode or "-",
                    gpu.index,
                    gpu.model,
                    f"{mem}/{gpu.mem}",
                    f"{core}%" if inventory.mode == "core_mem" else "-",
                    ", ".join(slices) or "-",
                ]
            )
    table = render(["NODE", "MODE", "GPU", "MODEL", "MEM(GiB)", "CORE", "PODS"], rows)
    return "\n".join([table, *(f"warning: {p}" for p in problems)])


def _slice_label(pod_key: str, allocation: PodAllocation, gpu_index: int) -> str:
    parts = []
    for container in allocation.containers:
        for s in container.gpus:
            if s.index == gpu_index:
                label = "whole" if container.exclusive else f"{s.mem}GiB"
                if s.core:
                    label += f"+{s.core}%"
                parts.append(f"{container.name}:{label}")
    return f"{pod_key.split('/', 1)[1]}[{' '.join(parts)}]"
