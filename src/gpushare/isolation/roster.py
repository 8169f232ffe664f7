"""The roster: the containers the agent knows, the members of each GPU in arrival order, and
what each member did on its GPU (whether it has work, the GPU time it used).

A container joins a GPU when its first process there is observed and stays on
the roster, keeping its place, until `forget_after_s` after its last GPU
process: a job that restarts its CUDA process is the same tenant again.
"""

import logging
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from gpushare.isolation.backends.port import GpuProcess
from gpushare.isolation.workload import GrantLookup, ObservedContainer, group_containers

log = logging.getLogger(__name__)

ACTIVE_PERCENT: Final = 1.0
"""Utilisation above which a thawed container counts as having work."""


@dataclass(slots=True)
class Usage:
    """What one container did on one GPU."""

    active: bool = True
    fresh: bool = True
    """Joined this tick: it had no slice yet, so its utilisation says nothing about its work."""
    used_s: float = 0.0
    """GPU-seconds it used so far."""
    rate: float = 0.0
    history: deque[tuple[float, float]] = field(default_factory=deque)
    """(time, used_s) over the utilisation window."""
    shown_util: float = 0.0
    """Percent of the GPU it used over the window, as last refreshed."""

    def record(
        self, now: float, elapsed: float, util: float | None, on_gpu: bool, frozen: bool
    ) -> None:
        """Activity and GPU time from the utilisation seen over the last tick. A frozen
        container cannot show work, so it keeps the activity it last showed while thawed."""
        if not on_gpu:
            self.active = False
            self.rate = 0.0
        elif util is not None:
            self.rate = util / 100
            if not self.fresh and not frozen:
                self.active = util > ACTIVE_PERCENT
        self.fresh = False
        self.used_s += self.rate * elapsed
        self.history.append((now, self.used_s))

    def trim(self, since: float) -> None:
        while self.history and self.history[0][0] < since:
            self.history.popleft()

    def refresh(self) -> None:
        if len(self.history) < 2:
            self.shown_util = 0.0
            return
        (t0, used0), (t1, used1) = self.history[0], self.history[-1]
        self.shown_util = 100 * (used1 - used0) / (t1 - t0) if t1 > t0 else 0.0


@dataclass(slots=True)
class Known:
    """A container as last observed."""

    seen: ObservedContainer
    last_seen: float
    present: bool = True
    """Whether it had GPU processes in the last observation."""


@dataclass(frozen=True, slots=True)
class Changes:
    joined: tuple[tuple[int, ObservedContainer], ...]
    """(GPU, container) for each container that joined a GPU, in arrival order."""
    gone: tuple[str, ...]
    """Containers forgotten: not seen for forget_after_s."""


class ContainerRoster:
    def __init__(
        self,
        gpus: Iterable[int],
        forget_after_s: float,
        util_window_s: float,
        grants: GrantLookup | None = None,
    ) -> None:
        self._grants = grants
        self._members: dict[int, dict[str, Usage]] = {index: {} for index in gpus}
        self._known: dict[str, Known] = {}
        self._unreadable: set[str] = set()
        self._forget_after_s = forget_after_s
        self._util_window_s = util_window_s

    def known(self, key: str) -> Known | None:
        return self._known.get(key)

    def members(self, gpu: int) -> Mapping[str, Usage]:
        """The GPU's containers in arrival order, with what each did there."""
        return self._members[gpu]

    def observe(self, processes: Iterable[GpuProcess]) -> dict[str, ObservedContainer]:
        """The containers behind the GPU processes; those whose limits cannot be read are
        left alone, and said so once."""
        seen = {key: known.seen for key, known in self._known.items()}
        observed, unreadable = group_containers(processes, seen, self._grants)
        for bad in unreadable:
            if bad.key not in self._unreadable:
                log.warning("container %s left alone: %s", bad.key[:12], bad.reason)
        self._unreadable = {bad.key for bad in unreadable}
        return observed

    def update(
        self,
        now: float,
        elapsed: float,
        observed: Mapping[str, ObservedContainer],
        frozen: frozenset[str],
    ) -> Changes:
        """Take in one observation: new members join, long-gone containers are forgotten,
        and every member's usage moves on by `elapsed` (`frozen`: those held last slice)."""
        joined = []
        for key, container in observed.items():
            if key not in self._known:
                log.info(
                    "container %s of pod %s (%s) on GPU %s",
                    key[:12],
                    container.pod,
                    container.limits.container or "-",
                    ",".join(map(str, container.gpu_indices)),
                )
            self._known[key] = Known(container, now)
            for index in container.gpu_indices:
                members = self._members.get(index)
                if members is not None and key not in members:
                    members[key] = Usage()
                    joined.append((index, container))
        gone = []
        for key, known in list(self._known.items()):
            known.present = key in observed
            if now - known.last_seen > self._forget_after_s:
                self._forget(key)
                gone.append(key)
        for index, members in self._members.items():
            for key, usage in members.items():
                member = observed.get(key)
                on_gpu = member is not None and bool(member.on(index))
                util = member.utilisation(index) if member is not None and on_gpu else None
                usage.record(now, elapsed, util, on_gpu, key in frozen)
                usage.trim(now - self._util_window_s)
        return Changes(tuple(joined), tuple(gone))

    def refresh_utilisation(self) -> None:
        """Utilisation over the window, shown at a steady pace rather than every slice,
        so the tree is not rewritten ten times a second for a moving average."""
        for members in self._members.values():
            for usage in members.values():
                usage.refresh()

    def _forget(self, key: str) -> None:
        del self._known[key]
        for members in self._members.values():
            members.pop(key, None)
        log.info("container %s gone; its weight is free again", key[:12])
