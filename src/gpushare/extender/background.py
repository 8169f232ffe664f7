"""The extender's background workers: a daemon thread that sleeps until woken and
then does its work, so that whoever wakes it (the watch thread, holding the cache's
lock) never waits on the API server."""

import logging
import threading

log = logging.getLogger(__name__)


class BackgroundWorker:
    """Runs `work` after each `wake`; wake-ups that arrive while it lingers or works
    make one more run. Errors of `work` are logged and the thread goes on."""

    def __init__(self, name: str, linger_s: float = 0.0) -> None:
        self.name = name
        self._linger_s = linger_s
        """How long to wait after a wake-up before working, so that a burst of
        changes makes one run."""
        self._cond = threading.Condition()
        self._woken = False
        self._stopped = False
        self._thread: threading.Thread | None = None

    def work(self) -> object:
        raise NotImplementedError

    def wake(self) -> None:
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._woken or self._stopped)
                self._cond.wait_for(lambda: self._stopped, self._linger_s)
                if self._stopped:
                    return
                self._woken = False
            try:
                self.work()
            except Exception:  # a bug, not the API: keep the worker alive
                log.exception("background worker %s failed", self.name)
