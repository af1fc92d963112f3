"""A pooled keep-alive HTTP/1.1 client for one origin (asyncio protocol + httptools).

The gateway forwards with it (one client per backend) and polls with it (one more per
backend: one persistent connection), and the load generator sends with it. Per request it
writes a head and a body on an idle pooled connection and parses the answer with httptools;
on loopback it costs 0.03-0.05 ms of CPU per request, aiohttp's client 0.08-0.13 ms and
httpx's 0.7-0.8 ms (bench/http_server_choice.py).

It does what a proxy's upstream side needs and no more: ``http://`` only, any method,
``Content-Length`` or chunked answers, keep-alive (a connection is reused only when the
answer allows it), the response headers it was asked to keep, a time limit per request, and
a cap on connections (``max_connections``; requests beyond it wait for one to come back).
A time limit is measured from when the request was sent, and a timeout is only declared
when the answer is not there: if the loop was too busy to look at the deadline in time, it
reads what has arrived first (``_deadline``), so the caller's own lag never reads as the
server's.

Keep-alive without losing requests. A server closes a connection that has been idle for its
keep-alive timeout (uvicorn: 5 s, ours: 15 s, nginx: 75 s) and does not read what is in flight
on it, so a request written on a pooled connection as that timer fires gets no answer: the
connection is lost before any byte of a response. Two remedies, as HTTP clients do:
- an idle connection is retired (closed, not reused) after ``max_idle_s`` (4 s), below those
  timeouts;
- a request whose *reused* connection is lost before *any* byte of the answer arrived is sent
  once more on a fresh connection (:meth:`HttpClient.send`; counted in ``resent``). A fresh
  connection lost, a connection lost after answer bytes, or the resend lost too, is an error.

Errors, by what they mean for a retry: :class:`ConnectFailed` (never connected: refused or
connect timeout; the request did not leave), :class:`ConnectionLost` (connected, no complete
answer), :class:`ResponseTimeout` (sent, no answer in time), :class:`BadResponse`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Iterable
from functools import partial
from typing import NamedTuple, cast
from urllib.parse import urlsplit

import httptools

#: Idle pooled connections are closed, not reused, once idle this long (module docstring).
MAX_IDLE_S = 4.0
#: A deadline timer that runs this late means the event loop was busy: the answer may have
#: arrived in time and be waiting unread, so it is looked for once more before the timeout.
LATE_S = 0.002


RESENT_LOST = (
    "the server closed the connection before answering (sent twice: a reused connection and "
    "then a fresh one were closed without an answer)"
)
#: A parsed answer: status, the headers kept, the body.
Result = tuple[int, dict[str, str], bytes]


class HttpClientError(Exception):
    """A request that got no (complete, well-formed) HTTP answer."""


class ConnectFailed(HttpClientError, ConnectionError):
    """Could not connect: the request never left. The message is ``connect-refused`` or
    ``timeout`` (or the OS error's name)."""


class ConnectionLost(HttpClientError, ConnectionError):
    """Connected, but the connection closed before the answer was complete."""


class ResponseTimeout(HttpClientError, TimeoutError):
    """The server has the request and did not answer within the time limit."""


class BadResponse(HttpClientError):
    """The answer was not valid HTTP."""


class Reply(NamedTuple):
    """One answer: status, the response headers asked for (lower-case names), the body, and
    ``resent``: 1 when the request was sent again on a fresh connection (see ``send``)."""

    status: int
    headers: dict[str, str]
    body: bytes
    resent: int


class _Conn(asyncio.Protocol):
    def __init__(self, keep: frozenset[bytes], loop: asyncio.AbstractEventLoop) -> None:
        self.keep = keep
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.fut: asyncio.Future[tuple[int, dict[str, str], bytes]] | None = None
        #: Instead of ``fut``: called with (result, None) or (None, error) (``send_cb``).
        self.cb: Callable[[Result | None, BaseException | None], None] | None = None
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.closed = False
        self.reusable = True
        #: Whether any byte came back since the current request was written.
        self.got_bytes = False
        #: When it went back to the pool (the loop's clock).
        self.idle_since = 0.0
        #: The current request's deadline timer.
        self.timer: asyncio.TimerHandle | None = None

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
    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.lower()
        if key in self.keep:
            self.headers[key.decode("latin-1")] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        status = self.parser.get_status_code()
        if status < 200:  # 100 Continue and friends: the real answer follows
            self.headers = {}
            self.body = []
            return
        self.reusable = self.parser.should_keep_alive()
        parts = self.body
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        fut = self.fut
        self.fut = None
        if fut is not None and not fut.done():
            fut.set_result((status, self.headers, body))
        elif self.cb is not None:
            cb = self.cb
            self.cb = None
            cb((status, self.headers, body), None)

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

    def request(
        self, head: bytes, body: bytes
    ) -> asyncio.Future[tuple[int, dict[str, str], bytes]]:
        self.fut = self.loop.create_future()
        self._write(head, body)
        return self.fut

    def _write(self, head: bytes, body: bytes) -> None:
        assert self.transport is not None
        self.headers = {}
        self.body = []
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


class HttpClient:
    """Requests to one ``http://host:port`` over pooled keep-alive connections."""

    def __init__(
        self,
        base_url: str,
        timeout_s: float,
        *,
        connect_timeout_s: float = 5.0,
        max_idle_s: float = MAX_IDLE_S,
        keep_headers: Iterable[str] = (),
        max_connections: int = 0,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"{base_url!r}: only plain http:// URLs are supported")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.host_header = f"{self.host}:{self.port}"
        self.base_path = parts.path.rstrip("/")
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_idle_s = max_idle_s
        self.keep = frozenset(h.lower().encode("latin-1") for h in keep_headers)
        self.max_connections = max_connections
        # Ordered by when each went idle: reuse from the right, retire from the left.
        self._idle: deque[_Conn] = deque()
        self._all: set[_Conn] = set()
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._resends: set[asyncio.Task[None]] = set()
        self.opened = 0
        self.late_deadlines = 0
        self.retired_idle = 0
        self.resent_stale = 0

    def head(self, method: str, path: str, headers: dict[str, str], length: int) -> bytes:
        """A request head (request line and headers, ``Content-Length`` included)."""
        text = f"{method} {self.base_path}{path} HTTP/1.1\r\nhost: {self.host_header}\r\n"
        for k, v in headers.items():
            text += f"{k}: {v}\r\n"
        if length or method in ("POST", "PUT", "PATCH"):
            text += f"content-length: {length}\r\n"
        return (text + "\r\n").encode("latin-1")

    async def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Reply:
        return await self.send(self.head(method, path, headers or {}, len(body)), body, timeout_s)

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        """The loop this client runs on (looked up once: each lookup is a system call)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            loop = self._loop = asyncio.get_running_loop()
        return loop

    # -- the pool -------------------------------------------------------------------------------
    async def _connect(self) -> _Conn:
        loop = self._running_loop()
        try:
            _, proto = await asyncio.wait_for(
                loop.create_connection(lambda: _Conn(self.keep, loop), self.host, self.port),
                self.connect_timeout_s,
            )
        except TimeoutError:
            raise ConnectFailed("timeout") from None
        except ConnectionRefusedError:
            raise ConnectFailed("connect-refused") from None
        except OSError as exc:
            raise ConnectFailed(type(exc).__name__) from exc
        self._all.add(proto)
        self.opened += 1
        return proto

    def _drop(self, conn: _Conn) -> None:
        conn.close()
        if conn in self._all:
            self._all.discard(conn)
            self._wake()

    def _wake(self) -> None:
        while self._waiters:
            w = self._waiters.popleft()
            if not w.done():
                w.set_result(None)
                return

    def _pooled(self, now: float) -> _Conn | None:
        """The most recently used idle connection, if it is open and not idle too long.

        Connections that have been idle too long gather on the left: they are closed there
        (counted as retired) before the server's keep-alive timeout can close them under a
        request.
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

    async def _acquire(self, loop: asyncio.AbstractEventLoop) -> tuple[_Conn, bool]:
        """An idle connection (reused: True) or a fresh one, waiting while at the cap."""
        while True:
            conn = self._pooled(loop.time())
            if conn is not None:
                return conn, True
            if not self.max_connections or len(self._all) < self.max_connections:
                return await self._connect(), False
            w = loop.create_future()
            self._waiters.append(w)
            await w

    async def _exchange(
        self, conn: _Conn, head: bytes, body: bytes, deadline: float
    ) -> tuple[int, dict[str, str], bytes]:
        """Write one request on ``conn`` and wait for its answer until ``deadline``."""
        loop = self._running_loop()
        fut = conn.request(head, body)
        conn.timer = loop.call_at(deadline, self._deadline, conn, deadline)
        try:
            result = await fut
        except BaseException:
            self._drop(conn)
            raise
        finally:
            if conn.timer is not None:
                conn.timer.cancel()
                conn.timer = None
        self._release(conn)
        return result

    def _deadline(self, conn: _Conn, deadline: float) -> None:
        """The time limit is up, as this loop sees it. If the loop came to it late (it was
        busy), an answer may be waiting unread in the socket: look again after the next
        poll for input (a timer due later than now runs after it) before failing."""
        loop = self._running_loop()
        waiting = conn.fut is not None or conn.cb is not None
        if loop.time() - deadline > LATE_S and waiting:
            self.late_deadlines += 1
            conn.timer = loop.call_later(LATE_S / 2, conn.expire)
        else:
            conn.expire()

    async def send(self, head: bytes, body: bytes = b"", timeout_s: float | None = None) -> Reply:
        """Send a request (its head from :meth:`head`, then its body); return the answer.

        Raises :class:`ConnectFailed`, :class:`ConnectionLost`, :class:`ResponseTimeout` or
        :class:`BadResponse` (module docstring).
        """
        loop = self._running_loop()
        deadline = loop.time() + (self.timeout_s if timeout_s is None else timeout_s)
        conn, reused = await self._acquire(loop)
        if not reused:
            return Reply(*await self._exchange(conn, head, body, deadline), 0)
        try:
            return Reply(*await self._exchange(conn, head, body, deadline), 0)
        except ConnectionLost:
            if conn.got_bytes:
                raise  # the server had begun to answer: it took the request and failed
        # The keep-alive race (module docstring): the server closed this idle connection as
        # the request went out, before reading any of it, so sending it again is safe (HTTP
        # clients resend in this one case too). Once, on a fresh connection, which cannot race
        # a keep-alive timeout: if that is lost as well, it is the server's failure. Counted.
        self.resent_stale += 1
        fresh = await self._connect()
        try:
            return Reply(*await self._exchange(fresh, head, body, deadline), 1)
        except ConnectionLost:
            raise ConnectionLost(RESENT_LOST) from None

    def send_cb(
        self,
        head: bytes,
        body: bytes,
        callback: Callable[[Reply | None, BaseException | None], None],
        timeout_s: float | None = None,
    ) -> bool:
        """``send`` without a task: on an idle pooled connection, write the request now and
        call ``callback(reply, None)`` or ``callback(None, error)`` once, later, from the
        loop. False (nothing sent) when no idle connection is ready: use ``send``. The
        keep-alive resend rule holds (the resend runs as a task)."""
        loop = self._running_loop()
        conn = self._pooled(loop.time())
        if conn is None:
            return False
        deadline = loop.time() + (self.timeout_s if timeout_s is None else timeout_s)
        conn.cb = partial(self._cb_done, conn, head, body, deadline, callback)
        conn.timer = loop.call_at(deadline, self._deadline, conn, deadline)
        conn._write(head, body)
        return True

    def _cb_done(
        self,
        conn: _Conn,
        head: bytes,
        body: bytes,
        deadline: float,
        callback: Callable[[Reply | None, BaseException | None], None],
        result: Result | None,
        exc: BaseException | None,
    ) -> None:
        if conn.timer is not None:
            conn.timer.cancel()
            conn.timer = None
        if result is not None:
            self._release(conn)
            callback(Reply(*result, 0), None)
            return
        self._drop(conn)
        if isinstance(exc, ConnectionLost) and not conn.got_bytes:
            self.resent_stale += 1  # the keep-alive race: once more, on a fresh connection
            task = self._running_loop().create_task(self._resend(head, body, deadline, callback))
            self._resends.add(task)
            task.add_done_callback(self._resends.discard)
            return
        callback(None, exc)

    async def _resend(
        self,
        head: bytes,
        body: bytes,
        deadline: float,
        callback: Callable[[Reply | None, BaseException | None], None],
    ) -> None:
        try:
            fresh = await self._connect()
            reply = Reply(*await self._exchange(fresh, head, body, deadline), 1)
        except ConnectionLost:
            callback(None, ConnectionLost(RESENT_LOST))
        except HttpClientError as exc:
            callback(None, exc)
        else:
            callback(reply, None)

    def _release(self, conn: _Conn) -> None:
        """Back to the pool, or closed when the answer said so."""
        if conn.reusable and conn.usable():
            conn.idle_since = self._running_loop().time()
            self._idle.append(conn)
            if self._waiters:
                self._wake()
        else:
            self._drop(conn)

    def stats(self) -> dict[str, int]:
        """Connections opened, idle ones retired before reuse, requests resent (see ``send``)."""
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
        for w in self._waiters:
            if not w.done():
                w.cancel()
        self._waiters.clear()
