"""A watch-driven cache of one kind of object, over any `gpushare.cluster.Cluster`.

It does what client-go's reflector and informer do: list, then watch from the
list's resourceVersion; re-list when the watch says that version is too old
(Expired, HTTP 410); reconnect with exponential backoff after any other
failure, resuming from the last event or bookmark seen (no list). Each change is
handed to a sink: the extender's scheduling state and the device plugin's view of
its own node and pods follow the API, and are rebuilt from a fresh listing after a
re-list. It only uses the cluster port, so the same code runs over the Kubernetes
API and over the in-memory cluster.

While the list or watch keeps failing, `trouble()` says since when and why, so a
component can tell its callers that what it answers from may be stale.
"""

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Generic, Protocol, TypeVar

from gpushare.backoff import Backoff
from gpushare.cluster import EventType, Expired, Listing, Watch, WatchEvent
from gpushare.objects import Node, Pod

T = TypeVar("T", Node, Pod)

log = logging.getLogger(__name__)

_QUIET_STREAM = 1.0
"""Seconds: a watch that ends sooner than this without any event counts as a failure."""


class CacheSink(Protocol[T]):
    """Receives what the cache learns: a whole listing, then changes one by one."""

    def replace(self, items: list[T]) -> None: ...

    def apply(self, event_type: EventType, obj: T) -> None: ...


class WatchCache(Generic[T]):
    """List-then-watch loop for one kind, run in a daemon thread by start()."""

    def __init__(
        self,
        kind: str,
        list_objects: Callable[[], Listing[T]],
        watch_objects: Callable[[str], Watch[T]],
        sink: CacheSink[T],
        keep: Callable[[T], bool] = lambda _: True,
        backoff: Backoff | None = None,
    ) -> None:
        self.kind = kind
        self._list: Callable[[], Listing[T]] = list_objects
        self._watch: Callable[[str], Watch[T]] = watch_objects
        self._sink: CacheSink[T] = sink
        self._keep: Callable[[T], bool] = keep
        self._backoff = backoff or Backoff()
        self._stopping = threading.Event()
        self._current: Watch[T] | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._resume = ""
        """Where the next watch starts; "" means list first."""
        self._delivered = 0
        """Events the current list/watch round has applied."""
        self._trouble: str | None = None
        self._failing_since = ""
        self.synced = threading.Event()
        """Set once the first full listing has been handed to the sink."""
        self.relists = 0
        self.reconnects = 0

    def start(self) -> "WatchCache[T]":
        self._thread = threading.Thread(target=self.run, name=f"watch-{self.kind}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        with self._lock:
            if self._current is not None:
                self._current.stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def trouble(self) -> str | None:
        """Why the sink's picture may be stale: the list or watch keeps failing, or
        the thread has died; None while the watch is followed."""
        thread = self._thread
        if thread is not None and not thread.is_alive() and not self._stopping.is_set():
            return f"watching {self.kind} has stopped (see the log)"
        with self._lock:
            return self._trouble

    def run(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            self._delivered = 0
            try:
                if not self._resume:
                    self._relist()
                started = time.monotonic()
                self._follow()
                if self._delivered or time.monotonic() - started > _QUIET_STREAM:
                    failures = 0
                else:
                    # A stream that ends at once with nothing in it: do not spin on it.
                    failures += 1
                    self._stopping.wait(self._backoff.delay(failures))
            except Expired as err:
                log.info("%s watch expired (%s); listing again", self.kind, err)
                self._resume = ""
            except Exception as err:  # the API, the network or a bad object: back off and retry
                if self._stopping.is_set():
                    return
                # A watch that delivered before it broke was working: a new count starts.
                failures = 1 if self._delivered else failures + 1
                self.reconnects += 1
                delay = self._backoff.delay(failures)
                self._failing(failures, err)
                log.warning("%s list/watch failed (%s); retrying in %.1fs", self.kind, err, delay)
                self._stopping.wait(delay)

    def _relist(self) -> None:
        listing = self._list()
        self._sink.replace([obj for obj in listing.items if self._keep(obj)])
        if self.synced.is_set():
            self.relists += 1
        self.synced.set()
        self._resume = listing.resource_version
        self._working()
        log.debug(
            "%s listed: %d objects at %s", self.kind, len(listing.items), listing.resource_version
        )

    def _follow(self) -> None:
        """Applies events until the stream ends; the next watch resumes from the last
        event or bookmark it saw, even when the stream broke."""
        watch = self._watch(self._resume)
        with self._lock:
            if self._stopping.is_set():
                watch.stop()
                return
            self._current = watch
        self._working()
        try:
            for event in watch:
                self._apply(event)
                self._delivered += 1
                if self._stopping.is_set():
                    break
        finally:
            with self._lock:
                self._current = None
            watch.stop()
            self._resume = watch.resume_from or self._resume

    def _apply(self, event: WatchEvent[T]) -> None:
        obj = event.object
        if event.type is EventType.DELETED or self._keep(obj):
            self._sink.apply(event.type, obj)
        else:
            # It stopped being interesting (e.g. a pod lost its GPU request): drop it.
            self._sink.apply(EventType.DELETED, obj)

    def _working(self) -> None:
        """The server answered: the list arrived or the watch was accepted."""
        with self._lock:
            self._trouble = None

    def _failing(self, failures: int, err: Exception) -> None:
        if failures == 1 or not self._failing_since:
            self._failing_since = datetime.now(UTC).strftime("%H:%M:%S UTC")
        with self._lock:
            self._trouble = f"watching {self.kind} has failed since {self._failing_since}: {err}"
