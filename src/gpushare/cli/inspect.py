"""`kubectl inspect cgpu`: how much GPU memory is allocated where, in ACK's format.

Installed as the kubectl plugin `kubectl-inspect-cgpu`. It reads nodes and the
allocation annotations of pods (ours and the keys ACK's gpushare writes), so it
shows clusters scheduled by either. The output keeps the columns of ACK's
`kubectl inspect cgpu` / `kubectl inspect gpushare`, so scripts written for
those keep working.
"""

import argparse
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from gpushare.allocation import PodAllocation
from gpushare.cluster.port import Cluster
from gpushare.commandline import add_version_flag, exit_status
from gpushare.objects import Node
from gpushare.state import ClusterState, NodeState
from gpushare.table import render

log = logging.getLogger("gpushare.inspect")

IN_CLUSTER = "Allocated/Total GPU Memory In Cluster:"


@dataclass(frozen=True, slots=True)
class NodeReport:
    """One node's GPUs and what its pods hold on each, in GiB."""

    name: str
    address: str
    totals: tuple[int, ...]
    used: tuple[int, ...]
    pods: tuple[tuple[str, str, tuple[int, ...]], ...]
    """(name, namespace, GiB on each GPU) per pod holding GPU memory on the node."""

    @property
    def total(self) -> int:
        return sum(self.totals)

    @property
    def allocated(self) -> int:
        return sum(self.used)


def collect(cluster: Cluster, node_name: str | None = None) -> tuple[list[NodeReport], list[str]]:
    """Reports for the nodes that have GPUs (or for one node), and the lines that
    describe objects whose annotations could not be read."""
    nodes = cluster.list_nodes().items if node_name is None else [cluster.get_node(node_name)]
    pods = cluster.list_pods(node_name).items
    state, problems = ClusterState.rebuild(nodes, pods)
    by_name = {node.name: node for node in nodes}
    reports = [
        _node_report(by_name[name], state.nodes[name])
        for name in sorted(state.nodes)
        if state.nodes[name].inventory.total_mem > 0
    ]
    return reports, problems


def _node_report(node: Node, state: NodeState) -> NodeReport:
    indices = [gpu.index for gpu in state.inventory.gpus]
    pods = []
    for key in sorted(state.pods):
        namespace, name = key.split("/", 1)
        pods.append((name, namespace, _mem_per_gpu(state.pods[key], indices)))
    return NodeReport(
        name=node.name,
        address=node.internal_ip or "unknown",
        totals=tuple(gpu.mem for gpu in state.inventory.gpus),
        used=tuple(state.used(index)[0] for index in indices),
        pods=tuple(pods),
    )


def _mem_per_gpu(allocation: PodAllocation, indices: Sequence[int]) -> tuple[int, ...]:
    charges = allocation.charges()
    return tuple(charges.get(index, (0, 0))[0] for index in indices)


def summary(reports: Sequence[NodeReport]) -> str:
    """One row per node, one column per GPU index; nodes with fewer GPUs leave cells empty."""
    width = max((len(r.totals) for r in reports), default=0)
    header = [
        "NAME",
        "IPADDRESS",
        *(f"GPU{i}(Allocated/Total)" for i in range(width)),
        "GPU Memory(GiB)",
    ]
    rows = []
    for report in reports:
        cells = [f"{u}/{t}" for u, t in zip(report.used, report.totals, strict=True)]
        cells += [""] * (width - len(cells))
        rows.append([report.name, report.address, *cells, f"{report.allocated}/{report.total}"])
    table = render(header, rows)
    rule = "-" * max(len(line) for line in table.splitlines())
    return "\n".join([table, rule, IN_CLUSTER, _cluster_total(reports)])


def details(reports: Sequence[NodeReport]) -> str:
    """Per node: its address, one row per pod with GiB on each GPU, and the node's totals."""
    blocks = []
    for report in reports:
        header = ["NAME", "NAMESPACE", *(f"GPU{i}(Allocated)" for i in range(len(report.totals)))]
        rows = [[name, namespace, *mem] for name, namespace, mem in report.pods]
        table = render(header, rows)
        totals = render(
            ["Allocated :", f"{report.allocated} ({_percent(report.allocated, report.total)}%)"],
            [["Total :", report.total]],
        )
        rule = "-" * max(len(line) for line in (table + "\n" + totals).splitlines())
        node = render(["NAME:", report.name], [["IPADDRESS:", report.address]])
        blocks.append("\n".join(["", node, "", table, totals, rule]))
    blocks.append(f"\n\n{IN_CLUSTER}  {_cluster_total(reports)}")
    return "\n".join(blocks)


def _cluster_total(reports: Sequence[NodeReport]) -> str:
    used = sum(r.allocated for r in reports)
    total = sum(r.total for r in reports)
    return f"{used}/{total} ({_percent(used, total)}%)"


def _percent(part: int, whole: int) -> int:
    # Truncated like ACK's tool, so 2/3 reads 66%.
    return part * 100 // whole if whole > 0 else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kubectl inspect cgpu",
        description="Show the shared-GPU memory allocated on each node (ACK's format). "
        "Reads gpushare's allocation annotations and those of ACK's gpushare.",
    )
    parser.add_argument("node", nargs="?", metavar="NODE", help="show only this node")
    parser.add_argument(
        "-d",
        "--details",
        action="store_true",
        help="per node, one row per pod with the GiB it holds on each GPU",
    )
    parser.add_argument(
        "--kubeconfig",
        default=None,
        help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster)",
    )
    add_version_flag(parser)
    return parser


def inspect(cluster: Cluster, node: str | None, show_details: bool) -> str:
    reports, problems = collect(cluster, node)
    for problem in problems:
        log.warning("skipped: %s", problem)
    return details(reports) if show_details else summary(reports)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="warning: %(message)s")
    return exit_status(parser, lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    # Imported here: the Kubernetes adapter is only needed against a real cluster.
    from gpushare.kubecluster import KubeCluster

    cluster = KubeCluster.from_config(args.kubeconfig)
    print(inspect(cluster, args.node, args.details))
    return 0


if __name__ == "__main__":
    sys.exit(main())
