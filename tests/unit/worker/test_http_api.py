"""HTTP states without a socket (httpx's MockTransport calls the worker's handler): loading,
ready, draining; encodings."""

from __future__ import annotations

import asyncio
import gzip
import json
from pathlib import Path

import httpx
import pytest
import yaml

from evenserve.core.options import QueueOptions
from evenserve.core.wire import LOAD_PATH
from evenserve.runtime.device import parse_device
from evenserve.worker.app import Worker
from evenserve.worker.options import WorkerOptions
from evenserve.worker.repository import load_model, load_repository
from tests.app_client import worker_client

TINY = Path(__file__).resolve().parents[3] / "examples" / "models" / "tiny"
BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}


def _service() -> Worker:
    return Worker(
        load_repository(TINY, ["tiny-emulated"]),
        WorkerOptions(device=parse_device("cpu"), max_body_bytes=4096),
    )


def _client(service: Worker) -> httpx.AsyncClient:
    return worker_client(service)


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
        # model.yaml's SLO and the worker's queue bound reach the gateway's refusal rule
        assert load["slo_ms_by_model"] == {"tiny-emulated": 100.0}
        assert load["max_queue_by_model"] == {"tiny-emulated": 1024}
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


async def test_classes_deadlines_and_refusals_over_http(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    (d / "profile.yaml").write_text(
        yaml.safe_dump(
            {
                "model": "m",
                "device": "test",
                "runtime": "emulated",
                "precision": "fp32",
                "source": "synthetic (test)",
                "points": [{"batch": 1, "latency_ms": 4.0}, {"batch": 4, "latency_ms": 6.0}],
            }
        )
    )
    (d / "model.yaml").write_text(
        yaml.safe_dump(
            {
                "runtime": "emulated",
                "max_batch_size": 4,
                "max_queue_size": 2,
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
                "outputs": [{"name": "y", "datatype": "FP32", "shape": [2]}],
                # Waits for a full batch of 4 that never comes: the queue stays as we fill it.
                "batching": {"policy": "static", "batch_size": 4},
                "priority": "offline",
                "slo_ms": 100,
                "profile": "profile.yaml",
                "emulated": {"profile": "profile.yaml"},
            }
        )
    )
    service = Worker(
        [load_model(d)],
        WorkerOptions(device=parse_device("cpu"), queue=QueueOptions(starvation_ms=60_000)),
    )
    service.load()
    await service.start()
    url = "/v2/models/m/infer"
    async with _client(service) as c:
        offline = [asyncio.ensure_future(c.post(url, json=BODY)) for _ in range(2)]
        while service.driver.sched.queued_by_model()["m"] < 2:
            await asyncio.sleep(0.001)
        online = asyncio.ensure_future(
            c.post(url, json=BODY, headers={"x-evenserve-priority": "online"})
        )
        done, _ = await asyncio.wait(offline, return_when=asyncio.FIRST_COMPLETED)
        shed = done.pop().result()
        assert shed.status_code == 429 and shed.headers["x-evenserve-reason"] == "shed"
        assert int(shed.headers["retry-after"]) >= 1
        assert shed.json()["error"].startswith("shed: model 'm'")
        # Full of requests of its class or higher: an offline newcomer is refused.
        full = await c.post(url, json=BODY)
        assert full.status_code == 429 and full.headers["x-evenserve-reason"] == "queue-full"
        body = {**BODY, "parameters": {"deadline_ms": 2}}  # a batch of one takes 4 ms
        late = await c.post(url, json=body, headers={"x-evenserve-priority": "online"})
        assert late.status_code == 504
        assert late.headers["x-evenserve-reason"] == "deadline-infeasible"
        bad = await c.post(url, json=BODY, headers={"x-evenserve-deadline-ms": "soon"})
        assert bad.status_code == 400 and "x-evenserve-deadline-ms" in bad.json()["error"]
        await service.stop()  # drain runs what is queued: the online one and an offline one
        assert (await online).status_code == 200
        assert [(await t).status_code for t in offline].count(200) == 1
    page = service.metrics.render()[0].decode()
    for reason in ("shed", "queue-full", "deadline-infeasible"):
        assert f'evenserve_worker_refusals_total{{model="m",reason="{reason}"}} 1.0' in page
    assert 'evenserve_worker_refusals_total{model="m",reason="deadline-expired"} 0.0' in page
    assert 'outcome="shed"} 1.0' in page and 'outcome="deadline_infeasible"} 1.0' in page


async def test_head_is_answered_as_get() -> None:
    """HEAD on every GET endpoint is answered as GET (the server drops the body); HEAD where
    only POST is taken is 405."""
    service = _service()
    service.load()
    await service.start()
    gets = (
        "/v2/health/live",
        "/v2/health/ready",
        "/v2",
        "/v2/repository/index",
        "/v2/models/stats",
        "/v2/models/tiny-emulated",
        "/v2/models/tiny-emulated/ready",
        "/v2/models/tiny-emulated/config",
        "/v2/models/tiny-emulated/stats",
        "/v2/models/tiny-emulated/versions/1",
        LOAD_PATH,
        "/metrics",
    )
    async with _client(service) as c:
        for path in gets:
            got, head = await c.get(path), await c.head(path)
            assert (path, head.status_code) == (path, got.status_code) == (path, 200)
        assert (await c.head("/v2/models/nope")).status_code == 404
        for path in ("/v2/models/tiny-emulated/infer", "/v2/repository/models/x/load"):
            r = await c.head(path)
            assert r.status_code == 405, path
    await service.stop()
