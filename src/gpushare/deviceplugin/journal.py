"""What the plugin answered.

Each grant records the device IDs of an Allocate call and the container the
plugin matched them to, with the GPU placement its answer carried:
- until the kubelet's PodResources confirms who got them, the reconciler looks
  open grants up by (resource, IDs);
- as long as the pod lives, a call with exactly the same IDs is the kubelet
  asking again for a container it already admitted (after a node reboot it
  re-allocates from its checkpoint) and gets the same answer. That record is
  kept in a file beside the kubelet's checkpoint (the kubelet removes only
  sockets there), so it survives plugin restarts and reboots.
"""

import json
import logging
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from io import TextIOWrapper
from pathlib import Path
from typing import Final

from gpushare.allocation import GpuSlice

log = logging.getLogger(__name__)

DEFAULT_TTL: Final = 600.0
"""Seconds a grant waits for confirmation; ordinary init containers never appear
in PodResources, and pods may die before they are listed."""
FILE_NAME: Final = "gpushare-grants.jsonl"

CallKey = tuple[str, frozenset[str]]
"""(resource, device IDs) of one Allocate call."""


@dataclass(frozen=True, slots=True)
class Grant:
    resource: str
    device_ids: frozenset[str]
    pod_uid: str
    pod_key: str
    container: str
    gpus: tuple[GpuSlice, ...]
    at: float = field(default_factory=time.monotonic)
    interposer_grant: str = ""
    """The ID of the grant (gpushare.grant) the answer mounted; '' without the interposer.
    Kept in memory only: it names the container's pod, which a repair may correct."""

    @property
    def target(self) -> tuple[str, str]:
        return (self.pod_key, self.container)

    @property
    def call(self) -> CallKey:
        return (self.resource, self.device_ids)


class GrantJournal:
    def __init__(self, path: Path | None = None, ttl: float = DEFAULT_TTL) -> None:
        self._path = path
        self._ttl = ttl
        self._lock = threading.Lock()
        self._open: dict[CallKey, Grant] = {}
        self._answered: dict[CallKey, tuple[str, str]] = self._load()
        self._unwritten: list[tuple[CallKey, str, str]] = []
        self._file: TextIOWrapper | None = None
        self._file_lock = threading.Lock()

    def add(self, grant: Grant) -> None:
        """Records the grant and appends it to the file."""
        self.record(grant)
        self.write()

    def record(self, grant: Grant) -> None:
        """Records the grant in memory at once; its line reaches the file at the
        next write(). Allocate answers first and writes after: a file write lets
        other threads take the interpreter, and the call would wait for them."""
        with self._lock:
            self._open[grant.call] = grant
            self._answered[grant.call] = (grant.pod_uid, grant.container)
            if self._path is not None:
                self._unwritten.append((grant.call, grant.pod_uid, grant.container))

    def write(self) -> None:
        """Appends the lines of the grants recorded since the last write."""
        with self._file_lock:
            with self._lock:
                unwritten, self._unwritten = self._unwritten, []
            text = "".join(_line(*record) for record in unwritten)
            if text:
                self._append(text)

    def answered(self, resource: str, device_ids: Collection[str]) -> tuple[str, str] | None:
        """(pod UID, container) a call with exactly these IDs was answered for."""
        with self._lock:
            return self._answered.get((resource, frozenset(device_ids)))

    def open_grants(self) -> list[Grant]:
        """Grants not yet confirmed, dropping the expired ones."""
        now = time.monotonic()
        with self._lock:
            self._open = {k: g for k, g in self._open.items() if now - g.at < self._ttl}
            return list(self._open.values())

    def settle(self, grants: list[Grant]) -> None:
        with self._lock:
            for grant in grants:
                self._open.pop(grant.call, None)

    def close(self) -> None:
        self.write()
        with self._file_lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def keep_pods(self, uids: Collection[str]) -> None:
        """Forgets the answers of pods that are gone. The file is rewritten without
        holding the lock Allocate reads answers under: a slow disk must not hold a
        call up."""
        live = set(uids)
        with self._file_lock:
            with self._lock:
                kept = {k: v for k, v in self._answered.items() if v[0] in live}
                if len(kept) == len(self._answered):
                    return
                self._answered = kept
                self._unwritten.clear()  # the rewrite holds every answer kept
                text = "".join(_line(call, *owner) for call, owner in kept.items())
            self._rewrite(text)

    def _load(self) -> dict[CallKey, tuple[str, str]]:
        if self._path is None or not self._path.exists():
            return {}
        answered = {}
        for line in self._path.read_text().splitlines():
            try:
                record = json.loads(line)
                key = (record["resource"], frozenset(record["ids"]))
                answered[key] = (record["uid"], record["container"])
            except (ValueError, KeyError, TypeError):
                log.warning("skipping an unreadable line of %s", self._path)
        return answered

    def _append(self, text: str) -> None:
        if self._path is None:
            return
        try:
            if self._file is None:
                self._file = self._path.open("a")
            self._file.write(text)
            self._file.flush()
        except OSError as err:
            log.warning("cannot record the answer in %s: %s", self._path, err)

    def _rewrite(self, text: str) -> None:
        if self._path is None:
            return
        if self._file is not None:
            self._file.close()
            self._file = None
        try:
            partial = self._path.with_suffix(".tmp")
            partial.write_text(text)
            partial.replace(self._path)
        except OSError as err:
            log.warning("cannot rewrite %s: %s", self._path, err)


def _line(call: CallKey, uid: str, container: str) -> str:
    resource, ids = call
    record = {"resource": resource, "ids": sorted(ids), "uid": uid, "container": container}
    return json.dumps(record, separators=(",", ":")) + "\n"
