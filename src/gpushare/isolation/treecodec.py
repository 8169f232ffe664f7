"""The control-tree codec: cGPU's procfs (/proc/cgpu_km) as files, encoded and decoded here only.

    version  default_memsize  inst_ctl
    <gpu>/policy  max_inst  prio_ratio  free_weight  major       (cGPU)
    <gpu>/uuid  model  mem_total  util                          (gpushare, read-only)
    <gpu>/<container-id>/id  memsize  meminfo  weight  highprio  (cGPU)
    <gpu>/<container-id>/pod  container  util  limit  violations (gpushare, read-only)
    <gpu>/<container-id>/interposer                              (gpushare, read-only)

Each file holds one value and a newline; `meminfo` holds `Free: <bytes>` then
one `PID: <pid> Mem: <bytes>` line per process, and `inst_ctl` one
`<gpu> <container-id>` line per container. The format is a wire contract
(operators' scripts and ACK's tooling read it), so the agent that writes the
tree and `cgpu-smi` that reads it both go through `encode` and `decode`.

A plain cGPU tree lacks gpushare's files; `decode` reads them as absent (see
ABSENT and the defaults below), so such a tree still decodes.
"""

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Final, TypeVar

from gpushare.isolation.policy import Policy

GPU_SETTINGS: Final = frozenset({"policy", "max_inst", "prio_ratio"})
CONTAINER_SETTINGS: Final = frozenset({"weight", "highprio"})
ABSENT: Final = "-"
"""What a text file of gpushare's reads as in a plain cGPU tree that lacks it."""
NO_LIMIT: Final = "none"
"""The `limit` of a container that is not time-sliced."""

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class ProcessMemory:
    pid: int
    mem_bytes: int


@dataclass(frozen=True, slots=True)
class ContainerEntry:
    id: str
    pod: str
    name: str
    memsize: int
    """Its memory cap on this GPU in bytes; 0 when not capped."""
    processes: tuple[ProcessMemory, ...]
    weight: int
    highprio: bool
    util: float | None
    """Percent of the GPU it used recently; None in a tree without gpushare's files."""
    limit: float | None
    """Percent of the GPU its policy promises it while it has work; None if not time-sliced."""
    violations: int
    interposer: bool | None = None
    """It runs under the CUDA interposer (memory refused at the call, launches paced); False:
    the agent enforces after the fact (freezing); None in a tree without gpushare's files."""

    @property
    def mem_used(self) -> int:
        return sum(p.mem_bytes for p in self.processes)

    @property
    def mem_free(self) -> int:
        """What it may still allocate under its cap; 0 when not capped."""
        return max(0, self.memsize - self.mem_used) if self.memsize else 0


@dataclass(frozen=True, slots=True)
class GpuEntry:
    index: int
    uuid: str
    model: str
    mem_bytes: int
    policy: Policy
    max_inst: int
    prio_ratio: int
    free_weight: int
    major: int
    util: float | None
    """Percent of the GPU its containers used recently; None without gpushare's files."""
    containers: tuple[ContainerEntry, ...]


@dataclass(frozen=True, slots=True)
class TreeContent:
    version: str
    default_memsize: int
    gpus: tuple[GpuEntry, ...]


@dataclass(frozen=True, slots=True)
class ControlWrite:
    """A file of the tree someone other than the agent changed."""

    path: str
    gpu: int | None
    container: str | None
    name: str
    raw: str


def is_setting(path: str) -> bool:
    """Whether a file of the tree takes writes (all others are read-only)."""
    parts = path.split("/")
    if len(parts) == 2:
        return parts[1] in GPU_SETTINGS
    return len(parts) == 3 and parts[2] in CONTAINER_SETTINGS


def control_write(path: str, raw: str) -> ControlWrite:
    """The write of `raw` to the file at `path` (relative to the tree's root)."""
    parts = path.split("/")
    gpu = int(parts[0]) if len(parts) >= 2 else None
    container = parts[1] if len(parts) == 3 else None
    return ControlWrite(path, gpu, container, parts[-1], raw)


def encode(content: TreeContent) -> dict[str, str]:
    """Every file of the tree: relative path to text."""
    files = {
        "version": _line(content.version),
        "default_memsize": _line(content.default_memsize),
        "inst_ctl": "".join(f"{g.index} {c.id}\n" for g in content.gpus for c in g.containers),
    }
    for gpu in content.gpus:
        files.update(_prefixed(str(gpu.index), _encode_gpu(gpu)))
        for container in gpu.containers:
            files.update(_prefixed(f"{gpu.index}/{container.id}", _encode_container(container)))
    return files


def decode(files: Mapping[str, str]) -> TreeContent:
    """The tree that `files` (relative path to text) hold. `inst_ctl` is not read: it only
    repeats the container directories. A GPU or container whose files are missing or do not
    parse (it went while the tree was read, or an operator's write is in flight) is left
    out. GPUs come by index, the containers of each by ID."""
    if "version" not in files:
        raise ValueError("not a control tree: it has no version file")
    gpus: dict[int, dict[str, str]] = {}
    containers: dict[tuple[int, str], dict[str, str]] = {}
    for path, text in files.items():
        parts = path.split("/")
        if not parts[0].isdigit() or len(parts) not in (2, 3):
            continue
        if len(parts) == 2:
            gpus.setdefault(int(parts[0]), {})[parts[1]] = text
        else:
            containers.setdefault((int(parts[0]), parts[1]), {})[parts[2]] = text
    by_id = sorted(containers.items())
    entries = []
    for index, gpu_files in sorted(gpus.items()):
        mine = (_or_none(partial(_decode_container, c)) for (g, _), c in by_id if g == index)
        entries.append(_or_none(partial(_decode_gpu, index, gpu_files, _present(mine))))
    return TreeContent(
        version=files["version"].strip(),
        default_memsize=int(files.get("default_memsize", "0")),
        gpus=_present(entries),
    )


def _encode_meminfo(free: int, processes: tuple[ProcessMemory, ...]) -> str:
    return f"Free: {free}\n" + "".join(f"PID: {p.pid} Mem: {p.mem_bytes}\n" for p in processes)


def _decode_meminfo(text: str) -> tuple[int, tuple[ProcessMemory, ...]]:
    """Free bytes and the processes, from `Free: <bytes>` then `PID: <n> Mem: <bytes>` lines."""
    free = 0
    processes = []
    for line in text.splitlines():
        words = line.replace(":", " ").split()
        if len(words) == 2 and words[0] == "Free":
            free = int(words[1])
        elif len(words) == 4 and words[0] == "PID" and words[2] == "Mem":
            processes.append(ProcessMemory(int(words[1]), int(words[3])))
    return free, tuple(processes)


def _encode_gpu(gpu: GpuEntry) -> dict[str, str]:
    return {
        "policy": _line(int(gpu.policy)),
        "max_inst": _line(gpu.max_inst),
        "prio_ratio": _line(gpu.prio_ratio),
        "free_weight": _line(gpu.free_weight),
        "major": _line(gpu.major),
        "uuid": _line(gpu.uuid),
        "model": _line(gpu.model),
        "mem_total": _line(gpu.mem_bytes),
        "util": _line(_encode_percent(gpu.util)),
    }


def _decode_gpu(
    index: int, files: Mapping[str, str], containers: tuple[ContainerEntry, ...]
) -> GpuEntry:
    return GpuEntry(
        index=index,
        uuid=_optional(files, "uuid", str, ABSENT),
        model=_optional(files, "model", str, ABSENT),
        mem_bytes=_optional(files, "mem_total", int, 0),
        policy=Policy(int(files["policy"])),
        max_inst=int(files["max_inst"]),
        prio_ratio=int(files["prio_ratio"]),
        free_weight=int(files["free_weight"]),
        major=_optional(files, "major", int, 0),
        util=_optional(files, "util", _decode_percent, None),
        containers=containers,
    )


def _encode_container(c: ContainerEntry) -> dict[str, str]:
    return {
        "id": _line(c.id),
        "memsize": _line(c.memsize),
        "meminfo": _encode_meminfo(c.mem_free, c.processes),
        "weight": _line(c.weight),
        "highprio": _line(int(c.highprio)),
        "pod": _line(c.pod),
        "container": _line(c.name),
        "util": _line(_encode_percent(c.util)),
        "limit": _line(_encode_percent(c.limit)),
        "violations": _line(c.violations),
        "interposer": _line(ABSENT if c.interposer is None else int(c.interposer)),
    }


def _decode_container(files: Mapping[str, str]) -> ContainerEntry:
    # Free is not kept: it follows from memsize and the processes (ContainerEntry.mem_free).
    _, processes = _decode_meminfo(files["meminfo"])
    return ContainerEntry(
        id=files["id"].strip(),
        pod=_optional(files, "pod", str, ABSENT),
        name=_optional(files, "container", str, ABSENT),
        memsize=int(files["memsize"]),
        processes=processes,
        weight=int(files["weight"]),
        highprio=_decode_flag(files["highprio"]),
        util=_optional(files, "util", _decode_percent, None),
        limit=_optional(files, "limit", _decode_percent, None),
        violations=_optional(files, "violations", int, 0),
        interposer=_optional(files, "interposer", _decode_optional_flag, None),
    )


def _or_none(decode_entry: Callable[[], _T]) -> _T | None:
    """The entry, or None when one of its files is missing or does not parse."""
    try:
        return decode_entry()
    except (KeyError, ValueError):
        return None


def _present(entries: Iterable[_T | None]) -> tuple[_T, ...]:
    return tuple(entry for entry in entries if entry is not None)


def _optional(
    files: Mapping[str, str], name: str, decode_value: Callable[[str], _T], default: _T
) -> _T:
    text = files.get(name)
    return default if text is None else decode_value(text.strip())


def _encode_percent(value: float | None) -> str:
    # One decimal: the tree shows a moving average, more digits would only churn the files.
    return NO_LIMIT if value is None else f"{value:.1f}"


def _decode_percent(text: str) -> float | None:
    return None if text.strip() == NO_LIMIT else float(text)


def _decode_flag(text: str) -> bool:
    value = text.strip()
    if value not in ("0", "1"):
        raise ValueError(f"a flag is 0 or 1; got {value!r}")
    return value == "1"


def _decode_optional_flag(text: str) -> bool | None:
    return None if text.strip() == ABSENT else _decode_flag(text)


def _line(value: object) -> str:
    return f"{value}\n"


def _prefixed(directory: str, files: Mapping[str, str]) -> dict[str, str]:
    return {f"{directory}/{name}": text for name, text in files.items()}


def _file_names() -> frozenset[str]:
    """The name of every file the tree holds (the last part of its path), from the encoder
    itself: a tree of one GPU with one container shows each kind of file once."""
    container = ContainerEntry("c", "ns/pod", "name", 0, (), 0, False, None, None, 0)
    gpu = GpuEntry(0, "", "", 0, Policy(0), 0, 0, 0, 0, None, (container,))
    return frozenset(path.rsplit("/", 1)[-1] for path in encode(TreeContent("", 0, (gpu,))))


FILE_NAMES: Final = _file_names()
"""What the file of a control write can be called."""
