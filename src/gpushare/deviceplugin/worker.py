"""The plugin's background threads.

`start_daemon` starts every one of them, so a thread that ends by an error its
own loop did not catch says so loudly: the plugin goes on answering, but what
that thread kept current (the node's pods, the registrations, the marks) no
longer changes.

`Worker` is the shape of the background writers: a daemon thread that waits on
a condition for work and ends when stopped, so the gRPC handlers never wait on
the API server.
"""

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


def start_daemon(name: str, target: Callable[[], None]) -> threading.Thread:
    def run() -> None:
        try:
            target()
        except BaseException:
            log.critical(
                "background thread %s died; what it keeps current stays as it is until "
                "the plugin restarts",
                name,
                exc_info=True,
            )

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


class Worker:
    def __init__(self, name: str, join_timeout: float = 5.0) -> None:
        self._name = name
        self._join_timeout = join_timeout
        self._cond = threading.Condition()
        self._stopped = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = start_daemon(self._name, self._run)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=self._join_timeout)

    def _run(self) -> None:
        raise NotImplementedError
