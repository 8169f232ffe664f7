"""The isolation agent: each slice it observes the GPUs, applies control-tree writes,
enforces memory caps, asks each GPU's scheduler who runs, and freezes the rest.

One tick per slice (default 100 ms), in this order, so that a write or an
allocation seen in one tick is acted on in that same tick:

1. observe the GPU processes through the backend and group them by container;
2. update each container's activity and GPU time from the utilisation seen (roster);
3. apply writes found in the control tree, refused ones are put back (settings);
4. tell which containers are paced by the CUDA interposer (pacing: a valid region and
   every GPU process of the container attached to it), then act on containers over
   their memory cap: kill the offender, or report (memory) — paced ones too, whose
   memory the library refuses at the call, over their cap plus a slack;
5. decide the slice on each GPU; hold the launches of paced containers at each GPU's
   gate in their region (pacing), and freeze every other container that may not run
   (slicer: a container on several GPUs runs only when all of them let it);
6. publish the control tree (treeview, then the codec) and the metrics; once a second,
   with what the interposer's processes that fail closed left in each container's
   accounting directory (failclosed).

The agent only wires these parts together and keeps the loop's timing.
"""

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from gpushare.isolation import slicer
from gpushare.isolation.backends.port import IsolationBackend
from gpushare.isolation.clock import Clock
from gpushare.isolation.control import ControlTree
from gpushare.isolation.failclosed import FailedClosedBook
from gpushare.isolation.grants import GrantBook
from gpushare.isolation.memory import (
    SLACK_MOST_BYTES,
    SLACK_PER_PROCESS_BYTES,
    BackstopSlack,
    MemoryAction,
    MemoryCapEnforcer,
)
from gpushare.isolation.metrics import AgentMetrics
from gpushare.isolation.pacing import RegionPacer
from gpushare.isolation.policy import DEFAULT_MAX_INST, DEFAULT_PRIO_RATIO, GpuSettings, Policy
from gpushare.isolation.roster import ContainerRoster
from gpushare.isolation.settings import SettingsStore
from gpushare.isolation.slicer import NodeSlicer, tenants
from gpushare.isolation.treecodec import TreeContent
from gpushare.isolation.treeview import TreeView
from gpushare.isolation.workload import ObservedContainer

log = logging.getLogger(__name__)

REFRESH_S: Final = 1.0
"""How often the utilisation shown is refreshed and read-only files are checked for writes
(settings are read every slice)."""


@dataclass(frozen=True, slots=True)
class AgentConfig:
    version: str
    slice_s: float = 0.1
    memory_action: MemoryAction = MemoryAction.KILL
    default_policy: Policy | None = None
    """None: fixed on a GPU whose containers carry a compute percentage, else native."""
    max_inst: int = DEFAULT_MAX_INST
    prio_ratio: int = DEFAULT_PRIO_RATIO
    forget_after_s: float = 30.0
    """How long a container stays known (and keeps its weight) after its last GPU process."""
    util_window_s: float = 5.0
    interposer_dir: Path | None = None
    """The node's interposer directory, whose regions/ hold the containers' regions; None:
    no container runs under the CUDA interposer (pacing.py)."""
    slack_per_process_bytes: int = SLACK_PER_PROCESS_BYTES
    """What a paced container may hold over its cap per process on a GPU (CUDA contexts and
    modules the library does not count) before the memory backstop acts..."""
    slack_most_bytes: int = SLACK_MOST_BYTES
    """...and at most, per GPU."""


class IsolationAgent:
    """The loop: each tick it hands the observation to the roster, the tree's writes to the
    settings store, the memory to the cap enforcer, the GPUs to the slicer, and publishes
    the tree view."""

    def __init__(
        self,
        backend: IsolationBackend,
        tree: ControlTree,
        clock: Clock,
        config: AgentConfig,
        metrics: AgentMetrics | None = None,
    ) -> None:
        self._backend = backend
        self._tree = tree
        self._clock = clock
        self.config = config
        self.metrics = metrics or AgentMetrics()
        devices = backend.devices()
        gpus = [d.index for d in devices]
        book = GrantBook(config.interposer_dir) if config.interposer_dir else None
        self._roster = ContainerRoster(
            gpus,
            config.forget_after_s,
            config.util_window_s,
            grants=(lambda grant_id: book.get(grant_id, clock.now())) if book else None,
        )
        self._settings = SettingsStore(
            gpus,
            tree,
            default_policy=config.default_policy,
            max_inst=config.max_inst,
            prio_ratio=config.prio_ratio,
        )
        self._memory = MemoryCapEnforcer(
            config.memory_action,
            backend.kill,
            BackstopSlack(config.slack_per_process_bytes, config.slack_most_bytes),
        )
        self.metrics.configure(gpus, config.slice_s, config.memory_action)
        self._slicer = NodeSlicer(gpus, config.slice_s, clock.now)
        self._pacer = (
            RegionPacer(config.interposer_dir, config.slice_s) if config.interposer_dir else None
        )
        self._paced: frozenset[str] = frozenset()
        self._failed_closed = FailedClosedBook()
        self._view = TreeView(
            config.version,
            devices,
            self._settings,
            self._roster,
            self._memory,
            interposed=lambda key: key in self._paced,
        )
        self._gpus = gpus
        self._frozen: frozenset[str] = frozenset()
        self._last_tick: float | None = None
        self._last_refresh: float | None = None
        self._failing = ""

    def run(self, stop: threading.Event | None = None, duration_s: float | None = None) -> None:
        """Tick once per slice until stopped (or for duration_s); thaw everything at the end."""
        start = self._clock.now()
        due = start
        try:
            while not (stop is not None and stop.is_set()):
                if duration_s is not None and self._clock.now() - start >= duration_s - 1e-9:
                    break
                self._tick_or_thaw()
                due += self.config.slice_s
                delay = due - self._clock.now()
                if delay < -self.config.slice_s:
                    self.metrics.late_tick()  # the next tick starts over a slice late
                if delay < 0:
                    due = self._clock.now()
                self._clock.sleep(max(0.0, delay))
        finally:
            if self._pacer is not None:
                self._pacer.close()
            self._backend.close()

    def _tick_or_thaw(self) -> None:
        """One tick; when it fails (NVML lost the GPU, /proc unreadable, a full disk) the
        agent cannot see what it enforces, so it thaws everyone and tries again next slice."""
        try:
            self.tick()
        except Exception as err:
            failing = str(err) or type(err).__name__  # never empty: it says we are failing
            if not self._failing:  # health changes on a tick's failure or recovery only
                self.metrics.seen(self._gpus, healthy=False)
            if failing != self._failing:
                log.exception("tick failed; every container runs freely until a tick works")
            self._failing = failing
            try:
                self._backend.hold(frozenset())
                if self._pacer is not None:
                    self._pacer.release()
            except Exception:
                log.debug("thawing after a failed tick failed too", exc_info=True)
            self._frozen = frozenset()
        else:
            if self._failing:
                self.metrics.seen(self._gpus, healthy=True)
                log.info("ticks work again; isolation enforced")
            self._failing = ""

    def tick(self) -> None:
        now = self._clock.now()
        elapsed = 0.0 if self._last_tick is None else now - self._last_tick
        self._last_tick = now
        with self.metrics.tick_seconds.time():
            observed = self._roster.observe(self._backend.observe().processes)
            changes = self._roster.update(now, elapsed, observed, self._frozen)
            for gpu, container in changes.joined:
                self._settings.join(gpu, container)
            for key in changes.gone:
                self._settings.leave(key)
                self._memory.forget(key)
                if self._pacer is not None:
                    self._pacer.forget(key)
                self._failed_closed.forget(key)
            since = None if self._last_refresh is None else now - self._last_refresh
            refresh = since is None or since >= REFRESH_S - self.config.slice_s / 2
            if refresh:
                self._last_refresh = now
                self._roster.refresh_utilisation()
                self._read_failed_closed(observed)
            for write in self._tree.poll(read_only_too=refresh):
                if not self._settings.apply(write):
                    self.metrics.refused_writes.labels(self.metrics.node, write.name).inc()
            paced = self._pacer.paced(observed) if self._pacer else frozenset()
            # The backstop never switches off: a paced container has a slack over its cap.
            self._memory.enforce(observed, paced)
            held = self._slicer.held(
                {
                    gpu: (self._settings.settings(gpu), tenants(gpu, self._settings, self._roster))
                    for gpu in self._gpus
                }
            )
            if self._pacer is not None:  # those whose gates could not be written are frozen
                paced = self._pacer.pace(observed, paced, held)
            was_paced, self._paced = self._paced, paced
            # Held either way: the roster reads a held container's quiet as no demand.
            frozen = slicer.frozen(held)
            self._backend.hold(frozen - paced)
            self.metrics.held_off(self._frozen, was_paced, elapsed)
            self._frozen = frozen
            content = self.content()
            self._tree.publish(content)
            self._publish_metrics(content, observed)

    def _read_failed_closed(self, observed: Mapping[str, ObservedContainer]) -> None:
        """What the interposer's processes that fail closed left in each container's
        accounting directory (once per refresh: a directory listing each)."""
        if self._pacer is None:
            return
        for key, container in observed.items():
            directory = self._pacer.accounting_directory(container)
            if directory is not None:
                self._failed_closed.read(key, directory)

    def _publish_metrics(
        self, content: TreeContent, observed: Mapping[str, ObservedContainer]
    ) -> None:
        if self._pacer is None:
            self.metrics.publish(content, backstops=self._memory.backstops)
            return
        self.metrics.publish(
            content,
            self._pacer.usage(observed),
            backstops=self._memory.backstops,
            distrusts=self._pacer.distrusts,
            distrusted=len(self._pacer.distrusted()),
            failed_closed=self._failed_closed.of,
        )

    def content(self) -> TreeContent:
        """What the control tree shows now."""
        return self._view.content()

    def settings(self, gpu: int) -> GpuSettings:
        return self._settings.settings(gpu)
