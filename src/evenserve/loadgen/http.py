"""The load generator's send path: prebuilt POSTs on the shared pooled keep-alive client.

Why not aiohttp here: its client spends 0.08-0.13 ms of CPU per request where this one spends
0.03-0.05 ms (bench/http_server_choice.py), and an answer burst (a batch of 8 completing at
once) then keeps the generator's single loop busy for milliseconds, which shows up as
scheduling lag of the next sends. ``httpio.client`` (an
asyncio protocol + httptools, the gateway's own upstream client) writes a prebuilt request
on an idle pooled connection: a fraction of the cost. Its keep-alive rules (idle connections
retired at 4 s, one resend when a reused connection is lost before any answer byte) are
described there. Preflight and scraping, which are not time-critical, use aiohttp.
"""

from __future__ import annotations

from typing import NamedTuple

from evenserve.core import wire
from evenserve.httpio.client import MAX_IDLE_S, HttpClient
from evenserve.loadgen.target import TargetError

__all__ = ["MAX_IDLE_S", "RawHttpClient", "RawReply"]
BACKEND = wire.BACKEND_HEADER.lower()


class RawReply(NamedTuple):
    """One answer: status, the answering backend (``x-evenserve-backend``), the body, and
    ``resent``: 1 when the request had to be sent again on a fresh connection."""

    status: int
    backend: str
    body: bytes
    resent: int


class RawHttpClient:
    """POSTs prebuilt requests to one ``http://host:port`` over pooled keep-alive connections."""

    def __init__(
        self,
        base_url: str,
        timeout_s: float,
        connect_timeout_s: float = 5.0,
        max_idle_s: float = MAX_IDLE_S,
    ) -> None:
        try:
            self._client = HttpClient(
                base_url,
                timeout_s,
                connect_timeout_s=connect_timeout_s,
                max_idle_s=max_idle_s,
                keep_headers=(BACKEND,),
            )
        except ValueError:
            raise TargetError(
                f"target {base_url!r}: the load generator speaks plain http:// only"
            ) from None

    def request_bytes(self, path: str, body: bytes, headers: dict[str, str]) -> bytes:
        """A complete HTTP/1.1 POST (head and body) to ``path``, ready to write."""
        return self._client.head("POST", path, headers, len(body)) + body

    async def post(self, data: bytes) -> RawReply:
        """Send a prebuilt request; return the answer. Errors: those of ``HttpClient.send``
        (``ConnectionLost``, ``ResponseTimeout``, ``BadResponse``, ``ConnectFailed``)."""
        r = await self._client.send(data)
        return RawReply(r.status, r.headers.get(BACKEND, ""), r.body, r.resent)

    def stats(self) -> dict[str, int]:
        """Connections opened, idle ones retired before reuse, requests resent."""
        return self._client.stats()

    def close(self) -> None:
        self._client.close()
