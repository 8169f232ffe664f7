"""The openb trace format (Alibaba cluster-trace-gpu-v2023): a node list and a pod list.

Columns used: nodes `sn,cpu_milli,memory_mib,gpu,model`; pods
`name,cpu_milli,memory_mib,num_gpu,gpu_milli` and, where present, `gpu_spec`
(others are ignored, as in the FGD paper's simulator). Some pod lists of the
public trace family have no `gpu_spec` column: their pods take any GPU model,
as an empty `gpu_spec` does. Each node and pod becomes the core's own types: a node
of `gpu` GPUs of 1000 milli-GPU (memory and compute alike), a pod asking m milli of
one GPU (a shared slice) or k whole GPUs (exclusive).
"""

import csv
import io
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from gpushare.commandline import InputFileError, read_text
from gpushare.inventory import Gpu, NodeGpus
from gpushare.labels import NodeMode
from gpushare.request import ContainerRequest, ContainerRole, PodRequest

MILLI_PER_GPU = 1000
UNBOUNDED_PODS_PER_GPU = 1_000_000
"""The pods-per-GPU limit is a Kubernetes rule; the trace's cluster has none."""

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
"""The pod list's required columns."""
POD_OPTIONAL_COLUMNS = ("gpu_spec",)
"""Read where present; missing, a pod may take any GPU model."""


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file, row and column."""


class PodClass(StrEnum):
    CPU = "cpu"
    SHARING = "sharing"
    GPU1 = "1-gpu"
    GPU2 = "2-gpu"
    GPU4 = "4-gpu"
    GPU8 = "8-gpu"
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str

    def inventory(self) -> NodeGpus:
        gpus = tuple(
            Gpu(index=i, uuid="", mem=MILLI_PER_GPU, model=self.model, core=MILLI_PER_GPU)
            for i in range(self.gpus)
        )
        return NodeGpus(
            node=self.name,
            mode=NodeMode.CORE_MEM,
            gpus=gpus,
            max_pods_per_gpu=UNBOUNDED_PODS_PER_GPU,
            cpu_milli=self.cpu_milli,
            memory_mib=self.memory_mib,
        )


@dataclass(frozen=True, slots=True)
class TracePod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: frozenset[str] | None

    @property
    def gpu_total(self) -> int:
        """milli-GPU the pod asks for in all (k * m)."""
        return self.num_gpu * self.gpu_milli

    @property
    def kind(self) -> PodClass:
        if self.num_gpu == 0:
            return PodClass.CPU
        if self.gpu_milli < MILLI_PER_GPU:
            return PodClass.SHARING if self.num_gpu == 1 else PodClass.OTHER
        return {1: PodClass.GPU1, 2: PodClass.GPU2, 4: PodClass.GPU4, 8: PodClass.GPU8}.get(
            self.num_gpu, PodClass.OTHER
        )

    def request(self) -> PodRequest:
        containers: tuple[ContainerRequest, ...] = ()
        if self.num_gpu:
            if self.gpu_milli >= MILLI_PER_GPU:
                container = ContainerRequest(
                    "main", ContainerRole.APP, 0, gpus=self.num_gpu, mem=0, exclusive=True
                )
            else:
                container = ContainerRequest(
                    "main",
                    ContainerRole.APP,
                    0,
                    gpus=self.num_gpu,
                    mem=self.gpu_milli,
                    core=self.gpu_milli,
                )
            containers = (container,)
        return PodRequest(
            containers,
            cpu_milli=self.cpu_milli,
            memory_mib=self.memory_mib,
            gpu_spec=self.gpu_spec,
        )


@dataclass(frozen=True, slots=True)
class Trace:
    nodes: tuple[TraceNode, ...]
    """In name order: a node's position is its id in a run."""
    pods: tuple[TracePod, ...]
    """In name order."""
    source: str = ""

    @property
    def capacity(self) -> int:
        """milli-GPU of the whole cluster."""
        return MILLI_PER_GPU * sum(n.gpus for n in self.nodes)

    @property
    def requested(self) -> int:
        return sum(p.gpu_total for p in self.pods)


def load(nodes_csv: Path, pods_csv: Path) -> Trace:
    nodes = tuple(sorted(_read_nodes(nodes_csv), key=lambda n: n.name))
    pods = tuple(sorted(_read_pods(pods_csv), key=lambda p: p.name))
    if not nodes:
        raise TraceError(f"{nodes_csv}: no nodes")
    if not pods:
        raise TraceError(f"{pods_csv}: no pods")
    return Trace(nodes, pods, source=f"{nodes_csv.name} + {pods_csv.name}")


def _rows(path: Path, columns: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    try:
        # Read whole and checked first: a FIFO or a directory is refused, not waited on.
        text = read_text(path, "cannot read trace file")
        with io.StringIO(text, newline="") as handle:  # pragma: no mutate: no field holds one
            reader = csv.DictReader(handle)
            missing = [c for c in columns if c not in (reader.fieldnames or ())]
            if missing:
                raise TraceError(
                    f"{path}: missing column(s) {', '.join(missing)}; "
                    f"the openb format needs {', '.join(columns)}"
                )
            rows = []
            for row in reader:
                # A short row leaves None values, a long one a None key: both are rows
                # the format does not allow, and would otherwise pass as empty fields.
                if None in row or None in row.values():
                    size = "more" if None in row else "fewer"
                    raise TraceError(
                        f"{path}:{reader.line_num}: the row has {size} fields than the "
                        f"header's {len(reader.fieldnames or ())}"
                    )
                rows.append((reader.line_num, row))
            return rows
    except InputFileError as err:
        raise TraceError(str(err)) from err
    except csv.Error as err:
        raise TraceError(f"{path}: not a CSV file: {err}") from err


def _int(path: Path, number: int, row: dict[str, str], column: str) -> int:
    value = (row.get(column) or "").strip()
    try:
        result = int(value)
    except ValueError:
        raise TraceError(
            f"{path}:{number}: column {column} must be a whole number, got {value!r}"
        ) from None
    if result < 0:
        raise TraceError(f"{path}:{number}: column {column} must not be negative, got {result}")
    return result


def _read_nodes(path: Path) -> list[TraceNode]:
    nodes = []
    for number, row in _rows(path, NODE_COLUMNS):
        nodes.append(
            TraceNode(
                name=row["sn"].strip(),
                cpu_milli=_int(path, number, row, "cpu_milli"),
                memory_mib=_int(path, number, row, "memory_mib"),
                gpus=_int(path, number, row, "gpu"),
                model=(row["model"] or "").strip(),
            )
        )
    return nodes


def _read_pods(path: Path) -> list[TracePod]:
    pods = []
    for number, row in _rows(path, POD_COLUMNS):
        num_gpu = _int(path, number, row, "num_gpu")
        gpu_milli = _int(path, number, row, "gpu_milli")
        if num_gpu and not 0 < gpu_milli <= MILLI_PER_GPU:
            raise TraceError(
                f"{path}:{number}: gpu_milli must be in 1..{MILLI_PER_GPU} for a pod "
                f"with num_gpu={num_gpu}, got {gpu_milli}"
            )
        spec = frozenset(m.strip() for m in (row.get("gpu_spec") or "").split("|") if m.strip())
        pods.append(
            TracePod(
                name=row["name"].strip(),
                cpu_milli=_int(path, number, row, "cpu_milli"),
                memory_mib=_int(path, number, row, "memory_mib"),
                num_gpu=num_gpu,
                gpu_milli=gpu_milli if num_gpu else 0,
                gpu_spec=spec or None,
            )
        )
    return pods


def pod_rows(pods: tuple[TracePod, ...]) -> str:
    """The pods as an openb pod list (the columns `load` reads), so a generated mix can
    be kept, read back with --pods, and compared with the paper's files."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow((*POD_COLUMNS, *POD_OPTIONAL_COLUMNS))
    for p in pods:
        spec = "|".join(sorted(p.gpu_spec or ()))
        writer.writerow((p.name, p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, spec))
    return out.getvalue()
