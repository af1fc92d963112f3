"""Real compute through the worker: tiny transformers models (random weights, seeded) served
over HTTP give the same outputs as the runtime called directly, also when concurrent requests
of different sequence lengths share a batch."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from evenserve.runtime.device import parse_device
from evenserve.worker.app import Worker
from evenserve.worker.options import WorkerOptions
from evenserve.worker.profiler import build_runtime
from evenserve.worker.repository import load_repository
from evenserve.worker.server import BackgroundWorker

pytest.importorskip("transformers")

TINY = Path(__file__).resolve().parents[2] / "examples" / "models" / "tiny"


@pytest.fixture(scope="module")
def worker() -> Iterator[BackgroundWorker]:
    entries = load_repository(TINY, ["tiny-bert", "tiny-resnet"])
    service = Worker(entries, WorkerOptions(device=parse_device("cpu"), cpu_threads=1))
    with BackgroundWorker(service) as w:
        yield w


def _bert_body(ids: np.ndarray) -> dict[str, object]:
    return {
        "inputs": [
            {
                "name": "input_ids",
                "datatype": "INT64",
                "shape": list(ids.shape),
                "data": ids.reshape(-1).tolist(),
            },
            {
                "name": "attention_mask",
                "datatype": "INT64",
                "shape": list(ids.shape),
                "data": [1] * ids.size,
            },
        ]
    }


def test_concurrent_mixed_lengths_match_direct_runtime(worker: BackgroundWorker) -> None:
    rng = np.random.default_rng(5)
    requests = [rng.integers(0, 100, size=(1, 8 if i % 2 else 12)) for i in range(16)]

    async def send_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=worker.url, timeout=60) as c:
            return await asyncio.gather(
                *(c.post("/v2/models/tiny-bert/infer", json=_bert_body(ids)) for ids in requests)
            )

    responses = asyncio.run(send_all())
    assert [r.status_code for r in responses] == [200] * len(requests)
    (entry,) = load_repository(TINY, ["tiny-bert"])
    direct = build_runtime(entry, parse_device("cpu"))
    direct.load()
    for ids, r in zip(requests, responses, strict=True):
        out = r.json()["outputs"][0]
        assert out["name"] == "logits" and out["shape"] == [1, 2]
        want = direct.run({"input_ids": ids, "attention_mask": np.ones_like(ids)})["logits"]
        np.testing.assert_allclose(np.array(out["data"]).reshape(1, 2), want, rtol=1e-4, atol=1e-5)
    stats = httpx.get(worker.url + "/v2/models/tiny-bert/stats").json()["model_stats"][0]
    assert stats["inference_count"] == len(requests)  # the warm-up batches are not counted
    # every batch size was warmed up (twice) before the worker was ready
    load = stats["evenserve_load"]
    assert load["warmup_batch_sizes"] == list(range(1, 9))
    assert sorted(int(b) for b in load["warmup_first_ms"]) == list(range(1, 9))
    assert sorted(int(b) for b in load["warmup_second_ms"]) == list(range(1, 9))


def test_resnet_binary_roundtrip(worker: BackgroundWorker) -> None:
    import tritonclient.http as triton

    x = np.random.default_rng(1).standard_normal((3, 3, 32, 32)).astype(np.float32)
    c = triton.InferenceServerClient(f"127.0.0.1:{worker.port}")
    inp = triton.InferInput("pixel_values", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    logits = c.infer("tiny-resnet", [inp]).as_numpy("logits")
    c.close()
    (entry,) = load_repository(TINY, ["tiny-resnet"])
    direct = build_runtime(entry, parse_device("cpu"))
    direct.load()
    np.testing.assert_allclose(
        logits, direct.run({"pixel_values": x})["logits"], rtol=1e-4, atol=1e-5
    )
