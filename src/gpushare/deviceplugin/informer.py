"""List-then-watch through the cluster port, on a thread, relisting whenever the
watch ends or expires (410 Gone), so the handler always holds the full picture.

A failing list or watch is retried with backoff, for as long as the plugin runs;
meanwhile `trouble()` says since when and why, so an Allocate refused for a pod
it could not see says that the watch is down.
"""

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Final, Generic, TypeVar

from gpushare.cluster import Expired, Listing, Watch, WatchEvent
from gpushare.deviceplugin.worker import start_daemon
from gpushare.objects import Node, Pod

log = logging.getLogger(__name__)

T = TypeVar("T", Node, Pod)

RETRY: Final = 0.5
RETRY_MAX: Final = 10.0
"""Seconds between retries: doubling from RETRY after each failure in a row, up to
RETRY_MAX, so a recovered API server is followed again within seconds."""


class Informer(Generic[T]):
    def __init__(
        self,
        name: str,
        list_objects: Callable[[], Listing[T]],
        watch_objects: Callable[[str], Watch[T]],
        on_list: Callable[[list[T]], None],
        on_event: Callable[[WatchEvent[T]], None],
    ) -> None:
        self.name = name
        self._list = list_objects
        self._watch_from = watch_objects
        self._on_list = on_list
        self._on_event = on_event
        self._lock = threading.Lock()
        self._watch: Watch[T] | None = None
        self._trouble: str | None = None
        self._delivered = False
        """The current watch delivered an event: a failure after that starts a new count."""
        self._stopped = threading.Event()
        self._synced = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = start_daemon(self.name, self._run)

    def stop(self) -> None:
        self._stopped.set()
        with self._lock:
            if self._watch is not None:
                self._watch.stop()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def wait_synced(self, timeout: float) -> bool:
        """True once the first list was handed over."""
        return self._synced.wait(timeout)

    def trouble(self) -> str | None:
        """Why the handler's picture may be stale; None while the watch is followed."""
        if self._thread is not None and not self._thread.is_alive() and not self._stopped.is_set():
            return f"{self.name} has stopped (see the log)"
        with self._lock:
            return self._trouble

    def _run(self) -> None:
        failures = 0
        failing_since = ""
        while not self._stopped.is_set():
            self._delivered = False
            try:
                listing = self._list()
                self._on_list(listing.items)
                self._synced.set()
                self._set_trouble(None)
                self._follow(listing.resource_version)
                failures = 0  # the server ended the watch, as it does every few minutes
            except Expired:
                log.info("%s: watch expired; listing again", self.name)
            except Exception as err:
                if self._stopped.is_set():
                    return  # stop() closed the watch under it
                failures = 1 if self._delivered else failures + 1
                if failures == 1:
                    failing_since = datetime.now(UTC).strftime("%H:%M:%S UTC")
                self._set_trouble(f"{self.name} failing since {failing_since}: {err}")
                delay = min(RETRY_MAX, RETRY * 2 ** (failures - 1))
                log.exception(
                    "%s: list or watch failed (%d in a row); retrying in %.1fs",
                    self.name,
                    failures,
                    delay,
                )
                self._stopped.wait(delay)

    def _follow(self, resource_version: str) -> None:
        watch = self._watch_from(resource_version)
        with self._lock:
            self._watch = watch
            if self._stopped.is_set():
                watch.stop()
        for event in watch:
            if self._stopped.is_set():
                break
            self._on_event(event)
            self._delivered = True

    def _set_trouble(self, trouble: str | None) -> None:
        with self._lock:
            self._trouble = trouble
