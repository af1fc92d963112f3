"""An httpx client that calls a worker's HTTP handler in process (no socket)."""

from __future__ import annotations

import httpx

from evenserve.httpio.server import Request
from evenserve.worker.app import Worker


def worker_client(service: Worker, **client: object) -> httpx.AsyncClient:
    """``service``'s HTTP front (its lifecycle the caller's) behind an httpx client."""
    app = service.http

    async def handler(r: httpx.Request) -> httpx.Response:
        req = Request(
            r.method,
            r.url.raw_path.split(b"?")[0].decode(),
            r.url.query.decode(),
            {k.lower(): v for k, v in r.headers.items()},
            await r.aread(),
        )
        resp = await app(req)
        return httpx.Response(resp.status, content=resp.body, headers=resp.headers or {})

    return httpx.AsyncClient(
        transport=httpx.MockTransport(handler),
        base_url="http://worker",
        **client,  # type: ignore[arg-type]
    )
