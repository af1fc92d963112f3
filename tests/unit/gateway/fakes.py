"""A forwarder over an ``httpx.AsyncClient``, so the dispatcher can be driven through
``httpx.MockTransport``: the gateway's ``Forwarder`` contract, with httpx's exceptions sorted
as ``PooledForwarder`` sorts the pooled client's."""

from __future__ import annotations

from collections.abc import Mapping

import httpx

from evenserve.gateway.forwarder import ConnectionLost, Reply, ResponseTimeout, Unreachable


class HttpxForwarder:
    def __init__(self, client: httpx.AsyncClient, keep_headers: tuple[str, ...]) -> None:
        self.client = client
        self._keep = keep_headers

    async def request(
        self, method: str, base_url: str, path: str, body: bytes, headers: Mapping[str, str]
    ) -> Reply:
        url = base_url + path
        try:
            resp = await self.client.request(method, url, content=body or None, headers=headers)
        except httpx.ConnectError as exc:
            raise Unreachable("connect-refused") from exc
        except httpx.ConnectTimeout as exc:
            raise Unreachable("timeout") from exc
        except httpx.TimeoutException as exc:
            raise ResponseTimeout(str(exc)) from exc
        except httpx.HTTPError as exc:
            raise ConnectionLost(type(exc).__name__) from exc
        kept = {h: resp.headers[h] for h in self._keep if h in resp.headers}
        return Reply(resp.status_code, kept, resp.content)

    async def aclose(self) -> None:
        await self.client.aclose()
