"""Statistics through the gateway: the sum over every worker that hosts the model; a model
version is the workers' to judge."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from evenserve.cluster.file import parse_cluster
from evenserve.gateway.server import Gateway
from evenserve.gateway.stats import aggregate_model_stats
from evenserve.runtime.device import parse_device
from evenserve.worker.repository import load_repository
from evenserve.worker.server import BackgroundWorker
from evenserve.worker.service import WorkerOptions, WorkerService
from tests.integration.fake_v2 import serving

from .worker_repo import write_repo

TOKEN = "stats-test-token-0123"


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[BackgroundWorker]]:
    repo = write_repo(tmp_path_factory.mktemp("repo"))
    ws = [
        BackgroundWorker(
            WorkerService(load_repository(repo), WorkerOptions(device=parse_device("cpu")))
        )
        for _ in range(2)
    ]
    for w in ws:
        w.start()
    yield ws
    for w in ws:
        w.stop()


def _body(x: float) -> dict[str, object]:
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [x] * 4}]}


async def test_stats_through_the_gateway_sum_every_worker(workers: list[BackgroundWorker]) -> None:
    raw = {
        "gateway": {
            "routing": "round-robin",
            "admin": {"token": TOKEN},
            "signals": {"interval_ms": 50, "stale_after_ms": 10_000, "timeout_ms": 10_000},
        },
        "backends": [
            {"name": f"w{i}", "url": w.url, "models": ["em"]} for i, w in enumerate(workers)
        ],
    }
    g = Gateway(parse_cluster(raw, Path(".")))
    async with serving(g) as served, httpx.AsyncClient(base_url=served.url, timeout=60) as c:
        for i in range(10):
            r = await c.post("/v2/models/em/infer", json=_body(float(i)))
            assert r.status_code == 200
        direct = []
        for w in workers:
            async with httpx.AsyncClient(base_url=w.url, timeout=60) as wc:
                direct.append((await wc.get("/v2/models/em/stats")).json()["model_stats"][0])
        r = await c.get("/v2/models/em/stats")
        assert r.status_code == 200 and r.headers["x-evenserve-backend"] == "w0,w1"
        (agg,) = r.json()["model_stats"]
        assert agg["inference_count"] == sum(d["inference_count"] for d in direct) >= 10
        assert all(d["inference_count"] > 0 for d in direct)  # both served: a real sum
        succ = agg["inference_stats"]["success"]
        assert succ["count"] == sum(d["inference_stats"]["success"]["count"] for d in direct)
        # A version no worker has: the workers say 404 (the gateway knows no versions).
        assert (await c.get("/v2/models/em/versions/999/ready")).status_code == 404
        assert (await c.get("/v2/models/em/versions/1/ready")).status_code == 200
        assert (await c.get("/v2/models/nope/stats")).status_code == 404
        # Every model's statistics (what perf_analyzer reads, when /v2 lists the extension).
        assert "statistics" in (await c.get("/v2")).json()["extensions"]
        r = await c.get("/v2/models/stats")
        # The workers' indexes list more models than the cluster file names: all are there.
        every = {e["name"]: e for e in r.json()["model_stats"]}
        assert r.status_code == 200 and every["em"] == agg and len(every) > 1
        # The repository index is the registry's; model control is a worker's (named).
        assert (await c.get("/v2/repository/index")).json() == g.registry.repository_index()
        for action in ("load", "unload"):
            r = await c.post(f"/v2/repository/models/em/{action}")
            assert r.status_code == 501
            message = r.json()["error"]
            assert f"does not {action} models" in message and "w0 (http://" in message


def test_aggregate_merges_batch_sizes_and_takes_the_latest_inference() -> None:
    a = {
        "name": "m", "version": "1", "last_inference": 5, "inference_count": 3,
        "execution_count": 2,
        "inference_stats": {"success": {"count": 3, "ns": 30}, "queue": {"count": 3, "ns": 6}},
        "batch_stats": [{"batch_size": 1, "compute_infer": {"count": 1, "ns": 10}},
                        {"batch_size": 2, "compute_infer": {"count": 1, "ns": 15}}],
    }  # fmt: skip
    b = {
        "name": "m", "version": "1", "last_inference": 9, "inference_count": 1,
        "execution_count": 1,
        "inference_stats": {"success": {"count": 1, "ns": 7}},
        "batch_stats": [{"batch_size": 1, "compute_infer": {"count": 1, "ns": 4}}],
    }  # fmt: skip
    agg = aggregate_model_stats([a, b])
    assert agg["last_inference"] == 9 and agg["inference_count"] == 4
    assert agg["execution_count"] == 3
    assert agg["inference_stats"]["success"] == {"count": 4, "ns": 37}
    assert agg["inference_stats"]["queue"] == {"count": 3, "ns": 6}
    assert agg["batch_stats"] == [
        {"batch_size": 1, "compute_infer": {"count": 2, "ns": 14}},
        {"batch_size": 2, "compute_infer": {"count": 1, "ns": 15}},
    ]
    with pytest.raises(ValueError):
        aggregate_model_stats([])
