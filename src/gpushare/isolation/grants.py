"""The grants of the node's containers, as the agent reads them: from the node's side
of the mount (`<interposer dir>/grants/<id>/grant`), found by the ID in a process's
mounts. What a grant says the agent enforces, whatever the container's environment says.

A grant never changes once written (the plugin writes each whole, under a new ID), so
each is read once; one that cannot be read is asked for again at most once a minute
(the plugin may still be writing it) and said so once.
"""

import logging
from pathlib import Path
from typing import Final

from gpushare import grant as grants
from gpushare.environment import REGION_FILE
from gpushare.grant import Grant, GrantError

log = logging.getLogger(__name__)

RETRY_S: Final = 60.0
MAX_KEPT: Final = 4096
"""Grants kept read: far more containers than a node runs; past it the oldest go."""


class GrantBook:
    def __init__(self, directory: Path) -> None:
        self._root = directory / grants.GRANTS
        self._read: dict[str, Grant] = {}
        self._failed: dict[str, float] = {}

    def region_path(self, grant_id: str) -> Path:
        """Where the container of this grant keeps its region, on the node's side."""
        return self._root / grant_id / grants.REGION_DIR / REGION_FILE

    def get(self, grant_id: str, now: float) -> Grant | None:
        """The grant; None when there is none by that ID or it cannot be read (then the
        container is held to what its environment says, as before grants)."""
        if not grants.ID_PATTERN.fullmatch(grant_id):
            return None
        found = self._read.get(grant_id)
        if found is not None:
            return found
        failed_at = self._failed.get(grant_id)
        if failed_at is not None and now - failed_at < RETRY_S:
            return None
        try:
            found = grants.decode((self._root / grant_id / grants.GRANT_FILE).read_bytes())
            if found.id != grant_id:
                raise GrantError(f"it says it is grant {found.id}")
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
        self._read[grant_id] = found
        return found
