"""The gateway learns each backend's models from its repository index: fake v2 backends on
loopback load and unload models (a test changes what they serve and what their index says),
the in-process gateway follows without a config change."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from evenserve.cluster.file import parse_cluster
from evenserve.core.wire import BACKEND_HEADER
from evenserve.gateway.server import Gateway
from tests.integration.fake_v2 import FakeBackend, serving
from tests.integration.test_gateway_routing import TOKEN, infer_body, wait_for


@contextlib.asynccontextmanager
async def cluster(
    *backends: tuple[FakeBackend, list[str] | None],
) -> AsyncIterator[tuple[Gateway, httpx.AsyncClient]]:
    async with contextlib.AsyncExitStack() as stack:
        specs: list[dict[str, Any]] = []
        for fb, configured in backends:
            s = await stack.enter_async_context(serving(fb.app()))
            spec: dict[str, Any] = {"name": fb.name, "url": s.url}
            if configured is not None:
                spec["models"] = configured
            specs.append(spec)
        raw = {
            "gateway": {
                "routing": "round-robin",
                "admin": {"token": TOKEN},
                "signals": {"interval_ms": 50, "stale_after_ms": 10_000, "timeout_ms": 10_000},
                "health": {"interval_ms": 50, "timeout_ms": 10_000},
            },
            "backends": specs,
        }
        g = Gateway(parse_cluster(raw, Path(".")))
        served = await stack.enter_async_context(serving(g))
        client = await stack.enter_async_context(httpx.AsyncClient(base_url=served.url, timeout=60))
        yield g, client


async def answered_by(client: httpx.AsyncClient, model: str, n: int) -> Counter[str]:
    seen: Counter[str] = Counter()
    for _ in range(n):
        r = await client.post(f"/v2/models/{model}/infer", json=infer_body())
        assert r.status_code == 200, r.text
        seen[r.headers[BACKEND_HEADER]] += 1
    return seen


async def probe(g: Gateway, *names: str) -> None:
    """One index probe of each backend now (the poller also runs them every period)."""
    for n in names:
        await g.poller.probe_index(g.registry.states[n])


async def test_loads_and_unloads_on_a_backend_change_routing_without_a_config_change() -> None:
    f0 = FakeBackend("f0", ["a"], index={"a": "READY"})
    f1 = FakeBackend("f1", ["a"], index={"a": "READY"})
    async with cluster((f0, ["a"]), (f1, None)) as (g, client):
        # Startup read both indexes: f1's models were learned, not configured.
        assert await answered_by(client, "a", 4) == {"f0": 2, "f1": 2}
        r = await client.post("/v2/models/b/infer", json=infer_body())
        assert r.status_code == 404
        # f1 starts loading b: known, not routable yet: 503 with Retry-After, not 404.
        f1.index["b"] = "LOADING"
        await probe(g, "f1")
        r = await client.post("/v2/models/b/infer", json=infer_body())
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert "f1 LOADING" in r.json()["error"]
        assert (await client.get("/v2/models/b/ready")).status_code == 503
        index = (await client.post("/v2/repository/index", json={})).json()
        assert {"name": "b", "state": "LOADING", "backends": {"f1": "LOADING"}} in index
        assert (await client.get("/v2/health/ready")).status_code == 200  # loading is no fault
        # b is loaded: routed to f1 only.
        f1.models.append("b")
        f1.index["b"] = "READY"
        await probe(g, "f1")
        assert await answered_by(client, "b", 3) == {"f1": 3}
        assert (await client.get("/v2/models/b/ready")).status_code == 200
        # f0 unloads a: every a goes to f1 from now on.
        f0.models.remove("a")
        del f0.index["a"]
        await probe(g, "f0")
        assert await answered_by(client, "a", 4) == {"f1": 4}
        index = (await client.post("/v2/repository/index", json={})).json()
        assert {"name": "a", "state": "READY", "backends": {"f1": "READY"}} in index
        # Unloaded everywhere (gone from every index): unknown again.
        f1.models.remove("b")
        del f1.index["b"]
        await probe(g, "f1")
        assert (await client.post("/v2/models/b/infer", json=infer_body())).status_code == 404
        auth = {"authorization": f"Bearer {TOKEN}"}
        events = (await client.get("/admin/events", headers=auth)).json()["events"]
        changes = [(e["backend"], e["reason"]) for e in events if e["event"] == "models"]
        assert changes == [
            ("f1", "now [a] (+a)"),
            ("f1", "now [a, b] (+b)"),
            ("f0", "now [] (-a)"),
            ("f1", "now [a] (-b)"),
        ]
        backends = (await client.get("/admin/backends", headers=auth)).json()["backends"]
        assert [(b["name"], b["models"], b["models_learned"]) for b in backends] == [
            ("f0", [], True),
            ("f1", ["a"], True),
        ]


async def test_the_poller_follows_the_index_on_its_own_schedule() -> None:
    f0 = FakeBackend("f0", ["a"], index={"a": "READY"})
    async with cluster((f0, None)) as (g, client):
        f0.models.append("c")
        f0.index["c"] = "READY"
        # No probe driven here: the poller's health-period loop picks it up.
        await wait_for(lambda: bool(g.registry.router.candidates("c")))
        assert await answered_by(client, "c", 2) == {"f0": 2}
        f0.index["c"] = "UNLOADING"
        await wait_for(lambda: not g.registry.router.candidates("c"))
        r = await client.post("/v2/models/c/infer", json=infer_body())
        assert r.status_code == 503 and "retry-after" in r.headers


async def test_a_backend_without_an_index_keeps_its_configured_models() -> None:
    f0 = FakeBackend("f0", ["a"])  # no repository extension: 404
    async with cluster((f0, ["a"])) as (g, client):
        await probe(g, "f0")
        assert await answered_by(client, "a", 2) == {"f0": 2}
        assert not g.registry.states["f0"].learned
