"""What a handler gets (``Request``) and returns (``Response``), the handler types, JSON
bodies, and a response's head as bytes (status line, the ``Date`` line renewed by the
servers' sweeps, headers, length), the one writing every answer uses."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from typing import Any


@dataclass(slots=True)
class Request:
    """One request as read: the path is as sent (still percent-encoded), without the query;
    header names are lower case (a repeated header's values joined with ``", "``)."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes = b""


@dataclass(slots=True)
class Response:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] | None = None
    #: The whole answer as bytes, head and body, to send as it is (a proxy relaying an
    #: upstream's answer); ``raw_head``: where its head ends (-1: a ``StreamResponse``).
    #: ``status`` and ``body`` still describe it; ``headers`` are not used.
    raw: bytes | None = None
    raw_head: int = 0


class StreamResponse(Response):
    """An answer whose body is streamed: ``chunks`` yields its pieces as they are made.

    The server writes the head at once (``Transfer-Encoding: chunked`` to an HTTP/1.1 client;
    to an HTTP/1.0 one no length and ``Connection: close``, the body ending with the
    connection), then each non-empty piece as it comes, flushed, waiting while the client
    reads slower than the pieces come (the transport's backpressure), then the end. When the
    client goes away (or the server stops) before the end, ``chunks`` is closed (``aclose``,
    or the task awaiting it cancelled): its producer sees GeneratorExit or CancelledError and
    can stop its work. A piece that fails after the head went out cannot become a 500: it is
    logged once and the connection is closed, so the client sees a body cut short. ``body``
    is unused."""

    __slots__ = ("chunks",)

    def __init__(
        self, status: int, headers: dict[str, str] | None, chunks: AsyncIterator[bytes]
    ) -> None:
        # raw_head -1 marks a streamed answer: the connection tells it from a whole one by
        # that slot, not by its type (a call on every whole answer's path).
        Response.__init__(self, status, b"", headers, None, -1)
        self.chunks = chunks


Handler = Callable[[Request], Awaitable[Response]]
#: A request handler without a task: called with the request and the function that answers
#: it; returns True when it took the request (then it calls that function exactly once, now
#: or later, from the event loop), False to leave it to the (async) Handler. The gateway's
#: forwarding path is one: a task and its coroutines cost more than the rest of a forward.
FastHandler = Callable[[Request, Callable[[Response], None]], bool]

JSON = "application/json"


def json_response(
    body: bytes, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    h = {"content-type": JSON}
    if headers:
        h.update(headers)
    return Response(status, body, h)


def json_bytes(obj: Any) -> bytes:
    """``obj`` as compact JSON, never with a bare ``Infinity`` or ``NaN`` (JSON has neither:
    RFC 8259 6; strict parsers refuse them): a float that is not finite is written ``null``.
    What the servers answer in JSON is written with it."""
    try:
        return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()
    except ValueError:  # a non-finite float somewhere: the rare path
        return json.dumps(_finite(obj), separators=(",", ":"), allow_nan=False).encode()


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def _status_line(status: int) -> bytes:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Unknown"
    return f"HTTP/1.1 {status} {phrase}\r\n".encode()


_STATUS_LINES = {s.value: _status_line(s.value) for s in HTTPStatus}


def _date_line() -> bytes:
    return b"date: %s\r\n" % formatdate(usegmt=True).encode()


#: The ``Date`` header line (RFC 9110 6.6.1: an origin server with a clock sends one), made
#: once and renewed by every server's sweep (at most half a second old), not per response.
_DATE = [_date_line()]


def refresh_date() -> None:
    _DATE[0] = _date_line()


def encode_head(status: int, headers: dict[str, str] | None, length: int, close: bool) -> bytes:
    line = _STATUS_LINES.get(status) or _status_line(status)
    parts = [line, _DATE[0]]
    if headers:
        parts.extend(f"{k}: {v}\r\n".encode("latin-1") for k, v in headers.items())
    parts.append(b"content-length: %d\r\n" % length)
    if close:
        parts.append(b"connection: close\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)


def encode_stream_head(
    status: int, headers: dict[str, str] | None, chunked: bool, close: bool
) -> bytes:
    """A streamed answer's head (``StreamResponse``): ``Transfer-Encoding: chunked`` when
    ``chunked``, else no length (the body ends with the connection: ``close`` must hold)."""
    line = _STATUS_LINES.get(status) or _status_line(status)
    parts = [line, _DATE[0]]
    if headers:
        parts.extend(
            f"{k}: {v}\r\n".encode("latin-1")
            for k, v in headers.items()
            if k.lower() not in ("content-length", "transfer-encoding", "connection")
        )
    if chunked:
        parts.append(b"transfer-encoding: chunked\r\n")
    if close:
        parts.append(b"connection: close\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)


def error_bytes(status: int, message: str) -> bytes:
    body = json.dumps({"error": message}).encode()
    return encode_head(status, {"content-type": JSON}, len(body), True) + body
