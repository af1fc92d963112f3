"""Forwarding one HTTP request to a backend, with failures sorted into what the dispatcher needs.

``PooledForwarder`` is the gateway's data plane: one ``httpio.client.HttpClient`` (pooled
keep-alive connections, asyncio protocol + httptools) per backend. Tests drive the
dispatcher through the same ``Forwarder`` interface over httpx (tests/unit/gateway/fakes.py).

Failures are raised as three exceptions, by what they mean for a retry:
``Unreachable`` (never connected: refused or connect timeout), ``ConnectionLost`` (connected,
but no complete response came back: reset, server closed, a malformed answer),
``ResponseTimeout`` (connected, request sent, no answer in time). Bodies are passed through
as bytes, never decompressed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from evenserve.httpio.client import (
    BadResponse,
    ConnectFailed,
    HttpClient,
    HttpClientError,
    parse_headers,
)
from evenserve.httpio.client import ConnectionLost as _Lost
from evenserve.httpio.client import ResponseTimeout as _Timeout

#: The request got no HTTP response from the backend.
ForwardError = HttpClientError
#: Could not connect (refused, unreachable, connect timeout): the request never left. The
#: message is the reason (``connect-refused``, ``timeout``).
Unreachable = ConnectFailed
#: The backend has the request and did not answer in time.
ResponseTimeout = _Timeout


class ConnectionLost(_Lost):
    """Connected, but the connection died before a (well-formed) response."""


class Reply:
    """A backend's answer. ``head`` and ``raw`` are ``httpio.client.Reply``'s (empty and None
    when the forwarder has none): then ``headers`` is read from the head when first asked
    for, only the names in ``keep``."""

    __slots__ = ("_headers", "body", "head", "keep", "raw", "status")

    def __init__(
        self,
        status: int,
        headers: dict[str, str] | None,
        body: bytes,
        head: bytes = b"",
        raw: bytes | None = None,
        keep: frozenset[bytes] | None = None,
    ) -> None:
        self.status = status
        self._headers = headers
        self.body = body
        self.head = head
        self.raw = raw
        self.keep = keep

    @property
    def headers(self) -> dict[str, str]:
        if self._headers is None:
            self._headers = parse_headers(self.head, self.keep)
        return self._headers


class Forwarder(Protocol):
    async def request(
        self, method: str, base_url: str, path: str, body: bytes, headers: Mapping[str, str]
    ) -> Reply: ...

    async def aclose(self) -> None: ...


class PooledForwarder:
    def __init__(
        self,
        *,
        max_connections: int,
        connect_timeout_s: float,
        request_timeout_s: float,
        keep_headers: tuple[str, ...],
    ) -> None:
        self._max_connections = max_connections
        self._connect_timeout_s = connect_timeout_s
        self._timeout_s = request_timeout_s
        #: The response headers a Reply's ``headers`` gives (read from its head on demand:
        #: a relayed answer's headers are never read on its way through).
        self.keep = frozenset(h.lower().encode("latin-1") for h in keep_headers)
        self._clients: dict[str, HttpClient] = {}

    def client(self, base_url: str) -> HttpClient:
        c = self._clients.get(base_url)
        if c is None:
            c = self._clients[base_url] = HttpClient(
                base_url,
                self._timeout_s,
                connect_timeout_s=self._connect_timeout_s,
                max_connections=self._max_connections,
            )
        return c

    @staticmethod
    def sorted_error(exc: BaseException) -> HttpClientError:
        """The client's error as one of this module's three kinds (module docstring)."""
        if isinstance(exc, _Lost | BadResponse) and not isinstance(exc, ConnectionLost):
            return ConnectionLost(str(exc))
        assert isinstance(exc, HttpClientError)
        return exc

    async def request(
        self, method: str, base_url: str, path: str, body: bytes, headers: Mapping[str, str]
    ) -> Reply:
        c = self.client(base_url)
        try:
            r = await c.send(c.head(method, path, dict(headers), len(body)), body)
        except HttpClientError as exc:
            raise self.sorted_error(exc) from exc
        return Reply(r.status, None, r.body, r.head, r.raw, self.keep)

    async def aclose(self) -> None:
        for c in self._clients.values():
            c.close()
        self._clients.clear()
