"""The gateway places an LLM engine on a real worker on loopback (design 0022): the engine is
asleep, a request arrives, the gateway's placement wakes it (the worker's load of an LLM
folder) and the request is answered from it; with ``min_switch_s`` the engine, idle at once,
is not put to sleep again within the window, and is after it. Placement ticks are driven
directly on the gateway's fake clock; the worker's wake sleeps its folder's warm_load_ms."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from evenserve.cluster.file import parse_cluster
from evenserve.core.clock import FakeClock
from evenserve.core.wire import BACKEND_HEADER
from evenserve.gateway.placement_catalogue import DeviceSetup, llm_model_info
from evenserve.gateway.server import Gateway
from evenserve.policy.placement import READY
from evenserve.worker.server import BackgroundWorker
from tests.integration.fake_v2 import serving
from tests.integration.test_gateway_routing import TOKEN, wait_for
from tests.integration.test_worker_llm_sleep import placed_repo, start_worker

GIB = 1024.0**3


@contextlib.asynccontextmanager
async def placed(
    w: BackgroundWorker, pset: Path, repo: Path, placement: dict[str, Any]
) -> AsyncIterator[tuple[Gateway, httpx.AsyncClient, FakeClock]]:
    clock = FakeClock(100.0)
    raw: dict[str, Any] = {
        "gateway": {
            "routing": "round-robin",
            "admin": {"token": TOKEN},
            "signals": {"interval_ms": 50, "stale_after_ms": 1e9, "timeout_ms": 10_000},
            "health": {"interval_ms": 50, "timeout_ms": 10_000},
            "placement": {
                **placement,
                "interval_ms": 100,
                "load_wait_ms": 30_000,
                "host_memory_gb": 64,
            },
        },
        "backends": [{"name": "w0", "url": w.url}],
    }
    folder = repo / "llm"
    import yaml

    info = llm_model_info("llm", yaml.safe_load((folder / "model.yaml").read_text()), folder,
                          [pset])  # fmt: skip
    assert info is not None
    g = Gateway(
        parse_cluster(raw, Path(".")),
        clock=clock,
        placement_models={"llm": info},
        placement_devices=[DeviceSetup("w0", 8.0 * GIB, (), True)],
    )
    assert g.placement is not None
    g.placement_loop = False
    async with serving(g) as served, httpx.AsyncClient(base_url=served.url, timeout=60) as c:
        yield g, c, clock


def worker_state(w: BackgroundWorker) -> str:
    return w.worker.models.states["llm"].state


async def test_asleep_a_request_wakes_it_and_is_answered_no_switch_within_the_window(
    tmp_path: Path,
) -> None:
    pset, repo = placed_repo(tmp_path, {"llm": 0.5}, cold_ms=400, warm_ms=150)
    with start_worker(pset, repo, {"llm"}) as w:
        # Put it to sleep: weights in host memory, its engine off the device.
        async with httpx.AsyncClient(base_url=w.url) as wc:
            assert (await wc.post("/v2/repository/models/llm/unload")).status_code == 200
        assert worker_state(w) == "UNAVAILABLE"
        policy = {"policy": "cost-aware", "hold_s": 1, "idle_unload_s": 5, "idle_rps": 1.0,
                  "min_switch_s": 30}  # fmt: skip
        async with placed(w, pset, repo, policy) as (g, c, clock):
            pl = g.placement
            assert pl is not None
            await wait_for(lambda: g.registry.states["w0"].healthy)
            await wait_for(lambda: g.registry.states["w0"].engine_utilization is not None)
            body = {"model": "llm", "prompt": "hello", "max_tokens": 5}
            r = await c.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
            assert r.headers[BACKEND_HEADER] == "w0"
            assert r.json()["usage"]["completion_tokens"] == 5
            assert worker_state(w) == READY
            view = await c.get("/admin/placement", headers={"authorization": f"Bearer {TOKEN}"})
            counts = view.json()["counts"]
            assert counts["loads"] == 1
            assert counts["live_warm_loads"] == 1  # the worker woke it from host memory
            assert pl.controller.devices["w0"].models == {"llm": READY}
            # The tick reads the device's load as the worker's report gives it for placement
            # (engine_utilization), not the busy fraction the router reads.
            st = g.registry.states["w0"]
            assert st.engine_utilization is not None
            st.engine_utilization = 0.4321
            pl.tick()
            assert pl.controller.devices["w0"].utilization == 0.4321
            assert g.registry.router.view("w0").utilization != 0.4321
            # Idle from now on: past idle_unload_s and hold_s, but within min_switch_s of
            # its wake, so no tick puts it to sleep.
            for _ in range(10):
                clock.advance(2.5)
                pl.tick()
            assert pl.controller.devices["w0"].models == {"llm": READY}
            assert worker_state(w) == READY
            assert len(pl.controller.counts.switch_log) == 1
            # Past the window: the next tick puts it to sleep on the worker.
            clock.advance(6.0)
            pl.tick()
            await wait_for(lambda: worker_state(w) == "UNAVAILABLE")
            log = pl.controller.counts.switch_log
            assert [k for _, _, _, k in log][-1] != log[0][3]
            assert log[1][0] - log[0][0] >= 30.0
            st = w.worker.models.states["llm"]
            assert st.reason is not None and "asleep" in st.reason
