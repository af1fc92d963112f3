"""The parser-free paths (a request or an answer read whole in one piece) read what the
parser reads, and leave to the parser whatever they do not take.

Each message is fed to a fresh connection once whole (the parser-free path, when it takes
it) and once byte by byte (always the parser): the request handed over (server) or the
answer given back (client) must be the same, and so must a refusal's status."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from evenserve.httpio.client.connection import Connection as ClientConnection
from evenserve.httpio.server import HttpServer, Limits, Request, Response
from evenserve.httpio.server.connection import Connection as ServerConnection


class Sink(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.out: list[bytes] = []
        self.closing = False

    def write(self, data: Any) -> None:
        self.out.append(bytes(data))

    def writelines(self, parts: Any) -> None:
        self.out.append(b"".join(parts))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


async def _serve(chunks: list[bytes], max_header_bytes: int = 4096) -> tuple[list[Request], bytes]:
    """Feed ``chunks`` to one server connection: the requests its fast handler got (each
    answered at once) and what it wrote. ``_serve.parsed``: whether the parser read the
    last request."""
    got: list[Request] = []

    def fast(req: Request, respond: Any) -> bool:
        got.append(req)
        respond(Response(200, b"ok", {}))
        return True

    async def handler(req: Request) -> Response:
        raise AssertionError("the fast handler takes every request")

    srv = HttpServer(handler, Limits(max_header_bytes=max_header_bytes, max_headers=8), None, fast)
    srv._loop = asyncio.get_running_loop()
    conn = ServerConnection(srv)
    sink = Sink()
    conn.connection_made(sink)
    for c in chunks:
        conn.data_received(c)
    _serve.parsed = conn.by_parser  # type: ignore[attr-defined]
    return got, b"".join(sink.out)


def _same(a: list[Request], b: list[Request]) -> None:
    assert [(r.method, r.path, r.query, r.headers, r.body) for r in a] == [
        (r.method, r.path, r.query, r.headers, r.body) for r in b
    ]


def _status(out: bytes) -> bytes:
    """The status of the last answer written (after a 100 Continue, the answer's)."""
    return out[out.rfind(b"HTTP/1.1 ") :][9:12]


TAKEN_WHOLE = 6
REQUESTS = [
    b"POST /p HTTP/1.1\r\nConnection: Keep-Alive\r\ncontent-length: 1\r\n\r\nx",
    b"POST /v2/models/m/infer HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
    b"content-length: 4\r\n\r\nbody",
    b"GET /a?b=1&c HTTP/1.1\r\nX-Thing:   spaced value \t\r\n\r\n",
    b"GET / HTTP/1.1\r\n\r\n",
    b"HEAD /v2/health/live HTTP/1.1\r\nhost: x\r\n\r\n",
    b"POST /p HTTP/1.1\r\nx-obs: caf\xe9\r\ncontent-length: 0\r\n\r\n",
    # Not taken whole (the parser's): a repeated header, chunked, Connection, Expect,
    # HTTP/1.0, an absolute-form target, a DEL in a value, pipelined requests.
    b"GET / HTTP/1.1\r\nx-a: 1\r\nX-A: 2\r\n\r\n",
    b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n4\r\nbody\r\n0\r\n\r\n",
    b"GET / HTTP/1.1\r\nconnection: close\r\n\r\n",
    b"POST / HTTP/1.1\r\nexpect: 100-continue\r\ncontent-length: 2\r\n\r\nab",
    b"GET / HTTP/1.0\r\n\r\n",
    b"GET http://h:1/x?y HTTP/1.1\r\n\r\n",
    b"GET /1 HTTP/1.1\r\n\r\nGET /2 HTTP/1.1\r\n\r\n",
]


@pytest.mark.parametrize("msg", REQUESTS)
async def test_a_request_read_whole_is_what_the_parser_reads(msg: bytes) -> None:
    whole, out_whole = await _serve([msg])
    assert _serve.parsed == (REQUESTS.index(msg) >= TAKEN_WHOLE)  # type: ignore[attr-defined]
    pieces, out_pieces = await _serve([msg[i : i + 1] for i in range(len(msg))])
    assert _serve.parsed  # type: ignore[attr-defined]
    _same(whole, pieces)
    assert whole, "answered"
    assert _status(out_whole) == _status(out_pieces) == b"200"


async def test_the_same_lines_again_are_read_once_and_each_request_gets_its_own_headers() -> None:
    msg = b"POST /p HTTP/1.1\r\nx-thing: 1\r\ncontent-length: 2\r\n\r\nab"
    got, _ = await _serve([msg, msg, msg.replace(b"ab", b"cd")])
    assert not _serve.parsed  # type: ignore[attr-defined]
    assert [r.body for r in got] == [b"ab", b"ab", b"cd"]
    assert all(r.headers == {"x-thing": "1", "content-length": "2"} for r in got)
    got[0].headers["x-thing"] = "changed"
    assert got[1].headers["x-thing"] == "1"  # not one dict shared by the requests


async def test_long_header_lines_are_not_remembered_and_take_the_parser() -> None:
    pad = b"x-pad: " + b"p" * 3000 + b"\r\n"
    msg = b"GET / HTTP/1.1\r\n" + pad * 3 + b"\r\n"  # 9 kB: over what is remembered
    got, out = await _serve([msg, msg], max_header_bytes=16384)
    assert _serve.parsed  # type: ignore[attr-defined]
    assert len(got) == 2 and _status(out) == b"200"


BAD = [
    b"GET / HTTP/1.1\r\nx: a\x7fb\r\n\r\n",  # a control character in a value
    b"GET / HTTP/1.1\r\nbad name: x\r\n\r\n",  # a space in a header name
    b"GET / HTTP/1.1\r\nx-ok: 1\r\n\r\n".replace(b"x-ok", b"x\x01ok"),
    b"POST / HTTP/1.1\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\na",
    b"POST / HTTP/1.1\r\ncontent-length: -1\r\n\r\n",
    b"GET / HTTP/1.1\r\n" + b"".join(b"x-%d: 1\r\n" % i for i in range(9)) + b"\r\n",
    b"GET / HTTP/1.1\r\nx-pad: " + b"p" * 5000 + b"\r\n\r\n",
    b"POST / HTTP/1.1\r\ncontent-length: 99999999999999999999\r\n\r\n",
    b"GET / HTTP/1.1\nx: bare line feeds\n\n",
]


@pytest.mark.parametrize("msg", BAD)
async def test_bad_input_gets_the_parsers_answer(msg: bytes) -> None:
    whole, out_whole = await _serve([msg])
    pieces, out_pieces = await _serve([msg[i : i + 1] for i in range(len(msg))])
    _same(whole, pieces)
    assert _status(out_whole) == _status(out_pieces), (out_whole[:80], out_pieces[:80])


class Spy:
    """A parser that counts what is fed to it."""

    def __init__(self, parser: Any) -> None:
        self.parser = parser
        self.fed = 0

    def feed_data(self, data: bytes) -> None:
        self.fed += 1
        self.parser.feed_data(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.parser, name)


def _answer(chunks: list[bytes]) -> tuple[Any, bool]:
    """Feed ``chunks`` to one client connection waiting for an answer: what it gave back
    (result or error) and whether the connection may be reused. ``_answer.parsed``: whether
    the parser was fed."""
    loop = asyncio.new_event_loop()
    try:
        conn = ClientConnection(frozenset({b"content-type", b"x-evenserve-reason"}), loop)
        spy = conn.parser = Spy(conn.parser)  # type: ignore[assignment]
        conn.connection_made(Sink())
        got: list[Any] = []
        conn.cb = lambda result, exc: got.append(result if exc is None else type(exc))
        for c in chunks:
            conn.data_received(c)
        _answer.parsed = spy.fed > 0  # type: ignore[attr-defined]
        return (got[0] if got else None), conn.reusable
    finally:
        loop.close()


ANSWERS = [
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}",
    b"HTTP/1.1 503 Service Unavailable\r\nX-Evenserve-Reason: queue-full\r\n"
    b"Content-Length: 0\r\n\r\n",
    b"HTTP/1.1 200\r\ncontent-length: 3\r\n\r\nabc",
    b"HTTP/1.1 201 Created\r\nContent-Length:  2 \r\nX-A: b\r\n\r\nok",
    # The parser's (not relayable as they came: no ``raw``): chunked, hop-by-hop, 204/304,
    # folded or bare-LF lines.
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5\r\ncontent-length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nproxy-authenticate: x\r\ncontent-length: 2\r\n\r\nok",
    b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nx-a: 1\r\n folded\r\ncontent-length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\ncontent-length: 2\n\nok",
    b"HTTP/1.1 200 OK\ncontent-length: 6\n\nab\r\n\r\n",  # a bare-LF head, CRLFs in the body
    b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nCONTENT-LENGTH: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\ncontent-length: 2\r\n\r\nok",
    # A bare-LF line end before the CRLF blank line: a lenient parser ends the head there.
    b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-a: 1\n\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nx-a: 1\n\r\ncontent-length: 2\r\n\r\nok",
]


@pytest.mark.parametrize("msg", ANSWERS)
def test_an_answer_read_whole_is_what_the_parser_reads(msg: bytes) -> None:
    whole, reuse_whole = _answer([msg])
    taken = not _answer.parsed  # type: ignore[attr-defined]
    assert taken == (ANSWERS.index(msg) < 4)
    pieces, reuse_pieces = _answer([msg[i : i + 1] for i in range(len(msg))])
    if isinstance(whole, tuple) and isinstance(pieces, tuple):
        assert (whole.status, whole.headers, whole.body, whole.head, whole.resent) == (
            pieces.status,
            pieces.headers,
            pieces.body,
            pieces.head,
            pieces.resent,
        )
        assert whole.raw == (msg if taken else None)
    else:
        assert whole == pieces
    assert reuse_whole == reuse_pieces
