"""32 concurrent HTTP clients against a live worker: what holds on any machine.

The shipped emulated BERT-base on an emulated A10 (published TensorRT figures), 32 closed-loop
clients x 12 requests over binary tensors. Checked: every request answered exactly once with
its outputs; the batch-size histogram in ``/metrics``, Triton's statistics and the batches the
driver ran agree with each other and with the request count; no batch exceeds the model's
max_batch_size; no emulated batch ends before its profile's time (a sleep never ends early).

Not checked here, because they depend on how fast and how loaded this machine is: the batch
sizes that form (how much concurrency the box sustains) and how close each batch comes to its
profile's time. Those are figures, printed by ``bench/worker_batching.py`` and
``bench/emulated_timing.py``; the batching decision itself (32 closed-loop clients keep every
batch full) is asserted on a FakeClock in ``tests/unit/worker/test_closed_loop_batching.py``.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import pytest

from evenserve.core.profile import load_profile
from evenserve.runtime.device import parse_device
from evenserve.worker.app import Worker
from evenserve.worker.batch import BatchResult, DriverObserver, RunningBatch
from evenserve.worker.options import WorkerOptions
from evenserve.worker.repository import load_repository
from evenserve.worker.server import BackgroundWorker

from .worker_repo import metric_samples

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = 32
REQUESTS_PER_CLIENT = 12
TOTAL = CLIENTS * REQUESTS_PER_CLIENT
MAX_BATCH = 8  # examples/models/emulated/bert-base/model.yaml: batching.max_batch_size


@dataclass
class BatchRecorder(DriverObserver):
    batches: list[tuple[int, float]] = field(default_factory=list)  # (items, compute_infer_s)

    def batch_finished(self, batch: RunningBatch, result: BatchResult, now_s: float) -> None:
        self.batches.append((batch.items, result.compute_infer_s))


@dataclass
class Run:
    worker: BackgroundWorker
    recorder: BatchRecorder
    statuses: Counter[int]
    outputs: list[list[dict[str, object]]]  # each answer's output descriptions
    ids_seen: list[str]


def binary_request(rng: np.random.Generator) -> tuple[bytes, dict[str, str]]:
    ids = rng.integers(0, 30522, size=(1, 128), dtype=np.int64)
    mask = np.ones_like(ids)
    head = (
        b'{"inputs":[{"name":"input_ids","datatype":"INT64","shape":[1,128],'
        b'"parameters":{"binary_data_size":1024}},{"name":"attention_mask","datatype":"INT64",'
        b'"shape":[1,128],"parameters":{"binary_data_size":1024}}],'
        b'"parameters":{"binary_data_output":true}}'
    )
    return head + ids.tobytes() + mask.tobytes(), {
        "Inference-Header-Content-Length": str(len(head))
    }


@pytest.fixture(scope="module")
def run() -> Iterator[Run]:
    entries = load_repository(ROOT / "examples" / "models" / "emulated", ["bert-base"])
    service = Worker(
        entries,
        WorkerOptions(device=parse_device("emulated:a10-trt-fp16"), profiles_dir=ROOT / "profiles"),
    )
    recorder = BatchRecorder()
    service.add_observer(recorder)
    body, headers = binary_request(np.random.default_rng(0))
    statuses: Counter[int] = Counter()
    outputs: list[list[dict[str, object]]] = []
    ids_seen: list[str] = []

    async def client(c: httpx.AsyncClient, who: int) -> None:
        for k in range(REQUESTS_PER_CLIENT):
            rid = f"{who}-{k}"
            r = await c.post("/v2/models/bert-base/infer", content=body, headers=headers)
            statuses[r.status_code] += 1
            if r.status_code == 200:
                n = int(r.headers["inference-header-content-length"])
                answer = json.loads(r.content[:n])
                outputs.append(answer["outputs"])
                # Binary outputs: one FP32 logits pair (8 bytes) after the JSON header.
                assert len(r.content) - n == 8
                ids_seen.append(rid)

    async def drive(url: str) -> None:
        limits = httpx.Limits(max_connections=CLIENTS)
        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as c:
            await asyncio.gather(*(client(c, i) for i in range(CLIENTS)))

    with BackgroundWorker(service) as w:
        asyncio.run(drive(w.url))
        yield Run(w, recorder, statuses, outputs, ids_seen)


def test_every_request_answered_once_with_its_outputs(run: Run) -> None:
    assert run.statuses == {200: TOTAL}
    assert sorted(run.ids_seen) == sorted(
        f"{c}-{k}" for c in range(CLIENTS) for k in range(REQUESTS_PER_CLIENT)
    )
    for outs in run.outputs:
        assert [(o["name"], o["datatype"], o["shape"]) for o in outs] == [
            ("logits", "FP32", [1, 2])
        ]


def test_batch_counts_agree_and_no_batch_exceeds_max_batch_size(run: Run) -> None:
    sizes = [n for n, _ in run.recorder.batches]
    assert sum(sizes) == TOTAL
    assert min(sizes) >= 1 and max(sizes) <= MAX_BATCH
    text = httpx.get(run.worker.url + "/metrics").text
    model = 'model="bert-base"'
    count = metric_samples(text, "evenserve_worker_batch_size_count")[
        f"evenserve_worker_batch_size_count{{{model}}}"
    ]
    total = metric_samples(text, "evenserve_worker_batch_size_sum")[
        f"evenserve_worker_batch_size_sum{{{model}}}"
    ]
    buckets = {
        k.split('le="')[1].split('"')[0]: v
        for k, v in metric_samples(text, "evenserve_worker_batch_size_bucket").items()
        if model in k
    }
    assert (count, total) == (len(sizes), TOTAL)
    # Cumulative buckets: each one counts the batches no larger than its bound.
    for le, v in buckets.items():
        bound = float("inf") if le == "+Inf" else float(le)
        assert v == sum(1 for n in sizes if n <= bound), (le, v)
    assert buckets[f"{float(MAX_BATCH)}"] == count  # none above max_batch_size
    requests = metric_samples(text, "evenserve_worker_requests_total")
    assert requests[f'evenserve_worker_requests_total{{{model},outcome="success"}}'] == TOTAL
    stats = httpx.get(run.worker.url + "/v2/models/bert-base/stats").json()["model_stats"][0]
    assert (stats["inference_count"], stats["execution_count"]) == (TOTAL, len(sizes))
    by_size = Counter(sizes)
    assert {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]} == by_size


def test_no_emulated_batch_ends_before_its_profile_time(run: Run) -> None:
    # A lower bound only: the emulated device sleeps until the profile's time has passed,
    # so a batch can end late on a busy host but never early. (How late: a measurement.)
    prof = load_profile(ROOT / "profiles" / "a10-trt-fp16" / "bert-base.yaml")
    for items, compute_s in run.recorder.batches:
        assert compute_s >= prof.latency_s(items) - 1e-9, (items, compute_s)
