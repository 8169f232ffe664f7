"""How long to wait before retrying something that failed: one policy for every retry
loop in the product (watches, registration with the kubelet, publishing to the API).

The delay doubles from `initial` up to `maximum`, with jitter so that many replicas
(one device plugin per node) do not hammer a recovering API server or kubelet in step.
Pure: the random source is injectable, so tests can pin the jitter.
"""

import random
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delays between retries: doubling from `initial` up to `maximum`, jittered by
    ±`jitter` (a fraction of the delay)."""

    initial: float = 0.2
    maximum: float = 30.0
    factor: float = 2.0
    jitter: float = 0.2
    uniform: Callable[[float, float], float] = field(
        default=random.uniform, repr=False, compare=False
    )
    """Draws the jitter: `uniform(low, high)` like `random.uniform`."""

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.maximum:
            raise ValueError(
                f"backoff needs 0 < initial <= maximum, got {self.initial} and {self.maximum}"
            )
        if self.factor < 1:
            raise ValueError(f"backoff factor must be at least 1, got {self.factor}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"backoff jitter must be in [0, 1), got {self.jitter}")

    def delay(self, failures: int) -> float:
        """Seconds to wait after `failures` failures in a row (the first failure waits
        about `initial`)."""
        exponent = max(failures - 1, 0)
        base = self.maximum
        # Past the cap the power is not needed (and could overflow for a long outage).
        if exponent < 64:
            base = min(self.maximum, self.initial * self.factor**exponent)
        if not self.jitter:
            return base
        return base * (1 + self.uniform(-self.jitter, self.jitter))
