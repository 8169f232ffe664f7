"""The per-GPU settings of the isolation agent, as cGPU names them, and their rules.

Each setting has one parser that both the command line and the control tree
use, so a value refused in one place is refused with the same reason in the
other. Parsers raise `InvalidSetting` with a message written for the operator.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Final

MAX_INST_RANGE: Final = (1, 25)
PRIO_RATIO_RANGE: Final = (20, 99)
DEFAULT_MAX_INST: Final = 16
DEFAULT_PRIO_RATIO: Final = 50


class Policy(IntEnum):
    """cGPU's scheduling policies, by the number written to `<gpu>/policy`."""

    FAIR_SHARE = 0
    PREEMPTIVE = 1
    WEIGHTED = 2
    FIXED = 3
    SOFT = 4
    NATIVE = 5

    @property
    def label(self) -> str:
        return _LABELS[self]

    @property
    def work_conserving(self) -> bool:
        """True when time a container does not use goes to the others."""
        return self in (Policy.PREEMPTIVE, Policy.WEIGHTED, Policy.SOFT)

    @property
    def slices_time(self) -> bool:
        return self is not Policy.NATIVE


_LABELS: Final = {
    Policy.FAIR_SHARE: "fair-share",
    Policy.PREEMPTIVE: "preemptive",
    Policy.WEIGHTED: "weight-preemptive",
    Policy.FIXED: "fixed",
    Policy.SOFT: "soft",
    Policy.NATIVE: "native",
}


class InvalidSetting(ValueError):
    """A setting value the agent refuses; the message says which rule it breaks."""


@dataclass(frozen=True, slots=True)
class GpuSettings:
    """What one GPU is scheduled by: its policy, instance count and high-priority ratio."""

    policy: Policy
    max_inst: int = DEFAULT_MAX_INST
    prio_ratio: int = DEFAULT_PRIO_RATIO

    @property
    def high_priority_share(self) -> float:
        """The fraction of the time high-priority containers with work get while others have
        work too (prio_ratio percent)."""
        return self.prio_ratio / 100


def parse_policy(raw: str) -> Policy:
    value = _whole(raw, "policy")
    try:
        return Policy(value)
    except ValueError:
        choices = ", ".join(f"{p.value} {p.label}" for p in Policy)
        raise InvalidSetting(f"policy must be one of {choices}; got {value}") from None


def parse_max_inst(raw: str) -> int:
    return _in_range(_whole(raw, "max_inst"), "max_inst", MAX_INST_RANGE)


def parse_prio_ratio(raw: str) -> int:
    return _in_range(_whole(raw, "prio_ratio"), "prio_ratio", PRIO_RATIO_RANGE)


def parse_weight(raw: str, max_inst: int) -> int:
    return _in_range(_whole(raw, "weight"), "weight", (1, max_inst))


def parse_highprio(raw: str) -> bool:
    value = _whole(raw, "highprio")
    if value not in (0, 1):
        raise InvalidSetting(f"highprio must be 0 or 1; got {value}")
    return value == 1


def _whole(raw: str, name: str) -> int:
    text = raw.strip()
    if not text:
        raise InvalidSetting(f"{name} was written empty; write a whole number")
    try:
        return int(text)
    except ValueError:
        raise InvalidSetting(f"{name} must be a whole number; got {text!r}") from None


def _in_range(value: int, name: str, bounds: tuple[int, int]) -> int:
    low, high = bounds
    if not low <= value <= high:
        raise InvalidSetting(f"{name} must be in {low}..{high}; got {value}")
    return value


def grant_weights(max_inst: int, requests: Sequence[tuple[str, int]]) -> dict[str, int]:
    """Weight units per container, in arrival order: a GPU has max_inst units, and
    each container gets what it asks for while they last (0 once they ran out)."""
    free = max_inst
    granted: dict[str, int] = {}
    for key, wanted in requests:
        granted[key] = max(0, min(wanted, free))
        free -= granted[key]
    return granted
