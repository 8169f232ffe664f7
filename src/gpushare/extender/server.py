"""uvicorn on a socket bound up front, in the calling thread or a background one.

Binding the socket before uvicorn starts gives a free port (port 0) that is
known at once, which the demo, the tests and the benchmark rely on.
"""

import socket
import threading
from pathlib import Path

import uvicorn
from fastapi import FastAPI


class HttpServer:
    def __init__(
        self,
        app: FastAPI,
        host: str = "127.0.0.1",
        port: int = 0,
        tls_cert_file: Path | None = None,
        tls_key_file: Path | None = None,
        log_level: str = "warning",
    ) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((host, port))
        self.host = host
        self.port: int = self.socket.getsockname()[1]
        self.tls = tls_cert_file is not None
        config = uvicorn.Config(
            app,
            log_config=None,
            log_level=log_level,
            access_log=False,
            ssl_certfile=str(tls_cert_file) if tls_cert_file else None,
            ssl_keyfile=str(tls_key_file) if tls_key_file else None,
            timeout_keep_alive=30,  # kube-scheduler's Go client keeps connections open
        )
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.tls else "http"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}"

    def run(self) -> None:
        """Serves in this thread until stop() or a signal."""
        self.server.run(sockets=[self.socket])

    def start(self, timeout: float = 10.0) -> "HttpServer":
        """Serves in a daemon thread; returns once the server accepts connections."""
        self._thread = threading.Thread(target=self.run, name=f"http-{self.port}", daemon=True)
        self._thread.start()
        stopped = threading.Event()
        while not self.server.started:
            if not self._thread.is_alive() or stopped.wait(0.01) or timeout <= 0:
                break
            timeout -= 0.01
        if not self.server.started:
            raise RuntimeError(f"the HTTP server on {self.url} did not start")
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
        self.socket.close()
