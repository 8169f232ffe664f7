"""The grant: what the node decided for one container, written where the container
cannot write it.

The device plugin writes one grant per Allocate answer into the node's interposer
directory and mounts it read-only into the container; the CUDA interposer (grant.c)
and the isolation agent read their caps, GPUs and shares from it, not from the
container's environment, which any process of the container can change for its
children. Each grant has its own accounting directory beside it, so two containers
never share a region, whatever order the kubelet admitted their pods in.

The format is lines of `key=value`, ASCII, at most MAX_BYTES: simple enough for the C
library to parse without an allocator, strict enough that a damaged file is refused
rather than read as something else. Unknown keys are skipped (a newer plugin may add
some); a repeated, missing or out-of-range key makes the whole grant unreadable.
"""

import re
from dataclasses import dataclass
from typing import Final

from gpushare.environment import ContainerLimits

FORMAT_LINE: Final = "gpushare-grant=1"
MAX_BYTES: Final = 4096
MAX_LINE: Final = 1024
MAX_GPUS: Final = 16
"""As the region holds them (region.h GS_MAX_GPUS)."""
MAX_CAP_BYTES: Final = 1 << 50
GIB: Final = 1 << 30

ID_PATTERN: Final = re.compile(r"[0-9a-f]{32}")
GRANTS: Final = "grants"
"""The folder of the node's interposer directory that holds one folder per grant."""
GRANT_FILE: Final = "grant"
REGION_DIR: Final = "region"
"""The grant's accounting directory: the container's /run/gpushare."""

_KEYS: Final = (
    "id",
    "pod-uid",
    "namespace",
    "pod",
    "container",
    "indices",
    "uuids",
    "mem-bytes",
    "core-percent",
    "dev-mem-gib",
    "weight",
    "high-priority",
    "isolation-disabled",
    "region",
)
_REQUIRED: Final = ("id", "indices", "mem-bytes", "region")


class GrantError(ValueError):
    """The bytes are not a grant this code can trust; the message names what is wrong."""


@dataclass(frozen=True, slots=True)
class Grant:
    id: str
    pod_uid: str
    namespace: str
    pod: str
    container: str
    indices: tuple[int, ...]
    """The node's GPU indices, in the container's order."""
    uuids: tuple[str, ...]
    """Same order; empty when the node's GPUs have no UUIDs (mapped by ordinal)."""
    mem_bytes: tuple[int, ...]
    """The memory cap on each GPU."""
    core_percent: tuple[int, ...]
    dev_mem_gib: tuple[int, ...]
    weight: int
    high_priority: bool
    isolation_disabled: bool
    region: str
    """The region's path as the container sees it."""

    def __post_init__(self) -> None:
        problem = _problem(self)
        if problem:
            raise GrantError(problem)

    @property
    def pod_key(self) -> str:
        return f"{self.namespace}/{self.pod}"

    def limits(self) -> ContainerLimits:
        """What the isolation agent enforces for the container, per GPU."""
        return ContainerLimits(
            pod=self.pod_key,
            container=self.container,
            gpu_uuids=self.uuids,
            gpu_indices=self.indices,
            mem_gib=tuple(-(-b // GIB) for b in self.mem_bytes),
            dev_mem_gib=self.dev_mem_gib,
            core_percent=self.core_percent,
            weight=self.weight,
            high_priority=self.high_priority,
            isolation_disabled=self.isolation_disabled,
        )


def grant_for(grant_id: str, pod_uid: str, limits: ContainerLimits, region: str) -> Grant:
    """The grant of a container the device plugin answers for, from the limits its
    environment carries (what the plugin decided, before the container could touch it)."""
    namespace, _, pod = limits.pod.partition("/")
    count = len(limits.gpu_indices)
    return Grant(
        id=grant_id,
        pod_uid=pod_uid,
        namespace=namespace,
        pod=pod,
        container=limits.container,
        indices=limits.gpu_indices,
        uuids=limits.gpu_uuids,
        mem_bytes=tuple(gib * GIB for gib in limits.mem_gib),
        core_percent=limits.core_percent or (0,) * count,
        dev_mem_gib=limits.dev_mem_gib or (0,) * count,
        weight=limits.weight,
        high_priority=limits.high_priority,
        isolation_disabled=limits.isolation_disabled,
        region=region,
    )


def _problem(grant: Grant) -> str:
    count = len(grant.indices)
    if not ID_PATTERN.fullmatch(grant.id):
        return f"id {grant.id!r} is not 32 lowercase hex characters"
    if not 1 <= count <= MAX_GPUS:
        return f"a grant names 1 to {MAX_GPUS} GPUs, this one {count}"
    for name, values in (
        ("uuids", grant.uuids),
        ("mem-bytes", grant.mem_bytes),
        ("core-percent", grant.core_percent),
        ("dev-mem-gib", grant.dev_mem_gib),
    ):
        if values and len(values) != count:
            return f"{name} has {len(values)} values for {count} GPUs"
    if len(grant.mem_bytes) != count:
        return f"mem-bytes has {len(grant.mem_bytes)} values for {count} GPUs"
    if any(i < 0 for i in grant.indices):
        return "a GPU index is negative"
    if any(not 1 <= b <= MAX_CAP_BYTES for b in grant.mem_bytes):
        return f"a memory cap is outside 1..{MAX_CAP_BYTES} bytes"
    if any(not 0 <= p <= 100 for p in grant.core_percent):
        return "a compute percentage is outside 0..100"
    if grant.weight < 1:
        return f"weight {grant.weight} is under 1"
    if not grant.region.startswith("/"):
        return f"region {grant.region!r} is not an absolute path"
    texts = (grant.pod_uid, grant.namespace, grant.pod, grant.container, grant.region)
    if any(_unsafe(t) for t in (*texts, *grant.uuids)):
        return "a value holds a comma, '=' or a character outside printable ASCII"
    return ""


def _unsafe(text: str) -> bool:
    return any(c in ",=" or not " " < c <= "~" for c in text)


def encode(grant: Grant) -> bytes:
    """The file's bytes; decode(encode(g)) == g."""
    fields = {
        "id": grant.id,
        "pod-uid": grant.pod_uid,
        "namespace": grant.namespace,
        "pod": grant.pod,
        "container": grant.container,
        "indices": _join(grant.indices),
        "uuids": _join(grant.uuids),
        "mem-bytes": _join(grant.mem_bytes),
        "core-percent": _join(grant.core_percent),
        "dev-mem-gib": _join(grant.dev_mem_gib),
        "weight": str(grant.weight),
        "high-priority": "1" if grant.high_priority else "0",
        "isolation-disabled": "1" if grant.isolation_disabled else "0",
        "region": grant.region,
    }
    text = "".join(f"{line}\n" for line in [FORMAT_LINE, *(f"{k}={v}" for k, v in fields.items())])
    data = text.encode("ascii")
    if len(data) > MAX_BYTES:
        raise GrantError(f"a grant is at most {MAX_BYTES} bytes, this one {len(data)}")
    return data


def decode(data: bytes) -> Grant:
    """The grant in a file's bytes; GrantError when they are not one, or not whole."""
    if len(data) > MAX_BYTES:
        raise GrantError(f"{len(data)} bytes: a grant is at most {MAX_BYTES}")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise GrantError("not ASCII") from None
    if not text.endswith("\n"):
        raise GrantError("the last line is cut short (no newline at the end)")
    lines = text[:-1].split("\n")
    if lines[0] != FORMAT_LINE:
        raise GrantError(f"the first line is not {FORMAT_LINE!r}")
    fields: dict[str, str] = {}
    for line in lines[1:]:
        if len(line) > MAX_LINE:
            raise GrantError(f"a line is over {MAX_LINE} bytes")
        key, sep, value = line.partition("=")
        if not sep:
            raise GrantError(f"line {line[:40]!r} is not key=value")
        if key in fields:
            raise GrantError(f"{key} is given twice")
        if key in _KEYS:
            fields[key] = value
    missing = [k for k in _REQUIRED if k not in fields]
    if missing:
        raise GrantError(f"{', '.join(missing)} missing")
    count = len(_ints(fields, "indices"))
    return Grant(
        id=fields["id"],
        pod_uid=fields.get("pod-uid", ""),
        namespace=fields.get("namespace", ""),
        pod=fields.get("pod", ""),
        container=fields.get("container", ""),
        indices=_ints(fields, "indices"),
        uuids=tuple(u for u in fields.get("uuids", "").split(",") if u),
        mem_bytes=_ints(fields, "mem-bytes"),
        core_percent=_ints(fields, "core-percent") or (0,) * count,
        dev_mem_gib=_ints(fields, "dev-mem-gib") or (0,) * count,
        weight=_int(fields, "weight", 1),
        high_priority=_flag(fields, "high-priority"),
        isolation_disabled=_flag(fields, "isolation-disabled"),
        region=fields["region"],
    )


def _join(values: tuple[object, ...]) -> str:
    return ",".join(str(v) for v in values)


_DECIMAL: Final = re.compile(r"0|[1-9][0-9]{0,17}")
"""What C's strict parse accepts too: no sign, no leading zero, no space, no fraction."""


def _ints(fields: dict[str, str], key: str) -> tuple[int, ...]:
    raw = fields.get(key, "")
    if not raw:
        return ()
    parts = raw.split(",")
    if not all(_DECIMAL.fullmatch(p) for p in parts):
        raise GrantError(f"{key}={raw[:60]!r} is not a comma list of whole numbers")
    return tuple(int(p) for p in parts)


def _int(fields: dict[str, str], key: str, default: int) -> int:
    values = _ints(fields, key)
    if len(values) > 1:
        raise GrantError(f"{key} takes one number")
    return values[0] if values else default


def _flag(fields: dict[str, str], key: str) -> bool:
    value = fields.get(key, "0")
    if value not in ("0", "1"):
        raise GrantError(f"{key}={value[:20]!r} is neither 0 nor 1")
    return value == "1"
