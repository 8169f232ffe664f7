"""List-then-watch through the cluster port, on a thread, relisting whenever the
watch ends or expires (410 Gone), so the handler always holds the full picture."""

import logging
import threading
from collections.abc import Callable
from typing import Final, Generic, TypeVar

from gpushare.cluster import Expired, Listing, Watch, WatchEvent
from gpushare.objects import Node, Pod

log = logging.getLogger(__name__)

T = TypeVar("T", Node, Pod)

RETRY: Final = 1.0


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
        self._stopped = threading.Event()
        self._synced = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

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

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                listing = self._list()
                self._on_list(listing.items)
                self._synced.set()
                self._follow(listing.resource_version)
            except Expired:
                log.info("%s: watch expired; listing again", self.name)
            except Exception:
                log.exception("%s: list or watch failed; retrying in %.0fs", self.name, RETRY)
                self._stopped.wait(RETRY)

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
