"""The httpio server's contract over real loopback sockets: answers, keep-alive, pipelining,
limits (431, 413 before the body is read, 408, connection cap), a failing handler, stop.

Timeouts are configured short so the tests wait little; no test asserts how long anything
took, only what was answered and whether the connection was closed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator, Callable

import pytest

from evenserve.httpio.client import HttpClient, ResponseTimeout
from evenserve.httpio.client.connection import Connection
from evenserve.httpio.server import (
    HttpServer,
    Limits,
    Request,
    Response,
    json_bytes,
    json_response,
)


async def echo(req: Request) -> Response:
    if req.path == "/boom":
        raise RuntimeError("a bug")
    if req.path == "/slow":
        await asyncio.sleep(0.05)
    if req.path == "/never":
        await asyncio.Event().wait()  # answered only when the server stops
    body = json.dumps(
        {"method": req.method, "path": req.path, "query": req.query, "n": len(req.body),
         "x": req.headers.get("x-thing")}
    ).encode()  # fmt: skip
    return json_response(body)


@contextlib.asynccontextmanager
async def server(**limits: float) -> AsyncIterator[HttpServer]:
    refused: list[tuple[int, str]] = []
    srv = HttpServer(echo, Limits(**limits), lambda s, p: refused.append((s, p)))  # type: ignore[arg-type]
    srv.refused = refused  # type: ignore[attr-defined]
    await srv.start("127.0.0.1", 0)
    try:
        yield srv
    finally:
        await srv.stop(1.0)


async def until(cond: Callable[[], bool], cap_s: float = 30.0) -> None:
    """Wait for ``cond`` (polling the loop); the cap only guards against a hang."""
    loop = asyncio.get_running_loop()
    end = loop.time() + cap_s
    while not cond():
        assert loop.time() < end, "condition not reached"
        await asyncio.sleep(0.005)


async def raw(port: int, data: bytes, *, read_until_eof: bool = True) -> bytes:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(data)
    await w.drain()
    out = await asyncio.wait_for(r.read() if read_until_eof else r.read(65536), 30)
    w.close()
    return out


async def test_get_post_keep_alive_and_query() -> None:
    async with server() as srv:
        c = HttpClient(f"http://127.0.0.1:{srv.port}", 10.0, keep_headers=("content-type",))
        r1 = await c.request("GET", "/a?b=1", headers={"X-Thing": "y"})
        r2 = await c.request("POST", "/p", b"x" * 1000)
        assert r1.status == 200 and json.loads(r1.body) == {
            "method": "GET", "path": "/a", "query": "b=1", "n": 0, "x": "y"
        }  # fmt: skip
        assert json.loads(r2.body)["n"] == 1000 and r2.headers["content-type"] == "application/json"
        assert c.opened == 1  # the second request reused the connection
        c.close()


async def test_pipelined_requests_are_answered_in_order() -> None:
    async with server() as srv:
        reqs = (
            b"".join(f"GET /{p} HTTP/1.1\r\nhost: x\r\n\r\n".encode() for p in ("slow", "b", "c"))
            + b"GET /d HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        )
        out = await raw(srv.port, reqs)
        paths = [json.loads(b)["path"] for b in re.findall(rb"\{[^}]*\}", out)]
        assert paths == ["/slow", "/b", "/c", "/d"]


async def test_a_failing_handler_answers_500_and_the_connection_stays_usable() -> None:
    async with server() as srv:
        c = HttpClient(f"http://127.0.0.1:{srv.port}", 10.0)
        for _ in range(20):
            assert (await c.request("GET", "/boom")).status == 500
            assert (await c.request("GET", "/fine")).status == 200
        assert c.opened == 1
        c.close()


async def test_a_head_over_the_limit_is_431() -> None:
    async with server(max_header_bytes=4096) as srv:
        out = await raw(srv.port, b"GET / HTTP/1.1\r\nx-big: " + b"a" * 10_000 + b"\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 431 ")
        many = b"".join(b"x-%d: 1\r\n" % i for i in range(200))
        out = await raw(srv.port, b"GET / HTTP/1.1\r\n" + many + b"\r\n")
        assert out.startswith(b"HTTP/1.1 431 ")
    assert [s for s, _ in srv.refused] == [431, 431]  # type: ignore[attr-defined]


async def _answer_while_held(port: int, parts: list[bytes]) -> bytes:
    """Send ``parts`` (one write each), then wait for the first bytes of an answer while
    holding the connection open: nothing more is sent, nothing is closed."""
    r, w = await asyncio.open_connection("127.0.0.1", port)
    try:
        for part in parts:
            w.write(part)
            await w.drain()
        return await asyncio.wait_for(r.read(65536), 10)  # a hang guard only
    finally:
        w.close()


@pytest.mark.parametrize("pieces", [1, 7])
async def test_an_unterminated_head_is_431_once_it_passes_the_limit(pieces: int) -> None:
    """A header line (or a request line) that never ends is refused once the head passes the
    limit, while the client still holds the connection and has sent one byte too many; the
    header timeout (60 s here) is not what answers it."""
    async with server(max_header_bytes=4096, header_timeout_s=60.0) as srv:
        start = b"GET / HTTP/1.1\r\nhost: x\r\nx-big: "
        head = start + b"a" * (4096 + 1 - len(start))
        size = -(-len(head) // pieces)
        parts = [head[i : i + size] for i in range(0, len(head), size)]
        out = await _answer_while_held(srv.port, parts)
        assert out.startswith(b"HTTP/1.1 431 "), out[:200]
        assert b"over the limit of 4096 bytes" in out
        line = b"GET /" + b"p" * 5000  # a request line that never ends
        assert (await _answer_while_held(srv.port, [line])).startswith(b"HTTP/1.1 431 ")
    assert [s for s, _ in srv.refused] == [431, 431]  # type: ignore[attr-defined]


async def test_a_head_of_exactly_the_limit_is_served_and_one_byte_more_is_431() -> None:
    """The limit counts the head's bytes as sent: request line, headers, the blank line."""
    async with server(max_header_bytes=4096) as srv:

        def head(size: int) -> bytes:
            start = b"GET /a HTTP/1.1\r\nconnection: close\r\nx-pad: "
            return start + b"p" * (size - len(start) - 4) + b"\r\n\r\n"

        assert len(head(4096)) == 4096
        assert (await raw(srv.port, head(4096))).startswith(b"HTTP/1.1 200 ")
        assert (await raw(srv.port, head(4097))).startswith(b"HTTP/1.1 431 ")


async def test_a_head_ending_in_a_chunk_with_a_body_or_more_requests_is_not_refused() -> None:
    """A chunk read may hold the end of a head and what follows it (a body, pipelined
    requests): only the head is counted against the limit."""
    async with server(max_header_bytes=4096) as srv:
        body = b"b" * 100_000
        pad = b"x-pad: " + b"p" * 3900 + b"\r\n"
        post = b"POST /p HTTP/1.1\r\n" + pad + b"content-length: %d\r\n\r\n" % len(body)
        assert len(post) < 4096
        out = await raw(srv.port, post + body + b"GET /c HTTP/1.1\r\nconnection: close\r\n\r\n")
        answers = [json.loads(b) for b in re.findall(rb"\{[^}]*\}", out)]
        assert [(a["path"], a["n"]) for a in answers] == [("/p", 100_000), ("/c", 0)]
        # 12 heads of ~3.9 kB each in one write (~47 kB, far over the limit all together)
        many = b"".join(b"GET /%d HTTP/1.1\r\n" % i + pad + b"\r\n" for i in range(11))
        many += b"GET /last HTTP/1.1\r\nconnection: close\r\n" + pad + b"\r\n"
        out = await raw(srv.port, many)
        paths = [json.loads(b)["path"] for b in re.findall(rb"\{[^}]*\}", out)]
        assert paths == [f"/{i}" for i in range(11)] + ["/last"]
        assert b" 431 " not in out


async def test_absolute_form_targets_reach_the_handler_as_their_path() -> None:
    async with server() as srv:
        host = f"127.0.0.1:{srv.port}".encode()

        async def path_and_query(target: bytes) -> tuple[str, str]:
            req = b"GET " + target + b" HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
            out = await raw(srv.port, req)
            assert out.startswith(b"HTTP/1.1 200 "), out[:200]
            doc = json.loads(out.partition(b"\r\n\r\n")[2])
            return doc["path"], doc["query"]

        assert await path_and_query(b"http://" + host + b"/v2/health/live") == (
            "/v2/health/live", ""
        )  # fmt: skip
        assert await path_and_query(b"HTTP://" + host + b"/a?b=1") == ("/a", "b=1")
        assert await path_and_query(b"http://" + host) == ("/", "")
        assert await path_and_query(b"http://" + host + b"?q=2") == ("/", "q=2")
        assert await path_and_query(b"/plain?x") == ("/plain", "x")
        # OPTIONS * goes to the handler as "*"; CONNECT (authority form) is an upgrade: 501.
        out = await raw(srv.port, b"OPTIONS * HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 200 ") and b'"path": "*"' in out
        out = await raw(srv.port, b"CONNECT " + host + b" HTTP/1.1\r\nhost: x\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 501 ")


async def test_a_declared_body_over_the_limit_is_413_before_it_is_sent() -> None:
    async with server(max_body_bytes=1000) as srv:
        head = b"POST /v2/models/m/infer HTTP/1.1\r\ncontent-length: 5000\r\n\r\n"
        out = await raw(srv.port, head, read_until_eof=False)
        assert out.startswith(b"HTTP/1.1 413 ")
        digits = b"POST / HTTP/1.1\r\ncontent-length: " + b"9" * 5000 + b"\r\n\r\n"
        assert (await raw(srv.port, digits)).startswith(b"HTTP/1.1 400 ")  # overflow
    assert srv.refused[0] == (413, "/v2/models/m/infer")  # type: ignore[attr-defined]


async def test_a_chunked_body_growing_over_the_limit_is_413_and_not_kept() -> None:
    async with server(max_body_bytes=10_000) as srv:
        r, w = await asyncio.open_connection("127.0.0.1", srv.port)
        w.write(b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n")
        chunk = b"%x\r\n%s\r\n" % (4096, b"z" * 4096)
        answer = b""
        with contextlib.suppress(ConnectionError):
            for _ in range(100):  # 400 kB offered: refused after the third chunk
                w.write(chunk)
                await w.drain()
                with contextlib.suppress(TimeoutError):
                    answer += await asyncio.wait_for(r.read(65536), 0.01)
                if answer:
                    break
        answer += await asyncio.wait_for(r.read(), 30)
        assert answer.startswith(b"HTTP/1.1 413 ")
        w.close()
        assert all(not c.body for c in srv.connections)


async def test_malformed_http_is_400_and_an_upgrade_is_501() -> None:
    async with server() as srv:
        assert (await raw(srv.port, b"GARBAGE\r\n\r\n")).startswith(b"HTTP/1.1 400 ")
        up = b"GET / HTTP/1.1\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n"
        assert (await raw(srv.port, up)).startswith(b"HTTP/1.1 501 ")


async def test_a_stalled_head_is_closed_with_408_and_an_idle_connection_closed() -> None:
    async with server(header_timeout_s=0.1, keepalive_timeout_s=0.1) as srv:
        out = await raw(srv.port, b"GET / HTTP/1.1\r\nhost: x\r\n")  # never finishes its head
        assert out.startswith(b"HTTP/1.1 408 ")
        out = await raw(srv.port, b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")  # then idles
        assert out.startswith(b"HTTP/1.1 200 ") and out.count(b"HTTP/1.1") == 1
        assert await raw(srv.port, b"") == b""  # connected, sent nothing: closed
        assert srv.timed_out == 1


async def test_connections_over_the_cap_get_503_and_the_rest_still_work() -> None:
    async with server(max_connections=5) as srv:
        held = [await asyncio.open_connection("127.0.0.1", srv.port) for _ in range(5)]
        await until(lambda: len(srv.connections) == 5)
        assert (await raw(srv.port, b"GET / HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 503 ")
        r, w = held[0]
        w.write(b"GET /ok HTTP/1.1\r\nconnection: close\r\n\r\n")
        assert (await asyncio.wait_for(r.read(), 30)).startswith(b"HTTP/1.1 200 ")
        for _, w in held:
            w.close()
        assert srv.refused_connections == 1


async def test_a_client_gone_mid_body_is_not_an_error(caplog: object) -> None:
    async with server() as srv:
        _r, w = await asyncio.open_connection("127.0.0.1", srv.port)
        w.write(b"POST / HTTP/1.1\r\ncontent-length: 1000\r\n\r\n" + b"x" * 10)
        await w.drain()
        w.close()
        await until(lambda: not srv.connections)
        assert not srv.handling
        assert "Traceback" not in getattr(caplog, "text", "")


async def test_stop_answers_what_was_read_then_closes() -> None:
    srv = HttpServer(echo)
    await srv.start("127.0.0.1", 0)
    c = HttpClient(f"http://127.0.0.1:{srv.port}", 10.0)
    slow = asyncio.ensure_future(c.request("GET", "/slow"))
    await until(lambda: srv.handling == 1)  # read, being handled
    await srv.stop(5.0)
    assert (await slow).status == 200
    assert not srv.connections
    c.close()


async def test_a_deadline_met_late_by_a_busy_loop_looks_for_the_answer_once_more() -> None:
    """Deadlines are checked by a sweep, not a timer per request. A sweep that finds a
    request past its deadline only marks it: the answer may be unread in the socket of a
    busy loop (a saturated gateway), and an answer read before the next sweep is taken
    (counted as late); a request still unanswered at the next sweep times out."""
    loop = asyncio.get_running_loop()

    class _Transport:
        def abort(self) -> None:
            pass

    c = HttpClient("http://127.0.0.1:9", 1.0)

    def pending() -> Connection:
        conn = Connection(frozenset(), loop)
        conn.transport = _Transport()  # type: ignore[assignment]
        conn.fut = loop.create_future()
        conn.deadline = loop.time() - 1.0
        c._all.add(conn)
        return conn

    late, never = pending(), pending()
    c.check_deadlines(loop.time())
    assert late.fut is not None and never.fut is not None
    assert not late.fut.done() and not never.fut.done() and late.overdue
    # The late one's answer is read before the next sweep: taken, counted late.
    c._answered(late)
    late.fut.set_result((200, {}, b"", b"", None))
    fut = never.fut
    c.check_deadlines(loop.time())
    assert isinstance(fut.exception(), ResponseTimeout)
    assert c.late_deadlines == 1 and late.deadline == 0.0
    c.close()


async def test_a_request_without_an_answer_times_out_both_ways() -> None:
    """The deadline sweep (no timer per request) ends an unanswered request with
    ResponseTimeout, on the awaited path and on the callback path, and the sweep stops once
    nothing is in flight; a request answered in time is not touched."""
    async with server() as srv:
        c = HttpClient(f"http://127.0.0.1:{srv.port}", 10.0)
        with pytest.raises(ResponseTimeout):
            await asyncio.wait_for(c.request("GET", "/never", timeout_s=0.05), 10.0)
        assert (await c.request("GET", "/a", timeout_s=5.0)).status == 200  # a fresh connection
        got: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
        head = c.head("GET", "/never", {}, 0)
        assert c.send_cb(head, b"", lambda r, e: got.set_result(e), timeout_s=0.05)
        assert isinstance(await asyncio.wait_for(got, 10.0), ResponseTimeout)
        await until(lambda: c._sweeper is None)  # nothing in flight: no sweep left running
        c.close()


async def test_every_answer_carries_a_date_header_in_http_date_form() -> None:
    from email.utils import parsedate_to_datetime

    async with server() as srv:
        out = await raw(srv.port, b"GET /a HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        found = re.search(rb"\r\ndate: ([^\r]+)\r\n", out)
        assert found is not None, out
        when = parsedate_to_datetime(found.group(1).decode())
        assert when.tzinfo is not None and found.group(1).endswith(b" GMT")
        bad = await raw(srv.port, b"NOT HTTP\r\n\r\n")  # refusals written by the parser too
        assert re.search(rb"\r\ndate: [^\r]+ GMT\r\n", bad), bad


async def test_reuse_port_lets_two_servers_listen_on_one_port() -> None:
    first, second = HttpServer(echo), HttpServer(echo)
    await first.start(reuse_port=True)
    try:
        await second.start(port=first.port, reuse_port=True)
        assert second.port == first.port
        get = b"GET /x HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n"
        for _ in range(4):  # the kernel hands each connection to one of them
            assert b" 200 " in await raw(first.port, get)
        with pytest.raises(OSError):
            await HttpServer(echo).start(port=first.port)  # without the flag: taken
    finally:
        await second.stop(1.0)
        await first.stop(1.0)


def test_json_bytes_never_writes_a_bare_infinity_or_nan() -> None:
    def strict(data: bytes) -> object:
        def refuse(const: str) -> object:
            raise AssertionError(f"bare {const} in {data!r}")

        return json.loads(data, parse_constant=refuse)

    doc = {"a": 1.5, "b": [float("inf"), {"c": float("nan")}, (-float("inf"), 2)], "d": "x"}
    assert strict(json_bytes(doc)) == {"a": 1.5, "b": [None, {"c": None}, [None, 2]], "d": "x"}
    assert json_bytes({"a": [1, 2.5, None, "s"]}) == b'{"a":[1,2.5,null,"s"]}'
