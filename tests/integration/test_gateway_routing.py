"""In-process gateway in front of fake v2 backends on loopback: routing, failures, admin."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from evenserve.cluster.file import parse_cluster
from evenserve.gateway.server import Gateway
from tests.integration.fake_v2 import FakeBackend, Served, bound_socket, serving

TOKEN = "test-token-123456"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "triton"


def infer_body(x: float = 1.0) -> dict[str, Any]:
    return {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [x] * 4}]}


@contextlib.asynccontextmanager
async def gateway_for(
    backends: list[tuple[FakeBackend, Served]], routing: Any = "round-robin", **gw: Any
) -> AsyncIterator[tuple[Gateway, httpx.AsyncClient]]:
    # Probes every 50 ms, but with time limits far beyond anything a loopback answer needs
    # even on a loaded machine: a probe that times out ejects its backend, and these tests
    # are about routing, not about how fast this machine answers a poll.
    raw = {
        "gateway": {
            "routing": routing,
            "admin": {"token": TOKEN},
            "signals": {"interval_ms": 50, "stale_after_ms": 10_000, "timeout_ms": 10_000},
            "health": {"interval_ms": 50, "timeout_ms": 10_000},
            **gw,
        },
        "backends": [
            {"name": fb.name, "url": s.url, "models": fb.models, **fb_signals(fb)}
            for fb, s in backends
        ],
    }
    g = Gateway(parse_cluster(raw, Path(".")))
    async with (
        serving(g) as served,
        httpx.AsyncClient(base_url=served.url, timeout=60) as client,
    ):
        yield g, client


def fb_signals(fb: FakeBackend) -> dict[str, Any]:
    if fb.metrics_text is not None:
        return {"signals": {"source": "prometheus", "mapping": "triton"}}
    return {}


@contextlib.asynccontextmanager
async def fakes(*specs: FakeBackend) -> AsyncIterator[list[tuple[FakeBackend, Served]]]:
    async with contextlib.AsyncExitStack() as stack:
        out = []
        for fb in specs:
            out.append((fb, await stack.enter_async_context(serving(fb.app()))))
        yield out


async def wait_for(cond: Any, timeout_s: float = 60.0) -> None:
    """Poll ``cond`` until it holds; the limit only guards against a hang."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(0.02)


async def test_round_robin_spreads_and_names_backend() -> None:
    async with (
        fakes(FakeBackend("a", ["m"]), FakeBackend("b", ["m"])) as fbs,
        gateway_for(fbs) as (_, client),
    ):
        seen = Counter()
        for i in range(10):
            r = await client.post("/v2/models/m/infer", json=infer_body(i))
            assert r.status_code == 200, r.text
            assert r.json()["served_by"] == r.headers["x-evenserve-backend"]
            seen[r.headers["x-evenserve-backend"]] += 1
        assert seen == {"a": 5, "b": 5}


async def test_head_is_answered_as_get() -> None:
    """HEAD on the gateway's GET endpoints (its own and those it asks a backend for) is
    answered as GET, without a body; HEAD on infer is 405."""
    async with fakes(FakeBackend("a", ["m"])) as fbs, gateway_for(fbs) as (_, client):
        auth = {"authorization": f"Bearer {TOKEN}"}
        for path in ("/v2/health/live", "/v2/health/ready", "/v2", "/v2/models/m/ready",
                     "/v2/repository/index", "/metrics", "/admin/routing"):  # fmt: skip
            got, head = await client.get(path, headers=auth), await client.head(path, headers=auth)
            assert (path, head.status_code) == (path, got.status_code) == (path, 200)
            assert head.content == b""
            if path != "/metrics":  # its figures move between the two requests
                assert head.headers["content-length"] == str(len(got.content))
        assert (await client.head("/v2/models/m/infer")).status_code == 405
        assert (await client.head("/admin/routing")).status_code == 401


async def test_queue_aware_spreads_a_burst_between_polls() -> None:
    # At the last poll a reports 2 queued, the others none; between polls the router's own
    # send counts must fill the others up to a's level and then share the rest, instead of
    # piling the burst onto whichever looked idlest. Nothing changes the estimates but the
    # sends, however long this machine takes to send the burst: no poll lands during it (the
    # startup probe is the only one; signals stay fresh) and no answer comes back (the fakes
    # hold every request until all 16 have arrived), so the split is exact.
    no_poll = {"interval_ms": 600_000, "stale_after_ms": 1_200_000, "timeout_ms": 10_000}
    reported = {"a": 2, "b": 0, "c": 0, "d": 0}
    gate = asyncio.Event()
    backends = [FakeBackend(n, ["m"], reported_queue=q, gate=gate) for n, q in reported.items()]
    async with (
        fakes(*backends) as fbs,
        gateway_for(fbs, routing="queue-aware", overload={"enabled": False}, signals=no_poll) as (
            g,
            client,
        ),
    ):
        assert all(g.registry.router.view(n).signals_fresh for n in "abcd")
        burst = asyncio.gather(
            *(client.post("/v2/models/m/infer", json=infer_body()) for _ in range(16))
        )
        await wait_for(lambda: sum(fb.received for fb in backends) == 16)
        gate.set()
        rs = await burst
        assert all(r.status_code == 200 for r in rs)
        seen = Counter(r.headers["x-evenserve-backend"] for r in rs)
        # Each send went to a backend with the lowest estimate (reported + sent since): the
        # estimates end within one of each other, 18 over 4 backends.
        ends = {n: reported[n] + seen[n] for n in reported}
        assert max(ends.values()) - min(ends.values()) <= 1, seen
        assert seen["a"] in (2, 3) and sum(seen.values()) == 16, seen
        assert {fb.name: fb.max_in_flight for fb in backends} == dict(seen)


async def test_placement_only_hosts_get_the_model_and_unknown_is_404() -> None:
    async with (
        fakes(FakeBackend("a", ["m", "n"]), FakeBackend("b", ["m"])) as fbs,
        gateway_for(fbs) as (_, client),
    ):
        for _ in range(4):
            r = await client.post("/v2/models/n/infer", json=infer_body())
            assert r.headers["x-evenserve-backend"] == "a"
        r = await client.post("/v2/models/zzz/infer", json=infer_body())
        assert r.status_code == 404
        assert "zzz" in r.json()["error"] and "served: m, n" in r.json()["error"]
        meta = await client.get("/v2/models/n")
        assert meta.status_code == 200 and meta.json()["name"] == "n"
        assert (await client.get("/v2/models/n/ready")).status_code == 200
        assert (await client.get("/v2/health/ready")).status_code == 200


async def test_binary_tensor_extension_passes_through_untouched() -> None:
    async with fakes(FakeBackend("a", ["m"])) as fbs, gateway_for(fbs) as (_, client):
        header = b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,4],'
        header += b'"parameters":{"binary_data_size":16}}]}'
        payload = header + bytes(range(16))
        r = await client.post(
            "/v2/models/m/infer",
            content=payload,
            headers={
                "inference-header-content-length": str(len(header)),
                "content-type": "application/octet-stream",
            },
        )
        assert r.status_code == 200
        assert r.content == payload
        assert r.headers["inference-header-content-length"] == str(len(header))


async def test_dead_backend_retried_elsewhere_ejected_and_readmitted() -> None:
    a, b = FakeBackend("a", ["m"]), FakeBackend("b", ["m"])
    async with fakes(a, b) as fbs, gateway_for(fbs) as (g, client):
        served_a = fbs[0][1]
        port = served_a.port
        await served_a.stop()  # connections to a are now refused
        rs = [await client.post("/v2/models/m/infer", json=infer_body()) for _ in range(6)]
        assert [r.status_code for r in rs] == [200] * 6
        assert {r.headers["x-evenserve-backend"] for r in rs} == {"b"}
        assert not g.registry.is_healthy("a")
        assert g.registry.states["a"].reason in ("connect-refused", "timeout", "connection-lost")
        # Restart a on the same port: the poller readmits it.
        sock = bound_socket_on(port)
        restarted = Served(a.app(), sock)
        await restarted.start()
        try:
            await wait_for(lambda: g.registry.is_healthy("a"))
            events = [(e.backend, e.event) for e in g.registry.events]
            assert ("a", "ejected") in events and ("a", "admitted") in events
            seen = Counter()
            for _ in range(4):
                r = await client.post("/v2/models/m/infer", json=infer_body())
                seen[r.headers["x-evenserve-backend"]] += 1
            assert seen["a"] == 2
        finally:
            await restarted.stop()


def bound_socket_on(port: int) -> Any:
    import socket

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    return sock


async def test_no_backend_left_is_a_clear_503() -> None:
    async with fakes(FakeBackend("a", ["m"])) as fbs, gateway_for(fbs) as (_, client):
        await fbs[0][1].stop()
        r = await client.post("/v2/models/m/infer", json=infer_body())
        assert r.status_code == 503
        assert "no backend available for model 'm'" in r.json()["error"]
        assert "retry-after" in r.headers
        assert (await client.get("/v2/health/ready")).status_code == 503


async def test_backend_503_is_retried_once_on_another_host() -> None:
    a = FakeBackend("a", ["m"], infer_status=503)
    b = FakeBackend("b", ["m"])
    async with fakes(a, b) as fbs, gateway_for(fbs) as (_, client):
        for _ in range(4):
            r = await client.post("/v2/models/m/infer", json=infer_body())
            assert r.status_code == 200 and r.headers["x-evenserve-backend"] == "b"
        # The round-robin cursor advances on the retry too, so each request tries a first.
        assert a.received == 4


async def test_backend_429_everywhere_is_relayed_with_retry_after() -> None:
    a = FakeBackend("a", ["m"], infer_status=429)
    b = FakeBackend("b", ["m"], infer_status=429)
    async with fakes(a, b) as fbs, gateway_for(fbs) as (_, client):
        r = await client.post("/v2/models/m/infer", json=infer_body())
        assert r.status_code == 429
        assert r.headers["retry-after"] == "2"
        assert a.received + b.received == 2  # tried once, retried once, then answered


async def test_a_queue_of_nine_is_not_overload_full_queues_everywhere_are() -> None:
    a = FakeBackend("a", ["m"], reported_queue=9)
    b = FakeBackend("b", ["m"], reported_queue=12)
    async with fakes(a, b) as fbs, gateway_for(fbs, routing="queue-aware") as (_, client):
        # queue-aware's old soft-overload rule (queue > 5 everywhere) refused this
        r = await client.post("/v2/models/m/infer", json=infer_body())
        assert r.status_code == 200
        a.reported_bound = b.reported_bound = 8  # now both queues are at their bounds
        deadline = time.monotonic() + 60.0
        while True:
            r = await client.post("/v2/models/m/infer", json=infer_body())
            if r.status_code == 429 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.02)
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.headers["x-evenserve-reason"] == "overloaded"
        assert "queue full" in r.json()["error"]
        received = a.received + b.received
        b.reported_queue = 0
        # Once b's 3-sample window has seen the drop, the gateway routes again (which host
        # takes it is the policy's: a late poll can make a's signals stale, and a stale host
        # is never judged full; the unit tests pin the choice on a fake clock).
        deadline = time.monotonic() + 60.0
        while True:
            r = await client.post("/v2/models/m/infer", json=infer_body())
            if r.status_code != 429 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.02)
        assert r.status_code == 200
        assert a.received + b.received == received + 1  # the 429s were never forwarded


async def test_admin_requires_token_and_policy_change_applies_to_next_request() -> None:
    async with (
        fakes(FakeBackend("a", ["m"]), FakeBackend("b", ["m"])) as fbs,
        gateway_for(fbs, routing={"policy": "weighted-random", "weights": {"a": 1, "b": 0}}) as (
            _,
            client,
        ),
    ):
        assert (await client.get("/admin/backends")).status_code == 401
        bad = {"authorization": "Bearer wrong-token-0000"}
        assert (await client.get("/admin/backends", headers=bad)).status_code == 401
        r = await client.put("/admin/routing", json={"policy": "round-robin"})
        assert r.status_code == 401
        auth = {"authorization": f"Bearer {TOKEN}"}
        view = (await client.get("/admin/backends", headers=auth)).json()
        assert [b["name"] for b in view["backends"]] == ["a", "b"]
        assert all(b["healthy"] for b in view["backends"])
        assert view["backends"][0]["signals"]["fresh"] is True
        r = await client.post("/v2/models/m/infer", json=infer_body())
        assert r.headers["x-evenserve-backend"] == "a"
        # Bad specs are refused with the field named; the policy in force is unchanged.
        r = await client.put("/admin/routing", json={"policy": "nope"}, headers=auth)
        assert r.status_code == 400 and "unknown routing policy 'nope'" in r.json()["error"]
        r = await client.put(
            "/admin/routing", json={"policy": "queue-aware", "queue_weight": -1}, headers=auth
        )
        assert r.status_code == 400 and "queue_weight" in r.json()["error"]
        r = await client.put("/admin/routing", content=b"{not json", headers=auth)
        assert r.status_code == 400
        r = await client.put("/admin/routing", content=b"[" * 100_000, headers=auth)
        assert r.status_code == 400 and "nested too deep" in r.json()["error"]
        huge = b'{"policy": "queue-aware", "queue_weight": ' + b"9" * 5000 + b"}"
        r = await client.put("/admin/routing", content=huge, headers=auth)
        assert r.status_code == 400 and "queue_weight" in r.json()["error"]
        r = await client.put(
            "/admin/routing",
            json={"policy": "weighted-random", "weights": {"a": 0, "b": 1}},
            headers=auth,
        )
        assert r.status_code == 200 and r.json()["weights"] == {"a": 0.0, "b": 1.0}
        r = await client.post("/v2/models/m/infer", json=infer_body())
        assert r.headers["x-evenserve-backend"] == "b"
        got = (await client.get("/admin/routing", headers=auth)).json()
        assert got["policy"] == "weighted-random" and got["changes"] == 1
        r = await client.put("/admin/routing", json={"policy": "queue-aware"}, headers=auth)
        view = (await client.get("/admin/backends", headers=auth)).json()
        assert set(view["backends"][0]["scores"]["m"]) == {"score", "overloaded"}


async def test_prometheus_signals_from_real_triton_text() -> None:
    text = (FIXTURES / "metrics_kura_gpu.txt").read_text()
    text = text.replace(
        'nv_inference_pending_request_count{model="preprocessor",version="1"} 0',
        'nv_inference_pending_request_count{model="preprocessor",version="1"} 3',
    )
    a = FakeBackend("a", ["preprocessor"], metrics_text=text)
    async with fakes(a) as fbs, gateway_for(fbs, routing="queue-aware") as (g, client):
        await wait_for(lambda: g.registry.router.view("a").signals_fresh)
        v = g.registry.router.view("a")
        assert v.queue_depth == pytest.approx(3.0)
        assert v.utilization == 0.0
        assert v.memory_total_bytes == pytest.approx(16101933056.0)
        assert v.memory_free_bytes == pytest.approx(16101933056.0 - 617611264.0)
        r = await client.post("/v2/models/preprocessor/infer", json=infer_body())
        assert r.status_code == 200


async def test_gateway_metrics_exposed() -> None:
    async with fakes(FakeBackend("a", ["m"])) as fbs, gateway_for(fbs) as (_, client):
        await client.post("/v2/models/m/infer", json=infer_body())
        await client.post("/v2/models/nope/infer", json=infer_body())
        text = (await client.get("/metrics")).text
        assert 'evenserve_gateway_requests_total{backend="a",model="m",outcome="ok"} 1.0' in text
        assert 'outcome="unknown_model"' in text
        assert "evenserve_gateway_routing_decision_seconds_bucket" in text
        assert 'evenserve_gateway_request_duration_seconds_count{model="m"} 1.0' in text
        assert 'evenserve_gateway_backend_healthy{backend="a"} 1.0' in text
        assert 'evenserve_gateway_backend_signal_age_seconds{backend="a"}' in text


def test_fake_socket_helper_binds_loopback() -> None:
    s = bound_socket()
    try:
        assert s.getsockname()[0] == "127.0.0.1"
    finally:
        s.close()
