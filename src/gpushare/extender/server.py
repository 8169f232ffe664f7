"""uvicorn on a socket bound up front, in the calling thread or a background one.

Binding the socket before uvicorn starts gives a free port (port 0) that is
known at once, which the demo, the tests and the benchmark rely on.

uvicorn bounds neither the time a client takes to send a request's headers nor
their size (its keep-alive timer stops at the first byte of the next request), so
a client trickling headers would hold its connection and grow its buffer forever;
and after answering a request whose body it did not read, it reads that body to
its end, however long. `_BoundedHttp` bounds all three; the apps bound the bodies
they read (gpushare.extender.bodies).
"""

import asyncio
import socket
import ssl
import threading
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gpushare.extender.limits import DEFAULT_READ_LIMITS, ReadLimits


class _CoalescedWrites:
    """A connection's transport that sends a response's head with the first write
    after it: uvicorn writes the head and the body separately, and each write is a
    send() on the socket that wakes the reader (kube-scheduler, the API server)
    while this thread holds the GIL. One send per response halves those; a profile of
    the extender beside a busy kube-scheduler showed a third of its Python time in
    them. A head is held only until that write, close(), or the loop's next turn
    (a head with nothing after it, as for 100 Continue); all else is the transport's."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._head = b""

    def write(self, data: bytes) -> None:
        if self._head:
            data, self._head = self._head + data, b""
        elif data.startswith(b"HTTP/") and data.endswith(b"\r\n\r\n"):
            self._head = data
            self._loop.call_soon(self._flush)
            return
        self._transport.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def _flush(self) -> None:
        if self._head:
            head, self._head = self._head, b""
            if not self._transport.is_closing():  # the peer went away meanwhile
                self._transport.write(head)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _BoundedHttp(HttpToolsProtocol):
    """uvicorn's httptools protocol, with a deadline and a size limit on each request's
    line and headers: a 408 once `limits.header_deadline` has passed since the
    connection opened or the request's first byte, a 431 once its headers pass
    `limits.header_bytes`; either closes the connection."""

    limits = DEFAULT_READ_LIMITS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._header_bytes = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        coalesced = _CoalescedWrites(transport, self.loop)
        super().connection_made(coalesced)  # type: ignore[arg-type]
        self._arm()  # a connection that never sends a byte is closed too

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_bytes = 0
        self._arm()

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value))
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._disarm()  # the app's body deadline takes over
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        if self.cycle.more_body:
            # Answered before the whole body came (refused, or an endpoint that takes
            # none): uvicorn would go on reading the rest, however long or slow, to
            # keep the connection; close it instead, as Go's servers do.
            self.transport.close()
        super().on_response_complete()

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.limits.header_deadline, self._late)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _late(self) -> None:
        self._deadline = None
        self._refuse(
            b"408 Request Timeout",
            f"the request's headers did not arrive within {self.limits.header_deadline:g} s",
        )

    def _count(self, size: int) -> None:
        self._header_bytes += size
        if self._header_bytes > self.limits.header_bytes:
            self._refuse(
                b"431 Request Header Fields Too Large",
                f"the request's line and headers exceed {self.limits.header_bytes} bytes",
            )

    def _refuse(self, status: bytes, message: str) -> None:
        if self.transport.is_closing():
            return
        body = message.encode()
        self.transport.write(
            b"HTTP/1.1 " + status + b"\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body
        )
        self.transport.close()


class HttpServer:
    def __init__(
        self,
        app: FastAPI,
        host: str = "127.0.0.1",
        port: int = 0,
        tls_cert_file: Path | None = None,
        tls_key_file: Path | None = None,
        log_level: str = "warning",
        client_ca_file: Path | None = None,
        limits: ReadLimits = DEFAULT_READ_LIMITS,
        loop: str = "auto",
    ) -> None:
        """`client_ca_file`: with TLS, only clients presenting a certificate signed by
        this CA are served (the handshake fails for any other). `loop`: uvicorn's
        event loop, "auto" (uvloop where installed) or "asyncio"."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((host, port))
        self.host = host
        self.port: int = self.socket.getsockname()[1]
        self.tls = tls_cert_file is not None
        protocol = type("BoundedHttp", (_BoundedHttp,), {"limits": limits})
        config = uvicorn.Config(
            app,
            http=protocol,
            log_config=None,
            log_level=log_level,
            access_log=False,
            ssl_certfile=str(tls_cert_file) if tls_cert_file else None,
            ssl_keyfile=str(tls_key_file) if tls_key_file else None,
            ssl_ca_certs=str(client_ca_file) if client_ca_file else None,
            ssl_cert_reqs=ssl.CERT_REQUIRED if client_ca_file else ssl.CERT_NONE,
            timeout_keep_alive=30,  # kube-scheduler's Go client keeps connections open
            loop=loop,
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
