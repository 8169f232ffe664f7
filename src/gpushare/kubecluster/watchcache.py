"""A watch-driven cache of one kind of object, over any `gpushare.cluster.Cluster`.

It does what client-go's reflector and informer do: list, then watch from the
list's resourceVersion; re-list when the watch says that version is too old
(Expired, HTTP 410); reconnect with exponential backoff after any other
failure. Each change is handed to a sink, so the extender's scheduling state
follows the API and is rebuilt from a fresh listing after a re-list. The same
code runs over the Kubernetes API and over the in-memory cluster.
"""

import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from gpushare.backoff import Backoff
from gpushare.cluster import EventType, Expired, Listing, Watch, WatchEvent
from gpushare.objects import Node, Pod

T = TypeVar("T", Node, Pod)
T_contra = TypeVar("T_contra", Node, Pod, contravariant=True)

log = logging.getLogger(__name__)

_QUIET_STREAM = 1.0
"""Seconds: a watch that ends sooner than this without any event counts as a failure."""


class CacheSink(Protocol[T_contra]):
    """Receives what the cache learns: a whole listing, then changes one by one."""

    def replace(self, items: list[T_contra]) -> None: ...

    def apply(self, event_type: EventType, obj: T_contra) -> None: ...


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
        self._list = list_objects
        self._watch = watch_objects
        self._sink = sink
        self._keep = keep
        self._backoff = backoff or Backoff()
        self._stopping = threading.Event()
        self._current: Watch[T] | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
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

    def run(self) -> None:
        failures = 0
        version = ""
        while not self._stopping.is_set():
            try:
                if not version:
                    version = self._relist()
                started = time.monotonic()
                version, events = self._follow(version)
                if events or time.monotonic() - started > _QUIET_STREAM:
                    failures = 0
                else:
                    # A stream that ends at once with nothing in it: do not spin on it.
                    failures += 1
                    self._stopping.wait(self._backoff.delay(failures))
            except Expired as err:
                log.info("%s watch expired (%s); listing again", self.kind, err)
                version = ""
            except Exception as err:  # the API, the network or a bad object: back off and retry
                if self._stopping.is_set():
                    return
                failures += 1
                self.reconnects += 1
                delay = self._backoff.delay(failures)
                log.warning("%s list/watch failed (%s); retrying in %.1fs", self.kind, err, delay)
                self._stopping.wait(delay)

    def _relist(self) -> str:
        listing = self._list()
        self._sink.replace([obj for obj in listing.items if self._keep(obj)])
        if self.synced.is_set():
            self.relists += 1
        self.synced.set()
        log.debug(
            "%s listed: %d objects at %s", self.kind, len(listing.items), listing.resource_version
        )
        return listing.resource_version

    def _follow(self, version: str) -> tuple[str, int]:
        """Applies events until the stream ends; returns the version to resume from
        and how many events there were."""
        watch = self._watch(version)
        events = 0
        with self._lock:
            if self._stopping.is_set():
                watch.stop()
                return version, events
            self._current = watch
        try:
            for event in watch:
                events += 1
                version = self._apply(event) or version
                if self._stopping.is_set():
                    break
        finally:
            with self._lock:
                self._current = None
            watch.stop()
        # A watch that sees bookmarks knows a newer place to resume from than the last
        # event (kubecluster.KubeWatch); the in-memory one does not need to.
        return getattr(watch, "resume_from", "") or version, events

    def _apply(self, event: WatchEvent[T]) -> str:
        obj = event.object
        if event.type is EventType.DELETED or self._keep(obj):
            self._sink.apply(event.type, obj)
        else:
            # It stopped being interesting (e.g. a pod lost its GPU request): drop it.
            self._sink.apply(EventType.DELETED, obj)
        return obj.metadata.resource_version
