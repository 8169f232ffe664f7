"""Memory caps: a container holding more GPU memory than its cap on a GPU is acted on.

Each observation, the memory of a container's processes on each GPU is held
against its cap there. Going over starts an episode, counted once as a
violation; under `kill` the process holding the most memory is killed on every
observation the container stays over, under `report` the episode is only
logged and counted.

A container paced by the CUDA interposer has its allocations refused at the cap by the
library already; this is its backstop, for what the library cannot see or a container
that got around it (a process started without it, a region rewritten). It gets a slack
on top of its cap for what the library does not count (CUDA contexts, modules): per
process on the GPU, up to a most. The backstop never switches off; its actions on paced
containers are counted apart, since each means the library was bypassed.
"""

import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from gpushare.isolation.backends.port import GIB
from gpushare.isolation.workload import ObservedContainer

MIB: Final = 1 << 20
SLACK_PER_PROCESS_BYTES: Final = 512 * MIB
SLACK_MOST_BYTES: Final = 2 * GIB

log = logging.getLogger(__name__)


class MemoryAction(StrEnum):
    KILL = "kill"
    REPORT = "report"


@dataclass(frozen=True, slots=True)
class BackstopSlack:
    """What a paced container may hold over its cap on one GPU before the backstop acts."""

    per_process_bytes: int = SLACK_PER_PROCESS_BYTES
    most_bytes: int = SLACK_MOST_BYTES

    def on(self, processes: int) -> int:
        return min(processes * self.per_process_bytes, self.most_bytes)


class MemoryCapEnforcer:
    def __init__(
        self,
        action: MemoryAction,
        kill: Callable[[int], None],
        slack: BackstopSlack = BackstopSlack(),
    ) -> None:
        self._action = action
        self._kill = kill
        self._slack = slack
        self._over_cap: set[tuple[str, int]] = set()
        self._violations: dict[tuple[str, int], int] = {}
        self._backstops: dict[tuple[str, int], int] = {}

    def violations(self, key: str, gpu: int) -> int:
        """Episodes over the cap of a container on one GPU since it was first seen (the tree
        shows them, the metrics count them on)."""
        return self._violations.get((key, gpu), 0)

    def backstops(self, key: str, gpu: int) -> int:
        """Actions (kills, or reported episodes) on a container while it was paced."""
        return self._backstops.get((key, gpu), 0)

    def enforce(
        self, observed: Mapping[str, ObservedContainer], paced: Collection[str] = ()
    ) -> None:
        """Acts on every container over its cap; those in `paced` over cap plus slack."""
        over: set[tuple[str, int]] = set()
        for key, container in observed.items():
            for index in container.gpu_indices:
                cap = container.cap_bytes(index)
                if cap is None:
                    continue
                if key in paced:
                    cap += self._slack.on(len(container.on(index)))
                used = container.mem_used(index)
                if used <= cap:
                    continue
                over.add((key, index))
                new = (key, index) not in self._over_cap
                self._act(container, index, used, cap, new=new, paced=key in paced)
        self._over_cap = over

    def forget(self, key: str) -> None:
        """A container gone for good: should its ID come back, it starts afresh."""
        self._over_cap = {(k, g) for k, g in self._over_cap if k != key}
        self._violations = {(k, g): n for (k, g), n in self._violations.items() if k != key}
        self._backstops = {(k, g): n for (k, g), n in self._backstops.items() if k != key}

    def _act(
        self, container: ObservedContainer, index: int, used: int, cap: int, new: bool, paced: bool
    ) -> None:
        offender = max(container.on(index), key=lambda p: p.mem_bytes)
        if new:
            episode = (container.key, index)
            self._violations[episode] = self._violations.get(episode, 0) + 1
        kill = self._action is MemoryAction.KILL
        if kill:
            self._kill(offender.pid)
        if new or kill:
            if paced:
                episode = (container.key, index)
                self._backstops[episode] = self._backstops.get(episode, 0) + 1
            log.warning(
                "memory cap exceeded: container %s of pod %s holds %s on GPU %d, cap %s%s; %s",
                container.key[:12],
                container.pod,
                _gib(used),
                index,
                _gib(cap),
                " with the slack of a paced container (the CUDA interposer was bypassed)"
                if paced
                else "",
                f"killed pid {offender.pid} (holding {_gib(offender.mem_bytes)})"
                if kill
                else "reported only (--memory-action report)",
            )


def _gib(value: int) -> str:
    return f"{value / GIB:.2f} GiB"
