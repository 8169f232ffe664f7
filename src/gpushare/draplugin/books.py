"""The node's books of prepared claims: what each claim was given, kept on disk.

The kubelet calls Prepare again after its own restart and Unprepare with only the
claim's name and UID (DRA-INTERFACES §3), so the driver answers both from its own
record. The record is written (synced, renamed over) before Prepare answers: a driver
restarted between Prepare and the container's start answers the retry with what it
gave, and counts that claim's share of each GPU before giving any to another.

A GPU's capacity is never handed out twice: a claim whose allocation does not fit
beside the claims prepared on the node (the scheduler's view and the node's disagree:
a slice republished, a claim deallocated while its pod still runs) is refused with
the numbers. A record that cannot be read is rebuilt from the CDI specs on disk, the
environment each prepared container was given, so a damaged file never frees capacity
that a running container holds.
"""

import json
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final

from pydantic import BaseModel, ConfigDict, ValidationError

from gpushare.allocation import ContainerAllocation, GpuSlice
from gpushare.dra.claims import DRIVER
from gpushare.environment import limits_from_env
from gpushare.inventory import Gpu
from gpushare.request import ContainerRole
from gpushare.resources import CORE_PER_GPU, DEFAULT_MAX_PODS_PER_GPU

log = logging.getLogger(__name__)

FILE_NAME: Final = "prepared-claims.json"
VERSION: Final = 1


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True)


class Answer(_Record):
    """One device of Prepare's answer."""

    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    share_id: str | None = None


class PreparedClaim(_Record):
    uid: str
    namespace: str
    name: str
    pod_uid: str = ""
    containers: tuple[ContainerAllocation, ...]
    answers: tuple[Answer, ...] = ()
    recovered: bool = False
    """Rebuilt from the CDI specs: its capacity counts, its answer is made again."""


class _File(_Record):
    version: int
    claims: tuple[PreparedClaim, ...]


class OverCommitted(Exception):
    """The claim does not fit beside those prepared; the message has the numbers."""


class PreparedClaims:
    """Not thread-safe: the preparer holds its lock around every use."""

    def __init__(self, state_dir: Path, cdi_dir: Path) -> None:
        self._path = state_dir / FILE_NAME
        self._cdi_dir = cdi_dir
        self._claims: dict[str, PreparedClaim] = {}

    def load(self) -> None:
        """Reads the record; where it is missing or damaged, rebuilds it from the specs."""
        try:
            raw = self._path.read_bytes()
        except FileNotFoundError:
            raw = None
        if raw is not None:
            try:
                record = _File.model_validate_json(raw)
                if record.version != VERSION:
                    raise ValueError(f"version {record.version}, this driver reads {VERSION}")
                self._claims = {c.uid: c for c in record.claims}
                return
            except (ValidationError, ValueError) as err:
                log.error(
                    "the record of prepared claims %s cannot be read (%s); rebuilding it "
                    "from the CDI specs in %s",
                    self._path,
                    err,
                    self._cdi_dir,
                )
        self._claims = {c.uid: c for c in recover(self._cdi_dir)}
        if self._claims:
            log.warning("recovered %d prepared claim(s) from CDI specs", len(self._claims))

    def get(self, uid: str) -> PreparedClaim | None:
        return self._claims.get(uid)

    def claims(self) -> list[PreparedClaim]:
        return list(self._claims.values())

    def check_fits(self, claim: PreparedClaim, gpus: Mapping[int, Gpu]) -> None:
        """Raises OverCommitted when `claim` (its own earlier record aside) would take
        more of a GPU than is left beside the others."""
        others = [c for uid, c in self._claims.items() if uid != claim.uid]
        held = usage(c for o in others for c in o.containers)
        wanted = usage(claim.containers)
        for index, (mem, core, shares, whole) in sorted(wanted.items()):
            gpu = gpus.get(index)
            if gpu is None:
                raise OverCommitted(f"GPU {index} is not on this node")
            h_mem, h_core, h_shares, h_whole = held.get(index, (0, 0, 0, False))
            if (whole or h_whole) and (h_shares or h_whole):
                raise OverCommitted(
                    f"GPU {index} is held by {h_shares or 1} prepared claim(s) "
                    f"{'whole' if h_whole else 'in slices'}; this claim asks it "
                    f"{'whole' if whole else 'in a slice'}"
                )
            over = []
            if h_mem + mem > gpu.mem:
                over.append(f"{h_mem} of {gpu.mem} GiB held, {mem} GiB asked")
            if h_core + core > CORE_PER_GPU:
                over.append(f"{h_core} of {CORE_PER_GPU} percent held, {core} asked")
            if h_shares + shares > DEFAULT_MAX_PODS_PER_GPU:
                over.append(f"{h_shares} of {DEFAULT_MAX_PODS_PER_GPU} claims held")
            if over:
                raise OverCommitted(f"GPU {index}: " + "; ".join(over))

    def held(self) -> dict[int, tuple[int, int, int]]:
        """Per GPU index: GiB, compute percent and slices the prepared claims hold."""
        return {
            index: (mem, core, shares)
            for index, (mem, core, shares, _) in usage(
                c for claim in self._claims.values() for c in claim.containers
            ).items()
        }

    def put(self, claim: PreparedClaim) -> None:
        self._claims[claim.uid] = claim
        self._save()

    def remove(self, uid: str) -> PreparedClaim | None:
        gone = self._claims.pop(uid, None)
        if gone is not None:
            self._save()
        return gone

    def _save(self) -> None:
        data = _File(version=VERSION, claims=tuple(self._claims.values())).model_dump_json()
        self._path.parent.mkdir(parents=True, exist_ok=True)
        partial = self._path.with_name(f".{self._path.name}.partial")
        with partial.open("w") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        partial.replace(self._path)


Usage = tuple[int, int, int, bool]
"""GiB, compute percent, claims' slices, held whole."""


def usage(containers: Iterable[ContainerAllocation]) -> dict[int, Usage]:
    """Per GPU index: what the containers hold of it."""
    held: dict[int, Usage] = {}
    for container in containers:
        for s in container.gpus:
            mem, core, shares, whole = held.get(s.index, (0, 0, 0, False))
            if container.exclusive:
                held[s.index] = (mem + s.gpu_mem, core, shares, True)
            else:
                held[s.index] = (mem + s.mem, core + s.core, shares + 1, whole)
    return held


def recover(cdi_dir: Path) -> list[PreparedClaim]:
    """Claims as the CDI specs this driver wrote show them: the GPUs and caps in each
    container's environment. A spec that cannot be read is skipped, logged."""
    claims: dict[str, list[ContainerAllocation]] = {}
    for path in sorted(cdi_dir.glob(f"{DRIVER}-*.json")):
        try:
            spec = json.loads(path.read_text())
            device = spec["devices"][0]
            env = dict(e.split("=", 1) for e in device["containerEdits"]["env"])
            limits = limits_from_env(env)
            uid = device["name"].removeprefix("claim-")[:36]
        except (OSError, ValueError, KeyError, IndexError, TypeError) as err:
            log.error("CDI spec %s cannot be read back: %s", path, err)
            continue
        if limits is None:
            continue
        slices = tuple(
            GpuSlice(index=i, uuid=u, mem=m, core=c, gpu_mem=d)
            for i, u, m, c, d in zip(
                limits.gpu_indices,
                limits.gpu_uuids,
                limits.mem_gib,
                limits.core_percent,
                limits.dev_mem_gib,
                strict=False,
            )
        )
        exclusive = limits.isolation_disabled and all(s.mem == s.gpu_mem for s in slices)
        claims.setdefault(uid, []).append(
            ContainerAllocation(
                name=limits.container or path.stem,
                role=ContainerRole.APP,
                index=len(claims.get(uid, [])),
                gpus=slices,
                exclusive=exclusive,
            )
        )
    return [
        PreparedClaim(uid=uid, namespace="", name="", containers=tuple(c), recovered=True)
        for uid, c in claims.items()
    ]
