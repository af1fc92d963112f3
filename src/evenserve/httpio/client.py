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
when the answer is not there: deadlines are checked by one sweep per client, not a timer per
request. The sweep sleeps until the earliest deadline in flight (at most ``SWEEP_MAX_S``, and
it ends when nothing is in flight); a request it finds past its deadline gets one more look
``SWEEP_GRACE_S`` later before it fails, so an answer that arrived while the loop was too
busy to read it is read first: the caller's own lag never reads as the server's.

Answers are parsed by httptools without a callback per header: the head arrives as bytes
(``Reply.head``), and only the headers asked for (``keep_headers``) are read out of it. An
answer that came in one read with a ``Content-Length`` body is also kept whole
(``Reply.raw``), so a proxy can relay it without building it again (the gateway does).

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
#: A client's deadline sweep sleeps until its earliest deadline, at most this long (a call
#: with a shorter time limit than those in flight is then late by at most this much)...
SWEEP_MAX_S = 0.25
#: ... and at least this long: the grace a request found past its deadline gets for an
#: answer the busy loop has not read yet (module docstring).
SWEEP_GRACE_S = 0.002


RESENT_LOST = (
    "the server closed the connection before answering (sent twice: a reused connection and "
    "then a fresh one were closed without an answer)"
)
#: A parsed answer: status, the headers kept, the body, the head, the raw answer or None.
Result = tuple[int, dict[str, str], bytes, bytes, bytes | None]


def _reply(result: Result, resent: int) -> Reply:
    status, headers, body, head, raw = result
    return Reply(status, headers, body, resent, head, raw)


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
    """One answer: status, the response headers asked for (lower-case names), the body,
    ``resent``: 1 when the request was sent again on a fresh connection (see ``send``), the
    head as received (status line and headers, up to and with the blank line), and ``raw``:
    the whole answer as received when it came in one read and its body is exactly
    ``Content-Length`` bytes (else None)."""

    status: int
    headers: dict[str, str]
    body: bytes
    resent: int
    head: bytes = b""
    raw: bytes | None = None


def head_end(data: bytes) -> int:
    """Where the head of an HTTP message in ``data`` ends (after its blank line); -1: not in
    it."""
    end = data.find(b"\r\n\r\n")
    if end >= 0:
        return end + 4
    end = data.find(b"\n\n")  # bare line feeds, as a lenient parser takes them
    return end + 2 if end >= 0 else -1


def parse_headers(head: bytes, keep: frozenset[bytes] | None = None) -> dict[str, str]:
    """The headers of an HTTP head (``Reply.head``) by lower-case name, a repeated one's
    values joined with ", "; only the names in ``keep`` (lower case) when it is given."""
    out: dict[str, str] = {}
    for line in head.split(b"\n")[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        key = name.strip().lower()
        if keep is not None and key not in keep:
            continue
        k, v = key.decode("latin-1"), value.strip().decode("latin-1")
        out[k] = f"{out[k]}, {v}" if k in out else v
    return out


class _Conn(asyncio.Protocol):
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
        #: The reads of the current answer until its head is complete, then its head.
        self.head_parts: list[bytes] = []
        self.head = b""
        self.in_head = True
        #: Reads of the current answer so far, and the first one.
        self.reads = 0
        self.first = b""
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
        self.reads += 1
        if self.reads == 1:
            self.first = data
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
        raw = None
        if self.reads == 1 and len(self.first) == len(head) + len(body):
            raw = self.first  # one read, the body framed by its length: relayable as it is
        self.reads = 0
        self.first = b""
        headers = parse_headers(head, self.keep) if self.keep else {}
        result = (status, headers, body, head, raw)
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
        self._sweeper: asyncio.Task[None] | None = None
        self.opened = 0
        #: Requests whose deadline a sweep found past and that had their answer by the next.
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

    async def _exchange(self, conn: _Conn, head: bytes, body: bytes, deadline: float) -> Result:
        """Write one request on ``conn`` and wait for its answer until ``deadline``."""
        fut = conn.request(head, body, deadline)
        self._sweeping()
        try:
            result = await fut
        except BaseException:
            conn.deadline = 0.0
            self._drop(conn)
            raise
        self._answered(conn)
        self._release(conn)
        return result

    def _answered(self, conn: _Conn) -> None:
        if conn.overdue:  # past its deadline at a sweep, answered before the next
            self.late_deadlines += 1
        conn.deadline = 0.0

    def _sweeping(self) -> None:
        """Make sure the deadline sweep runs (started with the first request)."""
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = self._running_loop().create_task(self._sweep())

    async def _sweep(self) -> None:
        """At the earliest deadline in flight: a request past its deadline is marked; one
        still unanswered at the next sweep (so the loop has had a turn to read what arrived
        meanwhile) fails with ResponseTimeout (module docstring)."""
        loop = self._running_loop()
        while True:
            due = [c.deadline for c in self._all if c.deadline]
            if not due:  # nothing in flight: the next request starts the sweep again
                break
            wait = min(due) - loop.time()
            await asyncio.sleep(min(SWEEP_MAX_S, max(SWEEP_GRACE_S, wait)))
            self.check_deadlines(loop.time())
        self._sweeper = None

    def check_deadlines(self, now: float) -> None:
        """One sweep: requests past their deadline at ``now`` are marked; those already
        marked by the previous sweep fail with ResponseTimeout."""
        for c in [c for c in self._all if c.deadline and c.deadline <= now]:
            if c.fut is None and c.cb is None:
                c.deadline = 0.0
            elif c.overdue:
                c.deadline = 0.0
                c.expire()
            else:
                c.overdue = True

    async def send(self, head: bytes, body: bytes = b"", timeout_s: float | None = None) -> Reply:
        """Send a request (its head from :meth:`head`, then its body); return the answer.

        Raises :class:`ConnectFailed`, :class:`ConnectionLost`, :class:`ResponseTimeout` or
        :class:`BadResponse` (module docstring).
        """
        loop = self._running_loop()
        deadline = loop.time() + (self.timeout_s if timeout_s is None else timeout_s)
        conn, reused = await self._acquire(loop)
        if not reused:
            return _reply(await self._exchange(conn, head, body, deadline), 0)
        try:
            return _reply(await self._exchange(conn, head, body, deadline), 0)
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
            return _reply(await self._exchange(fresh, head, body, deadline), 1)
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
        now = self._running_loop().time()
        conn = self._pooled(now)
        if conn is None:
            return False
        deadline = now + (self.timeout_s if timeout_s is None else timeout_s)
        conn.cb = partial(self._cb_done, conn, head, body, deadline, callback)
        conn._write(head, body, deadline)
        if self._sweeper is None:
            self._sweeping()
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
        self._answered(conn)
        if result is not None:
            self._release(conn)
            callback(_reply(result, 0), None)
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
            reply = _reply(await self._exchange(fresh, head, body, deadline), 1)
        except ConnectionLost:
            callback(None, ConnectionLost(RESENT_LOST))
        except HttpClientError as exc:
            callback(None, exc)
        else:
            callback(reply, None)

    def _release(self, conn: _Conn) -> None:
        """Back to the pool, or closed when the answer said so."""
        if conn.reusable and conn.usable():
            conn.idle_since = self._running_loop().time()  # the loop is known by now
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
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for c in self._all:
            c.close()
        self._all.clear()
        self._idle.clear()
        for w in self._waiters:
            if not w.done():
                w.cancel()
        self._waiters.clear()
