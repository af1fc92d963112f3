"""A minimal HTTP/1.1 keep-alive client for the send path (asyncio protocol + httptools).

Why not aiohttp here: on a small host aiohttp's client spends ~0.4 ms of CPU per request, and
an answer burst (a batch of 8 completing at once) then keeps the generator's single loop busy
for milliseconds, which shows up as scheduling lag of the next sends. This client writes a
prebuilt request (head and body in one buffer) on an idle pooled connection and parses the
answer with httptools (the C parser uvicorn uses): a fraction of the cost. It only does what
a load generator needs: POST to one ``http://`` origin, ``Content-Length`` or chunked answers,
keep-alive, a per-request time limit. Preflight and scraping, which are not time-critical,
use aiohttp.
"""

from __future__ import annotations

import asyncio
from typing import cast
from urllib.parse import urlsplit

import httptools

from evenserve.loadgen.target import BadResponseError, ConnectionLostError, TargetError

BACKEND_HEADER = b"x-evenserve-backend"


class _Conn(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.fut: asyncio.Future[tuple[int, str, bytes]] | None = None
        self.backend = ""
        self.body: list[bytes] = []
        self.closed = False
        self.reusable = True

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
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
        self.transport.write(data)
        return self.fut

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

    def __init__(self, base_url: str, timeout_s: float, connect_timeout_s: float = 5.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise TargetError(f"target {base_url!r}: the load generator speaks plain http:// only")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.host_header = f"{self.host}:{self.port}"
        self.base_path = parts.path.rstrip("/")
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._idle: list[_Conn] = []
        self._all: set[_Conn] = set()

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
        return proto

    async def post(self, data: bytes) -> tuple[int, str, bytes]:
        """Send a prebuilt request; return (status, answering backend, body)."""
        conn = None
        while self._idle:
            c = self._idle.pop()
            if not c.closed:
                conn = c
                break
            self._all.discard(c)
        if conn is None:
            conn = await self._connect()
        fut = conn.request(data)
        timer = asyncio.get_running_loop().call_later(self.timeout_s, conn.expire)
        try:
            result = await fut
        except BaseException:
            conn.close()
            self._all.discard(conn)
            raise
        finally:
            timer.cancel()
        if conn.reusable and not conn.closed:
            self._idle.append(conn)
        else:
            conn.close()
            self._all.discard(conn)
        return result

    def close(self) -> None:
        for c in self._all:
            c.close()
        self._all.clear()
        self._idle.clear()
