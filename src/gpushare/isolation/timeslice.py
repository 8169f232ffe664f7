"""The time-slice scheduler: who may run on one GPU in each slice, per cGPU policy.

Pure: no I/O, and time comes from an injected clock, so tests drive it on a
simulated one. The agent calls `next_slice` once per slice (its tick) with the
GPU's containers; the answer says which of them stay thawed until the next
call. A turn may last several slices (weight-based turns merge slices into one
longer turn): the owner simply keeps running, with nothing frozen or thawed.

How time is divided (fractions of the GPU's time while there is contention):

- High-priority containers with work take `prio_ratio`% of the time, split
  among them (by weight under policy 2); while none has work they take none.
  When the normal containers have nothing to run under a work-conserving
  policy (1, 2, 4), high-priority ones get that time too.
- The normal containers share the rest as their policy promises:
  0 fair-share: 1/max_inst each, used or not (slots nobody holds stay idle);
  1 preemptive: 1/N of the N with work; 2 weight-based: weight/sum of the
  weights of those with work, one turn of `weight` slices each; 3 fixed: the
  container's core percentage (weight/max_inst for one without), the rest idle;
  4 soft: every container with work runs at once and only one that used more
  than its 1/N over the recent window, while another with work got less, is
  held back; 5 native: no time slicing at all.
- A container holding weight 0 (the GPU's weight ran out) gets no time.

Turns are handed out by credit: each container in a class accrues its share of
every slice the class runs, the one with the most credit takes the next turn,
and the owner pays for the time it runs. Credits stay within one turn of each
other, so every share holds to within one turn over any stretch of time.
"""

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Final

from gpushare.isolation.policy import GpuSettings, Policy

IDLE: Final = ""
"""The credit key of a fixed policy's unheld time: its 'turn' leaves the GPU idle."""

_EPS: Final = 1e-9


@dataclass(frozen=True, slots=True)
class Tenant:
    """One container on the GPU, as the scheduler sees it."""

    id: str
    weight: int = 1
    """Weight units the container holds on this GPU (0: it gets no compute)."""
    high_priority: bool = False
    core_percent: int = 0
    """Its gpu-core.percentage on this GPU; 0 when it has none."""
    active: bool = True
    """Whether it has work, as last observed."""
    used_s: float = 0.0
    """GPU-seconds it has used on this GPU so far (only the soft policy reads it)."""


class SliceKind(StrEnum):
    TURN = "turn"
    """One normal container's turn."""
    IDLE = "idle"
    """Nobody's turn: a fixed slot no one holds, or nobody has work."""
    HIGH_PRIORITY = "high-priority"
    SHARED = "shared"
    """Soft policy: all containers with work run at once, minus those held back."""
    NATIVE = "native"
    """No time slicing: everyone runs."""


@dataclass(frozen=True, slots=True)
class Slice:
    kind: SliceKind
    owner: str | None
    """Whose turn it is; None for idle, shared and native slices."""
    runs: frozenset[str]
    """Containers left thawed: the owner, plus idle ones so their new work is seen."""


class TimeSliceScheduler:
    """Decides each slice of one GPU. One instance per GPU: it remembers turns and credit."""

    # Set by every slice decided, read only from the next one on.
    _charged: "_Rotation | None"
    """The rotation whose container ran the slice, to charge for it."""
    _last_kind: SliceKind
    _high_owed: bool
    """The high-priority slice was taken on balance (not only for want of normal work)."""
    _high_balance: float
    """Seconds high-priority containers may still run before a normal one is owed a slice."""

    def __init__(
        self,
        slice_s: float,
        clock: Callable[[], float] = time.monotonic,
        soft_window: int = 10,
        soft_tolerance: float = 0.02,
    ) -> None:
        if slice_s <= 0:
            raise ValueError(f"slice length must be positive; got {slice_s}")
        self.slice_s = slice_s
        self._clock = clock
        self._soft_tolerance = soft_tolerance
        self._usage = _UsageWindow(soft_window)
        self._last_at: float | None = None
        self._restart(None)

    def next_slice(self, settings: GpuSettings, tenants: Sequence[Tenant]) -> Slice:
        now = self._clock()
        if settings != self._settings:
            self._restart(settings)
        elif self._last_at is not None:
            self._charge(max(0.0, now - self._last_at), settings.high_priority_share)
        self._last_at = now
        decided = self._decide(settings, tenants)
        self._last_kind = decided.kind
        return decided

    def _restart(self, settings: GpuSettings | None) -> None:
        """A new policy (or max_inst, prio_ratio) starts from a clean rotation."""
        self._settings = settings
        self._normal = _Rotation(self.slice_s)
        self._high = _Rotation(self.slice_s)
        # The next slice high-priority containers have work in starts a new balance
        # (prio_ratio of a slice); set again whenever none has work.
        self._high_fresh = True

    def _charge(self, elapsed: float, ratio: float) -> None:
        if self._charged is not None:
            self._charged.charge(elapsed)
        if not self._high_fresh:
            if self._last_kind is SliceKind.HIGH_PRIORITY:
                if self._high_owed:
                    self._high_balance += ratio * elapsed - elapsed
            else:
                self._high_balance += ratio * elapsed

    def _decide(self, settings: GpuSettings, tenants: Sequence[Tenant]) -> Slice:
        policy = settings.policy
        if not policy.slices_time:
            self._charged = None
            return Slice(SliceKind.NATIVE, None, frozenset(t.id for t in tenants))
        holders = [t for t in tenants if t.weight > 0]
        self._usage.record(holders)
        high = [t for t in holders if t.high_priority and t.active]
        normal = [t for t in holders if not t.high_priority]
        probes = _probes(policy, holders)
        normal_runs = _normal_runnable(policy, normal)
        if high and self._high_fresh:
            self._high_balance = settings.high_priority_share * self.slice_s
        self._high_fresh = not high
        if high and (self._high_balance > 0 or not normal_runs):
            self._high_owed = self._high_balance > 0
            owner = self._high.pick(_split(policy, high), self._turns(policy, high), _ids(high))
            self._charged = self._high
            return Slice(SliceKind.HIGH_PRIORITY, owner, probes | {owner})
        if not normal_runs:
            self._charged = None
            return Slice(SliceKind.IDLE, None, probes)
        if policy is Policy.SOFT:
            self._charged = None
            active = [t for t in normal if t.active]
            runs = {t.id for t in active} - self._held_back(active)
            return Slice(SliceKind.SHARED, None, probes | runs)
        shares = normal_shares(settings, normal)
        order = [*_ids(normal), IDLE]
        owner = self._normal.pick(shares, self._turns(policy, normal), order)
        self._charged = self._normal
        if owner == IDLE:
            return Slice(SliceKind.IDLE, None, probes)
        return Slice(SliceKind.TURN, owner, probes | {owner})

    def _turns(self, policy: Policy, tenants: Sequence[Tenant]) -> dict[str, float]:
        """Turn length per container: weight-based turns merge `weight` slices into one."""
        turns = {
            t.id: self.slice_s * (t.weight if policy is Policy.WEIGHTED else 1) for t in tenants
        }
        turns[IDLE] = self.slice_s
        return turns

    def _held_back(self, active: Sequence[Tenant]) -> set[str]:
        """Soft policy: those above their fair share over the window while another is below."""
        used = {t.id: self._usage.used(t.id) for t in active}
        total = sum(used.values())
        if len(active) < 2 or total <= 0:
            return set()
        fair = 1 / len(active)
        fraction = {key: value / total for key, value in used.items()}
        if not any(f < fair - self._soft_tolerance for f in fraction.values()):
            return set()
        return {key for key, f in fraction.items() if f > fair + self._soft_tolerance}


def normal_shares(settings: GpuSettings, normal: Sequence[Tenant]) -> dict[str, float]:
    """How the normal (not high-priority) containers split the time left to them.

    `normal`: those holding weight (the others take no part). Keys are container IDs,
    plus IDLE for time the policy leaves unused; the fractions add up to 1 (or are
    empty when a work-conserving policy has nobody with work).
    """
    policy = settings.policy
    if policy is Policy.FAIR_SHARE:
        slots = normal[: settings.max_inst]
        shares = {t.id: 1 / settings.max_inst for t in slots}
        return _with_idle(shares)
    if policy is Policy.FIXED:
        wanted = {
            t.id: (t.core_percent / 100 if t.core_percent else t.weight / settings.max_inst)
            for t in normal
        }
        total = sum(wanted.values())
        if total > 1:  # pragma: no mutate: scaling by a total of exactly 1 changes nothing
            wanted = {key: value / total for key, value in wanted.items()}
        return _with_idle(wanted)
    active = [t for t in normal if t.active]
    return _split(policy, active)


def promised_shares(settings: GpuSettings, tenants: Sequence[Tenant]) -> dict[str, float | None]:
    """The fraction of the GPU each container gets while it has work, given who else has.

    None where the policy does not slice time (native). This is the promise the
    scheduler keeps; the control tree shows it as each container's compute limit.
    """
    if not settings.policy.slices_time:
        return {t.id: None for t in tenants}
    current = _shares(settings, tenants)
    promised: dict[str, float | None] = {}
    for t in tenants:
        if t.active:
            promised[t.id] = current.get(t.id, 0.0)
        else:
            woken = [replace(o, active=True) if o.id == t.id else o for o in tenants]
            promised[t.id] = _shares(settings, woken).get(t.id, 0.0)
    return promised


def _shares(settings: GpuSettings, tenants: Sequence[Tenant]) -> dict[str, float]:
    holders = [t for t in tenants if t.weight > 0]
    high = [t for t in holders if t.high_priority and t.active]
    normal = [t for t in holders if not t.high_priority]
    contended = _normal_runnable(settings.policy, normal)
    high_part = (settings.high_priority_share if contended else 1.0) if high else 0.0
    shares = {key: high_part * value for key, value in _split(settings.policy, high).items()}
    for key, value in normal_shares(settings, normal).items():
        if key != IDLE:
            shares[key] = (1 - high_part) * value
    return shares


def _split(policy: Policy, tenants: Sequence[Tenant]) -> dict[str, float]:
    """Equal shares, or by weight under the weight-based policy."""
    if policy is Policy.WEIGHTED:
        total = sum(t.weight for t in tenants)
        return {t.id: t.weight / total for t in tenants}
    return {t.id: 1 / len(tenants) for t in tenants}


def _with_idle(shares: dict[str, float]) -> dict[str, float]:
    rest = 1 - sum(shares.values())
    if rest > _EPS:  # pragma: no mutate: rest is never _EPS itself (over 1/2, or k * 2**-53)
        shares[IDLE] = rest
    return shares


def _normal_runnable(policy: Policy, normal: Sequence[Tenant]) -> bool:
    """Whether the normal class uses this slice. Fixed slots are kept whether used or not.
    `normal`: containers holding weight."""
    if not policy.work_conserving:
        return True
    return any(t.active for t in normal)


def _probes(policy: Policy, holders: Sequence[Tenant]) -> frozenset[str]:
    """Idle containers left thawed: an idle container uses nothing, and a thawed one
    shows new work at once. Fixed-slot policies keep idle normal containers frozen,
    since their slot is theirs only."""
    return frozenset(
        t.id for t in holders if not t.active and (t.high_priority or policy.work_conserving)
    )


def _ids(tenants: Sequence[Tenant]) -> list[str]:
    return [t.id for t in tenants]


class _Rotation:
    """Turns among one class of containers, handed out by credit."""

    shares: Mapping[str, float]
    turn_left: float
    """Of the owner's turn; both set by the first pick, before any charge."""

    def __init__(self, slice_s: float) -> None:
        self._slice_s = slice_s
        self.credit: dict[str, float] = {}
        self.owner: str | None = None
        # '' (IDLE) comes last in rotation order: a rotation after it starts at the front.
        self.last_owner: str | None = None  # pragma: no mutate: '' starts where None does

    def charge(self, elapsed: float) -> None:
        for key, share in self.shares.items():
            self.credit[key] = self.credit.get(key, 0.0) + share * elapsed
        if self.owner is not None:  # one of `shares`, so credited just above
            self.credit[self.owner] -= elapsed
            self.turn_left -= elapsed

    def pick(
        self, shares: Mapping[str, float], turns: Mapping[str, float], order: list[str]
    ) -> str:
        # A container that left the class (idle, gone) comes back without banked credit.
        self.credit = {key: value for key, value in self.credit.items() if key in shares}
        self.shares = shares
        # Less than half a slice left is clock jitter, not a slice still owed.
        if self.owner is not None and self.owner in shares and self.turn_left > self._slice_s / 2:
            return self.owner
        if self.owner is not None:
            self.last_owner = self.owner
        candidates = [key for key in order if key in shares]
        start = candidates.index(self.last_owner) + 1 if self.last_owner in candidates else 0
        # Ties go to the next in rotation order after the last owner: plain round robin.
        rotated = candidates[start:] + candidates[:start]
        top = max(self.credit.get(key, 0.0) for key in rotated)
        best = next(k for k in rotated if self.credit.get(k, 0.0) >= top - self._slice_s * 1e-6)
        self.owner = best
        self.turn_left = turns[best]
        return best


class _UsageWindow:
    """GPU-seconds each container used over the last `size` slices (soft policy)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._samples: dict[str, deque[float]] = {}

    def record(self, tenants: Sequence[Tenant]) -> None:
        present = {t.id for t in tenants}
        for key in list(self._samples):
            if key not in present:
                del self._samples[key]
        for t in tenants:
            self._samples.setdefault(t.id, deque(maxlen=self._size + 1)).append(t.used_s)

    def used(self, key: str) -> float:
        """Of a container recorded this slice (so it has a sample)."""
        samples = self._samples[key]
        return samples[-1] - samples[0]
