"""`evenserve worker` as a subprocess: an online request overtakes queued offline ones.

One emulated model served one request per batch (100 ms each). Six offline requests arrive
(class from the ``x-evenserve-priority`` header); one runs, five wait. Then an online request
arrives (class from the v2 ``parameters.priority``): it must run right after the batch on the
device, before every offline request that was waiting when it came. Order only, no timing.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from evenserve.core.load import LoadReport
from evenserve.core.wire import LOAD_PATH

from .test_worker_cli import _start

pytestmark = pytest.mark.e2e

BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0, 0, 0, 0]}]}


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[str]:
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
                "points": [{"batch": 1, "latency_ms": 100.0}],
            }
        )
    )
    (d / "model.yaml").write_text(
        yaml.safe_dump(
            {
                "runtime": "emulated",
                "max_batch_size": 1,
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
                "outputs": [{"name": "y", "datatype": "FP32", "shape": [2]}],
                "batching": "none",
                "slo_ms": 1000,
                "emulated": {"profile": "profile.yaml"},
            }
        )
    )
    proc, url = _start(["--repo", str(tmp_path / "repo"), "--device", "cpu"], tmp_path)
    yield url
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


async def _overtake(url: str) -> list[str]:
    done: list[str] = []
    infer = f"{url}/v2/models/m/infer"
    async with httpx.AsyncClient(timeout=30) as c:

        async def send(name: str, **kw: object) -> None:
            r = await c.post(infer, **kw)  # type: ignore[arg-type]
            assert r.status_code == 200, r.text
            done.append(name)

        offline = [
            asyncio.ensure_future(
                send(f"offline{i}", json=BODY, headers={"x-evenserve-priority": "offline"})
            )
            for i in range(6)
        ]
        for _ in range(500):  # until one runs and five wait
            load = LoadReport.model_validate((await c.get(url + LOAD_PATH)).json())
            if load.queued_by_model["m"] == 5:
                break
            await asyncio.sleep(0.005)
        else:
            raise AssertionError("the offline requests never queued up")
        online = {**BODY, "parameters": {"priority": "online"}}
        await asyncio.gather(send("online", json=online), *offline)
    return done


def test_online_request_overtakes_queued_offline_ones(worker: str) -> None:
    done = asyncio.run(_overtake(worker))
    # The offline request on the device finishes first; the online one goes next, ahead of
    # the five that were waiting when it arrived.
    assert done[1] == "online", done
    assert sorted(done) == sorted(["online", *(f"offline{i}" for i in range(6))])
