"""Events on pods whose allocation record cannot be trusted.

Such a pod is never dropped from the books (annotation.read): its GPU is charged as
ACK's keys say, or its node holds an unknown allocation and takes no new GPU pod.
Whoever can repair it must hear of it where they look, so the cache notes each such
pod in its book of them (`DamagedRecords`) and this worker posts one Warning event
`AllocationRecordDamaged` on it, saying what is wrong and what it costs, once per
problem: again only when the record changes and is still wrong.
"""

from collections.abc import Callable, Container
from typing import Final

from gpushare.cluster import Cluster
from gpushare.extender.background import BackgroundWorker
from gpushare.extender.podevents import post_pod_warning

ALLOCATION_RECORD_DAMAGED: Final = "AllocationRecordDamaged"

Damaged = tuple[str, str, str]
"""A pod whose record is damaged: key, UID, what is wrong."""


class DamagedRecords:
    """The damaged records noted and not told about yet, and what was told per pod."""

    def __init__(self) -> None:
        self._untold: dict[str, Damaged] = {}
        self._told: dict[str, str] = {}
        """key → the problem noted last: told about, or about to be."""

    def note(self, key: str, uid: str, problem: str) -> bool:
        """True when the pod's problem is new (it joins the untold ones)."""
        if self._told.get(key) == problem:
            return False
        self._told[key] = problem
        self._untold[key] = (key, uid, problem)
        return True

    def gone(self, key: str) -> None:
        """The pod is gone or its record repaired."""
        self._told.pop(key, None)
        self._untold.pop(key, None)

    def relisted(self, damaged: Container[str]) -> None:
        """A listing showed the pods: forget those no longer `damaged`."""
        for key in [key for key in self._told if key not in damaged]:
            self.gone(key)

    def take(self) -> list[Damaged]:
        untold = list(self._untold.values())
        self._untold = {}
        return untold


class DamagedRecordReporter(BackgroundWorker):
    """A daemon thread woken by the cache (`on_damaged`) that posts the events; API
    errors are logged, never raised (the event is not tried again)."""

    def __init__(self, cluster: Cluster, take: Callable[[], list[Damaged]]) -> None:
        super().__init__("damaged-record-events")
        self._cluster = cluster
        self._take = take

    def work(self) -> int:
        """Posts the event of each pod noted since the last call; how many were posted."""
        return sum(
            post_pod_warning(self._cluster, key, uid, ALLOCATION_RECORD_DAMAGED, problem)
            for key, uid, problem in self._take()
        )
