"""The gateway's placement against fake v2 backends when the workers do what placement did
not ask: a worker that stops answering is lost (its models are placed again elsewhere, its
device-seconds stop), one that comes back is adopted as its index says, and a model loaded or
unloaded by hand on a worker shows in the controller's view after the next index read. The
fakes' readiness stands for a worker dying and coming back (the poller ejects a backend
whose load report says not ready, as it does one that refuses connections)."""

from __future__ import annotations

import asyncio

import httpx

from evenserve.core.wire import BACKEND_HEADER
from tests.integration.fake_v2 import FakeBackend
from tests.integration.test_gateway_placement import AUTH, cluster
from tests.integration.test_gateway_routing import infer_body, wait_for


async def test_a_lost_worker_s_model_is_loaded_elsewhere_and_adopted_when_it_is_back() -> None:
    f0 = FakeBackend("f0", ["a"], index={"a": "READY"})
    f1 = FakeBackend("f1", ["b"], index={"b": "READY"})
    async with cluster([(f0, True), (f1, True)], {"policy": "lru"}) as (g, client, clock):
        drv = g.placement
        assert drv is not None
        r = await client.post("/v2/models/a/infer", json=infer_body())
        assert r.status_code == 200 and r.headers[BACKEND_HEADER] == "f0"
        clock.advance(1.0)
        f0.ready = False  # the worker is gone (its probes eject it)
        await wait_for(lambda: drv.controller.lost == {"f0"})
        view = (await client.get("/admin/placement", headers=AUTH)).json()
        assert view["lost"] == ["f0"] and view["devices"]["f0"]["lost"] is True
        assert view["devices"]["f0"]["residents"] == {}
        assert view["counts"]["lost"] == 1
        frozen = drv.active_seconds()["f0"]
        clock.advance(5.0)
        assert drv.active_seconds()["f0"] == frozen  # a lost device stops counting
        # a had no other replica: a miss again; lru makes room on f1 and loads it there.
        r = await client.post("/v2/models/a/infer", json=infer_body())
        assert r.status_code == 200, r.text
        assert r.headers[BACKEND_HEADER] == "f1"
        assert f1.control_log == ["unload b", "load a"]
        assert f0.control_log == []
        # The worker comes back (restarted with its model a): device_ready, a adopted.
        f0.ready = True
        await wait_for(lambda: drv.controller.devices["f0"].models == {"a": "READY"})
        assert drv.controller.lost == frozenset() and drv.controller.devices["f0"].active
        view = (await client.get("/admin/placement", headers=AUTH)).json()
        assert view["lost"] == [] and view["counts"]["adopted"] == 1
        clock.advance(2.0)
        assert drv.active_seconds()["f0"] == frozen + 2.0  # it counts again
        text = (await client.get("/metrics")).text
        assert 'evenserve_gateway_devices_lost_total{backend="f0"} 1.0' in text
        assert 'evenserve_gateway_placement_adopted_total{backend="f0",model="a"} 1.0' in text


async def test_a_request_waiting_for_a_load_on_a_lost_worker_is_placed_again() -> None:
    # The load on f0 outlasts its ejection (a probe period) by far: it is still under way.
    f0 = FakeBackend("f0", [], index={}, load_delay_s=3.0)
    f1 = FakeBackend("f1", [], index={})
    async with cluster([(f0, True), (f1, True)], {"policy": "lru"}) as (g, client, _):
        drv = g.placement
        assert drv is not None
        pending = asyncio.create_task(client.post("/v2/models/a/infer", json=infer_body()))
        await wait_for(lambda: f0.control_log == ["load a"])  # loading on f0 (first by name)
        f0.ready = False
        r = await pending
        assert r.status_code == 200, r.text
        assert r.headers[BACKEND_HEADER] == "f1"
        assert f1.control_log == ["load a"]
        assert drv.controller.devices["f1"].models == {"a": "READY"}
        assert drv.controller.devices["f0"].models == {}
        assert not drv.ops.waiters


async def test_models_loaded_and_unloaded_by_hand_show_after_the_next_index_read() -> None:
    f0 = FakeBackend("f0", ["a"], index={"a": "READY"})
    f1 = FakeBackend("f1", [], index={})
    async with cluster([(f0, True), (f1, True)], {"policy": "lru"}) as (g, client, _):
        drv = g.placement
        assert drv is not None
        async with httpx.AsyncClient(base_url=g.registry.url("f1")) as worker:
            r = await worker.post("/v2/repository/models/b/load")  # by hand, on the worker
            assert r.status_code == 200
        await wait_for(lambda: drv.controller.devices["f1"].models == {"b": "READY"})
        view = (await client.get("/admin/placement", headers=AUTH)).json()
        assert view["devices"]["f1"]["residents"] == {"b": "READY"}
        assert view["counts"]["adopted"] == 1
        # Routed there, and placement knows it: no load for b.
        r = await client.post("/v2/models/b/infer", json=infer_body())
        assert r.status_code == 200 and r.headers[BACKEND_HEADER] == "f1"
        assert drv.counters.loads == {}
        # A second model by hand on f0 is over its 1 GiB (0.6 + 0.6): adopted, f0 full.
        async with httpx.AsyncClient(base_url=g.registry.url("f0")) as worker:
            assert (await worker.post("/v2/repository/models/c/load")).status_code == 200
        await wait_for(lambda: "c" in drv.controller.devices["f0"].models)
        d0 = drv.controller.devices["f0"]
        assert d0.free_bytes(drv.controller.models) == 0.0
        assert d0.used_bytes(drv.controller.models) > d0.memory_total_bytes
        # Unloaded by hand: it leaves the view.
        async with httpx.AsyncClient(base_url=g.registry.url("f0")) as worker:
            assert (await worker.post("/v2/repository/models/a/unload")).status_code == 200
        await wait_for(lambda: drv.controller.devices["f0"].models == {"c": "READY"})
        view = (await client.get("/admin/placement", headers=AUTH)).json()
        assert view["counts"]["dropped"] == 1 and view["counts"]["adopted"] == 2
        text = (await client.get("/metrics")).text
        assert 'evenserve_gateway_placement_dropped_total{backend="f0",model="a"} 1.0' in text


async def test_a_lost_worker_s_model_that_fits_nowhere_else_is_503_with_retry_after() -> None:
    f0 = FakeBackend("f0", ["a"], index={"a": "READY"})
    f1 = FakeBackend("f1", ["b"], index={"b": "READY"})
    async with cluster([(f0, True), (f1, True)], {"policy": "static"}) as (g, client, _):
        drv = g.placement
        assert drv is not None
        f0.ready = False
        await wait_for(lambda: drv.controller.lost == {"f0"})
        # static never evicts, and f1 (1 GiB) is full with b: a cannot be placed now.
        r = await client.post("/v2/models/a/infer", json=infer_body())
        assert r.status_code == 503
        assert r.headers["retry-after"] == "1"
        assert "'a'" in r.json()["error"] and "no device can hold it" in r.json()["error"]
        assert f1.control_log == []
