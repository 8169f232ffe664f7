"""GPU health from NVML events: which XIDs take a GPU out, and when it comes back.

Pure (the caller supplies the clock and the probe results), so the rules are
tested without a GPU; nvml.py feeds it from the driver's event set.
"""

from dataclasses import dataclass, field
from typing import Final

from gpushare.gpunode.backends.port import HealthChange

APPLICATION_XIDS: Final = frozenset({13, 31, 43, 45, 68, 109})
"""XIDs an application causes (graphics exception, page fault, stopped channel,
preemptive cleanup, video processor exception, context switch timeout): the GPU
itself is fine, so they do not mark it unhealthy (as NVIDIA's plugin does)."""

DEFAULT_QUIET_PERIOD: Final = 60.0
"""Seconds without a critical event before a probed GPU counts as recovered."""


def is_critical_xid(xid: int) -> bool:
    return xid not in APPLICATION_XIDS


@dataclass
class _Outage:
    reason: str
    last_event: float


@dataclass
class XidHealth:
    """Tracks GPUs taken out by critical events until a probe shows them back."""

    quiet_period: float = DEFAULT_QUIET_PERIOD
    _out: dict[int, _Outage] = field(default_factory=dict)

    def on_xid(self, index: int, xid: int, now: float) -> HealthChange | None:
        if not is_critical_xid(xid):
            return None
        return self.on_critical(index, f"critical XID {xid}", now)

    def on_critical(self, index: int, reason: str, now: float) -> HealthChange | None:
        """A critical event on the GPU; a change only when it was healthy."""
        outage = self._out.get(index)
        self._out[index] = _Outage(reason, now)
        if outage is not None:
            return None
        return HealthChange(index, False, reason)

    def due_for_probe(self, now: float) -> list[int]:
        """Unhealthy GPUs quiet for long enough to be probed."""
        return sorted(i for i, o in self._out.items() if now - o.last_event >= self.quiet_period)

    def on_probe(self, index: int, ok: bool, now: float) -> HealthChange | None:
        outage = self._out.get(index)
        if outage is None or now - outage.last_event < self.quiet_period:
            return None
        if not ok:
            outage.last_event = now
            return None
        del self._out[index]
        return HealthChange(index, True, f"recovered from {outage.reason}")

    @property
    def unhealthy(self) -> frozenset[int]:
        return frozenset(self._out)
