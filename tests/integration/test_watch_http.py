"""The watch loop against a real gateway (in process, recording on, in front of an emulated
worker): its HTTP client reads the parameters and the request log, and one apply and one
rollback it decides reach the gateway's versioned parameters."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from evenserve.cluster.file import parse_cluster
from evenserve.experiment.watch import Figures, HttpWatchClient, Params, Record, WatchPolicy
from evenserve.gateway.server import Gateway
from evenserve.runtime.device import parse_device
from evenserve.worker.repository import load_repository
from evenserve.worker.server import BackgroundWorker
from evenserve.worker.service import WorkerOptions, WorkerService
from tests.integration.fake_v2 import serving

from .worker_repo import write_repo

TOKEN = "watch-test-token-0123"
N = 20


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundWorker]:
    repo = write_repo(tmp_path_factory.mktemp("w"))
    w = BackgroundWorker(
        WorkerService(load_repository(repo, ["em"]), WorkerOptions(device=parse_device("cpu")))
    )
    w.start()
    yield w
    w.stop()


class HalvingSim:
    """Predicts 10 ms for the startup routing and 1 ms for any other: a 10x promise that the
    live answers will not bear out (the guardrail: live > 1.15 x calibrated prediction)."""

    def observe_devices(self, scales: Any) -> None:
        self.scales = scales

    def predict(self, records: Sequence[Record], params: Params) -> Figures:
        qw = (params.get("routing") or {}).get("queue_weight", 0.5)
        return Figures(10.0 if qw == 0.5 else 1.0, 100.0, len(records))

    def tune(self, records: Sequence[Record], params: Params) -> tuple[Params, Figures]:
        best = {"routing": {**params["routing"], "queue_weight": 0.9}}
        return best, self.predict(records, best)


async def test_apply_then_rollback_through_the_gateway(
    worker: BackgroundWorker, tmp_path: Path
) -> None:
    raw: dict[str, Any] = {
        "gateway": {
            "routing": "queue-aware",
            "admin": {"token": TOKEN},
            "signals": {"interval_ms": 50, "stale_after_ms": 10_000, "timeout_ms": 10_000},
            "record": {"window": 1000, "flush_ms": 50},
        },
        "backends": [{"name": "w0", "url": worker.url, "models": ["em"]}],
    }
    g = Gateway(parse_cluster(raw, tmp_path))
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1.0] * 4}]}
    async with serving(g) as served, httpx.AsyncClient(base_url=served.url, timeout=60) as c:
        client = HttpWatchClient(served.url, TOKEN)
        policy = WatchPolicy(slo_ms={"em": 10_000.0}, window_s=1.0, min_requests=5)
        sim = HalvingSim()

        async def window() -> list[Record]:
            for _ in range(N):
                assert (await c.post("/v2/models/em/infer", json=body)).status_code == 200
            assert g.recorder is not None
            g.recorder.flush()
            return await asyncio.to_thread(client.pull_log, 0.0)

        warm = await window()  # connections opened, the model warm: not judged
        recs = [r for r in await window() if r["unix_s"] > max(x["unix_s"] for x in warm)]
        assert len(recs) == N and all(r["status"] == 200 and "unix_s" in r for r in recs)
        ev = await asyncio.to_thread(policy.step, client, sim, recs, 1.0)
        assert ev.action == "apply"
        got = await asyncio.to_thread(client.get_params)
        assert got["version"] == 2 and got["params"]["routing"]["queue_weight"] == 0.9
        # The next window is about as fast as the last, not the 10x promised.
        later = [r for r in await window() if r["unix_s"] > max(x["unix_s"] for x in recs)]
        ev = await asyncio.to_thread(policy.step, client, sim, later, 2.0)
        assert ev.action == "rollback"
        got = await asyncio.to_thread(client.get_params)
        assert got["version"] == 3 and got["params"]["routing"]["queue_weight"] == 0.5
        assert [h["source"] for h in got["history"]] == ["startup", "put", "rollback"]
        assert sim.scales == {"w0": {}}  # the worker does not learn: no scales
