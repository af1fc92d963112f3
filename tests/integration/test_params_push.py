"""Versioned parameters pushed live: an in-process gateway in front of two emulated workers
(and, for the failure case, a fake backend without the admin API) on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from evenserve.cluster.file import parse_cluster
from evenserve.gateway.server import Gateway
from evenserve.runtime.device import parse_device
from evenserve.worker.driver import BatchResult, DriverObserver, RunningBatch
from evenserve.worker.http_api import create_app
from evenserve.worker.repository import load_repository
from evenserve.worker.service import WorkerOptions, WorkerService

from .fake_v2 import FakeBackend, serving
from .test_gateway_routing import TOKEN, wait_for
from .worker_repo import MODELS, write_repo

AUTH = {"authorization": f"Bearer {TOKEN}"}
BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1.0] * 4}]}
SMALL = {"policy": "fixed-window", "max_batch_size": 2, "max_batch_delay_ms": 20}


@dataclass
class Sizes(DriverObserver):
    items: list[int] = field(default_factory=list)

    def batch_started(self, batch: RunningBatch, now_s: float) -> None:
        self.items.append(batch.items)

    def batch_finished(self, batch: RunningBatch, result: BatchResult, now_s: float) -> None:
        pass


@dataclass
class Cluster:
    gateway: Gateway
    client: httpx.AsyncClient
    workers: dict[str, str]  # name -> url
    services: dict[str, WorkerService]
    sizes: dict[str, Sizes]


def service_for(repo: Path, token: str | None) -> WorkerService:
    svc = WorkerService(
        load_repository(repo), WorkerOptions(device=parse_device("cpu"), admin_token=token)
    )
    svc.load()
    return svc


@contextlib.asynccontextmanager
async def cluster(
    tmp_path: Path, *, fake: FakeBackend | None = None, models: tuple[str, ...] = ("em",)
) -> AsyncIterator[Cluster]:
    repo = write_repo(tmp_path, {m: MODELS[m] for m in models})
    async with contextlib.AsyncExitStack() as stack:
        services: dict[str, WorkerService] = {}
        urls: dict[str, str] = {}
        sizes: dict[str, Sizes] = {}
        for name in ("w1", "w2"):
            svc = services[name] = service_for(repo, TOKEN)
            sizes[name] = Sizes()
            svc.add_observer(sizes[name])
            urls[name] = (await stack.enter_async_context(serving(create_app(svc)))).url
        backends: list[dict[str, Any]] = [
            {"name": n, "url": u, "models": list(models)} for n, u in urls.items()
        ]
        if fake is not None:
            s = await stack.enter_async_context(serving(fake.app()))
            backends.append({"name": fake.name, "url": s.url, "models": fake.models})
        raw = {
            "gateway": {
                "routing": "round-robin",
                "admin": {"token": TOKEN},
                "signals": {"interval_ms": 50, "stale_after_ms": 10_000, "timeout_ms": 10_000},
                "health": {"interval_ms": 50, "timeout_ms": 10_000},
            },
            "backends": backends,
        }
        g = Gateway(parse_cluster(raw, Path(".")))
        served = await stack.enter_async_context(serving(g))
        client = await stack.enter_async_context(httpx.AsyncClient(base_url=served.url, timeout=60))
        await wait_for(lambda: all(st.healthy for st in g.registry.states.values()))
        yield Cluster(g, client, urls, services, sizes)


async def test_a_put_changes_routing_on_the_gateway_and_batching_on_the_workers(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path) as c:
        got = (await c.client.get("/admin/params", headers=AUTH)).json()
        assert got["version"] == 1 and got["params"]["routing"]["policy"] == "round-robin"
        assert got["history"][0]["source"] == "startup"
        body = {
            "expected_version": 1,
            "note": "tuned",
            "params": {
                "routing": {"policy": "least-connections"},
                "batching_per_model": {"em": SMALL},
                "class_headroom": 0.8,
            },
        }
        r = await c.client.put("/admin/params", json=body, headers=AUTH)
        assert r.status_code == 200, r.text
        reply = r.json()
        assert reply["version"] == 2 and reply["previous_version"] == 1
        assert {n: b["ok"] for n, b in reply["backends"].items()} == {"w1": True, "w2": True}
        assert reply["backends"]["w1"]["version"] == 2
        # The gateway's router runs the new policy; /admin/routing says so.
        assert type(c.gateway.registry.router.policy).__name__ != "RoundRobin"
        routing = (await c.client.get("/admin/routing", headers=AUTH)).json()
        assert routing["policy"] == "least-connections" and routing["changes"] == 1
        # Each worker batches em with the new spec (GET, its scheduler, its batches).
        async with httpx.AsyncClient(timeout=60) as direct:
            w = (await direct.get(c.workers["w1"] + "/admin/params", headers=AUTH)).json()
        assert w["version"] == 2 and "routing" not in w["params"]
        assert w["params"]["batching_per_model"]["em"] == {**SMALL}
        assert w["params"]["class_headroom"] == 0.8
        for svc in c.services.values():
            assert svc.driver.sched.max_batch_size == {"em": 2}
            assert svc.driver.sched.queues.class_headroom == 0.8
        for s in c.sizes.values():
            s.items.clear()
        answers = await asyncio.gather(
            *(c.client.post("/v2/models/em/infer", json=BODY) for _ in range(12))
        )
        assert all(a.status_code == 200 for a in answers)
        seen = [k for s in c.sizes.values() for k in s.items]
        assert sum(seen) == 12 and max(seen) <= 2
        # Partial: only the note and one key; the rest is kept.
        r = await c.client.put(
            "/admin/params", json={"params": {"class_headroom": None}}, headers=AUTH
        )
        assert r.status_code == 200 and r.json()["version"] == 3
        p = r.json()["params"]
        assert p["routing"]["policy"] == "least-connections"
        assert p["batching_per_model"]["em"] == SMALL
        assert p["class_headroom"] is None
        # Stale version: 409 naming the current one; nothing changes.
        r = await c.client.put(
            "/admin/params",
            json={"expected_version": 1, "params": {"class_headroom": 0.5}},
            headers=AUTH,
        )
        assert r.status_code == 409 and r.json()["version"] == 3
        # Bad input names the field.
        bad = {
            "params": {
                "batching_per_model": {"em": {"policy": "fixed-window", "max_batch_size": 0}}
            }
        }
        r = await c.client.put("/admin/params", json=bad, headers=AUTH)
        assert r.status_code == 400
        assert "params.batching_per_model.em.max_batch_size" in r.json()["error"]
        # Rollback to 1: routing and each worker's own startup params come back.
        r = await c.client.post(
            "/admin/params/rollback", json={"to_version": 1, "expected_version": 3}, headers=AUTH
        )
        assert r.status_code == 200, r.text
        assert r.json()["version"] == 4 and r.json()["rolled_back_to"] == 1
        assert (await c.client.get("/admin/routing", headers=AUTH)).json()["policy"] == (
            "round-robin"
        )
        for svc in c.services.values():
            assert svc.driver.sched.max_batch_size == {"em": 16}
            assert svc.batching_specs["em"]["max_batch_delay_ms"] == 2
        got = (await c.client.get("/admin/params", headers=AUTH)).json()
        assert got["params"] == got["history"][0]["params"]
        assert got["backends"] == {"w1": 4, "w2": 4}
        r = await c.client.post("/admin/params/rollback", json={"to_version": 99}, headers=AUTH)
        assert r.status_code == 404
        # PUT /admin/routing is a version too.
        r = await c.client.put("/admin/routing", json={"policy": "least-connections"}, headers=AUTH)
        assert r.status_code == 200
        got = (await c.client.get("/admin/params", headers=AUTH)).json()
        assert got["version"] == 5 and got["history"][-1]["source"] == "routing"
        assert [h["version"] for h in got["history"]] == [1, 2, 3, 4, 5]


def _strict_json(data: bytes) -> Any:
    """JSON as RFC 8259 has it: a bare Infinity or NaN fails the test."""

    def refuse(const: str) -> Any:
        raise AssertionError(f"bare {const} in {data[:300]!r}")

    return json.loads(data, parse_constant=refuse)


#: (body as sent, what the 400's message names): the probes of the hardening list.
BAD_PUTS = [
    (
        b'{"params": {"routing": {"policy": "queue-aware", "queue_weight": 1e400}}}',
        "params.routing.queue_weight: inf is not a finite number",
    ),
    (
        b'{"params": {"batching_per_model": {"em": {"policy": "fixed-window", '
        b'"max_batch_delay_ms": 1e400}}}}',
        "params.batching_per_model.em.max_batch_delay_ms: inf is not a finite number",
    ),
    (b'{"params": {"class_headroom": NaN}}', "params.class_headroom: nan is not a finite"),
    (b'{"params": {"class_headroom": -Infinity}}', "params.class_headroom: -inf is not"),
    (b"", "body: empty"),
    (b"  ", "body: empty"),
    (b"{}", "params: required"),
    (b'{"params": {}}', "params: empty, nothing to change"),
    (b'{"parms": {"class_headroom": 0.5}}', "parms: unknown field"),
    (b'{"params": {"class_headroom": 0.5}, "force": true}', "force: unknown field"),
    (
        b'{"params": {"batching_per_model": {"nope": {"policy": "none"}}}}',
        "params.batching_per_model.nope:",
    ),
]


async def test_bad_changes_are_400_naming_the_field_and_make_no_version(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c, httpx.AsyncClient(timeout=60) as direct:
        ok = await c.client.put(
            "/admin/params", json={"params": {"class_headroom": 0.5}}, headers=AUTH
        )
        assert ok.status_code == 200, ok.text
        for url in ("", c.workers["w1"]):  # the gateway, then a worker directly
            got = await direct.get(f"{url or c.client.base_url}/admin/params", headers=AUTH)
            before = _strict_json(got.content)
            for raw, names in BAD_PUTS:
                r = await direct.put(
                    f"{url or c.client.base_url}/admin/params",
                    content=raw,
                    headers={**AUTH, "content-type": "application/json"},
                )
                assert r.status_code == 400, (url, raw, r.text)
                assert names in _strict_json(r.content)["error"], (url, raw, r.text)
            r = await direct.post(
                f"{url or c.client.base_url}/admin/params/rollback",
                content=b'{"to_version": 1, "force": true}',
                headers=AUTH,
            )
            assert r.status_code == 400 and "force: unknown field" in r.json()["error"]
            got = await direct.get(f"{url or c.client.base_url}/admin/params", headers=AUTH)
            after = _strict_json(got.content)
            assert after["version"] == before["version"] and after["history"] == before["history"]
        # The gateway names the models its backends host.
        r = await c.client.put("/admin/params", content=BAD_PUTS[-1][0], headers=AUTH)
        assert "no backend hosts model 'nope' (models: em)" in r.json()["error"]
        for svc in c.services.values():  # nothing reached the workers' schedulers
            assert svc.driver.sched.max_batch_size == {"em": 16}
            assert svc.driver.sched.queues.class_headroom == 0.5


async def test_learn_profiles_fans_out_to_every_worker_and_rolls_back(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        for svc in c.services.values():
            assert svc.driver.sched.learn_profiles is False
        r = await c.client.put(
            "/admin/params", json={"params": {"learn_profiles": True}}, headers=AUTH
        )
        assert r.status_code == 200, r.text
        assert r.json()["params"]["learn_profiles"] is True
        assert {n: b["ok"] for n, b in r.json()["backends"].items()} == {"w1": True, "w2": True}
        for svc in c.services.values():
            assert svc.driver.sched.learn_profiles is True
            assert svc.driver.sched.learned()[0] == {"em": 1.0}
        async with httpx.AsyncClient(timeout=60) as direct:
            w = (await direct.get(c.workers["w1"] + "/admin/params", headers=AUTH)).json()
        assert w["params"]["learn_profiles"] is True and w["live"]["learn_profiles"] is True
        answers = await asyncio.gather(
            *(c.client.post("/v2/models/em/infer", json=BODY) for _ in range(6))
        )
        assert all(a.status_code == 200 for a in answers)
        # Null: as the workers were started (off here).
        r = await c.client.put(
            "/admin/params", json={"params": {"learn_profiles": None}}, headers=AUTH
        )
        assert r.status_code == 200, r.text
        for svc in c.services.values():
            assert svc.driver.sched.learn_profiles is False
            assert svc.driver.sched.learned() == ({}, {})
        async with httpx.AsyncClient(timeout=60) as direct:
            w = (await direct.get(c.workers["w2"] + "/admin/params", headers=AUTH)).json()
        assert w["params"]["learn_profiles"] is None and w["live"]["learn_profiles"] is False
        # Rollback to 2: on again on every worker.
        r = await c.client.post("/admin/params/rollback", json={"to_version": 2}, headers=AUTH)
        assert r.status_code == 200, r.text
        for svc in c.services.values():
            assert svc.driver.sched.learn_profiles is True
        r = await c.client.put(
            "/admin/params", json={"params": {"learn_profiles": "on"}}, headers=AUTH
        )
        assert r.status_code == 400 and "params.learn_profiles" in r.json()["error"]


async def test_a_failed_backend_is_a_502_and_the_others_are_reverted(tmp_path: Path) -> None:
    fake = FakeBackend("f", ["em"])  # answers 404 on /admin/params: it has no admin API
    async with cluster(tmp_path, fake=fake) as c:
        body = {"params": {"routing": "least-connections", "batching_per_model": {"em": SMALL}}}
        r = await c.client.put("/admin/params", json=body, headers=AUTH)
        assert r.status_code == 502, r.text
        reply = r.json()
        assert reply["failed"] == ["f"] and "f" in reply["error"] and reply["version"] == 1
        assert reply["backends"]["w1"]["reverted"] is True
        assert reply["backends"]["w2"]["reverted"] is True
        # The gateway kept its version and its routing; the workers are back where they were.
        got = (await c.client.get("/admin/params", headers=AUTH)).json()
        assert got["version"] == 1 and len(got["history"]) == 1
        assert c.gateway.admin.routing_spec["policy"] == "round-robin"
        for svc in c.services.values():
            assert svc.driver.sched.max_batch_size == {"em": 16}
        async with httpx.AsyncClient(timeout=60) as direct:
            w = (await direct.get(c.workers["w1"] + "/admin/params", headers=AUTH)).json()
        assert w["version"] == 3 and w["history"][-1]["source"] == "rollback"
        assert w["params"] == w["history"][0]["params"]
        # A change that does not concern the failing backend's models (routing) goes through.
        r = await c.client.put(
            "/admin/params", json={"params": {"routing": "least-connections"}}, headers=AUTH
        )
        assert r.status_code == 200 and r.json()["backends"]["f"] == {
            "ok": True,
            "skipped": "nothing to change",
        }


async def test_token_rules_on_the_gateway_and_the_worker(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        assert (await c.client.get("/admin/params")).status_code == 401
        bad = {"authorization": "Bearer wrong-token-000000"}
        assert (await c.client.put("/admin/params", json={}, headers=bad)).status_code == 401
        r = await c.client.post("/admin/params/rollback", json={"to_version": 1})
        assert r.status_code == 401
        async with httpx.AsyncClient(base_url=c.workers["w1"], timeout=60) as w:
            assert (await w.get("/admin/params")).status_code == 401
            assert (await w.get("/admin/params", headers=bad)).status_code == 401
            r = await w.put(
                "/admin/params",
                json={"params": {"batching_per_model": {"nope": "none"}}},
                headers=AUTH,
            )
            assert r.status_code == 400 and "params.batching_per_model.nope" in r.json()["error"]
            r = await w.put(
                "/admin/params",
                json={
                    "params": {
                        "batching_per_model": {
                            "em": {"policy": "fixed-window", "max_batch_size": 64}
                        }
                    }
                },
                headers=AUTH,
            )
            assert r.status_code == 400
            assert "params.batching_per_model.em.max_batch_size" in r.json()["error"]
    # Without a token the worker's admin API is off.
    repo = write_repo(tmp_path / "off", {"em": MODELS["em"]})
    svc = service_for(repo, None)
    async with (
        serving(create_app(svc)) as s,
        httpx.AsyncClient(base_url=s.url, timeout=60) as w,
    ):
        r = await w.get("/admin/params", headers=AUTH)
        assert r.status_code == 404 and "admin API is off" in r.json()["error"]


@pytest.mark.parametrize("token", ["file", "env"])
def test_the_worker_reads_its_token_from_a_file_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, token: str
) -> None:
    from evenserve.cli.worker_cmd import worker_admin_token

    monkeypatch.delenv("EVENSERVE_ADMIN_TOKEN", raising=False)
    assert worker_admin_token(None) is None
    if token == "file":
        f = tmp_path / "t"
        f.write_text("from-a-file-123456\n")
        assert worker_admin_token(f) == "from-a-file-123456"
    else:
        monkeypatch.setenv("EVENSERVE_ADMIN_TOKEN", "from-the-env-123456")
        assert worker_admin_token(None) == "from-the-env-123456"
