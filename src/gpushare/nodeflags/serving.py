"""/metrics of the node binaries, bounded: prometheus-client's own server waits for ever
on a client that stops sending and keeps a thread for it, so 50 half-sent request lines
held 50 threads. Here a client that sends nothing for READ_TIMEOUT_S is dropped;
request lines and headers keep http.server's bounds (64 KiB, 100 headers)."""

import logging
import threading
from socketserver import ThreadingMixIn
from typing import Any, Final
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

READ_TIMEOUT_S: Final = 10.0


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


def serve_metrics(
    port: int,
    registry: CollectorRegistry,
    address: str = "",
    read_timeout_s: float = READ_TIMEOUT_S,
) -> WSGIServer:
    """Serves `registry` at http://address:port/metrics in a daemon thread; the server,
    whose `shutdown()` stops it. Raises OSError when the port cannot be bound."""

    class Handler(WSGIRequestHandler):
        timeout = read_timeout_s

        def log_message(self, format: str, *args: Any) -> None:
            """Scrapes are not worth a log line each."""

    server = make_server(address, port, make_wsgi_app(registry), _Server, Handler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server


def start_metrics(port: int, registry: CollectorRegistry, log: logging.Logger) -> bool:
    """Serves `registry` on --metrics-port unless it is 0; False, logged with what to do,
    when the port cannot be had."""
    if not port:
        return True
    try:
        serve_metrics(port, registry)
    except OSError as err:
        log.error("cannot serve metrics on port %d (%s); pick another --metrics-port or 0",
                  port, err)  # fmt: skip
        return False
    return True
