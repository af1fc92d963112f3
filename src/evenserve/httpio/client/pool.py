"""``HttpClient``: requests to one origin over a pool of keep-alive connections (reused from
the most recently idle, retired before the server's keep-alive timeout), a cap on them, one
deadline sweep per client, and the one resend the keep-alive race allows (the package's
docstring)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable
from functools import partial
from typing import TypeVar
from urllib.parse import urlsplit

from evenserve.httpio.client.connection import Connection
from evenserve.httpio.client.reply import (
    ConnectFailed,
    ConnectionLost,
    HttpClientError,
    Reply,
    Result,
)
from evenserve.httpio.client.stream import StreamReply

#: Idle pooled connections are closed, not reused, once idle this long (the package's docstring).
MAX_IDLE_S = 4.0
#: A client's deadline sweep sleeps until its earliest deadline, at most this long (a call
#: with a shorter time limit than those in flight is then late by at most this much)...
SWEEP_MAX_S = 0.25
#: ... and at least this long: the grace a request found past its deadline gets for an
#: answer the busy loop has not read yet (the package's docstring).
SWEEP_GRACE_S = 0.002


#: What ``send_with`` hands its callback back.
A = TypeVar("A")

RESENT_LOST = (
    "the server closed the connection before answering (sent twice: a reused connection and "
    "then a fresh one were closed without an answer)"
)


def _reply(result: Result, resent: int) -> Reply:
    return result if not resent else result._replace(resent=resent)


def _plain(
    callback: Callable[[Reply | None, BaseException | None], None],
    reply: Reply | None,
    exc: BaseException | None,
) -> None:
    """``send_cb``'s callback through ``send_with``'s."""
    callback(reply, exc)


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
        self._idle: deque[Connection] = deque()
        self._all: set[Connection] = set()
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
    async def _connect(self) -> Connection:
        loop = self._running_loop()
        try:
            _, proto = await asyncio.wait_for(
                loop.create_connection(lambda: Connection(self.keep, loop), self.host, self.port),
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

    def _drop(self, conn: Connection) -> None:
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

    def _pooled(self, now: float) -> Connection | None:
        """The most recently used idle connection, if it is open and not idle too long.

        Connections that have been idle too long gather on the left: they are closed there
        (counted as retired) before the server's keep-alive timeout can close them under a
        request.
        """
        idle = self._idle
        while idle:
            c = idle[0]
            if now - c.idle_since < self.max_idle_s:
                break  # the oldest is not idle too long: none is
            idle.popleft()
            if c.usable():
                self.retired_idle += 1
            self._drop(c)
        while idle:
            c = idle.pop()
            t = c.transport
            if not c.closed and t is not None and not t.is_closing():  # usable(), inlined
                return c
            self._drop(c)
        return None

    async def _acquire(self, loop: asyncio.AbstractEventLoop) -> tuple[Connection, bool]:
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
        self, conn: Connection, head: bytes, body: bytes, deadline: float
    ) -> Result:
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

    def _answered(self, conn: Connection) -> None:
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
        meanwhile) fails with ResponseTimeout (the package's docstring)."""
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
        :class:`BadResponse` (the package's docstring).
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
        # The keep-alive race (the package's docstring): the server closed this idle connection as
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
        return self.send_with(head, body, _plain, callback, timeout_s)

    def send_with(
        self,
        head: bytes,
        body: bytes,
        callback: Callable[[A, Reply | None, BaseException | None], None],
        arg: A,
        timeout_s: float | None = None,
    ) -> bool:
        """``send_cb`` calling ``callback(arg, reply, None)`` or ``callback(arg, None,
        error)``: a caller keeps one bound method for every request and hands each request's
        state as ``arg``, so nothing is made per request to carry it (a ``partial`` is an
        object, its arguments' tuple and a dict)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            loop = self._running_loop()
        now = loop.time()
        # ``_pooled``, its common case inlined: the most recent idle connection, open, and
        # the oldest not idle too long (else the full walk retires those).
        idle = self._idle
        if not idle or now - idle[0].idle_since >= self.max_idle_s:
            conn = self._pooled(now)
            if conn is None:
                return False
        else:
            conn = idle.pop()
            t = conn.transport
            if conn.closed or t is None or t.is_closing():
                self._drop(conn)
                conn = self._pooled(now)
                if conn is None:
                    return False
        deadline = now + (self.timeout_s if timeout_s is None else timeout_s)
        done = conn.pool_done
        if done is None:
            done = conn.pool_done = partial(self._cb_done, conn)
        conn.cb = done
        conn.sent = (head, body, deadline, callback, arg)
        conn.deadline = deadline  # conn._write, inlined
        conn.overdue = False
        conn.got_bytes = False
        t = conn.transport
        assert t is not None
        if not body:
            t.write(head)
        elif len(body) < 65536:
            t.write(head + body)
        else:
            t.writelines((head, body))
        if self._sweeper is None:
            self._sweeping()
        return True

    def _cb_done(self, conn: Connection, result: Result | None, exc: BaseException | None) -> None:
        if conn.overdue:  # _answered, inlined
            self.late_deadlines += 1
        conn.deadline = 0.0
        sent = conn.sent
        assert sent is not None
        conn.sent = None
        head, body, deadline, callback, arg = sent
        if result is not None:
            # _release, inlined: back to the pool, or closed when the answer said so.
            t = conn.transport
            if conn.reusable and not conn.closed and t is not None and not t.is_closing():
                conn.idle_since = self._loop.time()  # type: ignore[union-attr]
                self._idle.append(conn)
                if self._waiters:
                    self._wake()
            else:
                self._drop(conn)
            callback(arg, result, None)
            return
        self._drop(conn)
        if isinstance(exc, ConnectionLost) and not conn.got_bytes:
            self.resent_stale += 1  # the keep-alive race: once more, on a fresh connection
            task = self._running_loop().create_task(
                self._resend(head, body, deadline, partial(callback, arg))
            )
            self._resends.add(task)
            task.add_done_callback(self._resends.discard)
            return
        callback(arg, None, exc)

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

    # -- streamed answers (beside the whole-body path; ``stream`` module) --------------------------
    async def stream(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> StreamReply:
        """Send a request; return its answer once its head is in, its body to iterate
        (``StreamReply``; the ``stream`` module). ``timeout_s`` limits the wait for the head,
        then for each next piece of the body. The errors are ``send``'s, and the keep-alive
        resend rule holds."""
        head = self.head(method, path, headers or {}, len(body))
        return await self.send_stream(head, body, timeout_s)

    async def send_stream(
        self, head: bytes, body: bytes = b"", timeout_s: float | None = None
    ) -> StreamReply:
        """``stream`` with the request's head made already (:meth:`head`)."""
        loop = self._running_loop()
        limit = self.timeout_s if timeout_s is None else timeout_s
        conn, reused = await self._acquire(loop)
        try:
            return await self._open_stream(conn, head, body, limit, 0)
        except ConnectionLost:
            if not reused or conn.got_bytes:
                raise
        self.resent_stale += 1  # the keep-alive race (the package's docstring)
        fresh = await self._connect()
        try:
            return await self._open_stream(fresh, head, body, limit, 1)
        except ConnectionLost:
            raise ConnectionLost(RESENT_LOST) from None

    async def _open_stream(
        self, conn: Connection, head: bytes, body: bytes, limit_s: float, resent: int
    ) -> StreamReply:
        reply = StreamReply(self, conn, limit_s, resent)
        conn._write(head, body, self._running_loop().time() + limit_s)
        self._sweeping()
        try:
            await reply.wait_head()
        except BaseException:
            await reply.aclose()
            raise
        return reply

    def _release(self, conn: Connection) -> None:
        """Back to the pool, or closed when the answer said so."""
        loop = self._loop
        t = conn.transport
        usable = not conn.closed and t is not None and not t.is_closing()  # usable(), inlined
        if conn.reusable and usable and loop is not None:
            conn.idle_since = loop.time()  # the loop is known by now
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
