"""A minimal HTTP/1.1 keep-alive client for the send path (asyncio protocol + httptools).

Why not aiohttp here: on a small host aiohttp's client spends ~0.4 ms of CPU per request, and
an answer burst (a batch of 8 completing at once) then keeps the generator's single loop busy
for milliseconds, which shows up as scheduling lag of the next sends. This client writes a
prebuilt request (head and body in one buffer) on an idle pooled connection and parses the
answer with httptools (the C parser uvicorn uses): a fraction of the cost. It only does what
a load generator needs: POST to one ``http://`` origin, ``Content-Length`` or chunked answers,
keep-alive, a per-request time limit. Preflight and scraping, which are not time-critical,
use aiohttp.

Keep-alive without losing requests. uvicorn (the gateway's and the worker's server) closes a
connection that has been idle for ``timeout_keep_alive`` (5 s by default) and does not read
what is in flight on it, so a request written on a pooled connection as that timer fires gets
no answer: the connection is lost before any byte of a response, and the server logs nothing.
Under open-loop load the pool's deepest connections go back into use only when the number in
flight reaches a new high, often after seconds idle (one 66 s burst bench reused 16 between
4.5 and 5.5 s idle), and once in a while just as the server's timer fires (that bench lost 1
request of 14,165 this way). Two remedies, as HTTP clients do:
- an idle connection is retired (closed, not reused) after ``max_idle_s``, below the server's
  keep-alive timeout (the gateway's pool to the workers does the same, at 4 s);
- a request whose *reused* connection is lost before *any* byte of the answer arrived is sent
  once more on a fresh connection (see :meth:`RawHttpClient.post`). Counted: the reply's
  ``resent`` and :meth:`RawHttpClient.stats`. A fresh connection lost, a connection lost after
  answer bytes, or the resend lost too, is an error as before.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import NamedTuple, cast
from urllib.parse import urlsplit

import httptools

from evenserve.core import wire
from evenserve.loadgen.target import BadResponseError, ConnectionLostError, TargetError

BACKEND_HEADER = wire.BACKEND_HEADER.encode()
#: Idle pooled connections are closed, not reused, once idle this long: below uvicorn's
#: default 5 s keep-alive timeout, as the gateway's own pool (``gateway/forwarder.py``).
MAX_IDLE_S = 4.0


class RawReply(NamedTuple):
    """One answer: status, the answering backend (``x-evenserve-backend``), the body, and
    ``resent``: 1 when the request had to be sent again on a fresh connection (a reused
    keep-alive connection was closed by the server before answering; see ``post``), else 0."""

    status: int
    backend: str
    body: bytes
    resent: int


class _Conn(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.fut: asyncio.Future[tuple[int, str, bytes]] | None = None
        self.backend = ""
        self.body: list[bytes] = []
        self.closed = False
        self.reusable = True
        #: Whether any byte came back since the current request was written.
        self.got_bytes = False
        #: When it went back to the pool (the loop's clock).
        self.idle_since = 0.0

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.reusable = False
            self._fail(BadResponseError(f"malformed HTTP answer: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(ConnectionLostError("the server closed the connection before answering"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == BACKEND_HEADER:
            self.backend = value.decode(errors="replace")

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        status = self.parser.get_status_code()
        self.reusable = self.parser.should_keep_alive()
        body = b"".join(self.body)
        fut = self.fut
        self.fut = None
        if fut is not None and not fut.done():
            fut.set_result((status, self.backend, body))

    # ours
    def _fail(self, exc: BaseException) -> None:
        fut = self.fut
        self.fut = None
        if fut is not None and not fut.done():
            fut.set_exception(exc)

    def request(self, data: bytes) -> asyncio.Future[tuple[int, str, bytes]]:
        assert self.transport is not None
        self.fut = asyncio.get_running_loop().create_future()
        self.backend = ""
        self.body = []
        self.got_bytes = False
        self.transport.write(data)
        return self.fut

    def usable(self) -> bool:
        """Open as far as this side knows (the server may have closed it a moment ago)."""
        return not self.closed and self.transport is not None and not self.transport.is_closing()

    def expire(self) -> None:
        self.reusable = False
        self._fail(TimeoutError("no answer within the time limit"))
        self.close()

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.abort()
            self.closed = True


class RawHttpClient:
    """POSTs prebuilt requests to one ``http://host:port`` over pooled keep-alive connections."""

    def __init__(
        self,
        base_url: str,
        timeout_s: float,
        connect_timeout_s: float = 5.0,
        max_idle_s: float = MAX_IDLE_S,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise TargetError(f"target {base_url!r}: the load generator speaks plain http:// only")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.host_header = f"{self.host}:{self.port}"
        self.base_path = parts.path.rstrip("/")
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_idle_s = max_idle_s
        # Ordered by when each went idle: reuse from the right, retire from the left.
        self._idle: deque[_Conn] = deque()
        self._all: set[_Conn] = set()
        self.opened = 0
        self.retired_idle = 0
        self.resent_stale = 0

    def request_bytes(self, path: str, body: bytes, headers: dict[str, str]) -> bytes:
        """A complete HTTP/1.1 POST (head and body) to ``path``, ready to write."""
        lines = [
            f"POST {self.base_path}{path} HTTP/1.1",
            f"Host: {self.host_header}",
            *(f"{k}: {v}" for k, v in headers.items()),
            f"Content-Length: {len(body)}",
            "",
            "",
        ]
        return "\r\n".join(lines).encode("latin-1") + body

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        _, proto = await asyncio.wait_for(
            loop.create_connection(_Conn, self.host, self.port), self.connect_timeout_s
        )
        self._all.add(proto)
        self.opened += 1
        return proto

    def _drop(self, conn: _Conn) -> None:
        conn.close()
        self._all.discard(conn)

    def _pooled(self, now: float) -> _Conn | None:
        """The most recently used idle connection, if it is open and not idle too long.

        The pool is ordered by when each connection went idle (most recent on the right), so
        connections that are too old gather on the left: they are closed there (counted as
        retired) before the server's keep-alive timeout can close them under a request.
        """
        idle = self._idle
        while idle:
            c = idle[0]
            if c.usable() and now - c.idle_since < self.max_idle_s:
                break
            idle.popleft()
            if c.usable():
                self.retired_idle += 1
            self._drop(c)
        while idle:
            c = idle.pop()
            if c.usable():
                return c
            self._drop(c)
        return None

    async def _exchange(self, conn: _Conn, data: bytes, deadline: float) -> tuple[int, str, bytes]:
        """Write one request on ``conn`` and wait for its answer until ``deadline``."""
        loop = asyncio.get_running_loop()
        fut = conn.request(data)
        timer = loop.call_at(deadline, conn.expire)
        try:
            result = await fut
        except BaseException:
            self._drop(conn)
            raise
        finally:
            timer.cancel()
        if conn.reusable and conn.usable():
            conn.idle_since = loop.time()
            self._idle.append(conn)
        else:
            self._drop(conn)
        return result

    async def post(self, data: bytes) -> RawReply:
        """Send a prebuilt request; return the answer (see :class:`RawReply`).

        Errors: :class:`ConnectionLostError` (the server closed the connection before the
        answer was complete), ``TimeoutError`` (no answer within ``timeout_s``),
        :class:`BadResponseError`, and the connect errors (refused, connect timeout).
        """
        loop = asyncio.get_running_loop()
        conn = self._pooled(loop.time())
        if conn is None:
            conn = await self._connect()
            return RawReply(*await self._exchange(conn, data, loop.time() + self.timeout_s), 0)
        deadline = loop.time() + self.timeout_s
        try:
            return RawReply(*await self._exchange(conn, data, deadline), 0)
        except ConnectionLostError:
            if conn.got_bytes:
                raise  # the server had begun to answer: it took the request and failed
        # The keep-alive race (module docstring): the server closed this idle connection as
        # the request went out, before reading any of it, so sending it again is safe (HTTP
        # clients resend in this one case too). Once, on a fresh connection, which cannot race
        # a keep-alive timeout: if that is lost as well, it is the server's failure. Counted.
        self.resent_stale += 1
        fresh = await self._connect()
        try:
            return RawReply(*await self._exchange(fresh, data, deadline), 1)
        except ConnectionLostError:
            raise ConnectionLostError(
                "the server closed the connection before answering (sent twice: a reused "
                "connection and then a fresh one were closed without an answer)"
            ) from None

    def stats(self) -> dict[str, int]:
        """Connections opened, idle ones retired before reuse, requests resent (see ``post``)."""
        return {
            "opened": self.opened,
            "retired_idle": self.retired_idle,
            "resent_stale": self.resent_stale,
        }

    def close(self) -> None:
        for c in self._all:
            c.close()
        self._all.clear()
        self._idle.clear()
