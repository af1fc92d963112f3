"""One pooled keep-alive connection of ``HttpClient``: a request's head and body written, its
answer parsed by httptools (its head kept as bytes, the headers asked for read out of it),
the answer or the error handed to the future or the callback waiting for it."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable
from typing import cast

import httptools

from evenserve.httpio.client.reply import (
    BadResponse,
    ConnectionLost,
    Reply,
    ResponseTimeout,
    Result,
    head_end,
    new_reply,
    parse_headers,
)

#: Status codes (1xx aside) whose answers have no body whatever their Content-Length says.
_NO_BODY = (b"204", b"304")
#: What may follow a status code: the reason's space or the line's end.
_AFTER_CODE = (0x20, 0x0D)
#: In a lower-cased head (without its blank line): a header that concerns one connection, not
#: the answer (RFC 9110 7.6.1), Transfer-Encoding, a folded line, or a blank line before the
#: end, CRLF or bare LF (one search: a regular expression's, cheaper than a ``find`` per
#: name, whose arguments CPython 3.11 parses by format string).
_NOT_PLAIN = re.compile(
    rb"\n(?:transfer-encoding:|connection:|keep-alive:|proxy-|upgrade:|trailer:|[ \t\r\n])"
).search


class Connection(asyncio.Protocol):
    """One connection. httptools calls no method per header (there is no ``on_header``):
    the head's bytes are kept as they arrive and read once it is complete."""

    def __init__(self, keep: frozenset[bytes], loop: asyncio.AbstractEventLoop) -> None:
        self.keep = keep
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.fut: asyncio.Future[Result] | None = None
        #: Instead of ``fut``: called with (result, None) or (None, error) (``send_cb``).
        self.cb: Callable[[Result | None, BaseException | None], None] | None = None
        #: The pool's callback for this connection (made once, not per request) and what
        #: the request in flight on it by callback needs when it is over: its head, body,
        #: deadline, the caller's callback and its argument (``HttpClient.send_with``).
        self.pool_done: Callable[[Result | None, BaseException | None], None] | None = None
        self.sent: tuple[bytes, bytes, float, Callable[..., None], object] | None = None
        #: The reads of the current answer until its head is complete, then its head.
        self.head_parts: list[bytes] = []
        self.head = b""
        self.in_head = True
        #: Reads of the current answer so far (by the parser).
        self.reads = 0
        self.body: list[bytes] = []
        self.closed = False
        self.reusable = True
        #: Whether any byte came back since the current request was written.
        self.got_bytes = False
        #: When it went back to the pool (the loop's clock).
        self.idle_since = 0.0
        #: When the current request's time limit is up (the loop's clock; 0: no request),
        #: and whether a sweep has already found it past (``HttpClient._sweep``).
        self.deadline = 0.0
        self.overdue = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        if not self.reads and self.in_head and data[:9] == b"HTTP/1.1 ":
            # An answer read whole in one piece, its body framed by its Content-Length, no
            # hop-by-hop header (what a backend's answer nearly always is): taken without
            # the parser's callbacks, and kept whole as ``raw`` (a proxy relays it as it
            # is). Anything else (partial, chunked, 1xx, no body by its status, a hop-by-hop
            # header, folded or bare-LF lines) is the parser's, and has no ``raw``. Split
            # by ``partition`` and ``split``, not ``find`` and ``count`` (a format string
            # parsed per call).
            head, sep, body = data.partition(b"\r\n\r\n")
            if sep:
                low = head.lower()
                around = low.split(b"\ncontent-length:")  # two parts: one Content-Length
                code = head[9:12]
                if (
                    len(around) == 2
                    and b"200" <= code <= b"599"
                    and code.isdigit()
                    and data[12] in _AFTER_CODE
                    and code not in _NO_BODY
                    # The head ends where it was found: no blank line before it, CRLF or
                    # not (a lenient parser ends a head at a bare-LF blank line too).
                    and _NOT_PLAIN(low) is None
                    and head[-1] != 0x0A
                ):
                    value = around[1].partition(b"\r")[0].strip()
                    if value.isdigit() and int(value) == len(body):
                        head += sep
                        self.reusable = True
                        keep = self.keep
                        result: Reply = new_reply(
                            Reply,
                            (
                                int(code),
                                parse_headers(head, keep) if keep else {},
                                body,
                                0,
                                head,
                                data,
                            ),
                        )
                        cb = self.cb
                        if cb is not None and self.fut is None:  # _deliver, inlined
                            self.cb = None
                            cb(result, None)
                        else:
                            self._deliver(result)
                        return
        self.reads += 1
        if self.in_head:
            self.head_parts.append(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.reusable = False
            self._fail(BadResponse(f"malformed HTTP answer: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(ConnectionLost("the server closed the connection before answering"))

    def eof_received(self) -> bool | None:
        # A body delimited by the connection's end completes here.
        with contextlib.suppress(httptools.HttpParserError):
            self.parser.feed_data(b"")
        return None

    # httptools callbacks
    def on_headers_complete(self) -> None:
        parts = self.head_parts
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        end = head_end(data)
        self.head = data if end < 0 else data[:end]
        self.head_parts = []
        self.in_head = False

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        status = self.parser.get_status_code()
        head = self.head
        parts = self.body
        self.body = []
        self.in_head = True
        if status < 200:  # 100 Continue and friends: the real answer follows
            self.reads = 0 if not self.head_parts else 1
            return
        self.reusable = self.parser.should_keep_alive()
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        self.reads = 0
        headers = parse_headers(head, self.keep) if self.keep else {}
        self._deliver(new_reply(Reply, (status, headers, body, 0, head, None)))

    def _deliver(self, result: Result) -> None:
        """The answer to whoever waits for it (the future or the callback)."""
        fut = self.fut
        self.fut = None
        if fut is not None and not fut.done():
            fut.set_result(result)
        elif self.cb is not None:
            cb = self.cb
            self.cb = None
            cb(result, None)

    # ours
    def _fail(self, exc: BaseException) -> None:
        fut = self.fut
        self.fut = None
        if fut is not None and not fut.done():
            fut.set_exception(exc)
        elif self.cb is not None:
            cb = self.cb
            self.cb = None
            cb(None, exc)

    def request(self, head: bytes, body: bytes, deadline: float) -> asyncio.Future[Result]:
        self.fut = self.loop.create_future()
        self._write(head, body, deadline)
        return self.fut

    def _write(self, head: bytes, body: bytes, deadline: float) -> None:
        assert self.transport is not None
        self.deadline = deadline
        self.overdue = False
        self.got_bytes = False
        if not body:
            self.transport.write(head)
        elif len(body) < 65536:
            self.transport.write(head + body)
        else:
            self.transport.writelines((head, body))

    def usable(self) -> bool:
        """Open as far as this side knows (the server may have closed it a moment ago)."""
        return not self.closed and self.transport is not None and not self.transport.is_closing()

    def expire(self) -> None:
        self.reusable = False
        self._fail(ResponseTimeout("no answer within the time limit"))
        self.close()

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.abort()
            self.closed = True
