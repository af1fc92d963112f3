"""Recording: the gateway in front of an emulated worker writes the request log, serves its
window on the admin API, ``evenserve record``'s puller turns it into one trace, and a
recorded log replays through ``evenserve simulate`` as a ``trace`` workload unchanged."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from evenserve.cli.main import app
from evenserve.cluster.file import parse_cluster
from evenserve.core.requestlog import Recorder, RecordSettings
from evenserve.experiment.record import pull_log
from evenserve.gateway.server import Gateway
from evenserve.runtime.device import parse_device
from evenserve.worker.repository import load_repository
from evenserve.worker.server import BackgroundWorker
from evenserve.worker.service import WorkerOptions, WorkerService
from evenserve.workload.trace import read_trace
from tests.integration.fake_v2 import serving

from .worker_repo import PROFILE, write_repo

TOKEN = "record-test-token-0123"
AUTH = {"authorization": f"Bearer {TOKEN}"}
N = 12


@pytest.fixture(scope="module")
def worker_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("w") / "worker.jsonl"


@pytest.fixture(scope="module")
def worker(worker_log: Path) -> Iterator[BackgroundWorker]:
    root = worker_log.parent
    repo = write_repo(root)
    rec = Recorder(RecordSettings(path=worker_log, window=0, flush_s=0.05))
    w = BackgroundWorker(
        WorkerService(load_repository(repo, ["em"]), WorkerOptions(device=parse_device("cpu"))),
        recorder=rec,
    )
    w.start()
    yield w
    w.stop()


def _body(x: float) -> dict[str, object]:
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [x] * 4}]}


def _gateway(worker: BackgroundWorker, log: Path) -> Gateway:
    raw: dict[str, Any] = {
        "gateway": {
            "routing": "round-robin",
            "admin": {"token": TOKEN},
            "signals": {"interval_ms": 50, "stale_after_ms": 10_000, "timeout_ms": 10_000},
            "record": {"path": str(log), "flush_ms": 50},
        },
        "backends": [{"name": "w0", "url": worker.url, "models": ["em"]}],
    }
    return Gateway(parse_cluster(raw, log.parent))


def _rows(text: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in text.splitlines() if x.strip()]


async def test_the_gateway_records_every_answer_and_serves_the_window(
    worker: BackgroundWorker, worker_log: Path, tmp_path: Path
) -> None:
    log = tmp_path / "gw.jsonl"
    g = _gateway(worker, log)
    assert g.recorder is not None
    async with serving(g) as served, httpx.AsyncClient(base_url=served.url, timeout=60) as c:
        for i in range(N):
            headers = {"x-evenserve-priority": "offline"} if i % 2 else {}
            if i == 3:
                headers["x-evenserve-deadline-ms"] = "5000"
            r = await c.post("/v2/models/em/infer", json=_body(float(i)), headers=headers)
            assert r.status_code == 200
            # The worker's figures ride on the answer, relayed by the gateway.
            assert float(r.headers["x-evenserve-queue-ms"]) >= 0
            assert float(r.headers["x-evenserve-compute-ms"]) > 0
        assert (await c.post("/v2/models/nope/infer", json=_body(0.0))).status_code == 404
        g.recorder.flush()

        # The admin API: the token, then the query's fields.
        assert (await c.get("/admin/log")).status_code == 401
        assert (await c.get("/admin/record")).status_code == 401
        r = await c.get("/admin/log", params={"since_unix_s": "soon"}, headers=AUTH)
        assert r.status_code == 400 and r.json()["error"].startswith("since_unix_s:")
        r = await c.get("/admin/log", params={"limit": "0"}, headers=AUTH)
        assert r.status_code == 400 and r.json()["error"].startswith("limit:")

        r = await c.get("/admin/log", headers=AUTH)
        assert r.status_code == 200
        assert r.headers["content-type"] == "application/x-ndjson"
        rows = _rows(r.text)
        assert len(rows) == N + 1 and min(x["t_s"] for x in rows) == 0.0
        assert [x["seq"] for x in sorted(rows, key=lambda x: x["seq"])] == list(range(1, N + 2))
        ok = [x for x in rows if x["status"] == 200]
        assert len(ok) == N and all(x["backend"] == "w0" and x["model"] == "em" for x in ok)
        assert all(x["queue_ms"] is not None and x["compute_ms"] > 0 for x in ok)
        assert all(x["latency_ms"] >= x["compute_ms"] for x in ok)
        assert sum(1 for x in ok if x.get("priority") == 0) == N // 2
        assert [x["deadline_ms"] for x in ok if "deadline_ms" in x] == [5000.0]
        (miss,) = [x for x in rows if x["status"] == 404]
        assert miss["backend"] is None and miss["queue_ms"] is None
        # A cursor: the records after a seq, and after a wall time.
        r = await c.get("/admin/log", params={"since_seq": N - 2, "limit": 2}, headers=AUTH)
        assert sorted(x["seq"] for x in _rows(r.text)) == [N - 1, N]
        assert r.headers["x-evenserve-log-last-seq"] == str(N)
        cut = sorted(x["unix_s"] for x in rows)[4]
        r = await c.get("/admin/log", params={"since_unix_s": cut}, headers=AUTH)
        assert len(_rows(r.text)) == sum(1 for x in rows if x["unix_s"] > cut)

        r = await c.get("/admin/record", headers=AUTH)
        assert r.json()["records"] == N + 1 and r.json()["dropped"] == 0
        metrics = (await c.get("/metrics")).text
        assert "evenserve_gateway_record_dropped_total 0.0" in metrics

        # evenserve record's puller, on a clock that moves only when it sleeps.
        t = [0.0]

        def sleep(dt: float) -> None:
            t[0] += dt

        out = tmp_path / "pulled.jsonl"
        res = await asyncio.to_thread(
            pull_log, served.url, TOKEN, out, 3.0, now=lambda: t[0], sleep=sleep
        )
        assert res.records == N + 1 and res.pulls == 4 and res.failed_pulls == 0
        pulled = _rows(out.read_text())
        assert sorted(x["seq"] for x in pulled) == list(range(1, N + 2))  # each once
        assert pulled[0]["t_s"] == 0.0
        assert len(read_trace(out)) == N + 1
    # Stopped: the file holds every record, and it reads as a trace.
    assert len(read_trace(log)) == N + 1
    assert {x["seq"] for x in _rows(log.read_text())} == set(range(1, N + 2))
    # The worker wrote a log of its own: its answers, with its own figures (flushed every
    # 50 ms: wait for them by polling).
    for _ in range(1200):
        wrows = _rows(worker_log.read_text()) if worker_log.exists() else []
        if sum(1 for x in wrows if x["status"] == 200) >= N:
            break
        await asyncio.sleep(0.05)
    assert sum(1 for x in wrows if x["status"] == 200) >= N
    assert all(x["backend"] is None and x["compute_ms"] > 0 for x in wrows if x["status"] == 200)
    async with httpx.AsyncClient(base_url=worker.url, timeout=60) as wc:
        assert "evenserve_worker_record_dropped_total 0.0" in (await wc.get("/metrics")).text


def test_a_recorded_log_replays_through_evenserve_simulate(
    worker: BackgroundWorker, tmp_path: Path
) -> None:
    log = tmp_path / "gw.jsonl"

    async def record() -> None:
        g = _gateway(worker, log)
        async with serving(g) as served, httpx.AsyncClient(base_url=served.url, timeout=60) as c:
            for i in range(N):
                r = await c.post("/v2/models/em/infer", json=_body(float(i)))
                assert r.status_code == 200

    asyncio.run(record())
    prof = tmp_path / "profiles" / "em"
    prof.mkdir(parents=True)
    (prof / "em.yaml").write_text(yaml.safe_dump({**PROFILE, "model": "em"}))
    scenario = {
        "name": "replay",
        "seed": 0,
        "duration_s": 60,
        "profile_sets": {"em": "profiles/em"},
        "devices": [{"name": "d0", "models": ["em"]}],
        "models": {"em": {"slo_ms": 1000}},
        "workload": {"type": "trace", "path": log.name},
        "arms": {
            "a": {"routing": "round-robin", "batching": {"policy": "static", "batch_size": 1}}
        },
    }
    (tmp_path / "sc.yaml").write_text(yaml.safe_dump(scenario))
    out = tmp_path / "s.json"
    res = CliRunner().invoke(
        app, ["simulate", str(tmp_path / "sc.yaml"), "--arm", "a", "--json", str(out)]
    )
    assert res.exit_code == 0, res.output
    req = json.loads(out.read_text())["arms"]["a"]["requests"]
    assert req["arrived"] == N


async def test_evenserve_record_pulls_a_trace_and_never_shows_the_token(
    worker: BackgroundWorker, tmp_path: Path
) -> None:
    g = _gateway(worker, tmp_path / "gw.jsonl")
    good, bad = tmp_path / "token", tmp_path / "wrong"
    good.write_text(TOKEN + "\n")
    bad.write_text("not-the-token-at-all\n")
    runner = CliRunner()
    async with serving(g) as served, httpx.AsyncClient(base_url=served.url, timeout=60) as c:
        for i in range(3):
            assert (await c.post("/v2/models/em/infer", json=_body(float(i)))).status_code == 200
        assert g.recorder is not None
        g.recorder.flush()
        out = tmp_path / "t.jsonl"
        args = ["record", served.url, "--out", str(out), "--duration", "0"]
        res = await asyncio.to_thread(runner.invoke, app, [*args, "--token-file", str(good)])
        assert res.exit_code == 0, res.output
        assert TOKEN not in res.output and "wrote 3 records" in res.output
        assert [a.model for a in read_trace(out)] == ["em"] * 3
        res = await asyncio.to_thread(runner.invoke, app, [*args, "--token-file", str(bad)])
        assert res.exit_code == 2 and "401" in res.output
        assert "not-the-token-at-all" not in res.output
    for cmd in (["record"], ["gateway"], ["worker"]):
        text = runner.invoke(app, [*cmd, "--help"]).output
        assert TOKEN not in text
    assert "--record-max-mb" in runner.invoke(app, ["gateway", "--help"]).output
    assert "--record-keep" in runner.invoke(app, ["worker", "--help"]).output
