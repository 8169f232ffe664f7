"""The node binaries' /metrics: served, and a client that stops sending is dropped."""

import socket
import time
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter

from gpushare.nodeflags.serving import serve_metrics


@pytest.fixture
def server() -> Iterator[int]:
    registry = CollectorRegistry()
    Counter("gpushare_test_events", "events", registry=registry).inc()
    served = serve_metrics(0, registry, address="127.0.0.1", read_timeout_s=0.5)
    yield served.server_address[1]
    served.shutdown()


def test_metrics_are_served(server: int) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{server}/metrics", timeout=5) as answer:
        assert b"gpushare_test_events_total 1.0" in answer.read()


def test_a_client_that_stops_sending_is_dropped(server: int) -> None:
    with socket.create_connection(("127.0.0.1", server), timeout=5) as idle:
        idle.sendall(b"GET /metr")
        started = time.monotonic()
        assert idle.recv(1024) == b""  # closed by the server, not answered
        assert time.monotonic() - started < 3
    with urllib.request.urlopen(f"http://127.0.0.1:{server}/metrics", timeout=5) as answer:
        assert answer.status == 200
