"""Poller probes against an httpx MockTransport, on a FakeClock."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import httpx

from evenserve.core.clock import FakeClock
from evenserve.core.load import LoadReport
from evenserve.core.wire import LOAD_PATH
from evenserve.gateway.backends import BackendRegistry
from evenserve.gateway.config import parse_cluster
from evenserve.gateway.poller import Poller
from evenserve.policy.routing import ROUTING

TRITON_TEXT = (
    Path(__file__).resolve().parents[2] / "fixtures" / "triton" / "metrics_kura_gpu.txt"
).read_text()


class Backend:
    """State a MockTransport handler answers from."""

    def __init__(self) -> None:
        self.up = True
        self.ready = True
        self.queue = 2

    def handler(self, request: httpx.Request) -> httpx.Response:
        if not self.up:
            raise httpx.ConnectError("refused", request=request)
        if request.url.path == LOAD_PATH:
            rep = LoadReport(
                timestamp_s=time.time(), device="emulated:x", queue_depth=self.queue,
                in_flight=1, queued_by_model={"m": self.queue}, utilization=0.5,
                utilization_window_s=1.0, memory_used_bytes=4e9, memory_total_bytes=24e9,
                ready=self.ready,
            )  # fmt: skip
            return httpx.Response(200, content=rep.model_dump_json())
        if request.url.path == "/v2/health/ready":
            return httpx.Response(200 if self.ready else 503)
        if request.url.path == "/metrics":
            return httpx.Response(200, text=TRITON_TEXT)
        return httpx.Response(404)


def setup(signals: dict[str, Any]) -> tuple[Poller, BackendRegistry, FakeClock, Backend]:
    raw = {"backends": [{"name": "a", "url": "http://a.test", "models": ["m"],
                         "signals": signals}]}  # fmt: skip
    cluster = parse_cluster(raw, Path("."))
    clock = FakeClock(10.0)
    reg = BackendRegistry.build(
        cluster.backends(), ROUTING.build("queue-aware", random.Random(0)), clock,
        window=3, stale_after_s=0.5,
    )  # fmt: skip
    be = Backend()
    client = httpx.AsyncClient(transport=httpx.MockTransport(be.handler))
    return Poller(reg, cluster.config.gateway, clock, client=client), reg, clock, be


async def test_load_probe_observes_admits_and_stale_signals_become_unknown() -> None:
    p, reg, clock, _be = setup({"source": "evenserve"})
    assert not reg.is_healthy("a") and reg.states["a"].reason == "starting"
    await p.probe_load(reg.states["a"])
    assert reg.is_healthy("a")
    v = reg.router.view("a")
    assert v.signals_fresh and v.queue_depth == 2 and v.utilization == 0.5
    assert v.memory_free_bytes == 20e9
    # No new sample for longer than the bound: unknown, not idle.
    clock.advance(0.6)
    assert reg.router.expire(clock.now()) == ["a"]
    v = reg.router.view("a")
    assert not v.signals_fresh and v.utilization is None and v.memory_free_bytes is None


async def test_load_probe_ejects_on_refusal_and_not_ready_and_readmits() -> None:
    p, reg, clock, be = setup({"source": "evenserve"})
    st = reg.states["a"]
    await p.probe_load(st)
    be.up = False
    clock.advance(0.1)
    await p.probe_load(st)
    assert not reg.is_healthy("a") and st.reason == "connect-refused"
    be.up, be.ready = True, False
    clock.advance(0.1)
    await p.probe_load(st)
    assert not reg.is_healthy("a") and st.reason == "not-ready"
    be.ready = True
    clock.advance(0.1)
    await p.probe_load(st)
    assert reg.is_healthy("a")
    assert [(e.event, e.reason, round(e.t_s, 3)) for e in reg.events] == [
        ("ready", "ready", 10.0),
        ("ejected", "connect-refused", 10.1),
        ("admitted", "ready", 10.3),
    ]


async def test_prometheus_backend_reads_triton_text_and_readiness_separately() -> None:
    p, reg, _, be = setup({"source": "prometheus", "mapping": "triton"})
    st = reg.states["a"]
    await p.probe_metrics(st)
    await p.probe_ready(st)
    assert reg.is_healthy("a")
    v = reg.router.view("a")
    assert v.signals_fresh and v.utilization == 0.0
    assert v.memory_total_bytes == 16101933056.0
    be.ready = False
    await p.probe_ready(st)
    assert not reg.is_healthy("a") and st.reason == "not-ready (503)"


async def test_none_backend_only_polls_readiness() -> None:
    p, reg, _, be = setup({"source": "none"})
    await p.probe_all()
    assert reg.is_healthy("a")
    assert not reg.router.view("a").signals_fresh  # routed on in-flight counts only
    be.up = False
    await p.probe_all()
    assert not reg.is_healthy("a")
