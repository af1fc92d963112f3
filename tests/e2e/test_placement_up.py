"""`evenserve up` with placement and autoscaling on a tiny emulated cluster (2 devices + 1
spare, models that fill one device each, 300 ms loads), as subprocesses: a request for a
model resident nowhere is answered after its load, a burst turns the spare on, and the quiet
after it drains one device and stops it. Counts and states, never times."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e
EVENSERVE = [sys.executable, "-c", "from evenserve.cli.main import main; main()"]
TOKEN = "placement-e2e-token-0123"
BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_models(
    tmp: Path,
    *,
    load_ms: float,
    weights_mb: float,
    warm_load_ms: float | None = None,
    batched: bool = True,
) -> str:
    """Emulated models m1, m2, m3 under ``tmp/repo`` with profiles of ``weights_mb`` under
    ``tmp/tiny``; returns the device string that reads those profiles. ``batched``: batches
    of up to 8 (2 ms window), else batches of one."""
    for m in ("m1", "m2", "m3"):
        (tmp / "repo" / m).mkdir(parents=True)
        emulated: dict[str, float] = {"load_ms": load_ms}
        if warm_load_ms is not None:
            emulated["warm_load_ms"] = warm_load_ms
        cfg: dict[str, Any] = {
            "runtime": "emulated",
            "max_batch_size": 8 if batched else 1,
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [2]}],
            "emulated": emulated,
        }
        if batched:
            cfg["batching"] = {
                "policy": "fixed-window",
                "max_batch_size": 8,
                "max_batch_delay_ms": 2,
            }
        (tmp / "repo" / m / "model.yaml").write_text(yaml.safe_dump(cfg))
        points = [{"batch": 1, "latency_ms": 2.0}]
        if batched:
            points.append({"batch": 8, "latency_ms": 8.0})
        (tmp / "tiny").mkdir(exist_ok=True)
        (tmp / "tiny" / f"{m}.yaml").write_text(
            yaml.safe_dump(
                {
                    "model": m,
                    "device": "tiny",
                    "runtime": "emulated",
                    "precision": "fp16",
                    "source": "test",
                    "weights_mb": weights_mb,
                    "points": points,
                }
            )
        )
    return f"emulated:{tmp / 'tiny'}"


def write_cluster(tmp: Path) -> Path:
    dev = write_models(tmp, load_ms=300, weights_mb=6000)
    raw: dict[str, Any] = {
        "gateway": {
            "port": free_port(),
            "admin": {"token": TOKEN},
            "placement": {"policy": "lru", "interval_ms": 200, "load_wait_ms": 10_000},
            # Capacity 1000 req/s per replica: a target of 1 % makes a burst of a few hundred
            # requests ask for a third device.
            "autoscaling": {
                "policy": "demand",
                "up_after_s": 0,
                "target_utilization": 0.01,
                "quiet_s": 1,
                "min_devices": 2,
            },
        },
        "workers": {
            "repo": str(tmp / "repo"),
            "devices": [
                {
                    "name": "d0",
                    "device": dev,
                    "models": ["m1"],
                    "memory_gb": 10,
                    "port": free_port(),
                },
                {
                    "name": "d1",
                    "device": dev,
                    "models": ["m2"],
                    "memory_gb": 10,
                    "port": free_port(),
                },
                {
                    "name": "d2",
                    "device": dev,
                    "memory_gb": 10,
                    "port": free_port(),
                    "active": False,
                },
            ],
        },
    }
    cfg = tmp / "cluster.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    return cfg


@dataclass
class UpRun:
    """A running ``evenserve up``: its ready-file summary, its output file, and (once the
    ``with`` block is left) its exit code."""

    out: Path
    summary: dict[str, Any] = field(default_factory=dict)
    code: int | None = None


@contextlib.contextmanager
def running_up(tmp: Path, cfg: Path) -> Iterator[UpRun]:
    """``evenserve up cfg`` (logs under ``tmp/logs``) until it is ready; SIGINT on leaving."""
    ready = tmp / "ready.json"
    run = UpRun(tmp / "up.out")
    args = ["up", str(cfg), "--log-dir", str(tmp / "logs"), "--ready-file", str(ready)]
    with run.out.open("wb") as out:
        up = subprocess.Popen([*EVENSERVE, *args], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120
            while not ready.exists():
                assert up.poll() is None, run.out.read_text()
                assert time.monotonic() < deadline, "evenserve up did not get ready"
                time.sleep(0.2)
            run.summary = json.loads(ready.read_text())
            yield run
        finally:
            up.send_signal(signal.SIGINT)
            run.code = up.wait(timeout=60)


def test_a_cold_model_is_loaded_on_a_miss_and_a_burst_scales_up_the_spare(
    tmp_path: Path,
) -> None:
    with running_up(tmp_path, write_cluster(tmp_path)) as run:
        summary = run.summary
        assert [w["active"] for w in summary["workers"]] == [True, True, False]
        assert summary["workers"][2]["pid"] is None  # the spare is not started
        asyncio.run(_drive(summary["gateway"]["url"]))
    assert run.code == 0, (tmp_path / "up.out").read_text()[-3000:]
    text = (tmp_path / "up.out").read_text()
    assert "scale up: started worker d2" in text
    assert "scale down: worker" in text and " stopped" in text
    assert TOKEN not in text
    for log in (tmp_path / "logs").iterdir():
        if log.name != "admin-token":
            assert TOKEN not in log.read_text(errors="replace")


async def _placement(c: httpx.AsyncClient) -> dict[str, Any]:
    r = await c.get("/admin/placement", headers={"authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200, r.text
    view: dict[str, Any] = r.json()
    return view


async def _drive(url: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60, trust_env=False) as c:
        view = await _placement(c)
        assert view["devices"]["d0"]["residents"] == {"m1": "READY"}
        assert view["devices"]["d2"]["active"] is False
        # m3 is resident nowhere: LRU unloads one device's model, loads m3, then answers.
        r = await c.post("/v2/models/m3/infer", json=BODY)
        assert r.status_code == 200, r.text
        host = r.headers["x-evenserve-backend"]
        assert host in ("d0", "d1")
        view = await _placement(c)
        assert view["devices"][host]["residents"] == {"m3": "READY"}
        assert view["counts"]["loads"] == 1 and view["counts"]["evictions"] == 1
        metrics = (await c.get("/metrics")).text
        assert f'evenserve_gateway_model_loads_total{{backend="{host}",model="m3"}} 1.0' in metrics
        # A burst of m3: the demand asks for the spare; the launcher starts it, it is admitted.
        rs = await asyncio.gather(*(c.post("/v2/models/m3/infer", json=BODY) for _ in range(300)))
        assert all(x.status_code == 200 for x in rs), {x.status_code for x in rs}
        deadline = time.monotonic() + 90
        while True:
            view = await _placement(c)
            if view["devices"]["d2"]["active"]:
                break
            assert time.monotonic() < deadline, view
            await asyncio.sleep(0.2)
        assert view["counts"]["scale_ups"] == 1
        assert view["scale_up_decision_s"] is not None
        metrics = (await c.get("/metrics")).text
        assert 'evenserve_gateway_scale_decisions_total{direction="up"} 1.0' in metrics
        assert 'evenserve_gateway_device_active_seconds_total{backend="d2"}' in metrics
        # Quiet again: the demand decays, one device is drained, stopped by the launcher and
        # reported stopped (device_stopped); it stops counting device-seconds.
        while True:
            view = await _placement(c)
            off = [n for n, d in view["devices"].items() if not d["active"] and not d["scale"]]
            if view["counts"]["scale_downs"] >= 1 and off:
                break
            assert time.monotonic() < deadline + 90, view
            await asyncio.sleep(0.2)
        (gone,) = off
        before = view["devices"][gone]["active_seconds"]
        await asyncio.sleep(0.5)
        assert (await _placement(c))["devices"][gone]["active_seconds"] == before
        r = await c.post("/v2/models/m1/infer", json=BODY)
        assert r.status_code == 200, r.text
