"""A gRPC server on a unix socket only its owner (and root: the kubelet) may reach.

Both of the driver's sockets are served this way (DRA-INTERFACES §1): the stale file a
crashed driver left is removed first, the folder is created, the socket is made
owner-only before the server takes calls, and stop() removes it again, which for the
registration socket is how a plugin deregisters.
"""

import logging
import os
import stat
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final

import grpc

log = logging.getLogger(__name__)

MAX_SOCKET_PATH: Final = 107
"""sun_path holds 108 bytes including the terminating NUL."""
MAX_MESSAGE: Final = 4 * 1024 * 1024
"""Bytes of one request: a kubelet call names at most a pod's claims (a few hundred bytes
each), so anything near this is not a kubelet."""
SOCKET_MODE: Final = 0o600
FOLDER_MODE: Final = 0o750
_STOP_WAIT: Final = 5.0


class UnixServer:
    def __init__(self, path: Path, name: str, workers: int, max_calls: int) -> None:
        if len(str(path)) > MAX_SOCKET_PATH:
            raise ValueError(
                f"socket path {path} is longer than {MAX_SOCKET_PATH} bytes, the limit of a "
                f"unix socket address; use a shorter kubelet directory"
            )
        self.path = path
        self._name = name
        self._workers = workers
        self._max_calls = max_calls
        self._server: grpc.Server | None = None
        self._inode: int | None = None

    def start(self, add_services: Callable[[grpc.Server], None]) -> None:
        """Serves what add_services registers; calls beyond max_calls (running or queued
        for a worker) are answered RESOURCE_EXHAUSTED at once."""
        self.path.parent.mkdir(mode=FOLDER_MODE, parents=True, exist_ok=True)
        self.path.unlink(missing_ok=True)
        server = grpc.server(
            ThreadPoolExecutor(self._workers, thread_name_prefix=self._name),
            maximum_concurrent_rpcs=self._max_calls,
            options=[("grpc.max_receive_message_length", MAX_MESSAGE)],
        )
        add_services(server)
        server.add_insecure_port(f"unix:{self.path}")
        # Bound, not yet serving: nobody else gets in between.
        os.chmod(self.path, SOCKET_MODE)
        server.start()
        self._server = server
        self._inode = os.stat(self.path).st_ino

    def stop(self, grace: float = 1.0) -> None:
        if self._server is not None and not self._server.stop(grace).wait(_STOP_WAIT):
            log.error("the gRPC server on %s did not stop within %.0fs", self.path, _STOP_WAIT)
        if self.intact():
            self.path.unlink(missing_ok=True)
        self._server = None

    def intact(self) -> bool:
        """False once our socket file is gone or replaced by another."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        return stat.S_ISSOCK(st.st_mode) and st.st_ino == self._inode
