"""CDI specs: how a prepared claim reaches its containers (DRA-INTERFACES §3).

The kubelet hands the container runtime the CDI device IDs Prepare returned for the
container's request; the runtime applies the container edits of the spec that names
each ID. One spec file per claim and request, named with the claim's UID (runtimes
cache specs by file), written before Prepare answers and removed by Unprepare.
"""

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from gpushare.dra.claims import DRIVER
from gpushare.gpunode.backends.port import DeviceNode
from gpushare.gpunode.interposer import Mount

CDI_VERSION: Final = "0.5.0"
KIND: Final = f"{DRIVER}/gpu"


@dataclass(frozen=True, slots=True)
class ContainerEdits:
    """What the runtime adds to a container: the device plugin's Allocate answer as CDI."""

    env: Mapping[str, str]
    mounts: Sequence[Mount] = ()
    device_nodes: Sequence[DeviceNode] = ()

    def manifest(self) -> dict[str, object]:
        edits: dict[str, object] = {"env": [f"{k}={v}" for k, v in sorted(self.env.items())]}
        if self.mounts:
            edits["mounts"] = [
                {
                    "hostPath": m.host_path,
                    "containerPath": m.container_path,
                    "options": ["ro" if m.read_only else "rw", "bind"],
                }
                for m in self.mounts
            ]
        if self.device_nodes:
            edits["deviceNodes"] = [
                {"path": n.container_path, "hostPath": n.host_path, "permissions": n.permissions}
                for n in self.device_nodes
            ]
        return edits


def device_name(claim_uid: str, request: str) -> str:
    return f"claim-{claim_uid}-{request}"


def device_id(claim_uid: str, request: str) -> str:
    return f"{KIND}={device_name(claim_uid, request)}"


def spec_path(cdi_dir: Path, claim_uid: str, request: str) -> Path:
    return cdi_dir / f"{DRIVER}-{claim_uid}-{request}.json"


def write_spec(cdi_dir: Path, claim_uid: str, request: str, edits: ContainerEdits) -> str:
    """Writes the spec (whole or not at all: beside, synced, then renamed over) and
    returns the CDI device ID. Edits always carry the environment, so a device is never
    empty (the runtime fails "unresolvable CDI devices" on an empty one)."""
    if not edits.env:
        raise ValueError("a CDI device needs container edits; this one has no environment")
    spec = {
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        "devices": [{"name": device_name(claim_uid, request), "containerEdits": edits.manifest()}],
    }
    cdi_dir.mkdir(parents=True, exist_ok=True)
    path = spec_path(cdi_dir, claim_uid, request)
    partial = path.with_name(f".{path.name}.partial")
    with partial.open("w") as out:
        json.dump(spec, out, indent=1)
        out.flush()
        os.fsync(out.fileno())
    partial.chmod(0o644)
    partial.replace(path)
    return device_id(claim_uid, request)


def remove_specs(cdi_dir: Path, claim_uid: str) -> int:
    """Removes every spec of the claim; how many there were."""
    removed = 0
    for path in cdi_dir.glob(f"{DRIVER}-{claim_uid}-*.json"):
        path.unlink(missing_ok=True)
        removed += 1
    return removed
