"""Memory caps: a container holding more GPU memory than its cap on a GPU is acted on.

Each observation, the memory of a container's processes on each GPU is held
against its cap there. Going over starts an episode, counted once as a
violation; under `kill` the process holding the most memory is killed on every
observation the container stays over, under `report` the episode is only
logged and counted.
"""

import logging
from collections.abc import Callable, Mapping
from enum import StrEnum

from gpushare.isolation.backends.port import GIB
from gpushare.isolation.workload import ObservedContainer

log = logging.getLogger(__name__)


class MemoryAction(StrEnum):
    KILL = "kill"
    REPORT = "report"


class MemoryCapEnforcer:
    def __init__(self, action: MemoryAction, kill: Callable[[int], None]) -> None:
        self._action = action
        self._kill = kill
        self._over_cap: set[tuple[str, int]] = set()
        self._violations: dict[tuple[str, int], int] = {}

    def violations(self, key: str, gpu: int) -> int:
        """Episodes over the cap of a container on one GPU since it was first seen (the tree
        shows them, the metrics count them on)."""
        return self._violations.get((key, gpu), 0)

    def enforce(self, observed: Mapping[str, ObservedContainer]) -> None:
        over: set[tuple[str, int]] = set()
        for key, container in observed.items():
            for index in container.gpu_indices:
                cap = container.cap_bytes(index)
                used = container.mem_used(index)
                if cap is None or used <= cap:
                    continue
                over.add((key, index))
                self._act(container, index, used, cap, new=(key, index) not in self._over_cap)
        self._over_cap = over

    def forget(self, key: str) -> None:
        """A container gone for good: should its ID come back, it starts afresh."""
        self._over_cap = {(k, g) for k, g in self._over_cap if k != key}
        self._violations = {(k, g): n for (k, g), n in self._violations.items() if k != key}

    def _act(
        self, container: ObservedContainer, index: int, used: int, cap: int, new: bool
    ) -> None:
        offender = max(container.on(index), key=lambda p: p.mem_bytes)
        if new:
            episode = (container.key, index)
            self._violations[episode] = self._violations.get(episode, 0) + 1
        kill = self._action is MemoryAction.KILL
        if kill:
            self._kill(offender.pid)
        if new or kill:
            log.warning(
                "memory cap exceeded: container %s of pod %s holds %s on GPU %d, cap %s; %s",
                container.key[:12],
                container.pod,
                _gib(used),
                index,
                _gib(cap),
                f"killed pid {offender.pid} (holding {_gib(offender.mem_bytes)})"
                if kill
                else "reported only (--memory-action report)",
            )


def _gib(value: int) -> str:
    return f"{value / GIB:.2f} GiB"
