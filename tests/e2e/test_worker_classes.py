"""`evenserve worker` as a subprocess: an online request overtakes queued offline ones.

One emulated model with static batching of exactly 8 items and requests of 5 items each: two
never fit in one batch, so no batch ever forms and requests only queue. Six offline requests
arrive (class from the ``x-evenserve-priority`` header), then an online one (class from the
v2 ``parameters.priority``). SIGTERM drains the queue one request per batch (200 ms each), in
the order the device scheduler picks: the online request must run first, before every
offline request that was waiting when it came, and the offline ones in their arrival order.
Order only: nothing depends on how long this machine takes to send the requests (they wait
until they are all there), and the answers come 200 ms apart.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from evenserve.core.load import LoadReport
from evenserve.core.wire import LOAD_PATH

from .test_worker_cli import _start

pytestmark = pytest.mark.e2e

ITEMS = 5  # per request: 5 + 5 > max_batch_size 8, and 5 < the static batch of 8
BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [ITEMS, 4], "data": [0] * 4 * ITEMS}]}


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    d = tmp_path / "repo" / "m"
    d.mkdir(parents=True)
    (d / "profile.yaml").write_text(
        yaml.safe_dump(
            {
                "model": "m",
                "device": "test device (synthetic)",
                "runtime": "emulated",
                "precision": "fp32",
                "source": "Synthetic figures for tests (not a measurement).",
                "points": [
                    {"batch": 1, "latency_ms": 200.0},
                    {"batch": 8, "latency_ms": 200.0},
                ],
            }
        )
    )
    (d / "model.yaml").write_text(
        yaml.safe_dump(
            {
                "runtime": "emulated",
                "max_batch_size": 8,
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
                "outputs": [{"name": "y", "datatype": "FP32", "shape": [2]}],
                "batching": {"policy": "static", "batch_size": 8},
                "slo_ms": 1000,
                "emulated": {"profile": "profile.yaml"},
            }
        )
    )
    proc, url = _start(["--repo", str(tmp_path / "repo"), "--device", "cpu"], tmp_path)
    yield proc, url
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


async def _overtake(proc: subprocess.Popen[str], url: str) -> list[str]:
    done: list[str] = []
    infer = f"{url}/v2/models/m/infer"
    async with httpx.AsyncClient(timeout=120) as c:

        async def send(name: str, **kw: object) -> None:
            r = await c.post(infer, **kw)  # type: ignore[arg-type]
            assert r.status_code == 200, r.text
            done.append(name)

        async def until_queued(n: int) -> None:
            deadline = time.monotonic() + 60  # a hang guard only
            while True:
                load = LoadReport.model_validate((await c.get(url + LOAD_PATH)).json())
                if load.queued_by_model["m"] == n:
                    assert load.in_flight == 0  # nothing runs: the batch of 8 never forms
                    return
                assert time.monotonic() < deadline, f"never {n} queued: {load}"
                await asyncio.sleep(0.005)

        offline = []
        for i in range(6):  # one at a time, so their arrival order is known
            offline.append(
                asyncio.ensure_future(
                    send(f"offline{i}", json=BODY, headers={"x-evenserve-priority": "offline"})
                )
            )
            await until_queued(i + 1)
        online = asyncio.ensure_future(
            send("online", json={**BODY, "parameters": {"priority": "online"}})
        )
        await until_queued(7)
        proc.send_signal(signal.SIGTERM)  # drain: run what is queued, then exit
        await asyncio.gather(online, *offline)
    return done


def test_online_request_overtakes_queued_offline_ones(
    worker: tuple[subprocess.Popen[str], str],
) -> None:
    proc, url = worker
    done = asyncio.run(_overtake(proc, url))
    assert done == ["online", *(f"offline{i}" for i in range(6))], done
    assert proc.wait(60) == 0
