"""The plugin's background writers: a daemon thread that waits on a condition for
work and ends when stopped, so the gRPC handlers never wait on the API server."""

import threading


class Worker:
    def __init__(self, name: str, join_timeout: float = 5.0) -> None:
        self._name = name
        self._join_timeout = join_timeout
        self._cond = threading.Condition()
        self._stopped = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=self._join_timeout)

    def _run(self) -> None:
        raise NotImplementedError
