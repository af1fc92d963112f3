"""`evenserve up` with placement on two emulated workers (no supervision restarts): a model
loaded by hand on a worker (its own ``POST /v2/repository/models/{m}/load``) shows in the
gateway's ``/admin/placement`` after the next index read; a worker killed while it holds the
only copy of a model is lost, and the next request for that model is answered after the
model loads on the other worker. Counts and states, never times."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.e2e.test_placement_up import (
    BODY,
    TOKEN,
    _placement,
    free_port,
    running_up,
    write_models,
)

pytestmark = pytest.mark.e2e


def write_cluster(tmp: Path) -> Path:
    """m1 on d0, m2 on d1, m3 nowhere; 4 GB each, 10 GB devices: two fit on one."""
    dev = write_models(tmp, load_ms=200, weights_mb=4000)
    raw: dict[str, Any] = {
        "gateway": {
            "port": free_port(),
            "admin": {"token": TOKEN},
            "placement": {"policy": "lru", "interval_ms": 200, "load_wait_ms": 10_000},
        },
        "workers": {
            "repo": str(tmp / "repo"),
            "restart": False,  # a killed worker stays dead: the gateway must place around it
            "devices": [
                {"name": n, "device": dev, "models": [m], "memory_gb": 10, "port": free_port()}
                for n, m in (("d0", "m1"), ("d1", "m2"))
            ],
        },
    }
    cfg = tmp / "cluster.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    return cfg


def test_a_hand_loaded_model_is_adopted_and_a_killed_worker_s_model_moves(
    tmp_path: Path,
) -> None:
    with running_up(tmp_path, write_cluster(tmp_path)) as run:
        workers = {w["name"]: w for w in run.summary["workers"]}
        asyncio.run(_drive(run.summary["gateway"]["url"], workers))
    text = (tmp_path / "up.out").read_text()
    assert run.code == 0, text[-3000:]
    assert "worker d0 exited" in text and "not restarting" in text


async def _until(c: httpx.AsyncClient, cond: Any, what: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        view = await _placement(c)
        if cond(view):
            return view
        assert time.monotonic() < deadline, f"{what}: {view}"
        await asyncio.sleep(0.1)


async def _drive(url: str, workers: dict[str, dict[str, Any]]) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60, trust_env=False) as c:
        view = await _placement(c)
        assert view["devices"]["d0"]["residents"] == {"m1": "READY"}
        assert view["devices"]["d1"]["residents"] == {"m2": "READY"}
        # m3 loaded by hand on d1's worker: placement adopts it at the next index read.
        async with httpx.AsyncClient(base_url=workers["d1"]["url"], trust_env=False) as w:
            r = await w.post("/v2/repository/models/m3/load", json={})
            assert r.status_code == 200, r.text
        view = await _until(
            c, lambda v: "m3" in v["devices"]["d1"]["residents"], "m3 never adopted"
        )
        assert view["devices"]["d1"]["residents"] == {"m2": "READY", "m3": "READY"}
        assert view["counts"]["adopted"] == 1 and view["counts"]["loads"] == 0
        r = await c.post("/v2/models/m3/infer", json=BODY)
        assert r.status_code == 200 and r.headers["x-evenserve-backend"] == "d1"
        # d0's worker dies holding m1, its only copy: d0 is lost, m1 is a miss again.
        os.kill(workers["d0"]["pid"], signal.SIGKILL)
        view = await _until(c, lambda v: v["lost"] == ["d0"], "d0 never lost")
        assert view["devices"]["d0"]["residents"] == {}
        assert view["counts"]["lost"] == 1
        # d1 (8 of 10 GB) must make room: lru unloads one of m2, m3, then loads m1 there.
        r = await c.post("/v2/models/m1/infer", json=BODY)
        assert r.status_code == 200, r.text
        assert r.headers["x-evenserve-backend"] == "d1"
        view = await _placement(c)
        assert view["devices"]["d1"]["residents"].get("m1") == "READY"
        assert view["counts"]["loads"] == 1 and view["counts"]["evictions"] == 1
        metrics = (await c.get("/metrics")).text
        assert 'evenserve_gateway_devices_lost_total{backend="d0"} 1.0' in metrics
        assert 'evenserve_gateway_placement_adopted_total{backend="d1",model="m3"} 1.0' in metrics
        before = view["devices"]["d0"]["active_seconds"]
        await asyncio.sleep(0.5)
        assert (await _placement(c))["devices"]["d0"]["active_seconds"] == before
