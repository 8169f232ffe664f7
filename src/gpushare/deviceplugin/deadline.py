"""The bound on every answer to the kubelet.

The kubelet calls GetPreferredAllocation and Allocate without a deadline and
admits one pod at a time, so a call the plugin never answers stalls every later
pod of the node. Each call therefore gets ANSWER_WITHIN_S seconds (the flag
--allocate-timeout): whatever it waits for (the pod watch, the pod list's lock)
it stops waiting for then, and the call is refused with a message that says
what it waited for, or, for GetPreferredAllocation, answered without a
preference.
"""

import time
from dataclasses import dataclass
from typing import Final

ANSWER_WITHIN_S: Final = 10.0


@dataclass(frozen=True, slots=True)
class Deadline:
    started: float
    at: float
    """time.monotonic() values."""

    @classmethod
    def after(cls, seconds: float) -> "Deadline":
        now = time.monotonic()
        return cls(now, now + seconds)

    @property
    def budget(self) -> float:
        """Seconds the call was given."""
        return self.at - self.started

    def remaining(self) -> float:
        return max(0.0, self.at - time.monotonic())
