"""A response's head leaves with its body in one send (gpushare.extender.server)."""

from typing import Any

from gpushare.extender.server import _CoalescedWrites

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"


class Transport:
    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        assert not self.closed, "written after close"
        self.sent.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else None


class Loop:
    def __init__(self) -> None:
        self.soon: list[Any] = []

    def call_soon(self, callback: Any) -> None:
        self.soon.append(callback)

    def turn(self) -> None:
        callbacks, self.soon = self.soon, []
        for callback in callbacks:
            callback()


def coalesced() -> tuple[_CoalescedWrites, Transport, Loop]:
    transport, loop = Transport(), Loop()
    return _CoalescedWrites(transport, loop), transport, loop  # type: ignore[arg-type]


def test_the_head_and_the_body_leave_in_one_write():
    writes, transport, loop = coalesced()
    writes.write(HEAD)
    assert transport.sent == []
    writes.write(b"{}")
    assert transport.sent == [HEAD + b"{}"]
    loop.turn()  # nothing held any more: nothing sent twice
    assert transport.sent == [HEAD + b"{}"]


def test_a_head_alone_leaves_at_the_next_turn_of_the_loop_or_at_close():
    writes, transport, loop = coalesced()
    writes.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    loop.turn()
    assert transport.sent == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    writes.write(HEAD)
    writes.close()
    assert transport.sent[-1] == HEAD and transport.closed


def test_other_writes_and_attributes_are_the_transports():
    writes, transport, _ = coalesced()
    writes.write(b"5\r\nhello\r\n")
    assert transport.sent == [b"5\r\nhello\r\n"]
    assert writes.get_extra_info("peername") == ("127.0.0.1", 1)
    assert not writes.is_closing()


def test_a_head_held_when_the_peer_went_away_is_dropped():
    writes, transport, loop = coalesced()
    writes.write(HEAD)
    transport.closed = True
    loop.turn()
    assert transport.sent == []
