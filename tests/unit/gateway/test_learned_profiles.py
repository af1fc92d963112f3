"""Profiles that learn, at the gateway: a worker's load report carries its learned figures
and the poller hands them to the router, whose profile for that backend follows them."""

from __future__ import annotations

import random
import time
from pathlib import Path

import httpx
import pytest

from evenserve.cluster.file import parse_cluster
from evenserve.core.clock import FakeClock
from evenserve.core.load import LoadReport
from evenserve.core.profile import LatencyProfile
from evenserve.core.wire import LOAD_PATH
from evenserve.gateway.backends import BackendRegistry
from evenserve.gateway.poller import Poller
from evenserve.httpio.client import Reply
from evenserve.policy.routing import ROUTING

BASE = LatencyProfile.from_points("m", {1: 2.0, 8: 6.0})


async def test_the_routers_profile_follows_the_workers_report() -> None:
    learned: dict[str, object] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == LOAD_PATH
        rep = LoadReport(
            timestamp_s=time.time(), device="emulated:x", queue_depth=0, in_flight=0,
            utilization=0.1, utilization_window_s=1.0, **learned,  # type: ignore[arg-type]
        )  # fmt: skip
        return httpx.Response(200, content=rep.model_dump_json())

    raw = {"backends": [{"name": "a", "url": "http://a.test", "models": ["m"]}]}
    cluster = parse_cluster(raw, Path("."))
    clock = FakeClock(10.0)
    reg = BackendRegistry.build(
        cluster.backends(), ROUTING.build("least-expected-work", random.Random(0)), clock,
        window=3, stale_after_s=0.5, profiles=lambda spec: {"m": BASE},
    )  # fmt: skip
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))

    async def fetch(url: str, timeout_s: float) -> Reply:
        r = await client.get(url)
        return Reply(r.status_code, dict(r.headers), r.content, 0)

    poller = Poller(reg, cluster.config.gateway, clock, fetch=fetch)
    st = reg.states["a"]
    await poller.probe_load(st)  # a worker that does not learn: the profile as given
    assert reg.router.view("a").profiles["m"] is BASE
    learned = {"profile_scale_by_model": {"m": 2.0}, "observed_ms_by_model": {"m": {8: 15.0}}}
    await poller.probe_load(st)
    prof = reg.router.view("a").profiles["m"]
    assert prof.latency_s(1) == pytest.approx(0.004)  # not observed: the base x 2
    assert prof.latency_s(8) == pytest.approx(0.015)  # observed: as reported
    assert reg.router.learned_scales("a") == {"m": 2.0}  # what /admin/backends shows
    learned = {"profile_scale_by_model": {"m": 1.0}}  # back to speed
    await poller.probe_load(st)
    assert reg.router.view("a").profiles["m"].latency_s(8) == pytest.approx(0.006)
