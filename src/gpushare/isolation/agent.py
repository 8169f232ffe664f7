"""The isolation agent: each slice it observes the GPUs, applies control-tree writes,
enforces memory caps, asks each GPU's scheduler who runs, and freezes the rest.

One tick per slice (default 100 ms), in this order, so that a write or an
allocation seen in one tick is acted on in that same tick:

1. observe the GPU processes through the backend and group them by container;
2. update each container's activity and GPU time from the utilisation seen;
3. apply writes found in the control tree (refused ones are put back);
4. act on containers over their memory cap (kill the offender, or report);
5. decide the slice on each GPU and freeze every container that may not run
   (a container on several GPUs runs only when all of them let it);
6. publish the control tree and the metrics.
"""

import logging
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from gpushare.isolation.backends.port import GIB, GpuBackend, GpuDevice
from gpushare.isolation.clock import Clock
from gpushare.isolation.control import (
    CONTAINER_SETTINGS,
    ContainerEntry,
    ControlTree,
    ControlWrite,
    GpuEntry,
    ProcessMemory,
    TreeContent,
    control_write,
    is_setting,
)
from gpushare.isolation.metrics import AgentMetrics
from gpushare.isolation.policy import (
    DEFAULT_MAX_INST,
    DEFAULT_PRIO_RATIO,
    GpuSettings,
    InvalidSetting,
    Policy,
    grant_weights,
    parse_highprio,
    parse_max_inst,
    parse_policy,
    parse_prio_ratio,
    parse_weight,
)
from gpushare.isolation.timeslice import Tenant, TimeSliceScheduler, promised_shares
from gpushare.isolation.workload import ObservedContainer, group_containers

log = logging.getLogger("gpushare.isolation.agent")

ACTIVE_PERCENT: Final = 1.0
"""Utilisation above which a thawed container counts as having work."""
REFRESH_S: Final = 1.0
"""How often the utilisation shown is refreshed and read-only files are checked for writes
(settings are read every slice)."""


class MemoryAction(StrEnum):
    KILL = "kill"
    REPORT = "report"


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


@dataclass(slots=True)
class _Member:
    """A container on one GPU."""

    key: str
    weight: int
    high_priority: bool
    core_percent: int
    disabled: bool
    active: bool = True
    fresh: bool = True
    """Joined this tick: it had no slice yet, so its utilisation says nothing about its work."""
    used_s: float = 0.0
    rate: float = 0.0
    history: deque[tuple[float, float]] = field(default_factory=deque)
    shown_util: float = 0.0
    violations: int = 0


@dataclass(slots=True)
class _Gpu:
    device: GpuDevice
    scheduler: TimeSliceScheduler
    max_inst: int
    prio_ratio: int
    policy: Policy | None = None
    """Set once written to the control tree (or by --default-policy); None follows the default."""
    members: dict[str, _Member] = field(default_factory=dict)

    def requests(self) -> list[tuple[str, int]]:
        return [(m.key, m.weight) for m in self.members.values() if not m.disabled]

    def grants(self) -> dict[str, int]:
        return grant_weights(self.max_inst, self.requests())


@dataclass(slots=True)
class _Known:
    """What the agent remembers of a container across ticks."""

    seen: ObservedContainer
    last_seen: float
    present: bool = True


class IsolationAgent:
    def __init__(
        self,
        backend: GpuBackend,
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
        self._gpus = {
            d.index: _Gpu(
                d,
                TimeSliceScheduler(config.slice_s, clock.now),
                config.max_inst,
                config.prio_ratio,
                config.default_policy,
            )
            for d in backend.devices()
        }
        self._known: dict[str, _Known] = {}
        self._frozen: frozenset[str] = frozenset()
        self._over_cap: set[tuple[str, int]] = set()
        self._unreadable: set[str] = set()
        self._last_tick: float | None = None
        self._last_refresh: float | None = None
        self._auto_policy: dict[int, Policy] = {}
        self._failing = ""
        self._saved = tree.load_settings()
        for path, raw in sorted(self._saved.items()):
            if path.count("/") == 1:
                self._apply(control_write(path, raw), restored=True)

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
                if delay < 0:
                    due = self._clock.now()
                self._clock.sleep(max(0.0, delay))
        finally:
            self._backend.close()

    def _tick_or_thaw(self) -> None:
        """One tick; when it fails (NVML lost the GPU, /proc unreadable, a full disk) the
        agent cannot see what it enforces, so it thaws everyone and tries again next slice."""
        try:
            self.tick()
        except Exception as err:
            if str(err) != self._failing:
                log.exception("tick failed; every container runs freely until a tick works")
            self._failing = str(err)
            try:
                self._backend.hold(frozenset())
            except Exception:
                log.debug("thawing after a failed tick failed too", exc_info=True)
            self._frozen = frozenset()
        else:
            if self._failing:
                log.info("ticks work again; isolation enforced")
            self._failing = ""

    def tick(self) -> None:
        now = self._clock.now()
        elapsed = 0.0 if self._last_tick is None else now - self._last_tick
        self._last_tick = now
        with self.metrics.tick_seconds.time():
            seen = {key: known.seen for key, known in self._known.items()}
            observed, unreadable = group_containers(self._backend.observe().processes, seen)
            for bad in unreadable:
                if bad.key not in self._unreadable:
                    log.warning("container %s left alone: %s", bad.key[:12], bad.reason)
            self._unreadable = {bad.key for bad in unreadable}
            self._track(now, elapsed, observed)
            since = None if self._last_refresh is None else now - self._last_refresh
            refresh = since is None or since >= REFRESH_S - self.config.slice_s / 2
            if refresh:
                self._last_refresh = now
                self._refresh_utilisation()
            for write in self._tree.poll(read_only_too=refresh):
                self._apply(write)
            self._enforce_memory(observed)
            frozen = self._schedule()
            self._backend.hold(frozen)
            self._count_throttled(elapsed)
            self._frozen = frozen
            content = self.content()
            self._tree.publish(content)
            self.metrics.publish(content)

    def content(self) -> TreeContent:
        """What the control tree shows now."""
        return TreeContent(
            version=self.config.version,
            default_memsize=0,
            gpus=tuple(self._gpu_entry(gpu) for gpu in self._gpus.values()),
        )

    def settings(self, gpu: int) -> GpuSettings:
        state = self._gpus[gpu]
        return GpuSettings(self._policy(state), state.max_inst, state.prio_ratio)

    def _policy(self, gpu: _Gpu) -> Policy:
        if gpu.policy is not None:
            return gpu.policy
        core = any(m.core_percent for m in gpu.members.values() if not m.disabled)
        policy = Policy.FIXED if core else Policy.NATIVE
        if self._auto_policy.get(gpu.device.index) is not policy:
            log.info(
                "GPU %d runs policy %d (%s): %s",
                gpu.device.index,
                policy,
                policy.label,
                "its containers carry a compute percentage"
                if core
                else "no container carries a compute percentage",
            )
            self._auto_policy[gpu.device.index] = policy
        return policy

    def _track(self, now: float, elapsed: float, observed: Mapping[str, ObservedContainer]) -> None:
        for key, container in observed.items():
            if key not in self._known:
                log.info(
                    "container %s of pod %s (%s) on GPU %s",
                    key[:12],
                    container.pod,
                    container.limits.container or "-",
                    ",".join(map(str, container.gpu_indices)),
                )
            self._known[key] = _Known(container, now)
            for index in container.gpu_indices:
                if index in self._gpus:
                    self._join(self._gpus[index], container, index)
        for key, known in list(self._known.items()):
            known.present = key in observed
            if now - known.last_seen > self.config.forget_after_s:
                self._forget(key)
        for gpu in self._gpus.values():
            for member in gpu.members.values():
                self._account(now, elapsed, gpu.device.index, member, observed.get(member.key))

    def _join(self, gpu: _Gpu, container: ObservedContainer, index: int) -> None:
        if container.key in gpu.members:
            return
        gpu.members[container.key] = _Member(
            key=container.key,
            weight=container.limits.weight,
            high_priority=container.limits.high_priority,
            core_percent=container.core_percent(index),
            disabled=container.limits.isolation_disabled,
        )
        for name in sorted(CONTAINER_SETTINGS):
            path = f"{index}/{container.key}/{name}"
            if path in self._saved:
                self._apply(control_write(path, self._saved[path]), restored=True)

    def _forget(self, key: str) -> None:
        del self._known[key]
        for gpu in self._gpus.values():
            gpu.members.pop(key, None)
        self._over_cap = {(k, g) for k, g in self._over_cap if k != key}
        log.info("container %s gone; its weight is free again", key[:12])
        saved = {path: raw for path, raw in self._saved.items() if f"/{key}/" not in path}
        if saved != self._saved:
            self._saved = saved
            self._tree.save_settings(saved)

    def _account(
        self,
        now: float,
        elapsed: float,
        index: int,
        member: _Member,
        container: ObservedContainer | None,
    ) -> None:
        """Activity and GPU time from the utilisation seen over the last tick. A frozen
        container cannot show work, so it keeps the activity it last showed while thawed."""
        if container is None or not container.on(index):
            member.active = False
            member.rate = 0.0
        else:
            util = container.utilisation(index)
            if util is not None:
                member.rate = util / 100
                if not member.fresh and member.key not in self._frozen:
                    member.active = util > ACTIVE_PERCENT
        member.fresh = False
        member.used_s += member.rate * elapsed
        member.history.append((now, member.used_s))
        while member.history and member.history[0][0] < now - self.config.util_window_s:
            member.history.popleft()

    def _refresh_utilisation(self) -> None:
        """Utilisation over the window, shown at a steady pace rather than every slice,
        so the tree is not rewritten ten times a second for a moving average."""
        for gpu in self._gpus.values():
            for member in gpu.members.values():
                member.shown_util = 100 * _window_rate(member.history)

    def _apply(self, write: ControlWrite, restored: bool = False) -> None:
        """Apply an operator's write to the tree, or one saved by an earlier run."""
        try:
            change = self._accept(write)
        except InvalidSetting as refused:
            if restored:
                log.warning("setting %s from an earlier run dropped: %s", write.path, refused)
                self._saved.pop(write.path, None)
                self._tree.save_settings(self._saved)
                return
            log.warning(
                "refused write %r to %s: %s; the old value stays",
                write.raw.strip(),
                write.path,
                refused,
            )
            self.metrics.refused_writes.labels(self.metrics.node, write.name).inc()
            return
        if restored:
            log.info("control tree: %s (kept from an earlier run)", change)
            return
        log.info("control tree: %s", change)
        self._saved[write.path] = write.raw.strip()
        self._tree.save_settings(self._saved)

    def _accept(self, write: ControlWrite) -> str:
        if not is_setting(write.path):
            raise InvalidSetting(
                f"{write.name} is read-only; the settings are policy, max_inst and prio_ratio "
                "per GPU, weight and highprio per container"
            )
        gpu = self._gpus.get(write.gpu) if write.gpu is not None else None
        if gpu is None:
            raise InvalidSetting(f"there is no GPU {write.gpu} on this node")
        if write.container is None:
            return self._accept_gpu(gpu, write)
        member = gpu.members.get(write.container)
        if member is None:
            raise InvalidSetting(f"container {write.container[:12]} is not on GPU {write.gpu}")
        if member.disabled:
            raise InvalidSetting(
                f"isolation is off for container {member.key[:12]} (CGPU_DISABLE); "
                "it is not scheduled"
            )
        if write.name == "weight":
            return self._accept_weight(gpu, member, write.raw)
        member.high_priority = parse_highprio(write.raw)
        return (
            f"container {member.key[:12]} on GPU {write.gpu}: highprio {int(member.high_priority)}"
        )

    def _accept_gpu(self, gpu: _Gpu, write: ControlWrite) -> str:
        index = gpu.device.index
        if write.name == "policy":
            gpu.policy = parse_policy(write.raw)
            return f"GPU {index}: policy {int(gpu.policy)} ({gpu.policy.label})"
        if write.name == "max_inst":
            value = parse_max_inst(write.raw)
            held = sum(gpu.grants().values())
            if value < held:
                raise InvalidSetting(
                    f"max_inst {value} is below the {held} weight units the containers on "
                    f"GPU {index} hold; lower their weights first"
                )
            gpu.max_inst = value
            return f"GPU {index}: max_inst {value}"
        gpu.prio_ratio = parse_prio_ratio(write.raw)
        return f"GPU {index}: prio_ratio {gpu.prio_ratio}"

    def _accept_weight(self, gpu: _Gpu, member: _Member, raw: str) -> str:
        value = parse_weight(raw, gpu.max_inst)
        grants = gpu.grants()
        free = gpu.max_inst - sum(grants.values())
        most = grants.get(member.key, 0) + free
        if value > most:
            raise InvalidSetting(
                f"weight {value} needs more than the {most} units container {member.key[:12]} "
                f"can hold on GPU {gpu.device.index} (free_weight {free})"
            )
        member.weight = value
        return f"container {member.key[:12]} on GPU {gpu.device.index}: weight {value}"

    def _enforce_memory(self, observed: Mapping[str, ObservedContainer]) -> None:
        over: set[tuple[str, int]] = set()
        for key, container in observed.items():
            for index in container.gpu_indices:
                cap = container.cap_bytes(index)
                used = container.mem_used(index)
                if cap is None or used <= cap:
                    continue
                over.add((key, index))
                self._act_on_memory(
                    container, index, used, cap, new=(key, index) not in self._over_cap
                )
        self._over_cap = over

    def _act_on_memory(
        self, container: ObservedContainer, index: int, used: int, cap: int, new: bool
    ) -> None:
        """One violation per episode over the cap; under `kill`, the process holding the most
        memory is killed on every tick the container stays over."""
        action = self.config.memory_action
        offender = max(container.on(index), key=lambda p: p.mem_bytes)
        if new:
            self.metrics.violations.labels(
                self.metrics.node, str(index), container.key, container.pod, action.value
            ).inc()
            member = self._gpus[index].members.get(container.key) if index in self._gpus else None
            if member is not None:
                member.violations += 1
        if action is MemoryAction.KILL:
            self._backend.kill(offender.pid)
        if new or action is MemoryAction.KILL:
            log.warning(
                "memory cap exceeded: container %s of pod %s holds %s on GPU %d, cap %s; %s",
                container.key[:12],
                container.pod,
                _gib(used),
                index,
                _gib(cap),
                f"killed pid {offender.pid} (holding {_gib(offender.mem_bytes)})"
                if action is MemoryAction.KILL
                else "reported only (--memory-action report)",
            )

    def _schedule(self) -> frozenset[str]:
        """Containers that may not run in this slice on at least one of their GPUs."""
        frozen: set[str] = set()
        for index, gpu in self._gpus.items():
            tenants = self._tenants(gpu)
            decided = gpu.scheduler.next_slice(self.settings(index), tenants)
            frozen.update(t.id for t in tenants if t.id not in decided.runs)
        return frozenset(frozen)

    def _tenants(self, gpu: _Gpu) -> list[Tenant]:
        grants = gpu.grants()
        return [
            Tenant(m.key, grants[m.key], m.high_priority, m.core_percent, m.active, m.used_s)
            for m in gpu.members.values()
            if not m.disabled
        ]

    def _count_throttled(self, elapsed: float) -> None:
        for key in self._frozen:
            known = self._known.get(key)
            if known is not None:
                self.metrics.throttled.labels(self.metrics.node, key, known.seen.pod).inc(elapsed)

    def _gpu_entry(self, gpu: _Gpu) -> GpuEntry:
        index = gpu.device.index
        settings = self.settings(index)
        tenants = self._tenants(gpu)
        promised = promised_shares(settings, tenants)
        grants = gpu.grants()
        containers = tuple(
            self._container_entry(index, member, grants.get(member.key, 0), promised)
            for member in gpu.members.values()
        )
        return GpuEntry(
            index=index,
            uuid=gpu.device.uuid,
            model=gpu.device.model,
            # The GiB the node advertises for this GPU (rounded as the plugin rounds it),
            # so cgpu-smi shows a T4 as the 15 GiB its pods were given, not 14.76.
            mem_bytes=gpu.device.mem_gib * GIB,
            policy=settings.policy,
            max_inst=gpu.max_inst,
            prio_ratio=gpu.prio_ratio,
            free_weight=gpu.max_inst - sum(grants.values()),
            major=gpu.device.major,
            util=min(100.0, sum(c.util for c in containers)),
            containers=containers,
        )

    def _container_entry(
        self, index: int, member: _Member, weight: int, promised: Mapping[str, float | None]
    ) -> ContainerEntry:
        known = self._known[member.key]
        seen = known.seen
        share = promised.get(member.key)
        processes = seen.on(index) if known.present else ()
        return ContainerEntry(
            id=member.key,
            pod=seen.pod,
            name=seen.limits.container,
            memsize=seen.cap_bytes(index) or 0,
            processes=tuple(ProcessMemory(p.pid, p.mem_bytes) for p in processes),
            weight=weight,
            highprio=member.high_priority,
            util=member.shown_util,
            limit=None if share is None else 100 * share,
            violations=member.violations,
        )


def _gib(value: int) -> str:
    return f"{value / GIB:.2f} GiB"


def _window_rate(history: deque[tuple[float, float]]) -> float:
    if len(history) < 2:
        return 0.0
    (t0, used0), (t1, used1) = history[0], history[-1]
    return (used1 - used0) / (t1 - t0) if t1 > t0 else 0.0
