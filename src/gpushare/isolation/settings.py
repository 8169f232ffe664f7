"""The settings store: each GPU's policy, max_inst and prio_ratio, each container's weight and
high priority on it, and the rules a control-tree write must pass to change them.

Settings start from the agent's flags (per GPU) and the container's environment
(per container). An operator changes them by writing the control tree; a write
is checked against the rules of `gpushare.isolation.policy` and against the
GPU's weight units, then applied, or refused with the reason logged. Accepted
writes are saved beside the tree and applied again after an agent restart (a
container's, when that container is seen again).
"""

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from gpushare.isolation.policy import (
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
from gpushare.isolation.treecodec import CONTAINER_SETTINGS, ControlWrite, control_write, is_setting
from gpushare.isolation.workload import ObservedContainer

log = logging.getLogger(__name__)


class SavedSettings(Protocol):
    """Where accepted settings are kept between runs (the control tree keeps them)."""

    def load_settings(self) -> dict[str, str]: ...

    def save_settings(self, settings: Mapping[str, str]) -> None: ...


@dataclass(slots=True)
class ContainerSettings:
    """A container's settings on one GPU: from its environment, then from the tree."""

    weight: int
    high_priority: bool
    core_percent: int
    disabled: bool
    """Isolation is off for it (CGPU_DISABLE): never scheduled, its settings not writable."""

    @classmethod
    def of(cls, container: ObservedContainer, gpu: int) -> "ContainerSettings":
        return cls(
            weight=container.limits.weight,
            high_priority=container.limits.high_priority,
            core_percent=container.core_percent(gpu),
            disabled=container.limits.isolation_disabled,
        )


@dataclass(slots=True)
class _GpuSetup:
    max_inst: int
    prio_ratio: int
    policy: Policy | None
    """Set once written to the tree (or by --default-policy); None follows the containers."""
    containers: dict[str, ContainerSettings] = field(default_factory=dict)
    """In arrival order, which is the order weight units are granted in."""

    def grants(self) -> dict[str, int]:
        requests = [(key, c.weight) for key, c in self.containers.items() if not c.disabled]
        return grant_weights(self.max_inst, requests)


class SettingsStore:
    def __init__(
        self,
        gpus: Iterable[int],
        saved: SavedSettings,
        *,
        default_policy: Policy | None,
        max_inst: int,
        prio_ratio: int,
    ) -> None:
        self._gpus = {index: _GpuSetup(max_inst, prio_ratio, default_policy) for index in gpus}
        self._store = saved
        self._saved = saved.load_settings()
        self._auto_policy: dict[int, Policy] = {}
        for path in sorted(self._saved):
            if path.count("/") == 1:
                self._restore(path)

    def settings(self, gpu: int) -> GpuSettings:
        """What the GPU is scheduled by now."""
        setup = self._gpus[gpu]
        return GpuSettings(self._policy(gpu, setup), setup.max_inst, setup.prio_ratio)

    def containers(self, gpu: int) -> Mapping[str, ContainerSettings]:
        """The GPU's containers in arrival order."""
        return self._gpus[gpu].containers

    def grants(self, gpu: int) -> dict[str, int]:
        """Weight units each container holds on the GPU (0 once they ran out)."""
        return self._gpus[gpu].grants()

    def free_weight(self, gpu: int) -> int:
        return self._gpus[gpu].max_inst - sum(self.grants(gpu).values())

    def join(self, gpu: int, container: ObservedContainer) -> None:
        """A container appeared on the GPU: its environment's settings, then any saved ones."""
        setup = self._gpus[gpu]
        if container.key in setup.containers:
            return
        setup.containers[container.key] = ContainerSettings.of(container, gpu)
        for name in sorted(CONTAINER_SETTINGS):
            path = f"{gpu}/{container.key}/{name}"
            if path in self._saved:
                self._restore(path)

    def leave(self, key: str) -> None:
        """A container is gone for good: its weight is free, its saved settings dropped."""
        for setup in self._gpus.values():
            setup.containers.pop(key, None)
        saved = {path: raw for path, raw in self._saved.items() if f"/{key}/" not in path}
        if saved != self._saved:
            self._save(saved)

    def apply(self, write: ControlWrite) -> bool:
        """Apply an operator's write to the tree; False (and the reason logged) if refused."""
        try:
            change = self._accept(write)
        except InvalidSetting as refused:
            log.warning(
                "refused write %r to %s: %s; the old value stays",
                write.raw.strip(),
                write.path,
                refused,
            )
            return False
        log.info("control tree: %s", change)
        self._save({**self._saved, write.path: write.raw.strip()})
        return True

    def _restore(self, path: str) -> None:
        """Apply a setting saved by an earlier run; one the rules now refuse is dropped."""
        try:
            change = self._accept(control_write(path, self._saved[path]))
        except InvalidSetting as refused:
            log.warning("setting %s from an earlier run dropped: %s", path, refused)
            self._save({p: raw for p, raw in self._saved.items() if p != path})
            return
        log.info("control tree: %s (kept from an earlier run)", change)

    def _save(self, saved: dict[str, str]) -> None:
        self._saved = saved
        self._store.save_settings(saved)

    def _policy(self, gpu: int, setup: _GpuSetup) -> Policy:
        if setup.policy is not None:
            return setup.policy
        core = any(c.core_percent for c in setup.containers.values() if not c.disabled)
        policy = Policy.FIXED if core else Policy.NATIVE
        if self._auto_policy.get(gpu) is not policy:
            log.info(
                "GPU %d runs policy %d (%s): %s",
                gpu,
                policy,
                policy.label,
                "its containers carry a compute percentage"
                if core
                else "no container carries a compute percentage",
            )
            self._auto_policy[gpu] = policy
        return policy

    def _accept(self, write: ControlWrite) -> str:
        """Apply the write if the rules let it; what changed, for the log."""
        if not is_setting(write.path):
            raise InvalidSetting(
                f"{write.name} is read-only; the settings are policy, max_inst and prio_ratio "
                "per GPU, weight and highprio per container"
            )
        if write.gpu is None or write.gpu not in self._gpus:
            raise InvalidSetting(f"there is no GPU {write.gpu} on this node")
        setup = self._gpus[write.gpu]
        if write.container is None:
            return self._accept_gpu(write.gpu, setup, write)
        key = write.container
        container = setup.containers.get(key)
        if container is None:
            raise InvalidSetting(f"container {key[:12]} is not on GPU {write.gpu}")
        if container.disabled:
            raise InvalidSetting(
                f"isolation is off for container {key[:12]} (CGPU_DISABLE); it is not scheduled"
            )
        if write.name == "weight":
            return self._accept_weight(write.gpu, setup, key, write.raw)
        container.high_priority = parse_highprio(write.raw)
        return f"container {key[:12]} on GPU {write.gpu}: highprio {int(container.high_priority)}"

    def _accept_gpu(self, gpu: int, setup: _GpuSetup, write: ControlWrite) -> str:
        if write.name == "policy":
            setup.policy = parse_policy(write.raw)
            return f"GPU {gpu}: policy {int(setup.policy)} ({setup.policy.label})"
        if write.name == "max_inst":
            value = parse_max_inst(write.raw)
            held = sum(setup.grants().values())
            if value < held:
                raise InvalidSetting(
                    f"max_inst {value} is below the {held} weight units the containers on "
                    f"GPU {gpu} hold; lower their weights first"
                )
            setup.max_inst = value
            return f"GPU {gpu}: max_inst {value}"
        setup.prio_ratio = parse_prio_ratio(write.raw)
        return f"GPU {gpu}: prio_ratio {setup.prio_ratio}"

    def _accept_weight(self, gpu: int, setup: _GpuSetup, key: str, raw: str) -> str:
        value = parse_weight(raw, setup.max_inst)
        grants = setup.grants()
        free = setup.max_inst - sum(grants.values())
        most = grants[key] + free  # _accept let only a container on the GPU, not disabled, in
        if value > most:
            raise InvalidSetting(
                f"weight {value} needs more than the {most} units container {key[:12]} "
                f"can hold on GPU {gpu} (free_weight {free})"
            )
        setup.containers[key].weight = value
        return f"container {key[:12]} on GPU {gpu}: weight {value}"
