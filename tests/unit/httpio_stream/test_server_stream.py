"""The server's streamed answers (``StreamResponse``) over real loopback sockets: chunked to
HTTP/1.1, close-delimited to HTTP/1.0, each piece sent as it is made, the producer closed
when the client goes away, a failing producer, HEAD, pipelining and backpressure.

Pieces are released by the test (events), never by time; no test asserts how long anything
took."""

from __future__ import annotations

import asyncio
import logging
import socket
import struct

import pytest

from evenserve.httpio.server import HttpServer, Limits, Request, Response, StreamResponse
from evenserve.httpio.server.connection import Connection
from tests.unit.httpio_stream.servers import Producer, StreamApp, stream_server, until


class Peer:
    """A raw client connection that reads until what it expects has arrived."""

    def __init__(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.r, self.w, self.got = r, w, b""

    @classmethod
    async def open(cls, port: int) -> Peer:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        return cls(r, w)

    async def send(self, data: bytes) -> None:
        self.w.write(data)
        await self.w.drain()

    async def read_until(self, marker: bytes) -> bytes:
        while marker not in self.got:
            data = await asyncio.wait_for(self.r.read(65536), 30)  # a hang guard only
            assert data, f"connection closed before {marker!r}; got {self.got!r}"
            self.got += data
        return self.got

    async def read_to_eof(self) -> bytes:
        self.got += await asyncio.wait_for(self.r.read(), 30)
        return self.got

    def close(self) -> None:
        self.w.close()


GET_STREAM = b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n"


async def test_pieces_are_sent_chunked_as_they_are_made_and_the_connection_is_kept() -> None:
    app = StreamApp()
    async with stream_server(app) as srv:
        p = await Peer.open(srv.port)
        await p.send(GET_STREAM)
        head = await p.read_until(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"transfer-encoding: chunked\r\n" in head and b"content-length" not in head
        assert b"content-type: text/event-stream\r\n" in head and b"x-kind: stream" in head
        # Each piece reaches the client before the next is made.
        for k, piece in enumerate(app.producer.pieces):
            assert app.producer.yielded == k
            app.producer.release(k)
            await p.read_until(b"%x\r\n%s\r\n" % (len(piece), piece))
        await p.read_until(b"0\r\n\r\n")
        assert app.producer.ended == "done"
        # The same connection answers the next request.
        await p.send(b"GET /next HTTP/1.1\r\nhost: x\r\n\r\n")
        assert (await p.read_until(b"/next")).endswith(b"\r\n\r\n/next")
        p.close()


async def test_http_1_0_gets_a_close_delimited_body() -> None:
    app = StreamApp()
    app.producer = Producer([b"a", b"b"], gated=False)
    async with stream_server(app) as srv:
        p = await Peer.open(srv.port)
        await p.send(b"GET /stream HTTP/1.0\r\n\r\n")
        out = await p.read_to_eof()
        head, _, body = out.partition(b"\r\n\r\n")
        assert b"connection: close" in head and b"transfer-encoding" not in head
        assert body == b"ab"
        p.close()


@pytest.mark.parametrize("how", ["close", "reset"])
async def test_a_client_that_goes_away_closes_the_producer(how: str) -> None:
    app = StreamApp()
    async with stream_server(app) as srv:
        p = await Peer.open(srv.port)
        await p.send(GET_STREAM)
        app.producer.release(0)
        await p.read_until(b"3\r\none\r\n")
        # The producer now waits for its second piece, which the test never releases.
        if how == "reset":
            sock = p.w.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            p.w.transport.abort()
        else:
            p.close()
        await until(lambda: app.producer.ended is not None)
        assert app.producer.ended in ("closed", "cancelled")
        await until(lambda: not srv.connections)


async def test_a_producer_that_fails_mid_stream_is_logged_once_and_the_connection_closed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = StreamApp()
    app.producer = Producer([b"one", b"two"], gated=False, fail_after=1)
    async with stream_server(app) as srv:
        p = await Peer.open(srv.port)
        with caplog.at_level(logging.ERROR, logger="evenserve.http"):
            await p.send(GET_STREAM)
            out = await p.read_to_eof()
        assert out.endswith(b"3\r\none\r\n")  # cut short: no last chunk
        assert app.producer.ended == "failed"
        failures = [r for r in caplog.records if "streamed answer failed" in r.getMessage()]
        assert len(failures) == 1
        p.close()


async def test_head_gets_the_head_only_and_the_producer_is_closed() -> None:
    app = StreamApp()
    async with stream_server(app) as srv:
        p = await Peer.open(srv.port)
        await p.send(b"HEAD /stream HTTP/1.1\r\nhost: x\r\n\r\n")
        await p.read_until(b"\r\n\r\n")
        assert b"transfer-encoding: chunked" in p.got
        await p.send(b"GET /after HTTP/1.1\r\nhost: x\r\n\r\n")
        out = await p.read_until(b"/after")
        _, _, rest = out.partition(b"\r\n\r\n")
        assert rest.startswith(b"HTTP/1.1 200 OK")  # nothing between the two answers
        assert app.producer.yielded == 0
        p.close()


async def test_a_pipelined_request_waits_for_the_stream_before_it() -> None:
    app = StreamApp()
    async with stream_server(app) as srv:
        p = await Peer.open(srv.port)
        await p.send(GET_STREAM + b"GET /behind HTTP/1.1\r\nhost: x\r\n\r\n")
        app.producer.release(0)
        await p.read_until(b"3\r\none\r\n")
        conn = next(iter(srv.connections))
        await until(lambda: len(conn.pending) == 1)  # read, and waiting its turn
        assert app.paths == ["/stream"]
        app.producer.release()
        out = await p.read_until(b"/behind")
        end = out.index(b"0\r\n\r\n")
        assert out[end + 5 :].startswith(b"HTTP/1.1 200 OK\r\n") and out.endswith(b"/behind")
        assert app.paths == ["/stream", "/behind"]
        p.close()


async def test_a_client_that_does_not_read_holds_the_producer_back() -> None:
    """Backpressure: while the client reads nothing, the server stops asking the producer
    for pieces once the transport's buffer is full; reading resumes it, and every byte
    arrives."""
    app = StreamApp()
    piece = b"x" * (1 << 20)
    app.producer = Producer([piece] * 48, gated=False)
    async with stream_server(app) as srv:
        p = await Peer.open(srv.port)
        await p.send(GET_STREAM)
        await until(lambda: bool(srv.connections))
        conn: Connection = next(iter(srv.connections))
        await until(lambda: conn.drain_waiter is not None)
        held = app.producer.yielded
        assert held < 48
        for _ in range(5):
            await asyncio.sleep(0)
        assert app.producer.yielded == held  # still waiting for the client
        await p.read_until(b"0\r\n\r\n")
        assert p.got.count(piece[:1024]) >= 48
        assert app.producer.ended == "done"
        p.close()


class Closable:
    """A streamed answer's iterator (not a generator) that records being closed."""

    def __init__(self) -> None:
        self.closed = False

    def __aiter__(self) -> Closable:
        return self

    async def __anext__(self) -> bytes:
        raise StopAsyncIteration

    async def aclose(self) -> None:
        self.closed = True


async def test_a_stream_whose_client_left_before_it_was_answered_is_closed_unsent() -> None:
    gate = asyncio.Event()
    chunks = Closable()

    async def late(req: Request) -> Response:
        await gate.wait()
        return StreamResponse(200, None, chunks)

    srv = HttpServer(late, Limits())
    await srv.start("127.0.0.1", 0)
    try:
        p = await Peer.open(srv.port)
        await p.send(GET_STREAM)
        await until(lambda: srv.handling == 1)
        # A reset (not an end of input, which reads as a half-close): the connection is lost.
        sock = p.w.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        p.w.transport.abort()
        await until(lambda: not srv.connections)
        gate.set()  # the answer comes after its client went away
        await until(lambda: chunks.closed)
    finally:
        await srv.stop(1.0)
