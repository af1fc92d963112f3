"""A streamed answer (``HttpClient.stream``): its head first, then its body piece by piece as
the pieces arrive, on a pooled connection that goes back to the pool only once the body has
been read to its end.

Theory of operation. The whole-body path (``connection.Connection``) parses with a parser
whose callbacks gather the answer; a streamed exchange puts its own parser on the connection
for its length (``StreamReply`` is that parser's callback object) and gives it back after,
so the whole-body path's callbacks gain no test per request. The connection's failures
(lost, malformed, past its deadline) reach the stream through the connection's callback
slot (``Connection.cb``), as a callback-driven request's do.

- The head: ``HttpClient.stream`` returns once it is complete (status, every header by
  lower-case name); a 1xx answer before it is skipped. The time limit runs from the request
  to the head, then from each piece to the next (a stream may last minutes; a stalled one
  fails with ``ResponseTimeout``).
- The body: framed by chunks, a ``Content-Length`` or the connection's end (httptools has
  no end-of-input call, so the connection lost after a head without either ends the body,
  as HTTP clients take it). Pieces are
  queued as they are parsed; when more than ``READ_HIGH`` bytes wait for the consumer,
  reading pauses (no time limit meanwhile: the wait is the consumer's) and resumes under
  ``READ_LOW``.
- The end: a body read to its end puts the connection back in the pool (when the answer
  allows keep-alive); ``aclose`` before that closes it (what is still coming is not
  wanted), and so does any failure. A connection lost or a malformed piece after the head
  raises ``ConnectionLost`` or ``BadResponse`` from the iteration.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Protocol

import httptools

from evenserve.httpio.client.connection import Connection
from evenserve.httpio.client.reply import ConnectionLost, Result

if TYPE_CHECKING:
    from types import TracebackType

#: Bytes of a stream's body waiting for its consumer at which reading pauses...
READ_HIGH = 256 * 1024
#: ... and under which it resumes.
READ_LOW = 64 * 1024


class Pool(Protocol):
    """What a stream needs of its client (``pool.HttpClient``): where its connection goes
    when the stream ends."""

    def _release(self, conn: Connection) -> None: ...

    def _drop(self, conn: Connection) -> None: ...


class StreamReply:
    """One streamed answer: ``status`` and ``headers`` (every header, lower-case names, a
    repeated one's values joined with ", ") once the head is in, ``resent`` as ``Reply``'s;
    iterate it for the body's pieces (``async for piece in reply``), or ``read`` the rest
    whole; ``aclose`` (or ``async with``) when done with it."""

    def __init__(self, pool: Pool, conn: Connection, limit_s: float, resent: int) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.resent = resent
        self._pool = pool
        self._conn = conn
        self._loop = conn.loop
        self._limit_s = limit_s
        self._pieces: deque[bytes] = deque()
        self._queued = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        #: The body was parsed to its end, and whether the connection may be reused then.
        self._ended = False
        self._reusable = False
        #: The connection was given back (pooled or closed).
        self._finished = False
        self._head: asyncio.Future[None] = self._loop.create_future()
        self._parser = httptools.HttpResponseParser(self)
        # The connection parses with this stream's parser until the stream ends.
        self._saved = conn.parser
        conn.parser = self._parser
        conn.in_head = False
        conn.cb = self._failed

    # -- what the consumer calls ----------------------------------------------------------------
    def __aiter__(self) -> StreamReply:
        return self

    async def __anext__(self) -> bytes:
        while True:
            if self._pieces:
                piece = self._pieces.popleft()
                self._queued -= len(piece)
                if self._paused and self._queued < READ_LOW:
                    self._resume()
                return piece
            if self._error is not None:
                self._finish(False)
                raise self._error
            if self._ended:
                self._finish(self._reusable)
                raise StopAsyncIteration
            w = self._waiter = self._loop.create_future()
            try:
                await w
            finally:
                self._waiter = None

    async def read(self) -> bytes:
        """The rest of the body, whole."""
        return b"".join([piece async for piece in self])

    async def aclose(self) -> None:
        """Done with the answer: its connection goes back to the pool when the body was
        read to its end, else it is closed."""
        self._finish(self._ended and self._error is None and self._reusable)

    async def __aenter__(self) -> StreamReply:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- httptools callbacks (the connection feeds this stream's parser) -----------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        k, v = name.decode("latin-1").lower(), value.decode("latin-1")
        h = self.headers
        h[k] = f"{h[k]}, {v}" if k in h else v

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if status < 200:  # 100 Continue and friends: the real answer follows
            self.headers = {}
            return
        self.status = status
        self._renew()
        if not self._head.done():
            self._head.set_result(None)

    def on_body(self, body: bytes) -> None:
        if not body:
            return  # the connection's end fed to the parser (``Connection.eof_received``)
        self._pieces.append(body)
        self._queued += len(body)
        if self._queued > READ_HIGH and not self._paused:
            self._pause()
        else:
            self._renew()
        self._wake()

    def on_message_complete(self) -> None:
        if self._parser.get_status_code() < 200:
            return
        self._ended = True
        self._reusable = self._parser.should_keep_alive()
        conn = self._conn
        conn.deadline = 0.0
        conn.cb = None
        self._wake()

    # -- the connection's side --------------------------------------------------------------------
    def _failed(self, result: Result | None, exc: BaseException | None) -> None:
        """The connection failed (lost, malformed answer, past its deadline)."""
        if self._ended or exc is None:
            return
        if self._head.done() and type(exc) is ConnectionLost and self._close_delimited():
            self._ended = True  # a body without a length or chunks ends with its connection
            self._wake()
            return
        if self._head.done() and type(exc) is ConnectionLost:
            exc = ConnectionLost("the connection closed before the answer's body ended")
        self._error = exc
        if not self._head.done():
            self._head.set_exception(exc)
        self._wake()

    def _close_delimited(self) -> bool:
        h = self.headers
        return "content-length" not in h and "chunked" not in h.get("transfer-encoding", "")

    def _renew(self) -> None:
        """The time limit runs again from now (the next piece is due within it)."""
        conn = self._conn
        conn.deadline = self._loop.time() + self._limit_s
        conn.overdue = False

    def _pause(self) -> None:
        self._paused = True
        self._conn.deadline = 0.0  # the consumer is behind: no time limit meanwhile
        if self._conn.transport is not None:
            self._conn.transport.pause_reading()

    def _resume(self) -> None:
        self._paused = False
        if self._ended or self._conn.closed:
            return
        self._renew()
        if self._conn.transport is not None:
            self._conn.transport.resume_reading()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def wait_head(self) -> None:
        """Until the head is in (or the request failed: then its error is raised)."""
        await self._head

    def _finish(self, reuse: bool) -> None:
        """Give the connection back: to the pool (``reuse``) or closed."""
        if self._finished:
            return
        self._finished = True
        conn = self._conn
        conn.parser = self._saved
        conn.in_head = True
        conn.head_parts = []
        conn.reads = 0
        conn.cb = None
        conn.deadline = 0.0
        if self._paused and not conn.closed and conn.transport is not None:
            conn.transport.resume_reading()
        if not self._head.done():
            self._head.cancel()
        if reuse:
            conn.reusable = True
            self._pool._release(conn)
        else:
            conn.reusable = False
            self._pool._drop(conn)
