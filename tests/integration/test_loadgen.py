"""The load generator against real servers on loopback: a real worker (in process, on a
thread), bad targets (nothing listening, an unknown model, a server answering 500), and
uvicorn closing an idle keep-alive connection as a request arrives on it."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from evenserve.loadgen.http import RawHttpClient
from evenserve.loadgen.records import RunLabels, result_records
from evenserve.loadgen.runner import LoadGenerator, run_load
from evenserve.loadgen.spec import LoadSpec
from evenserve.loadgen.target import TargetError, error_lines
from evenserve.report.summary import summarize
from evenserve.runtime.device import parse_device
from evenserve.worker.app import Worker
from evenserve.worker.options import WorkerOptions
from evenserve.worker.repository import load_repository
from evenserve.worker.server import BackgroundWorker
from evenserve.workload import ClosedLoopUsers, user_rng

from .fake_v2 import FakeBackend, serving
from .worker_repo import MODELS, write_repo


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundWorker]:
    repo = write_repo(tmp_path_factory.mktemp("lg"), {"em": MODELS["em"], "pair": MODELS["pair"]})
    service = Worker(load_repository(repo), WorkerOptions(device=parse_device("cpu")))
    with BackgroundWorker(service) as w:
        yield w


def test_closed_loop_against_a_real_worker(worker: BackgroundWorker) -> None:
    # Bounded by a request count, not by what the machine manages in a time: the duration is
    # only a guard against hangs.
    users, cap = 8, 120
    spec = LoadSpec(
        target=worker.url,
        mix={"em": 3.0, "pair": 1.0},
        duration_s=60.0,
        users=users,
        think_s=0.01,
        seed=4,
        var_dim=16,
        scrape={"w": worker.url},
        max_requests=cap,
    )
    result = run_load(spec, realtime=False)
    ok = [s for s in result.samples if s.outcome == "ok"]
    assert result.errors == {} and result.aborted is None
    assert len(ok) == len(result.samples)
    # The cap is checked before each user waits for its next send time, so each of the other
    # users may still send the one it was waiting for.
    assert cap <= len(ok) <= cap + users - 1
    assert all(s.sent_s >= s.intended_s and s.done_s > s.sent_s for s in ok)
    # Every user's requests follow its own seeded draws, whatever the timing: think, model,
    # think, model... from ``{seed}:user:{u}``; its first send is at its first think time.
    for u in range(users):
        mine = [s for s in ok if s.user == u]
        draws = ClosedLoopUsers(spec.mix, spec.think_s, user_rng(spec.seed, u))
        first_think = draws.think_s()
        expected = [draws.draw_model()]
        for _ in mine[1:]:
            draws.think_s()
            expected.append(draws.draw_model())
        assert [s.model for s in mine] == expected, u
        assert mine[0].intended_s == pytest.approx(first_think, abs=1e-9)
    # Every user sends at least once (a batch takes at least 4 ms, so 120 answers take longer
    # than any user's first think here), and seed 4's users 0 and 3 start with em and pair.
    assert {s.model for s in ok} == {"em", "pair"}
    assert result.lag_ms["count"] == len(ok)
    scrape = result.scrapes["w"]
    # One load-endpoint reading at the start; the busy counter at the start and at the end.
    assert len(scrape.queue_t_s) >= 1 and len(scrape.busy_t_s) >= 2
    labels = RunLabels("t", "live", "-", "-", 4, {"em": 50.0, "pair": 50.0})
    summary = summarize(result_records(result, labels))
    assert summary["requests"]["completed"] == len(ok)
    assert 0.0 < summary["devices"]["w"]["utilization"] <= 1.0
    assert summary["latency_ms"]["p50"] is not None


def test_open_loop_respects_the_request_cap(worker: BackgroundWorker) -> None:
    spec = LoadSpec(
        target=worker.url, mix={"em": 1.0}, duration_s=5.0, rate_rps=200.0, max_requests=40
    )
    result = run_load(spec, realtime=False)
    assert len(result.samples) == 40
    assert all(s.outcome == "ok" for s in result.samples)


def test_unknown_model_is_refused_before_any_load(worker: BackgroundWorker) -> None:
    spec = LoadSpec(target=worker.url, mix={"nosuch": 1.0}, duration_s=1.0, users=1)
    with pytest.raises(TargetError) as e:
        run_load(spec, realtime=False)
    msg = str(e.value)
    assert "no model named 'nosuch'" in msg and "em, pair" in msg


def test_refused_connection_is_one_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        spec = LoadSpec(target=f"http://127.0.0.1:{port}", mix={"m": 1}, duration_s=1.0, users=1)
        with pytest.raises(TargetError, match="connection-refused"):
            run_load(spec, realtime=False)


async def test_a_server_answering_500_gets_an_error_summary(tmp_path: Path) -> None:
    fake = FakeBackend("bad", ["m"], infer_status=500)
    async with serving(fake.app()) as srv:
        spec = LoadSpec(target=srv.url, mix={"m": 1}, duration_s=60.0, users=4, abort_after=30)
        result = await LoadGenerator(spec).run()
    assert result.aborted is not None and "first 30 requests all failed" in result.aborted
    assert list(result.errors) == ["http-500"]
    lines = error_lines(result.errors, len(result.samples))
    assert lines[0].startswith("http-500:") and "fake bad says 500" in lines[0]


async def test_a_keep_alive_race_with_uvicorn_loses_no_request() -> None:
    """uvicorn (a server a target may run) closes a keep-alive connection idle for
    ``timeout_keep_alive`` (5 s by default) without reading what is in flight on it: a request
    written on that connection as the timer fires gets no answer, and the server logs nothing.
    The client must send it again on a fresh connection, and count that it did.

    Deterministic, not timed: the loop that runs both the server and the client is blocked
    past the keep-alive timeout (as a busy gateway's loop can be), so when it runs again the
    server's due timer and the client's next send on that connection come before either has
    seen the other's bytes.
    """
    fake = FakeBackend("ka", ["m"])
    one = {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1.0] * 4}
    body = json.dumps({"inputs": [one]}).encode()
    async with serving(fake.app(), timeout_keep_alive=0.5) as srv:
        client = RawHttpClient(srv.url, timeout_s=10.0)
        data = client.request_bytes(
            "/v2/models/m/infer", body, {"content-type": "application/json"}
        )
        try:
            first = await client.post(data)
            time.sleep(0.7)  # blocks the loop: uvicorn's keep-alive timer is now due
            await asyncio.sleep(0)  # the next loop iteration: the timer and our send
            second = await client.post(data)
        finally:
            client.close()
    assert first[0] == 200
    assert second[0] == 200, second
    assert fake.received == 2  # the lost send never reached the application
    assert client.stats() == {"opened": 2, "retired_idle": 0, "resent_stale": 1}
