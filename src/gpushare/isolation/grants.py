"""The grants of the node's containers, as the agent reads them: from the node's side
of the mount (`<interposer dir>/grants/<id>/grant`), found by the ID in a process's
mounts. What a grant says the agent enforces, whatever the container's environment says.

A grant's caps and GPUs never change once written (the plugin writes each whole, under a
new ID); its names may be corrected once (a swapped admission), which is taken up within
RECHECK_S. One that cannot be read is asked for again at most once a minute (the plugin
may still be writing it) and said so once.
"""

import dataclasses
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from gpushare import grant as grants
from gpushare.environment import REGION_FILE
from gpushare.grant import Grant, GrantError

log = logging.getLogger(__name__)

RETRY_S: Final = 60.0
RECHECK_S: Final = 1.0
"""How often a grant read is checked for a correction (the plugin renames the pod a
grant was answered for when the kubelet admitted another; caps and GPUs never change)."""
MAX_KEPT: Final = 4096
"""Grants kept read: far more containers than a node runs; past it the oldest go."""

_Stamp = tuple[int, int, int]
"""(inode, mtime ns, size) of a grant file: a correction is written anew and renamed in."""


@dataclass(slots=True)
class _Read:
    grant: Grant
    stamp: _Stamp
    checked: float


class GrantBook:
    def __init__(self, directory: Path) -> None:
        self._root = directory / grants.GRANTS
        self._read: dict[str, _Read] = {}
        self._failed: dict[str, float] = {}

    def region_path(self, grant_id: str) -> Path:
        """Where the container of this grant keeps its region, on the node's side."""
        return self._root / grant_id / grants.REGION_DIR / REGION_FILE

    def get(self, grant_id: str, now: float) -> Grant | None:
        """The grant; None when there is none by that ID or it cannot be read (then the
        container is held to what its environment says, as before grants). The same
        object while the file is the same."""
        if not grants.ID_PATTERN.fullmatch(grant_id):
            return None
        known = self._read.get(grant_id)
        if known is not None:
            return self._rechecked(grant_id, known, now)
        failed_at = self._failed.get(grant_id)
        if failed_at is not None and now - failed_at < RETRY_S:
            return None
        try:
            read = self._load(grant_id, now)
        except (OSError, GrantError) as err:
            if failed_at is None:
                log.warning(
                    "grant %s cannot be read (%s): its container is held to the "
                    "limits in its environment",
                    grant_id,
                    err,
                )
            self._failed[grant_id] = now
            return None
        self._failed.pop(grant_id, None)
        if len(self._read) >= MAX_KEPT:
            del self._read[next(iter(self._read))]
        self._read[grant_id] = read
        return read.grant

    def _rechecked(self, grant_id: str, known: _Read, now: float) -> Grant:
        """A correction is taken up within RECHECK_S; what it may change is the names
        (the caps and GPUs a container started with are kept, whatever the file says)."""
        if now - known.checked < RECHECK_S:
            return known.grant
        known.checked = now
        try:
            if _stamp(self._file(grant_id)) == known.stamp:
                return known.grant
            read = self._load(grant_id, now)
        except (OSError, GrantError) as err:
            log.debug("grant %s not read again (%s): the one read stands", grant_id, err)
            return known.grant
        before = known.grant
        corrected = dataclasses.replace(
            before,
            pod_uid=read.grant.pod_uid,
            namespace=read.grant.namespace,
            pod=read.grant.pod,
            container=read.grant.container,
        )
        if corrected != before:
            log.info(
                "grant %s now names %s container %s (was %s container %s)",
                grant_id,
                corrected.pod_key,
                corrected.container,
                before.pod_key,
                before.container,
            )
        self._read[grant_id] = _Read(corrected, read.stamp, now)
        return corrected if corrected != before else before

    def _file(self, grant_id: str) -> Path:
        return self._root / grant_id / grants.GRANT_FILE

    def _load(self, grant_id: str, now: float) -> _Read:
        path = self._file(grant_id)
        with open(path, "rb") as file:
            stamp = _stamp_of(os.fstat(file.fileno()))
            found = grants.decode(file.read(grants.MAX_BYTES + 1))
        if found.id != grant_id:
            raise GrantError(f"it says it is grant {found.id}")
        return _Read(found, stamp, now)


def _stamp(path: Path) -> _Stamp:
    return _stamp_of(os.stat(path))


def _stamp_of(status: os.stat_result) -> _Stamp:
    return (status.st_ino, status.st_mtime_ns, status.st_size)
