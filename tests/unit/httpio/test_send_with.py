"""``HttpClient.send_with``: the callback path that carries the caller's state as an argument
(the gateway's fast path hands each request's ``Forward``), against a scripted loopback
server: the argument comes back with the answer, with the error, and with the answer of the
keep-alive race's resend; nothing is sent without an idle connection."""

from __future__ import annotations

import asyncio
from typing import Any

from evenserve.httpio.client import ConnectionLost, HttpClient
from tests.unit.loadgen.test_http import scripted

HEAD = b"POST /x HTTP/1.1\r\nhost: h\r\ncontent-length: 2\r\n\r\n"


async def _pooled(url: str) -> HttpClient:
    """A client with one idle pooled connection (a first request answered on it)."""
    client = HttpClient(url, 5.0)
    first = await client.send(HEAD, b"{}")
    assert first.status == 200
    return client


async def _send_with(client: HttpClient, arg: object) -> tuple[Any, Any, Any]:
    got: asyncio.Future[tuple[Any, Any, Any]] = asyncio.get_running_loop().create_future()

    def done(a: object, reply: Any, exc: Any) -> None:
        assert not got.done(), "called twice"
        got.set_result((a, reply, exc))

    assert client.send_with(HEAD, b"{}", done, arg)
    return await asyncio.wait_for(got, 5.0)


async def test_the_argument_comes_back_with_the_answer() -> None:
    async with scripted(lambda c, n: "answer") as srv:
        client = await _pooled(srv.url)
        try:
            token = object()
            a, reply, exc = await _send_with(client, token)
            assert a is token and exc is None
            assert (reply.status, reply.body, reply.resent) == (200, b"ok", 0)
            assert reply.raw is not None and reply.raw.endswith(b"\r\n\r\nok")
            # Back in the pool: the next one goes on the same connection.
            a2, reply2, _ = await _send_with(client, 2)
            assert a2 == 2 and reply2.status == 200 and srv.connections == 1
        finally:
            client.close()


async def test_the_keep_alive_race_is_resent_with_the_argument() -> None:
    # The server closes the idle connection as the second request arrives, before any byte
    # of an answer: sent once more on a fresh connection, the argument still handed back.
    async with scripted(lambda c, n: "close" if (c, n) == (0, 2) else "answer") as srv:
        client = await _pooled(srv.url)
        try:
            a, reply, exc = await _send_with(client, "mine")
            assert a == "mine" and exc is None
            assert (reply.status, reply.resent) == (200, 1)
            assert client.stats()["resent_stale"] == 1 and srv.connections == 2
        finally:
            client.close()


async def test_a_failure_comes_back_with_the_argument() -> None:
    # The server began an answer and closed: it took the request, so no resend.
    async with scripted(lambda c, n: "partial" if (c, n) == (0, 2) else "answer") as srv:
        client = await _pooled(srv.url)
        try:
            a, reply, exc = await _send_with(client, 7)
            assert a == 7 and reply is None and isinstance(exc, ConnectionLost)
            assert client.stats()["resent_stale"] == 0
        finally:
            client.close()


async def test_nothing_is_sent_without_an_idle_connection() -> None:
    async with scripted(lambda c, n: "answer") as srv:
        client = HttpClient(srv.url, 5.0)
        try:
            assert not client.send_with(HEAD, b"{}", lambda *a: None, None)
            assert srv.requests == 0
        finally:
            client.close()
