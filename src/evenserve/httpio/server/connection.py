"""One client connection of ``HttpServer``: the head and body read with httptools under the
limits (431, 413, 400, 501, 408 as the package's docstring says), requests handed to the
fast handler or the handler in order, one at a time, each answer written once, the
lingering close after a refusal."""

from __future__ import annotations

import asyncio
import logging
import re
from collections import deque
from typing import cast

import httptools

from evenserve.httpio.server.limits import Listener
from evenserve.httpio.server.messages import (
    Request,
    Response,
    StreamResponse,
    encode_head,
    encode_stream_head,
    error_bytes,
    json_response,
)

log = logging.getLogger("evenserve.http")
#: How long a refused request's remaining input is read and dropped before closing.
LINGER_S = 2.0
#: ``Connection.head_left`` while no head is being read (a body, or a request being handled):
#: more than any connection will carry, so the per-chunk comparison never fires.
_NOT_IN_HEAD = 1 << 62


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


#: A request line or header lines longer than this are not remembered by a connection (the
#: parser-free path and the parser's path's memo: ``data_received``, ``on_headers_complete``),
#: so what an idle keep-alive connection keeps stays small; such requests take the parser.
MEMO_MAX_BYTES = 8192
#: Request methods as strings, without a decode per request.
_METHODS = {m.encode(): m for m in ("GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "PATCH")}
_NO_REQUEST = Request("", "", "", {})
#: An origin-form request target the parser-free path takes (printable ASCII, no space).
_TARGET = re.compile(rb"/[!-~]*")
#: Header lines the parser-free path takes, up to and with the blank line (RFC 9110 5.1,
#: 5.5: a token, a colon, a value of visible characters, spaces, tabs and obs-text).
_HEADER_LINES = re.compile(rb"(?:[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[\t\x20-\x7e\x80-\xff]*\r\n)*\r\n")
#: ``Connection.fast_block`` when no header lines are remembered: never the lines of a head
#: (they never hold CRLF CRLF, where a head ends), so it matches none.
_NO_BLOCK = b"\r\n"
#: Headers that change how a request is framed or answered: the parser's to read.
_FRAMING = frozenset(("transfer-encoding", "connection", "expect", "upgrade"))


class _Refuse(Exception):
    """Raised from a parser callback: answer ``status`` with ``message`` and close."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Connection(asyncio.Protocol):
    def __init__(self, server: Listener) -> None:
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
        #: The head being read's header names and values as they came, one after the other.
        self.raw_headers: list[bytes] = []
        self.max_raw_headers = 2 * self.max_headers
        #: The last head read's header lines and what they read as (a keep-alive client
        #: sends the same ones again: ``on_headers_complete``).
        self.last_raw: list[bytes] = []
        self.last_headers: dict[str, str] = {}
        #: Bytes the head being read may still take, counted as they arrive (data_received);
        #: _NOT_IN_HEAD from a head's end to the end of its request.
        self.head_left = self.max_head
        self.reading = False  # from a request's first byte to its last
        self.body: list[bytes] = []
        self.body_len = 0
        # requests read, waiting for their turn; the one being handled
        self.pending: deque[tuple[Request, bool]] = deque()
        #: The request being handled and whether its connection may stay open after it.
        self.req = _NO_REQUEST
        self.keep = False
        #: What a fast handler calls with its answer (the request being handled's).
        self.respond = self._answer
        #: The last request target read and its path and query (a client asks for the same
        #: one again and again: decoded once).
        self.last_url = b""
        self.last_target = ("", "")
        #: The parser-free path's last request line and header lines, and what they read
        #: as (None: not for that path): ``data_received``.
        self.fast_line = b""
        self.fast_target: tuple[str, str, str] | None = None
        self.fast_block = _NO_BLOCK
        self.fast_info: tuple[dict[str, str], int] | None = None
        #: Whether the request being handled was read by the parser (else it is HTTP/1.1).
        self.by_parser = False
        #: A request is being handled (its answer is due before the next one's).
        self.busy = False
        #: When this connection times out (the loop's clock; 0: not timed). The server's
        #: sweep looks every ``Limits.sweep_s``: no timer is set per request.
        self.deadline = 0.0
        #: The task writing a streamed answer (``StreamResponse``), while one is written.
        self.streaming: asyncio.Task[None] | None = None
        #: The transport's buffer is over its high-water mark (``pause_writing``); a
        #: streamed answer waits on ``drain_waiter`` until it is under the low one.
        self.write_paused = False
        self.drain_waiter: asyncio.Future[None] | None = None

    # -- asyncio.Protocol ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        server = self.server
        if len(server.connections) >= server.max_connections or server.stopping:
            server.refused_connections += 1
            self.transport.write(error_bytes(503, "too many connections"))
            self.transport.close()
            self.closed = True
            return
        server.connections.add(self)
        self._arm(self.limits.header_timeout_s)

    def eof_received(self) -> bool | None:
        if self.lingering or self.reading or self.idle():
            self._close()  # nothing due, or a request that can no longer complete
            return None
        if self.streaming is not None and not self.pending:
            # A client that ends its side while its answer streams has gone away (it cannot
            # be told from a half-close; a stream may run for minutes): stop the producer.
            self._close()
            return None
        self.stopping = True  # the client sent all it will: answer, then close
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._disarm()
        self.server.connections.discard(self)
        self.pending.clear()
        if self.streaming is not None:
            self.streaming.cancel()  # its producer is closed (StreamResponse)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        w = self.drain_waiter
        if w is not None and not w.done():
            w.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self.closed or self.lingering:
            return  # a refused request's rest is read and dropped (see _refuse)
        if not self.reading:
            # A request read whole in one piece (what a keep-alive client's nearly always
            # is): taken without the parser when its request line and header lines are
            # ones this connection has read and checked before (``_learn_line``,
            # ``_learn_block``) and its body is exactly its Content-Length; anything else
            # is the parser's.
            # ``partition``, not ``find``: one argument, no format string to parse.
            head, sep, body = data.partition(b"\r\n\r\n")
            if sep and head and len(head) + 4 <= self.max_head:
                line, _, block = head.partition(b"\r\n")
                target = self.fast_target if line == self.fast_line else self._learn_line(line)
                info = self.fast_info if block == self.fast_block else self._learn_block(block)
                if target is not None and info is not None and len(body) == info[1]:
                    self.deadline = 0.0
                    self.by_parser = False
                    method, path, query = target
                    req = Request(method, path, query, info[0].copy(), body)
                    if self.busy or self.pending:
                        self._queue(req, True)
                    else:
                        self._take(req, True)
                    return
        n = len(data)
        if n > self.head_left:
            self._over_head(data)
            return
        self.head_left -= n
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade, _Refuse) as exc:
            self._parse_failed(exc)

    def _learn_line(self, line: bytes) -> tuple[str, str, str] | None:
        """A request line the parser-free path takes (``data_received``): a known method, an
        origin-form target of printable ASCII, HTTP/1.1; as (method, path, query), or None.
        Remembered: the next request's line is compared with it, not checked again."""
        self.fast_line = line
        self.fast_target = None
        if len(line) > MEMO_MAX_BYTES:
            self.fast_line = b""  # not kept: what an idle connection keeps stays small
            return None
        parts = line.split(b" ")
        if len(parts) != 3 or parts[2] != b"HTTP/1.1" or parts[0] not in _METHODS:
            return None
        target = parts[1]
        if _TARGET.fullmatch(target) is None:
            return None
        q = target.find(b"?")
        raw_path, raw_query = (target, b"") if q < 0 else (target[:q], target[q + 1 :])
        self.fast_target = (
            _METHODS[parts[0]],
            raw_path.decode("latin-1"),
            raw_query.decode("latin-1"),
        )
        return self.fast_target

    def _learn_block(self, block: bytes) -> tuple[dict[str, str], int] | None:
        """Header lines the parser-free path takes (``data_received``; ``block``: the lines
        after the request line, without the blank line's CRLF CRLF, empty when there are
        none): well-formed lines (a token, a colon, a value of visible characters, spaces
        and tabs), at most ``max_headers``, none that changes how the request is framed or
        answered (Transfer-Encoding, Connection other than ``keep-alive``, which HTTP/1.1
        implies, Expect, Upgrade), one Content-Length at most, its body within the limit;
        as (headers, body length), or None. Remembered as ``_learn_line`` is."""
        self.fast_block = block
        self.fast_info = None
        if len(block) > MEMO_MAX_BYTES:
            self.fast_block = _NO_BLOCK  # not kept: what an idle connection keeps stays small
            return None
        if block and _HEADER_LINES.fullmatch(block + b"\r\n\r\n") is None:
            return None
        headers: dict[str, str] = {}
        lines = block.split(b"\r\n") if block else []
        if len(lines) > self.max_headers:
            return None
        length = 0
        for raw in lines:
            name, _, value = raw.partition(b":")
            key = name.decode("latin-1").lower()
            v = value.lstrip(b" \t").decode("latin-1")  # as the parser gives it
            if key in headers:
                return None  # a repeated header is joined by the parser's path
            if key in _FRAMING and (key != "connection" or v.lower() != "keep-alive"):
                return None
            headers[key] = v
        cl = headers.get("content-length")
        if cl is not None:
            if not cl.isdigit() or len(cl) > 18 or int(cl) > self.limits.max_body_bytes:
                return None
            length = int(cl)
        self.fast_info = (headers, length)
        return self.fast_info

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
        self.raw_headers = []
        self.reading = True
        self.body = []
        self.body_len = 0
        self._arm(self.limits.header_timeout_s)

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        # Called per header of every request: the names and values are kept as they came
        # and read once the head is complete (``on_headers_complete``).
        raw = self.raw_headers
        raw.append(name)
        raw.append(value)
        if len(raw) > self.max_raw_headers:
            raise _Refuse(431, f"more than {self.max_headers} request headers")

    def on_headers_complete(self) -> None:
        self.head_left = _NOT_IN_HEAD
        raw = self.raw_headers
        # The head's bytes as counted before: the request target and each header line (a
        # pipelined head's first part, read with the request before it, is counted here).
        lines = sum(map(len, raw)) + 2 * len(raw)
        if len(self.url) + lines > self.max_head:
            raise _Refuse(431, f"request head over the limit of {self.max_head} bytes")
        if raw == self.last_raw:
            # A client sends the same header lines request after request: read once.
            headers = self.headers = self.last_headers.copy()
        else:
            headers = self.headers = {}
            for i in range(0, len(raw), 2):
                key = raw[i].decode("latin-1").lower()
                value = raw[i + 1].decode("latin-1")
                headers[key] = f"{headers[key]}, {value}" if key in headers else value
            if lines <= MEMO_MAX_BYTES:  # what an idle connection keeps stays small
                self.last_raw = raw
                self.last_headers = headers.copy()
        if self.parser.should_upgrade():
            raise _Refuse(501, "protocol upgrades are not supported")
        cl = headers.get("content-length")
        limit = self.limits.max_body_bytes
        if cl is not None and (len(cl) > 18 or (cl.isdigit() and int(cl) > limit)):
            raise _Refuse(413, f"request body over the limit of {limit} bytes")
        self._arm(self.limits.body_timeout_s)
        if "expect" in headers and headers["expect"].lower() == "100-continue" and self.transport:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self.body_len += len(body)
        if self.body_len > self.limits.max_body_bytes:
            raise _Refuse(413, f"request body over the limit of {self.limits.max_body_bytes} bytes")
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.deadline = 0.0
        self.reading = False
        self.head_left = self.max_head  # the next request's head begins
        url = self.url
        if url == self.last_url:
            path, query = self.last_target
        else:
            target = url if url.startswith(b"/") else origin_form(url)
            q = target.find(b"?")
            raw_path, raw_query = (target, b"") if q < 0 else (target[:q], target[q + 1 :])
            path, query = self.last_target = raw_path.decode("latin-1"), raw_query.decode("latin-1")
            self.last_url = url
        parts = self.body
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        self.body = []
        parser = self.parser
        m = parser.get_method()
        method = _METHODS.get(m) or m.decode("latin-1")
        req = Request(method, path, query, self.headers, body)
        keep = parser.should_keep_alive()
        self.by_parser = True
        if self.busy or self.pending:
            self._queue(req, keep)
        elif not self.closed:
            self._take(req, keep)

    def _queue(self, req: Request, keep: bool) -> None:
        """A request read while another is handled: its turn comes (``_next``)."""
        self.pending.append((req, keep))
        if len(self.pending) >= self.limits.max_pipelined and self.transport is not None:
            self.transport.pause_reading()
            self.reading_paused = True

    # -- handling -------------------------------------------------------------------------------
    def _next(self) -> None:
        if self.closed or not self.pending:
            return
        req, keep = self.pending.popleft()
        if self.reading_paused and self.transport is not None:
            self.transport.resume_reading()
            self.reading_paused = False
        self._take(req, keep)

    def _take(self, req: Request, keep: bool) -> None:
        """Handle ``req``: by the fast handler if it takes it, else by a task."""
        self.busy = True
        self.req = req
        self.keep = keep
        fast = self.server.fast
        if fast is not None:
            try:
                taken = fast(req, self.respond)
            except Exception:
                log.exception("%s %s: the handler failed", req.method, req.path[:200])
                self._answer(json_response(b'{"error":"internal server error"}', 500))
                return
            if taken:
                return
        self.loop.create_task(self._handle(req))

    async def _handle(self, req: Request) -> None:
        try:
            resp = await self.server.handler(req)
        except Exception:
            log.exception("%s %s: the handler failed", req.method, req.path[:200])
            resp = json_response(b'{"error":"internal server error"}', 500)
        self._answer(resp)

    def _answer(self, resp: Response) -> None:
        """Write the answer to the request being handled (``self.req``: exactly one answer
        per request), then take the next one."""
        req = self.req
        self.busy = False
        transport = self.transport
        if self.closed or transport is None:
            if isinstance(resp, StreamResponse):
                self._discard(resp)
            return  # the client went away; nothing to answer
        keep = self.keep and not self.stopping
        raw = resp.raw
        if raw is not None:
            n = resp.raw_head
            if not keep:
                raw = b"".join((raw[: n - 2], b"connection: close\r\n", raw[n - 2 :]))
                n += 19
            transport.write(raw if req.method != "HEAD" else raw[:n])
        elif resp.raw_head < 0:  # a StreamResponse (a slot read: no call on this path)
            assert isinstance(resp, StreamResponse)
            self.busy = True  # until its last piece is written (_stream)
            self.streaming = self.loop.create_task(self._stream(req, keep, resp))
            return
        else:
            body = b"" if req.method == "HEAD" else resp.body
            head = encode_head(resp.status, resp.headers, len(resp.body), not keep)
            if len(body) < 65536:
                transport.write(head + body)
            else:
                transport.writelines((head, body))
        if not keep:
            self._close()
        elif self.pending:
            self._next()
        elif not self.deadline:  # _arm, inlined
            lim = self.limits
            after_s = lim.body_timeout_s if self.reading else lim.keepalive_timeout_s
            self.deadline = self.loop.time() + after_s

    # -- streamed answers (beside the whole-body path above, which does not see them) -----------
    async def _stream(self, req: Request, keep: bool, resp: StreamResponse) -> None:
        """Write a streamed answer (``StreamResponse``): the head, each piece as it comes
        (chunked to an HTTP/1.1 client, as it is to an HTTP/1.0 one, which then reads to the
        connection's end), the end; then the next request, as ``_answer`` does.

        Cancelled by ``connection_lost``: the iterator is closed in ``finally``. The HTTP
        version read is the parser's latest request's: a client speaks one version on a
        connection."""
        transport = self.transport
        assert transport is not None
        chunked = not self.by_parser or self.parser.get_http_version() != "1.0"
        keep = keep and chunked
        transport.write(encode_stream_head(resp.status, resp.headers, chunked, not keep))
        chunks = resp.chunks
        failed = False
        try:
            if req.method != "HEAD":
                async for piece in chunks:
                    if self.closed:
                        break
                    if not piece:
                        continue  # an empty chunk would end the body
                    if chunked:
                        transport.writelines((b"%x\r\n" % len(piece), piece, b"\r\n"))
                    else:
                        transport.write(piece)
                    if self.write_paused:
                        await self._drain()
                else:
                    if chunked and not self.closed:
                        transport.write(b"0\r\n\r\n")
        except Exception:
            failed = True
            log.exception(
                "%s %s: the streamed answer failed after its head was sent; connection closed",
                req.method,
                req.path[:200],
            )
        finally:
            self.streaming = None
            await _aclose(chunks)
        if failed:
            if not self.closed:
                # Chunked: the body is cut short, which the client sees. Close-delimited:
                # only a reset tells it the body did not end.
                if not chunked:
                    transport.abort()
                self._close()
            return
        self.busy = False
        if self.closed:
            return
        if not keep or self.stopping:
            self._close()
        elif self.pending:
            self._next()
        elif not self.deadline:
            lim = self.limits
            self._arm(lim.body_timeout_s if self.reading else lim.keepalive_timeout_s)

    async def _drain(self) -> None:
        """Wait until the transport's buffer is under its low-water mark (``resume_writing``)
        or the connection is lost."""
        w = self.drain_waiter = self.loop.create_future()
        try:
            await w
        finally:
            self.drain_waiter = None

    def _discard(self, resp: StreamResponse) -> None:
        """A streamed answer that will not be sent: its iterator is closed."""
        task = self.loop.create_task(_aclose(resp.chunks))
        _closing.add(task)
        task.add_done_callback(_closing.discard)

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
        self.transport.write(error_bytes(status, message))
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


#: Tasks closing discarded streamed answers' iterators (kept referenced until done).
_closing: set[asyncio.Task[None]] = set()


async def _aclose(chunks: object) -> None:
    """Close a streamed answer's iterator when it can be closed (an async generator can);
    what it raises while closing is logged, not raised."""
    aclose = getattr(chunks, "aclose", None)
    if aclose is None:
        return
    try:
        await aclose()
    except Exception:
        log.exception("closing a streamed answer's iterator failed")
