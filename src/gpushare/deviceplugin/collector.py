"""Keeps the garbage collector's passes out of the kubelet's admission calls.

A pass of CPython's cyclic collector holds the whole interpreter while it walks
its generations, which takes milliseconds in a plugin holding a node's pods,
and it starts in whichever thread happens to cross the allocation threshold.
So an Allocate would now and then pay for garbage the watch threads made. While
any GetPreferredAllocation or Allocate is being answered the collector is held
off; the pass that was due runs once the last answer has left (gRPC's
end-of-call callback). The collector is one per process, so the hold is too.
"""

import gc
import threading
from collections.abc import Callable
from typing import Protocol


class CallContext(Protocol):
    """The part of grpc.ServicerContext the hold uses."""

    def add_callback(self, callback: Callable[[], None]) -> bool: ...


class CollectorHold:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls = 0
        self._disabled_here = False

    def during(self, context: CallContext) -> None:
        """Holds the collector off until the call behind `context` has ended."""
        with self._lock:
            if self._calls == 0 and gc.isenabled():
                gc.disable()
                self._disabled_here = True
            self._calls += 1
        if not context.add_callback(self._release):
            self._release()  # the call has already ended

    def _release(self) -> None:
        with self._lock:
            self._calls -= 1
            if self._calls == 0 and self._disabled_here:
                self._disabled_here = False
                gc.enable()  # someone else's gc.disable() is left as it was


ADMISSION_CALLS = CollectorHold()
