"""Tiny traces in the openb CSV format, written where a test wants them."""

from collections.abc import Sequence
from pathlib import Path

from gpushare.simulator.trace import Trace, load

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"
POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time"
)

REPO_TRACES = Path(__file__).resolve().parents[2] / "data" / "openb"
NODES_CSV = REPO_TRACES / "openb_node_list_gpu_node.csv"
PODS_CSV = REPO_TRACES / "openb_pod_list_default.csv"


def write(
    directory: Path,
    nodes: Sequence[tuple[str, int, int, int, str]],
    pods: Sequence[tuple[str, int, int, int, int, str]],
) -> tuple[Path, Path]:
    """CSV files for (name, cpu, memory, gpus, model) nodes and
    (name, cpu, memory, num_gpu, gpu_milli, gpu_spec) pods."""
    node_file = directory / "nodes.csv"
    pod_file = directory / "pods.csv"
    node_file.write_text("\n".join([NODE_HEADER, *(",".join(map(str, n)) for n in nodes)]) + "\n")
    pod_file.write_text(
        "\n".join([POD_HEADER, *(",".join(map(str, p)) + ",LS,Running,0,0,0" for p in pods)]) + "\n"
    )
    return node_file, pod_file


def tiny(directory: Path, nodes: Sequence, pods: Sequence) -> Trace:
    return load(*write(directory, nodes, pods))


def subsample(directory: Path, every: int) -> tuple[Path, Path]:
    """Every `every`-th node and pod of the repository's openb trace (all node types)."""
    node_file = directory / "nodes.csv"
    pod_file = directory / "pods.csv"
    for source, target in ((NODES_CSV, node_file), (PODS_CSV, pod_file)):
        header, *rows = source.read_text().splitlines()
        target.write_text("\n".join([header, *rows[::every]]) + "\n")
    return node_file, pod_file
