"""``HttpClient.stream``: the head first, then each piece as it arrives (chunked,
Content-Length, to the connection's end), the connection pooled again only after the body
was read to its end and closed when the consumer stops early; against the project's server
and against a plain asyncio server that writes its answer in parts the test releases."""

from __future__ import annotations

import pytest

from evenserve.httpio.client import ConnectionLost, HttpClient, ResponseTimeout
from tests.unit.httpio_stream.servers import (
    RawScript,
    StreamApp,
    raw_server,
    stream_server,
    until,
)


async def test_pieces_arrive_one_by_one_and_the_connection_is_pooled_after() -> None:
    app = StreamApp()
    async with stream_server(app) as srv:
        c = HttpClient(f"http://127.0.0.1:{srv.port}", 10.0)
        reply = await c.stream("GET", "/stream")
        assert reply.status == 200 and reply.headers["content-type"] == "text/event-stream"
        got = []
        for k in range(3):
            app.producer.release(k)  # the next piece is made only after this one came
            got.append(await anext(reply))
        assert got == [b"one", b"two", b"three"]
        with pytest.raises(StopAsyncIteration):
            await anext(reply)
        assert len(c._idle) == 1  # read to its end: back in the pool
        r = await c.request("GET", "/whole")
        assert r.body == b"/whole" and c.opened == 1  # and reused
        c.close()


async def test_stopping_early_closes_the_connection_and_the_server_sees_it() -> None:
    app = StreamApp()
    async with stream_server(app) as srv:
        c = HttpClient(f"http://127.0.0.1:{srv.port}", 10.0)
        async with await c.stream("GET", "/stream") as reply:
            app.producer.release(0)
            assert await anext(reply) == b"one"
        assert not c._all and not c._idle  # closed, not pooled
        await until(lambda: app.producer.ended is not None)
        assert app.producer.ended in ("closed", "cancelled")
        r = await c.request("GET", "/whole")
        assert r.status == 200 and c.opened == 2
        c.close()


CHUNKED_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


@pytest.mark.parametrize(
    "framing",
    ["chunked", "length", "close"],
)
async def test_a_plain_server_writing_parts_with_pauses(framing: str) -> None:
    pieces = [b"data: 1\n\n", b"data: 2\n\n", b"data: 3\n\n"]
    if framing == "chunked":
        parts = [CHUNKED_HEAD] + [b"%x\r\n%s\r\n" % (len(p), p) for p in pieces] + [b"0\r\n\r\n"]
        script = RawScript(parts)
    elif framing == "length":
        head = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % sum(map(len, pieces))
        script = RawScript([head, *pieces])
    else:
        script = RawScript([b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n", *pieces], close=True)
    async with raw_server(script) as port:
        c = HttpClient(f"http://127.0.0.1:{port}", 10.0)
        reply = await c.stream("POST", "/v1/x", b"{}")
        assert reply.status == 200
        got = b""
        for k, piece in enumerate(pieces):
            script.gates[k + 1].set()  # the server writes the next part only now
            while not got.endswith(piece):
                got += await anext(reply)
        if framing == "chunked":
            script.gates[-1].set()
        assert await reply.read() == b""
        assert got == b"".join(pieces)
        # Keep-alive answers go back to the pool; the close-delimited one is closed.
        assert len(c._idle) == (0 if framing == "close" else 1)
        c.close()


async def test_a_connection_lost_mid_body_is_raised_from_the_iteration() -> None:
    script = RawScript([CHUNKED_HEAD, b"3\r\none\r\n"], close=True)
    async with raw_server(script) as port:
        c = HttpClient(f"http://127.0.0.1:{port}", 10.0)
        reply = await c.stream("GET", "/")
        script.gates[1].set()
        assert await anext(reply) == b"one"
        with pytest.raises(ConnectionLost, match="body ended"):
            await anext(reply)
        assert not c._all
        c.close()


async def test_no_head_within_the_limit_is_a_timeout_and_a_stalled_body_too() -> None:
    script = RawScript([b"", CHUNKED_HEAD, b"3\r\none\r\n"])
    async with raw_server(script) as port:
        c = HttpClient(f"http://127.0.0.1:{port}", 0.05)
        with pytest.raises(ResponseTimeout):
            await c.stream("GET", "/")
        script.gates[1].set()  # the next connection gets its head, then nothing more
        reply = await c.stream("GET", "/")
        with pytest.raises(ResponseTimeout):
            await reply.read()
        assert not c._all
        c.close()
