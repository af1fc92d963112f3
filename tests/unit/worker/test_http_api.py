"""HTTP states without a socket (httpx ASGI transport): loading, ready, draining; encodings."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import httpx
import pytest

from evenserve.core.load import LOAD_PATH
from evenserve.runtime.device import parse_device
from evenserve.worker.http_api import create_app
from evenserve.worker.repository import load_repository
from evenserve.worker.service import WorkerOptions, WorkerService

TINY = Path(__file__).resolve().parents[3] / "examples" / "models" / "tiny"
BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}


def _service() -> WorkerService:
    return WorkerService(
        load_repository(TINY, ["tiny-emulated"]),
        WorkerOptions(device=parse_device("cpu"), max_body_bytes=4096),
    )


def _client(service: WorkerService) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=create_app(service, manage_lifecycle=False))
    return httpx.AsyncClient(transport=transport, base_url="http://worker")


async def test_not_started_then_ready_then_draining() -> None:
    service = _service()
    service.load()
    async with _client(service) as c:
        assert (await c.get("/v2/health/live")).status_code == 200
        assert (await c.get("/v2/health/ready")).status_code == 503
        assert (await c.get(LOAD_PATH)).status_code == 503
        r = await c.post("/v2/models/tiny-emulated/infer", json=BODY)
        assert r.status_code == 503 and "not ready" in r.json()["error"]
        await service.start()
        assert (await c.get("/v2/health/ready")).status_code == 200
        r = await c.post("/v2/models/tiny-emulated/infer", json=BODY)
        assert r.status_code == 200
        load = (await c.get(LOAD_PATH)).json()
        assert load["ready"] and load["device"] == "cpu" and load["queue_depth"] == 0
        service.begin_drain()
        assert (await c.get("/v2/health/ready")).status_code == 503
        r = await c.post("/v2/models/tiny-emulated/infer", json=BODY)
        assert r.status_code == 503
        await service.stop()
    page = service.metrics.render()[0].decode()
    assert 'outcome="unavailable"} 2.0' in page
    assert 'outcome="success"} 1.0' in page


async def test_encodings_and_limits() -> None:
    service = _service()
    service.load()
    await service.start()
    async with _client(service) as c:
        url = "/v2/models/tiny-emulated/infer"
        raw = json.dumps(BODY).encode()
        r = await c.post(url, content=gzip.compress(raw), headers={"content-encoding": "gzip"})
        assert r.status_code == 200
        r = await c.post(url, content=raw, headers={"content-encoding": "br"})
        assert r.status_code == 415 and "'br' is not supported" in r.json()["error"]
        bomb = gzip.compress(b" " * 100_000)  # small on the wire, over the limit unpacked
        r = await c.post(url, content=bomb, headers={"content-encoding": "gzip"})
        assert r.status_code == 413 and "decompressed body" in r.json()["error"]
        r = await c.post(url, content=b"x" * 5000)
        assert r.status_code == 413
        r = await c.get("/v2/models/stats")
        assert [s["name"] for s in r.json()["model_stats"]] == ["tiny-emulated"]
        r = await c.get("/v2/models/tiny-emulated/versions/2/config")
        assert r.status_code == 404
    await service.stop()


@pytest.mark.parametrize("path", ["/v2/models/x/infer", "/v2/models/x/versions/1/infer"])
async def test_unknown_model_is_404_and_counted(path: str) -> None:
    service = _service()
    service.load()
    await service.start()
    async with _client(service) as c:
        r = await c.post(path, json=BODY)
    assert r.status_code == 404 and "model 'x' is not served here" in r.json()["error"]
    page = service.metrics.render()[0].decode()
    assert 'evenserve_worker_requests_total{model="_unknown",outcome="not_found"} 1.0' in page
    await service.stop()
