"""`gpushare demo`: the example pods placed on an in-memory cluster with mock GPUs.

Every pod of examples/ goes through the admission webhook and is placed by the
real extender HTTP service on loopback (filter, prioritize, bind, as
kube-scheduler calls them); the invalid examples show how a pod is refused, and
one pod too big for any GPU shows how a pod stays Pending. Then the real device
plugin admits the bound pods over its gRPC socket, driven by a kubelet stand-in
(admission.py), the isolation agent runs on mock GPUs and enforces its policies
(isolation.py), and the same pods run on a node in DRA mode: webhook rewrite to a
claim, allocation, the real DRA driver preparing it over its gRPC socket (dra.py).
"""

import argparse
from importlib import resources
from pathlib import Path

from pydantic import ValidationError

from gpushare.allocation import PodAllocation
from gpushare.cli.demo import admission
from gpushare.cli.demo.dra import run_stage as dra_stage
from gpushare.cli.demo.extender import LARGE_MODELS, ExtenderStage
from gpushare.cli.demo.isolation import run_stage as isolation_stage
from gpushare.cluster.memory import MemoryCluster, gpu_node
from gpushare.commandline import InputFileError, check_directory, read_yaml
from gpushare.inventory import parse_layout
from gpushare.manifests import pods_from_manifests
from gpushare.objects import Pod
from gpushare.state import ClusterState
from gpushare.table import render

DEMO_NODES = (
    ("gpu-node-1", "core_mem", "2x16GiB:Tesla-T4", "10.0.0.11"),
    ("gpu-node-2", "cgpu", "4x24GiB:A10", "10.0.0.12"),
    ("gpu-node-3", "share", "1x80GiB:A100-80GB,1x40GiB:A100-40GB", "10.0.0.13"),
)


def default_examples() -> Path:
    """The examples/ shipped as package data: the demo runs the same from a checkout,
    an installed wheel or the image."""
    return Path(str(resources.files("gpushare.cli") / "examples"))


def register(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = commands.add_parser(
        "demo",
        help="place the example pods on an in-memory cluster with mock GPUs",
        description=__doc__,
    )
    parser.add_argument(
        "--examples",
        type=Path,
        default=default_examples(),
        help="directory of pod YAMLs to apply (default: the examples shipped with gpushare)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    examples = check_directory(args.examples, "--examples")
    # Every file is read before anything runs: a bad one is said at once, by name and line.
    manifests = [(path, _pods(path)) for path in sorted(examples.rglob("*.yaml"))]
    cluster = MemoryCluster()
    for name, mode, layout, ip in DEMO_NODES:
        cluster.add_node(gpu_node(name, parse_layout(layout, name), mode=mode, ip=ip))
    print("Cluster:")
    for name, mode, layout, _ in DEMO_NODES:
        print(f"  {name}  ack.node.gpu.schedule={mode:<9} GPUs {layout}")
    print()
    with ExtenderStage(cluster) as stage:
        print(f"Scheduling through the {stage.describe()}:")
        for path, pods in manifests:
            for pod in pods:
                print(f"{path.relative_to(examples)}: {stage.submit(pod)}")
        for pod in LARGE_MODELS:
            print(f"(48 GiB model): {stage.submit(pod)}")
    print()
    print(gpu_table(cluster))
    print()
    layouts = {name: layout for name, _, layout, _ in DEMO_NODES}
    print(admission.render(admission.admit_bound_pods(cluster, layouts)))
    print()
    print(isolation_stage())
    print()
    print(dra_stage([pod for _, pods in manifests for pod in pods]))
    return 0


def _pods(path: Path) -> list[Pod]:
    """The pods the manifests of `path` make; InputFileError saying why there are none."""
    documents = read_yaml(path, "--examples file")
    for number, document in enumerate(documents, 1):
        if document is not None and not isinstance(document, dict):
            raise InputFileError(
                "--examples file", path, f"document {number} is not a Kubernetes object"
            )
    try:
        return pods_from_manifests(documents)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise InputFileError(
            "--examples file", path, f"not a valid pod: {where}: {first['msg']}"
        ) from None
    except ValueError as err:  # a replica count that is not a number
        raise InputFileError("--examples file", path, f"not a valid workload: {err}") from None


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
