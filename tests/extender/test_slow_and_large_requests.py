"""How the real server reads a request: bodies over their limit are refused before
they are in memory (the process's RSS stays flat under 100 MB), slow or endless
headers and bodies are cut off at their deadlines while other clients are served,
and a connection answered before its body came is closed rather than drained.
The server runs in a process of its own (tests/extender/serve.py) with 1-second
deadlines, spoken to over raw sockets where httpx would refuse to misbehave."""

import contextlib
import json
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpushare.extender import limits
from tests.builders import pod
from tests.extender.harness import PREFIX, pod_json

DEADLINE = 1.0
MiB = 1024 * 1024
ROOT = Path(__file__).resolve().parents[2]


class Served:
    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.extender.serve", str(DEADLINE), str(DEADLINE)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        urls = json.loads(self.process.stdout.readline())
        self.extender = urlsplit(urls["extender"]).port
        self.webhook = urlsplit(urls["webhook"]).port

    def rss(self) -> int:
        """Resident memory of the server process, bytes."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        line = next(line for line in status.splitlines() if line.startswith("VmRSS:"))
        return int(line.split()[1]) * 1024

    def close(self) -> None:
        self.process.communicate(input="", timeout=20)


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    if not Path("/proc/self/status").exists():
        pytest.skip("needs /proc to read the server's memory")
    server = Served()
    yield server
    server.close()


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=DEADLINE * 5)


def head(path: str, *headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", *headers, "", ""]
    return "\r\n".join(lines).encode()


def answer(sock: socket.socket) -> tuple[int, bytes]:
    """Status and body of the one answer on `sock`, read until the server closes it."""
    data = b""
    with contextlib.suppress(ConnectionResetError):  # a close with our bytes unread
        while chunk := sock.recv(65536):
            data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


def send_until_answered(sock: socket.socket, data: bytes) -> bool:
    """Sends `data` unless the server has answered already (it may refuse before the
    end and close: what we sent after that would make it reset the connection, losing
    its answer); False once it has answered or closed."""
    if select.select([sock], [], [], 0)[0]:
        return False
    try:
        sock.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        return False
    return True


def healthy(served: Served) -> float:
    """Seconds a plain request takes while whatever else is going on goes on."""
    started = time.monotonic()
    assert httpx.get(f"http://127.0.0.1:{served.extender}/healthz").status_code == 200
    return time.monotonic() - started


# ----- size: refused before it is read, memory flat


@pytest.mark.parametrize(
    ("port", "path", "limit"),
    [
        ("extender", f"{PREFIX}/filter", limits.EXTENDER_ARGS_MAX),
        ("webhook", "/validate", limits.ADMISSION_REVIEW_MAX),
    ],
)
def test_a_100_mb_body_declared_is_a_413_before_any_of_it_is_read(served, port, path, limit):
    before = served.rss()
    with connect(getattr(served, port)) as sock:
        # Headers alone: the answer comes without a byte of the body.
        sock.sendall(head(path, "Content-Type: application/json", f"Content-Length: {100 * MiB}"))
        status, body = answer(sock)
    assert status == 413
    assert f"limit of {limit} bytes ({100 * MiB} bytes declared)".encode() in body
    assert served.rss() - before < 2 * MiB


@pytest.mark.parametrize(
    ("port", "path", "limit"),
    [
        ("extender", f"{PREFIX}/filter", limits.EXTENDER_ARGS_MAX),
        ("webhook", "/validate", limits.ADMISSION_REVIEW_MAX),
    ],
)
def test_a_100_mb_chunked_body_is_read_only_up_to_the_limit(served, port, path, limit):
    before = served.rss()
    chunk = b" " * MiB
    with connect(getattr(served, port)) as sock:
        sock.sendall(head(path, "Content-Type: application/json", "Transfer-Encoding: chunked"))
        sent = 0
        while sent < 100 and send_until_answered(sock, b"%x\r\n%s\r\n" % (len(chunk), chunk)):
            sent += 1
        status, body = answer(sock)
    assert sent < 100 * MiB / limit  # it stopped taking the body shortly after the limit
    assert status == 413
    assert f"limit of {limit} bytes (over {limit} bytes sent)".encode() in body
    # At most the limit held at once, and given back: growth well under the 100 MB.
    assert served.rss() - before < limit + 4 * MiB


# ----- time: slow clients are cut off, others are served meanwhile


def test_headers_that_trickle_are_a_408_at_the_deadline_while_others_are_served(served):
    with connect(served.extender) as sock:
        sock.sendall(b"POST /healthz HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        while time.monotonic() - started < DEADLINE * 3:
            if not send_until_answered(sock, b"X-Slow: 1\r\n"):
                break
            assert healthy(served) < DEADLINE / 2
            time.sleep(DEADLINE / 10)
        status, body = answer(sock)
        took = time.monotonic() - started
    assert status == 408 and b"headers did not arrive within 1 s" in body
    assert DEADLINE * 0.8 < took < DEADLINE * 3


def test_a_connection_that_never_sends_a_byte_is_closed_at_the_deadline(served):
    with connect(served.extender) as sock:
        started = time.monotonic()
        status, _ = answer(sock)
        assert status == 408 and time.monotonic() - started < DEADLINE * 3


def test_endless_headers_are_a_431_at_their_limit(served):
    with connect(served.extender) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        for _ in range(100):
            if not send_until_answered(sock, b"X-Big: " + b"x" * 4096 + b"\r\n"):
                break
        status, body = answer(sock)
    assert status == 431
    assert f"exceed {limits.HEADER_BYTES_MAX} bytes".encode() in body


@pytest.mark.parametrize(("port", "path"), [("extender", f"{PREFIX}/bind"), ("webhook", "/mutate")])
def test_a_body_that_trickles_is_a_408_at_the_deadline_in_the_callers_shape(served, port, path):
    with connect(getattr(served, port)) as sock:
        sock.sendall(head(path, "Content-Type: application/json", "Content-Length: 1000"))
        started = time.monotonic()
        while time.monotonic() - started < DEADLINE * 3:
            if not send_until_answered(sock, b" "):
                break
            time.sleep(DEADLINE / 10)
        status, body = answer(sock)
        took = time.monotonic() - started
    assert status == 408
    error = json.loads(body)
    message = error["Error"] if port == "extender" else error["message"]
    assert "the body did not arrive within 1 s" in message
    assert DEADLINE * 0.8 < took < DEADLINE * 3


def test_an_endless_body_to_an_endpoint_that_takes_none_is_answered_and_cut_off(served):
    with connect(served.extender) as sock:
        sock.sendall(
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"
        )
        started = time.monotonic()
        status, _ = answer(sock)  # returns only once the server has closed the connection
    assert status == 200 and time.monotonic() - started < DEADLINE


# ----- what the server itself makes of malformed framing


@pytest.mark.parametrize("declared", ["-1", "abc", "1e9", "10, 20"])
def test_a_content_length_that_is_no_number_is_a_400(served, declared):
    with connect(served.extender) as sock:
        path = f"{PREFIX}/filter"
        sock.sendall(head(path, "Content-Type: application/json", f"Content-Length: {declared}"))
        send_until_answered(sock, b"{}")
        status, _ = answer(sock)
    assert status == 400


def test_a_body_cut_short_by_the_client_costs_nothing_and_breaks_nothing(served):
    whole = json.dumps({"Pod": pod_json(pod("p", mem=1)), "NodeNames": ["n1"]}).encode()
    with connect(served.extender) as sock:
        path = f"{PREFIX}/filter"
        sock.sendall(head(path, "Content-Type: application/json", f"Content-Length: {len(whole)}"))
        sock.sendall(whole[:50])
        sock.shutdown(socket.SHUT_WR)  # and nothing more: the server sees the end
        data = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                data += chunk
    assert data == b"" or data.startswith(b"HTTP/1.1 400")  # nobody is left to read it
    assert healthy(served) < DEADLINE


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    cuts=st.lists(st.integers(min_value=1, max_value=400), max_size=6),
    declared=st.sampled_from(["exact", "none", "short"]),
)
def test_any_chunking_of_a_good_body_is_read_as_the_whole_body(served, cuts, declared):
    """However the body is split on the wire, the server reads the same bytes: 200
    when the declared length is right or absent (chunked), 4xx never 5xx otherwise."""
    body = json.dumps({"Pod": pod_json(pod("p", mem=1)), "NodeNames": ["n1"]}).encode()
    length = {"exact": len(body), "short": len(body) - 7}.get(declared)
    framing = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    pieces, at = [], 0
    for cut in [*cuts, len(body)]:
        pieces.append(body[at : at + cut])
        at += cut
    with connect(served.extender) as sock:
        sock.sendall(head(f"{PREFIX}/filter", "Content-Type: application/json", framing))
        for piece in filter(None, pieces):
            data = piece if length is not None else b"%x\r\n%s\r\n" % (len(piece), piece)
            send_until_answered(sock, data)
        if length is None:
            send_until_answered(sock, b"0\r\n\r\n")
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)
        status, reply = answer(sock)
    if declared == "short":
        # Our 400 for the truncated JSON, or the server's for the 7 bytes after it.
        assert status == 400
    else:
        assert status == 200 and json.loads(reply)["NodeNames"] == ["n1"]
