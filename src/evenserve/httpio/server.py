"""An HTTP/1.1 server on an asyncio protocol and httptools: what the gateway and the worker run.

Why not uvicorn + starlette: serving a tiny POST costs them 0.05-0.07 ms of CPU per request
on this project's 2-core host, granian (Rust) 0.11 ms, this server 0.02-0.03 ms
(bench/http_server_choice.py; design note 0007). This server does only what a KServe v2
endpoint needs, per request: parse the head with httptools (the C parser uvicorn uses),
read the body, call one handler, write one response. The handler gets a :class:`Request`
with the whole body and returns a :class:`Response`; routing is the application's (a dict
lookup and ``core.wire.split_model_path``).

Limits, each answered as HTTP says (and then the connection is closed, since what follows on
it cannot be trusted):
- a request head (request line and headers) over ``max_header_bytes`` or with more than
  ``max_headers`` headers: 431. The head's bytes are counted as they arrive, before the
  parser sees them (httptools hands a header over only once its line is complete), so a head
  that never ends, or one of 50 MiB, is refused as soon as it passes the limit: the rest is
  neither parsed nor kept. One comparison per chunk read while a head is being read;
- a ``Content-Length`` over ``max_body_bytes``: 413 at once, before any of the body is read;
  a chunked body that grows over it: 413 as soon as it does (the rest is not read);
- malformed HTTP: 400; an upgrade (websocket, h2c): 501;
- a head not complete ``header_timeout_s`` after the connection opened or its previous
  answer went out, or a body that stalls for ``body_timeout_s``: the connection is closed
  (408 when nothing of the request is being handled); idle keep-alive connections are
  closed after ``keepalive_timeout_s``;
- connections beyond ``max_connections`` get a 503 and are closed at once, so a flood of
  idle connections cannot take the file descriptors the process needs for its own backends.
Request targets in absolute form (``GET http://host:port/path HTTP/1.1``, which RFC 9112
3.2.2 says a server must accept) reach the handler as their path; ``*`` (``OPTIONS *``) is
handed over as it is. A HEAD request is answered without the body its handler returns.
A handler that raises answers 500 (logged once, with the traceback: that is a bug) and the
connection stays usable. A client that goes away mid-request is not an error: nothing is
logged. Pipelined requests are answered in order, one at a time; reading pauses when
``max_pipelined`` are waiting.

Graceful stop (:meth:`HttpServer.stop`): stop listening, close idle connections, let every
request already read be answered (then close its connection), and after ``timeout_s`` close
what is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import resource
import socket
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from email.utils import formatdate
from functools import partial
from http import HTTPStatus
from typing import Any, cast

import httptools

log = logging.getLogger("evenserve.http")
#: How long a refused request's remaining input is read and dropped before closing.
LINGER_S = 2.0
#: ``_Connection.head_left`` while no head is being read (a body, or a request being handled):
#: more than any connection will carry, so the per-chunk comparison never fires.
_NOT_IN_HEAD = 1 << 62


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
    #: upstream's answer); ``raw_head``: where its head ends. ``status`` and ``body`` still
    #: describe it; ``headers`` are not used.
    raw: bytes | None = None
    raw_head: int = 0


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


def _default_max_connections() -> int:
    """Client connections a process accepts: its descriptor limit less a reserve of 256 for
    its own outgoing connections, files and the listening sockets."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(64, min(16384, soft - 256))


@dataclass(frozen=True, slots=True)
class Limits:
    max_header_bytes: int = 64 * 1024
    max_headers: int = 128
    max_body_bytes: int = 256 * 1024 * 1024
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keepalive_timeout_s: float = 15.0
    #: How often connections are checked against their deadlines (at most half the
    #: shortest timeout).
    sweep_s: float = 0.5
    max_connections: int = 0  # 0: the descriptor limit less a reserve
    max_pipelined: int = 16

    def connections(self) -> int:
        return self.max_connections or _default_max_connections()


def raise_descriptor_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit (as nginx's
    ``worker_rlimit_nofile`` does); returns the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft


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


def _error_bytes(status: int, message: str) -> bytes:
    body = json.dumps({"error": message}).encode()
    return encode_head(status, {"content-type": JSON}, len(body), True) + body


def origin_form(target: bytes) -> bytes:
    """A request target as a path (and query): an absolute-form target
    (``http://host:port/p?q``, RFC 9112 3.2.2) becomes ``/p?q`` (``/`` when it has no path);
    any other (a path, ``*``, an authority) is returned as it is."""
    scheme, sep, rest = target.partition(b"://")
    if not sep or scheme.lower() not in (b"http", b"https"):
        return target
    end = len(rest)
    for c in (b"/", b"?", b"#"):
        i = rest.find(c)
        if 0 <= i < end:
            end = i
    path = rest[end:]
    return path if path.startswith(b"/") else b"/" + path


class _Refuse(Exception):
    """Raised from a parser callback: answer ``status`` with ``message`` and close."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Connection(asyncio.Protocol):
    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.limits = server.limits
        self.max_head = server.limits.max_header_bytes
        self.max_headers = server.limits.max_headers
        self.loop = server.loop
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reading_paused = False
        self.stopping = False
        self.lingering = False
        # the request being read
        self.url = b""
        self.headers: dict[str, str] = {}
        self.head_bytes = 0
        #: Bytes the head being read may still take, counted as they arrive (data_received);
        #: _NOT_IN_HEAD from a head's end to the end of its request.
        self.head_left = self.max_head
        self.reading = False  # from a request's first byte to its last
        self.body: list[bytes] = []
        self.body_len = 0
        # requests read, waiting for their turn; the one being handled
        self.pending: deque[tuple[Request, bool]] = deque()
        #: A request is being handled (its answer is due before the next one's).
        self.busy = False
        #: When this connection times out (the loop's clock; 0: not timed). The server's
        #: sweep looks every ``Limits.sweep_s``: no timer is set per request.
        self.deadline = 0.0

    # -- asyncio.Protocol ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        server = self.server
        if len(server.connections) >= server.max_connections or server.stopping:
            server.refused_connections += 1
            self.transport.write(_error_bytes(503, "too many connections"))
            self.transport.close()
            self.closed = True
            return
        server.connections.add(self)
        self._arm(self.limits.header_timeout_s)

    def eof_received(self) -> bool | None:
        if self.lingering or self.reading or self.idle():
            self._close()  # nothing due, or a request that can no longer complete
            return None
        self.stopping = True  # the client sent all it will: answer, then close
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._disarm()
        self.server.connections.discard(self)
        self.pending.clear()

    def data_received(self, data: bytes) -> None:
        if self.closed or self.lingering:
            return  # a refused request's rest is read and dropped (see _refuse)
        n = len(data)
        if n > self.head_left:
            self._over_head(data)
            return
        self.head_left -= n
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade, _Refuse) as exc:
            self._parse_failed(exc)

    def _over_head(self, data: bytes) -> None:
        """A chunk longer than what the head being read may still take: feed the parser what
        the head may take; if that ends the head, go on with the rest (a body, pipelined
        requests), else the head is over the limit: 431, and the rest is not parsed.

        The count of a head starts with the first chunk read after the request before it
        ended. A pipelined head's first bytes, read in the same chunk as the end of the
        request before it, are not counted here (its complete lines are, by ``on_url`` and
        ``on_header``): such a head may pass the limit by at most that part of one chunk
        before it is refused."""
        view = memoryview(data)
        while view:
            k = self.head_left
            if len(view) <= k:
                self.head_left = k - len(view)
                self._feed(view)
                return
            self.head_left = 0
            if k:
                self._feed(view[:k])
            if self.closed or self.lingering:
                return  # refused by the parser (malformed, a body over its limit...)
            if self.head_left == 0:  # still in the same head, and at its limit
                self._refuse(431, f"request head over the limit of {self.max_head} bytes")
                return
            view = view[k:]

    def _feed(self, data: bytes | memoryview) -> None:
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade, _Refuse) as exc:
            self._parse_failed(exc)

    def _parse_failed(self, exc: Exception) -> None:
        if isinstance(exc, httptools.HttpParserUpgrade):
            self._refuse(501, "protocol upgrades are not supported")
            return
        # An exception raised in a callback comes back wrapped by the parser.
        r = exc if isinstance(exc, _Refuse) else exc.__context__
        if isinstance(r, _Refuse):
            self._refuse(r.status, str(r))
        else:
            self._refuse(400, f"malformed HTTP request: {exc}")

    # -- httptools callbacks --------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = {}
        self.head_bytes = 0
        self.reading = True
        self.body = []
        self.body_len = 0
        self._arm(self.limits.header_timeout_s)

    def on_url(self, url: bytes) -> None:
        self.url += url
        self._count(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        # Called per header of every request: the checks are inlined.
        self.head_bytes += len(name) + len(value) + 4
        headers = self.headers
        if self.head_bytes > self.max_head or len(headers) >= self.max_headers:
            self._count(0)  # 431 naming the byte limit when that is what was passed
            raise _Refuse(431, f"more than {self.max_headers} request headers")
        key = name.decode("latin-1").lower()
        if key in headers:
            headers[key] = f"{headers[key]}, {value.decode('latin-1')}"
        else:
            headers[key] = value.decode("latin-1")

    def _count(self, n: int) -> None:
        self.head_bytes += n
        if self.head_bytes > self.limits.max_header_bytes:
            raise _Refuse(
                431, f"request head over the limit of {self.limits.max_header_bytes} bytes"
            )

    def on_headers_complete(self) -> None:
        self.head_left = _NOT_IN_HEAD
        if self.parser.should_upgrade():
            raise _Refuse(501, "protocol upgrades are not supported")
        cl = self.headers.get("content-length")
        limit = self.limits.max_body_bytes
        if cl is not None and (len(cl) > 18 or (cl.isdigit() and int(cl) > limit)):
            raise _Refuse(413, f"request body over the limit of {limit} bytes")
        self._arm(self.limits.body_timeout_s)
        if self.headers.get("expect", "").lower() == "100-continue" and self.transport:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self.body_len += len(body)
        if self.body_len > self.limits.max_body_bytes:
            raise _Refuse(413, f"request body over the limit of {self.limits.max_body_bytes} bytes")
        self.body.append(body)

    def on_message_complete(self) -> None:
        self._disarm()
        self.reading = False
        self.head_left = self.max_head  # the next request's head begins
        url = self.url
        if not url.startswith(b"/"):
            url = origin_form(url)
        q = url.find(b"?")
        path, query = (url, b"") if q < 0 else (url[:q], url[q + 1 :])
        parts = self.body
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        self.body = []
        method = self.parser.get_method().decode("latin-1")
        req = Request(method, path.decode("latin-1"), query.decode("latin-1"), self.headers, body)
        self.pending.append((req, self.parser.should_keep_alive()))
        if len(self.pending) >= self.limits.max_pipelined and self.transport is not None:
            self.transport.pause_reading()
            self.reading_paused = True
        if not self.busy:
            self._next()

    # -- handling -------------------------------------------------------------------------------
    def _next(self) -> None:
        if self.closed or not self.pending:
            return
        req, keep = self.pending.popleft()
        if self.reading_paused and self.transport is not None:
            self.transport.resume_reading()
            self.reading_paused = False
        self.busy = True
        fast = self.server.fast
        if fast is not None:
            try:
                taken = fast(req, partial(self._answer, req, keep))
            except Exception:
                log.exception("%s %s: the handler failed", req.method, req.path[:200])
                self._answer(req, keep, json_response(b'{"error":"internal server error"}', 500))
                return
            if taken:
                return
        self.loop.create_task(self._handle(req, keep))

    async def _handle(self, req: Request, keep: bool) -> None:
        try:
            resp = await self.server.handler(req)
        except Exception:
            log.exception("%s %s: the handler failed", req.method, req.path[:200])
            resp = json_response(b'{"error":"internal server error"}', 500)
        self._answer(req, keep, resp)

    def _answer(self, req: Request, keep: bool, resp: Response) -> None:
        """Write the answer to ``req`` (exactly once per request), then take the next one."""
        self.busy = False
        if self.closed or self.transport is None:
            return  # the client went away; nothing to answer
        keep = keep and not self.stopping
        raw = resp.raw
        if raw is not None:
            n = resp.raw_head
            if not keep:
                raw = b"".join((raw[: n - 2], b"connection: close\r\n", raw[n - 2 :]))
                n += 19
            self.transport.write(raw[:n] if req.method == "HEAD" else raw)
        else:
            body = b"" if req.method == "HEAD" else resp.body
            head = encode_head(resp.status, resp.headers, len(resp.body), not keep)
            if len(body) < 65536:
                self.transport.write(head + body)
            else:
                self.transport.writelines((head, body))
        if not keep:
            self._close()
        elif self.pending:
            self._next()
        elif not self.deadline:
            lim = self.limits
            self._arm(lim.body_timeout_s if self.reading else lim.keepalive_timeout_s)

    # -- timers and closing -----------------------------------------------------------------------
    def _arm(self, after_s: float) -> None:
        self.deadline = self.loop.time() + after_s

    def _disarm(self) -> None:
        self.deadline = 0.0

    def timed_out(self) -> None:
        """The sweep found this connection past its deadline."""
        self.deadline = 0.0
        if self.lingering:
            self._close()
            return
        if self.busy or self.closed:
            return
        if self.reading:
            self.server.timed_out += 1
            self._refuse(408, "request not received in time")
        else:
            self._close()  # idle keep-alive connection

    def _refuse(self, status: int, message: str) -> None:
        """Answer ``status`` and close. What the client is still sending (a body over the
        limit) is read and dropped for up to ``LINGER_S`` first, as nginx's lingering close
        does: closing a socket with unread input resets it, and the client would lose the
        answer."""
        if self.transport is None or self.closed:
            return
        if self.busy or self.pending:
            self._close()  # an earlier request's answer is due first: just close
            return
        self.transport.write(_error_bytes(status, message))
        hook = self.server.on_refusal
        if hook is not None:
            hook(status, origin_form(self.url).split(b"?")[0].decode("latin-1"))
        self.lingering = True
        self.reading = False
        self.body = []
        self._disarm()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._arm(LINGER_S)

    def _close(self) -> None:
        self._disarm()
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()
        self.server.connections.discard(self)

    def idle(self) -> bool:
        return not self.busy and not self.pending and not self.reading


class HttpServer:
    """Serves ``handler`` on a listening socket (see the module docstring)."""

    def __init__(
        self,
        handler: Handler,
        limits: Limits | None = None,
        on_refusal: Callable[[int, str], None] | None = None,
        fast: FastHandler | None = None,
    ) -> None:
        self.handler = handler
        #: Tried first for every request (see FastHandler).
        self.fast = fast
        #: Told of each request the server answered itself (status, path as far as read).
        self.on_refusal = on_refusal
        self.limits = limits or Limits()
        self.max_connections = self.limits.connections()
        self.connections: set[_Connection] = set()
        self.refused_connections = 0
        self.timed_out = 0
        self.stopping = False
        self._server: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sweeper: asyncio.Task[None] | None = None

    @property
    def handling(self) -> int:
        """Requests being handled now."""
        return sum(c.busy for c in self.connections)

    async def _sweep(self) -> None:
        lim = self.limits
        period = min(
            lim.sweep_s,
            lim.header_timeout_s / 2,
            lim.body_timeout_s / 2,
            lim.keepalive_timeout_s / 2,
            LINGER_S / 2,
        )
        loop = self.loop
        while True:
            await asyncio.sleep(period)
            refresh_date()
            now = loop.time()
            for c in [c for c in self.connections if c.deadline and c.deadline <= now]:
                c.timed_out()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "start() first"
        return self._loop

    async def start(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        sock: socket.socket | None = None,
        *,
        reuse_port: bool = False,
    ) -> None:
        """Listen on ``sock``, else on ``host:port``; with ``reuse_port`` (SO_REUSEPORT)
        several processes listen on the same port and the kernel splits the connections
        among them (several gateways behind one address)."""
        self._loop = asyncio.get_running_loop()
        if sock is not None:
            self._server = await self._loop.create_server(
                lambda: _Connection(self), sock=sock, backlog=4096
            )
        else:
            self._server = await self._loop.create_server(
                lambda: _Connection(self),
                host,
                port,
                backlog=4096,
                reuse_address=True,
                reuse_port=reuse_port or None,
            )

        self._sweeper = self._loop.create_task(self._sweep())

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Stop listening, answer every request already read, then close (module docstring)."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        for c in list(self.connections):
            c.stopping = True
            if c.idle():
                c._close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.connections and loop.time() < deadline:
            for c in list(self.connections):
                if c.idle():
                    c._close()
            await asyncio.sleep(0.01)
        for c in list(self.connections):
            if c.transport is not None:
                c.transport.abort()
            c._close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
