"""The gateway's placement driver against fake v2 backends on loopback: the miss path loads a
model (after the unloads that make room) and answers from there, a miss nobody can hold is
503 with Retry-After, rebalance and scale actions are carried out on tick, device-seconds
are counted on the gateway's (fake) clock. Ticks are driven directly."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from evenserve.cluster.file import parse_cluster
from evenserve.core.clock import FakeClock
from evenserve.core.wire import BACKEND_HEADER
from evenserve.gateway.placement_catalogue import DeviceSetup
from evenserve.gateway.server import Gateway
from evenserve.policy.placement import ModelInfo
from tests.integration.fake_v2 import FakeBackend, serving
from tests.integration.test_gateway_routing import TOKEN, infer_body, wait_for

GIB = 1024.0**3
AUTH = {"authorization": f"Bearer {TOKEN}"}


def info(name: str, gib: float = 0.6) -> ModelInfo:
    return ModelInfo(name, gib * GIB, 0.05, 0.01, batch_s=1.0, max_batch_size=1)


@contextlib.asynccontextmanager
async def cluster(
    backends: list[tuple[FakeBackend, bool]],
    placement: Any,
    autoscaling: Any = None,
    models: tuple[str, ...] = ("a", "b", "c"),
) -> AsyncIterator[tuple[Gateway, httpx.AsyncClient, FakeClock]]:
    """Each backend a 1 GiB device (active or a spare); models of 0.6 GiB: one fits."""
    clock = FakeClock(100.0)
    async with contextlib.AsyncExitStack() as stack:
        specs: list[dict[str, Any]] = []
        for fb, _ in backends:
            s = await stack.enter_async_context(serving(fb.app()))
            spec: dict[str, Any] = {"name": fb.name, "url": s.url}
            if fb.models:
                spec["models"] = list(fb.models)
            specs.append(spec)
        raw: dict[str, Any] = {
            "gateway": {
                "routing": "round-robin",
                "admin": {"token": TOKEN},
                "signals": {"interval_ms": 50, "stale_after_ms": 1e9, "timeout_ms": 10_000},
                "health": {"interval_ms": 50, "timeout_ms": 10_000},
                "placement": {**placement, "interval_ms": 100, "load_wait_ms": 30_000},
            },
            "backends": specs,
        }
        if autoscaling is not None:
            raw["gateway"]["autoscaling"] = autoscaling
        devices = [
            DeviceSetup(fb.name, 1.0 * GIB, tuple(fb.models), active) for fb, active in backends
        ]
        g = Gateway(
            parse_cluster(raw, Path(".")),
            clock=clock,
            placement_models={m: info(m) for m in models},
            placement_devices=devices,
        )
        assert g.placement is not None
        g.placement_loop = False  # the test drives the ticks
        served = await stack.enter_async_context(serving(g))
        client = await stack.enter_async_context(httpx.AsyncClient(base_url=served.url, timeout=60))
        yield g, client, clock


async def test_a_miss_unloads_then_loads_and_is_answered_from_the_new_host() -> None:
    f0 = FakeBackend("f0", ["a"], index={"a": "READY"}, load_delay_s=0.2)
    f1 = FakeBackend("f1", ["b"], index={"b": "READY"}, load_delay_s=0.2)
    async with cluster([(f0, True), (f1, True)], {"policy": "lru"}) as (_g, client, clock):
        assert (await client.post("/v2/models/a/infer", json=infer_body())).status_code == 200
        clock.advance(1.0)
        assert (await client.post("/v2/models/b/infer", json=infer_body())).status_code == 200
        clock.advance(1.0)
        # c is in the catalogue, resident nowhere: a (used longest ago) makes room on f0.
        r = await client.post("/v2/models/c/infer", json=infer_body())
        assert r.status_code == 200, r.text
        assert r.headers[BACKEND_HEADER] == "f0"
        assert f0.control_log == ["unload a", "load c"]
        assert f1.control_log == []
        view = (await client.get("/admin/placement", headers=AUTH)).json()
        assert view["devices"]["f0"]["residents"] == {"c": "READY"}
        assert view["counts"]["loads"] == 1 and view["counts"]["evictions"] == 1
        # The controller planned c cold; the worker's reply says where it came from.
        assert view["counts"]["cold_loads"] == 1 and view["counts"]["warm_loads"] == 0
        assert (view["counts"]["live_cold_loads"], view["counts"]["live_warm_loads"]) == (1, 0)
        text = (await client.get("/metrics")).text
        assert 'evenserve_gateway_model_loads_total{backend="f0",model="c"} 1.0' in text
        assert 'evenserve_gateway_evictions_total{backend="f0",model="a"} 1.0' in text
        # c is READY on f0 now: the next request goes there without any model control.
        r = await client.post("/v2/models/c/infer", json=infer_body())
        assert r.status_code == 200 and r.headers[BACKEND_HEADER] == "f0"
        assert f0.control_log == ["unload a", "load c"]


async def test_requests_for_a_loading_model_wait_for_that_one_load() -> None:
    import asyncio

    f0 = FakeBackend("f0", [], index={}, load_delay_s=0.3)
    async with cluster([(f0, True)], {"policy": "static"}) as (_g, client, _):
        rs = await asyncio.gather(
            *(client.post("/v2/models/a/infer", json=infer_body()) for _ in range(3))
        )
        assert [r.status_code for r in rs] == [200, 200, 200]
        assert f0.control_log == ["load a"]


async def test_a_miss_no_device_can_hold_is_503_with_retry_after_naming_the_model() -> None:
    f0 = FakeBackend("f0", ["a"], index={"a": "READY"})
    f1 = FakeBackend("f1", ["b"], index={"b": "READY"})
    async with cluster([(f0, True), (f1, True)], {"policy": "static"}) as (_g, client, _):
        r = await client.post("/v2/models/c/infer", json=infer_body())
        assert r.status_code == 503
        assert r.headers["retry-after"] == "1"
        assert "'c'" in r.json()["error"] and "no device can hold it" in r.json()["error"]
        assert f0.control_log == [] and f1.control_log == []
        # A model outside the catalogue is still unknown.
        assert (await client.post("/v2/models/zz/infer", json=infer_body())).status_code == 404


async def test_a_refused_load_answers_the_waiting_request_with_503() -> None:
    f0 = FakeBackend("f0", [], index={}, load_status=400)
    async with cluster([(f0, True)], {"policy": "static"}) as (g, client, _):
        r = await client.post("/v2/models/a/infer", json=infer_body())
        assert r.status_code == 503 and "load of model 'a' on f0 failed" in r.json()["error"]
        assert g.placement is not None
        assert g.placement.controller.devices["f0"].models == {}


async def test_rebalance_actions_are_carried_out_on_tick() -> None:
    f0 = FakeBackend("f0", ["a"], index={"a": "READY"})
    async with cluster([(f0, True)], {"policy": "lru", "idle_evict_s": 5.0}) as (g, client, clock):
        assert g.placement is not None
        assert (await client.post("/v2/models/a/infer", json=infer_body())).status_code == 200
        clock.advance(10.0)
        g.placement.tick()
        await wait_for(lambda: f0.control_log == ["unload a"])
        await wait_for(lambda: g.placement is not None and not g.placement.ops.tasks)
        assert g.placement.controller.devices["f0"].models == {}
        assert g.registry.states["f0"].index == {}


async def test_a_burst_scales_up_a_spare_and_a_quiet_spell_drains_and_stops_it() -> None:
    f0 = FakeBackend("f0", ["a"], index={"a": "READY"})
    f1 = FakeBackend("f1", [], index={})
    scaler = {"policy": "demand", "up_after_s": 0.0, "quiet_s": 0.0, "target_utilization": 0.5}
    async with cluster([(f0, True), (f1, False)], {"policy": "static"}, scaler) as (
        g,
        client,
        clock,
    ):
        drv = g.placement
        assert drv is not None
        drv.scaling.wall = lambda: 1.7e9  # the ScaleUp's wall time, for a bench's burst clock
        # The spare is held out of routing: its probes do not admit it.
        await g.poller.probe_load(g.registry.states["f1"])
        assert not g.registry.is_healthy("f1")
        # A burst of a (capacity 1 req/s per replica): 20 requests in 2 s.
        t_first = clock.now()
        for _ in range(20):
            drv.arrival("a")
            clock.advance(0.1)
        drv.tick()
        assert drv.scale_requests() == [{"device": "f1", "action": "start"}]
        assert drv.counters.scale_decisions["up"] == 1
        assert drv.counters.last_scale_up_s is not None
        assert abs(drv.counters.last_scale_up_s - (clock.now() - t_first)) < 1e-9
        view = await client.get("/admin/placement", headers=AUTH)
        assert view.json()["scale_ups_unix_s"] == [1.7e9]
        # The decision log, in wall time: the ScaleUp and the demand behind it.
        up = view.json()["decisions"][-1]
        assert up[:5] == [1.7e9, "autoscale", "up", "", "f1"] and up[5] > 1.0 and len(up) == 7
        assert view.json()["switches"] == []  # no model changed device yet
        # The controller's clock in wall time: its next autoscaler check is ahead.
        c = view.json()["clock"]
        assert c["started_unix_s"] is not None and c["started_unix_s"] <= 1.7e9
        assert c["next_scale_unix_s"] > 1.7e9 and c["next_rebalance_unix_s"] > 1.7e9
        # The launcher started it; its first good probe admits it: device_ready.
        await g.poller.probe_load(g.registry.states["f1"])
        assert g.registry.is_healthy("f1")
        assert drv.controller.devices["f1"].active
        assert drv.scale_requests() == []
        up_at = clock.now()
        # Quiet: the demand decays; the autoscaler turns the least-loaded device off.
        clock.advance(600.0)
        drv.tick()  # the quiet clock starts
        clock.advance(1.0)
        drv.tick()
        down = [n for n, d in drv.controller.devices.items() if not d.active]
        assert len(down) == 1
        (dev,) = down
        assert not g.registry.is_healthy(dev)  # held out of routing at once
        assert drv.scale_requests() == [{"device": dev, "action": "stop"}]
        r = await client.post(
            "/admin/scale", headers=AUTH, json={"device": dev, "event": "stopped"}
        )
        assert r.status_code == 200, r.text
        assert drv.scale_requests() == []
        secs = drv.active_seconds()
        # f0 was on from the start (t=100); f1 from its ScaleUp; the one stopped stops counting.
        clock.advance(50.0)
        later = drv.active_seconds()
        assert later[dev] == secs[dev]
        other = "f0" if dev == "f1" else "f1"
        assert later[other] == secs[other] + 50.0
        assert secs["f0"] == clock.now() - 50.0 - 100.0 or dev == "f0"
        assert up_at <= clock.now()
        text = (await client.get("/metrics")).text
        assert 'evenserve_gateway_scale_decisions_total{direction="up"} 1.0' in text
        assert 'evenserve_gateway_scale_decisions_total{direction="down"} 1.0' in text
        assert "evenserve_gateway_device_active_seconds_total" in text
        # A wrong report is refused naming the cause.
        r = await client.post(
            "/admin/scale", headers=AUTH, json={"device": "nope", "event": "stopped"}
        )
        assert r.status_code == 400 and "nope" in r.json()["error"]
        assert (await client.get("/admin/scale")).status_code == 401


async def test_a_scaled_down_device_is_stopped_only_once_its_requests_are_answered() -> None:
    import asyncio

    gate = asyncio.Event()
    f0 = FakeBackend("f0", ["a"], index={"a": "READY"}, gate=gate)
    f1 = FakeBackend("f1", ["a"], index={"a": "READY"}, gate=gate)
    scaler = {"policy": "demand", "quiet_s": 0.0}
    async with cluster([(f0, True), (f1, True)], {"policy": "static"}, scaler) as (
        g,
        client,
        clock,
    ):
        drv = g.placement
        assert drv is not None
        held = [
            asyncio.create_task(client.post("/v2/models/a/infer", json=infer_body()))
            for _ in range(2)
        ]
        await wait_for(lambda: f0.in_flight == 1 and f1.in_flight == 1)
        clock.advance(600.0)
        drv.tick()
        clock.advance(1.0)
        drv.tick()
        assert drv.counters.scale_decisions["down"] == 1
        assert not drv.controller.devices["f1"].active
        assert not g.registry.is_healthy("f1")
        # Its request is still running: not stopped yet; new requests go to f0 only.
        assert drv.scale_requests() == []
        gate.set()
        rs = await asyncio.gather(*held)
        assert sorted(r.headers[BACKEND_HEADER] for r in rs) == ["f0", "f1"]
        assert drv.scale_requests() == [{"device": "f1", "action": "stop"}]
        r = await client.post("/v2/models/a/infer", json=infer_body())
        assert r.status_code == 200 and r.headers[BACKEND_HEADER] == "f0"


def test_the_catalogue_comes_from_the_profiles_with_the_scenario_s_load_times(
    tmp_path: Path,
) -> None:
    from evenserve.core.profile import LatencyProfile
    from evenserve.core.scenario import ModelSpec
    from evenserve.gateway.placement_catalogue import cluster_setup

    for m in ("a", "b"):
        (tmp_path / "repo" / m).mkdir(parents=True)
        (tmp_path / "repo" / m / "model.yaml").write_text("runtime: emulated\n")
    raw = {
        "gateway": {"placement": "lru", "autoscaling": "demand"},
        "workers": {
            "repo": "repo",
            "devices": [
                {"name": "g0", "device": "cpu", "models": ["a"], "memory_gb": 8},
                {"name": "g1", "device": "cpu", "active": False},
            ],
        },
    }
    prof = LatencyProfile.from_points("a", {1: 2.0, 8: 10.0}, weights_mb=4000)
    infos, devices = cluster_setup(parse_cluster(raw, tmp_path), {"set": {"a": prof}})
    assert sorted(infos) == ["a", "b"]
    a = infos["a"]
    cold, warm = ModelSpec(slo_ms=50.0).load_times_s(prof.weights_bytes)
    assert (a.weights_bytes, a.cold_load_s, a.warm_load_s) == (prof.weights_bytes, cold, warm)
    assert a.max_batch_size == 8 and a.batch_s == prof.latency_s(8)
    assert infos["b"].weights_bytes == 0.0
    assert devices == [
        DeviceSetup("g0", 8 * GIB, ("a",), True),
        DeviceSetup("g1", 24 * GIB, (), False),
    ]


async def test_without_placement_nothing_of_it_runs_and_its_admin_views_say_so() -> None:
    f0 = FakeBackend("f0", ["a"], index={"a": "READY"})
    async with serving(f0.app()) as s:
        raw = {
            "gateway": {"routing": "round-robin", "admin": {"token": TOKEN}},
            "backends": [{"name": "f0", "url": s.url, "models": ["a"]}],
        }
        g = Gateway(parse_cluster(raw, Path(".")))
        assert g.placement is None and g.dispatcher.placement is None
        assert g.registry.catalogue == frozenset() and g.registry.index_override is None
        async with serving(g) as served, httpx.AsyncClient(base_url=served.url) as client:
            r = await client.get("/admin/placement", headers=AUTH)
            assert r.status_code == 404 and "placement is off" in r.json()["error"]
            assert (await client.post("/v2/models/zz/infer", json=infer_body())).status_code == 404
            text = (await client.get("/metrics")).text
            assert "evenserve_gateway_model_loads" not in text
