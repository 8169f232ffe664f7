"""What a container runtime makes of the CDI device IDs a DRA driver hands the kubelet
(DRA-INTERFACES §3, "CDI facts"): it looks each `<vendor>/<class>=<name>` up in the spec
files of the CDI directory and applies the container edits found there.

As in the runtime, a spec file that does not validate (not JSON, no `kind`, a device
without a name or with empty containerEdits) is left out whole, and an ID no valid spec
defines fails the container: "unresolvable CDI devices".
"""

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EDIT_KEYS = ("env", "mounts", "deviceNodes", "hooks")


class CdiError(Exception):
    """The runtime cannot start the container with these CDI devices."""


@dataclass(frozen=True, slots=True)
class CdiMount:
    host_path: str
    container_path: str
    options: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CdiDeviceNode:
    path: str
    host_path: str
    permissions: str = ""


@dataclass
class ContainerEdits:
    env: dict[str, str] = field(default_factory=dict)
    mounts: list[CdiMount] = field(default_factory=list)
    device_nodes: list[CdiDeviceNode] = field(default_factory=list)

    def apply(self, edits: Mapping[str, Any]) -> None:
        """Later edits win for an env key, as the runtime appends them in order."""
        for entry in edits.get("env") or ():
            key, _, value = entry.partition("=")
            self.env[key] = value
        self.mounts += [
            CdiMount(m["hostPath"], m["containerPath"], tuple(m.get("options") or ()))
            for m in edits.get("mounts") or ()
        ]
        self.device_nodes += [
            CdiDeviceNode(d["path"], d.get("hostPath") or d["path"], d.get("permissions", ""))
            for d in edits.get("deviceNodes") or ()
        ]


@dataclass(frozen=True, slots=True)
class _Spec:
    file: str
    edits: Mapping[str, Any]
    devices: Mapping[str, Mapping[str, Any]]
    """Device name -> its containerEdits."""


def resolve(cdi_dir: Path, ids: Sequence[str]) -> ContainerEdits:
    """The merged edits of `ids`, in order; raises CdiError naming every unresolvable ID
    and why the specs that were left out were."""
    specs, problems = _load(cdi_dir)
    found: dict[str, tuple[_Spec, Mapping[str, Any]]] = {}
    for spec_kind, spec in specs:
        for name, edits in spec.devices.items():
            found.setdefault(f"{spec_kind}={name}", (spec, edits))
    missing = [i for i in ids if i not in found]
    if missing:
        skipped = "".join(f"; {p}" for p in problems)
        raise CdiError(f"unresolvable CDI devices {', '.join(missing)}{skipped}")
    result = ContainerEdits()
    applied: set[str] = set()
    for device_id in ids:
        spec, edits = found[device_id]
        if spec.file not in applied:  # a spec's own edits come once, before its devices'
            applied.add(spec.file)
            result.apply(spec.edits)
        result.apply(edits)
    return result


def _load(cdi_dir: Path) -> tuple[list[tuple[str, _Spec]], list[str]]:
    specs, problems = [], []
    for path in sorted(cdi_dir.glob("*.json")) if cdi_dir.is_dir() else ():
        try:
            specs.append(_parse(path))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            problems.append(f"spec {path.name} left out: {err}")
    return specs, problems


def _parse(path: Path) -> tuple[str, _Spec]:
    document = json.loads(path.read_text())
    kind = document["kind"]
    if not isinstance(kind, str) or kind.count("/") != 1:
        raise ValueError(f"kind {kind!r} is not <vendor>/<class>")
    devices: dict[str, Mapping[str, Any]] = {}
    for device in document["devices"]:
        name, edits = device["name"], device.get("containerEdits") or {}
        if not name or not _has_edits(edits):
            raise ValueError(f"device {name!r} has empty containerEdits")
        _check(edits)
        devices[name] = edits
    spec_edits = document.get("containerEdits") or {}
    _check(spec_edits)
    return kind, _Spec(path.name, spec_edits, devices)


def _has_edits(edits: Mapping[str, Any]) -> bool:
    return any(edits.get(key) for key in EDIT_KEYS)


def _check(edits: Mapping[str, Any]) -> None:
    """Raises what applying the edits would: a bad entry spoils the spec, not the run."""
    for entry in edits.get("env") or ():
        if "=" not in entry:
            raise ValueError(f"env entry {entry!r} is not KEY=VALUE")
    ContainerEdits().apply(edits)
