"""Reads a request's body within its limits, deciding before the body is in memory.

The declared Content-Length is checked first; then the body is read chunk by
chunk as the server receives it (ASGI `receive()`), stopping as soon as it passes
the limit, so an oversized body is refused having held at most the limit plus one
chunk; and the whole read runs under a deadline, so a body that trickles or never
ends costs its connection no more than that. A refusal is a `BodyRefused` with
the status and a message naming the limit, which each face writes in the shape
its caller reads.
"""

import anyio
from starlette.requests import ClientDisconnect, Request

JSON = "application/json"


class BodyRefused(Exception):
    """A body refused before it was parsed: `status` (400, 408, 413 or 415) and why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def read_json_body(request: Request, limit: int, deadline: float) -> bytes:
    """The body of a JSON request of at most `limit` bytes that arrives within `deadline`
    seconds; BodyRefused otherwise."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise BodyRefused(400, f"Content-Length must be a number of bytes, got {declared!r}")
        if int(declared) > limit:
            raise BodyRefused(413, _too_large(limit, f"{declared} bytes declared"))
    chunks: list[bytes] = []
    size = 0
    try:
        with anyio.fail_after(deadline):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise BodyRefused(413, _too_large(limit, f"over {limit} bytes sent"))
                chunks.append(chunk)
    except TimeoutError:
        raise BodyRefused(
            408, f"the body did not arrive within {deadline:g} s ({size} bytes came)"
        ) from None
    except ClientDisconnect:
        raise BodyRefused(400, f"the body ended early, after {size} bytes") from None
    # The type is judged once the (bounded) body is read: a connection answered with its
    # body unread is closed, and the client may see a reset instead of the answer.
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type != JSON:
        got = f"got {media_type!r}" if media_type else "got none"
        raise BodyRefused(415, f"Content-Type must be {JSON}, {got}")
    return b"".join(chunks)


def _too_large(limit: int, what: str) -> str:
    return f"the body exceeds this endpoint's limit of {limit} bytes ({what})"
