"""The send path's HTTP client against a scripted loopback server: keep-alive reuse, the
stale-connection retry (only on a reused connection that died before any answer byte), and
idle connections retired before the server's keep-alive timeout.

The server decides what to do with the n-th request of its c-th connection, so every case is
driven by events (a request arriving), never by timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

from evenserve.loadgen.http import RawHttpClient
from evenserve.loadgen.target import ConnectionLostError

#: Action for (connection index from 0, request number on it from 1).
Script = Callable[[int, int], str]

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nx-evenserve-backend: c%d\r\n\r\nok"


class ScriptedServer:
    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.requests = 0
        self.server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    def protocol(self) -> asyncio.Protocol:
        owner = self

        class Conn(asyncio.Protocol):
            def __init__(self) -> None:
                self.index = owner.connections
                owner.connections += 1
                self.n = 0
                self.buf = b""
                self.transport: asyncio.Transport | None = None

            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                self.transport = transport  # type: ignore[assignment]

            def data_received(self, data: bytes) -> None:
                assert self.transport is not None
                self.buf += data
                while b"\r\n\r\n" in self.buf:
                    head, _, rest = self.buf.partition(b"\r\n\r\n")
                    m = re.search(rb"content-length: *(\d+)", head, re.IGNORECASE)
                    length = int(m.group(1)) if m else 0
                    if len(rest) < length:
                        return
                    self.buf = rest[length:]
                    self.n += 1
                    owner.requests += 1
                    action = owner.script(self.index, self.n)
                    if action == "answer":
                        self.transport.write(ANSWER % self.index)
                    elif action == "close":
                        # What uvicorn's keep-alive timer does: close, answer nothing.
                        self.transport.close()
                        return
                    elif action == "partial":
                        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Len")
                        self.transport.close()
                        return
                    else:  # pragma: no cover - a typo in a test
                        raise AssertionError(action)

        return Conn()


@contextlib.asynccontextmanager
async def scripted(script: Script) -> AsyncIterator[ScriptedServer]:
    s = ScriptedServer(script)
    s.server = await asyncio.get_running_loop().create_server(s.protocol, "127.0.0.1", 0)
    try:
        yield s
    finally:
        s.server.close()
        await s.server.wait_closed()


def _request(client: RawHttpClient) -> bytes:
    return client.request_bytes("/v2/models/m/infer", b"{}", {"content-type": "application/json"})


async def _posts(srv: ScriptedServer, n: int, **kw: float) -> tuple[RawHttpClient, list[Any]]:
    """``n`` requests one after the other; each result is a RawReply or the exception."""
    client = RawHttpClient(srv.url, timeout_s=10.0, **kw)
    out: list[Any] = []
    try:
        for _ in range(n):
            try:
                out.append(await client.post(_request(client)))
            except ConnectionLostError as exc:
                out.append(exc)
    finally:
        client.close()
    return client, out


async def test_keep_alive_reuses_one_connection() -> None:
    async with scripted(lambda c, n: "answer") as srv:
        client, replies = await _posts(srv, 3)
    assert [tuple(r) for r in replies] == [(200, "c0", b"ok", 0)] * 3
    assert srv.connections == 1
    assert client.stats() == {"opened": 1, "retired_idle": 0, "resent_stale": 0}


async def test_reused_connection_closed_before_any_answer_byte_is_resent_once() -> None:
    # The keep-alive race: the server closes its idle connection just as our next request
    # arrives on it (connection 0, request 2). The request must be sent again, once, on a
    # fresh connection, and the resend counted.
    async with scripted(lambda c, n: "close" if (c, n) == (0, 2) else "answer") as srv:
        client, (first, second) = await _posts(srv, 2)
    assert not isinstance(second, Exception), f"the request was lost: {second!r}"
    assert (first.status, first.backend, first.resent) == (200, "c0", 0)
    assert (second.status, second.backend, second.resent) == (200, "c1", 1)
    assert srv.connections == 2 and srv.requests == 3
    assert client.stats() == {"opened": 2, "retired_idle": 0, "resent_stale": 1}


async def test_fresh_connection_closed_before_answering_is_an_error() -> None:
    # A fresh connection cannot have raced a keep-alive timeout: the server dropped the
    # request. That is reported, never retried.
    async with scripted(lambda c, n: "close") as srv:
        client, (only,) = await _posts(srv, 1)
    assert isinstance(only, ConnectionLostError)
    assert srv.connections == 1 and srv.requests == 1
    assert client.stats()["resent_stale"] == 0


async def test_connection_lost_after_answer_bytes_is_an_error() -> None:
    # On a reused connection, but the server had started answering: it took the request.
    async with scripted(lambda c, n: "partial" if (c, n) == (0, 2) else "answer") as srv:
        client, (first, second) = await _posts(srv, 2)
    assert first.status == 200 and isinstance(second, ConnectionLostError)
    assert srv.connections == 1 and srv.requests == 2
    assert client.stats()["resent_stale"] == 0


async def test_the_resend_is_tried_once_only() -> None:
    # The resend's fresh connection is lost too: that is the server's failure, reported.
    async with scripted(lambda c, n: "answer" if (c, n) == (0, 1) else "close") as srv:
        client, (first, second) = await _posts(srv, 2)
    assert first.status == 200 and isinstance(second, ConnectionLostError)
    assert srv.connections == 2 and srv.requests == 3
    assert client.stats() == {"opened": 2, "retired_idle": 0, "resent_stale": 1}


async def test_idle_connections_are_retired_before_the_servers_keep_alive() -> None:
    # max_idle_s=0: every idle connection counts as too old, so none is reused (the rule is
    # tested without a clock; the default is below uvicorn's 5 s keep-alive timeout).
    async with scripted(lambda c, n: "answer") as srv:
        client, (a, b) = await _posts(srv, 2, max_idle_s=0.0)
    assert (a.backend, b.backend) == ("c0", "c1")
    assert srv.connections == 2
    assert client.stats() == {"opened": 2, "retired_idle": 1, "resent_stale": 0}
