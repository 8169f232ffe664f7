"""What the plugin answered, until the kubelet's PodResources confirms who got it.

Each grant records the device IDs of an Allocate call and the container the
plugin matched them to, with the GPU placement its answer carried. The
reconciler looks the kubelet's records up here by (resource, IDs).
"""

import threading
import time
from dataclasses import dataclass, field
from typing import Final

from gpushare.allocation import GpuSlice

DEFAULT_TTL: Final = 600.0
"""Seconds a grant waits for confirmation; ordinary init containers never appear
in PodResources, and pods may die before they are listed."""


@dataclass(frozen=True, slots=True)
class Grant:
    resource: str
    device_ids: frozenset[str]
    pod_uid: str
    pod_key: str
    container: str
    gpus: tuple[GpuSlice, ...]
    at: float = field(default_factory=time.monotonic)

    @property
    def target(self) -> tuple[str, str]:
        return (self.pod_key, self.container)


class GrantJournal:
    def __init__(self, ttl: float = DEFAULT_TTL) -> None:
        self._ttl = ttl
        self._lock = threading.Lock()
        self._grants: dict[tuple[str, frozenset[str]], Grant] = {}

    def add(self, grant: Grant) -> None:
        with self._lock:
            self._grants[(grant.resource, grant.device_ids)] = grant

    def open_grants(self) -> list[Grant]:
        """Grants not yet confirmed, dropping the expired ones."""
        now = time.monotonic()
        with self._lock:
            self._grants = {k: g for k, g in self._grants.items() if now - g.at < self._ttl}
            return list(self._grants.values())

    def settle(self, grants: list[Grant]) -> None:
        with self._lock:
            for grant in grants:
                self._grants.pop((grant.resource, grant.device_ids), None)
