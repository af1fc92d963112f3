"""Batch formation under real concurrency: N HTTP clients against a live worker, measured.

The shipped emulated BERT-base (``examples/models/emulated/bert-base``: fixed-window, at most 8
per batch, 5 ms window) on an emulated A10 (the published TensorRT profile, every batch time
multiplied by ``--time-scale``, default 10), served by an in-process worker on loopback and
driven by ``--clients`` closed-loop httpx clients (default 32) sending ``--requests`` requests
each (default 12) over binary tensors, with no think time.

On a FakeClock the driver keeps every batch full under 32 such clients (asserted in
``tests/unit/worker/test_closed_loop_batching.py``). How close a live worker comes to that
depends on this machine: the clients, the HTTP server and the device thread share one
process and its GIL, so on a slow or loaded host fewer requests are waiting when a batch
forms. That is what this prints, never what a test asserts:
- batches formed, mean batch size, how many of size 1, the size histogram (from ``/metrics``);
- per batch size: count, P50 of the emulated compute time against the profile, the error;
- client latency P50/P99 and throughput.
(x10 batch times: 32 clients' scheduling jitter of a few hundred microseconds is 10 % of a
1 ms batch; ten times longer batches measure the emulated device rather than the GIL.)

    python bench/worker_batching.py [--clients 32] [--requests 12] [--time-scale 10] [--json PATH]

Exits 0 whatever the figures are.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from rich.console import Console
from rich.table import Table

from evenserve.core.profile import LatencyProfile, dump_profile, load_profile
from evenserve.runtime.device import parse_device
from evenserve.worker.app import Worker
from evenserve.worker.batch import BatchResult, DriverObserver, RunningBatch
from evenserve.worker.options import WorkerOptions
from evenserve.worker.repository import load_repository
from evenserve.worker.server import BackgroundWorker

ROOT = Path(__file__).resolve().parent.parent
MODEL = "bert-base"


@dataclass
class ComputeRecorder(DriverObserver):
    by_size: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))

    def batch_finished(self, batch: RunningBatch, result: BatchResult, now_s: float) -> None:
        self.by_size[batch.items].append(result.compute_infer_s)


def scaled_profiles(root: Path, scale: float) -> tuple[Path, LatencyProfile]:
    """profiles/a10-trt-fp16 with every batch time multiplied by ``scale``, as a set."""
    out = root / "a10-trt-fp16-scaled"
    for src in (ROOT / "profiles" / "a10-trt-fp16").glob("*.yaml"):
        prof = load_profile(src)
        dump_profile(
            replace(prof, latency_ms=tuple(ms * scale for ms in prof.latency_ms)),
            out / src.name,
            notes=f"bench copy: batch times x{scale:g}",
        )
    return out, load_profile(out / f"{MODEL}.yaml")


def request_body() -> tuple[bytes, dict[str, str]]:
    ids = np.random.default_rng(0).integers(0, 30522, size=(1, 128), dtype=np.int64)
    mask = np.ones_like(ids)
    head = (
        b'{"inputs":[{"name":"input_ids","datatype":"INT64","shape":[1,128],'
        b'"parameters":{"binary_data_size":1024}},{"name":"attention_mask","datatype":"INT64",'
        b'"shape":[1,128],"parameters":{"binary_data_size":1024}}],'
        b'"parameters":{"binary_data_output":true}}'
    )
    headers = {"Inference-Header-Content-Length": str(len(head))}
    return head + ids.tobytes() + mask.tobytes(), headers


def metric(text: str, name: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith(name) and f'model="{MODEL}"' in line:
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def measure(clients: int, per_client: int, scale: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="evenserve-batching-") as tmp:
        set_dir, prof = scaled_profiles(Path(tmp), scale)
        entries = load_repository(ROOT / "examples" / "models" / "emulated", [MODEL])
        service = Worker(
            entries,
            WorkerOptions(device=parse_device(f"emulated:{set_dir}"), profiles_dir=Path(tmp)),
        )
        recorder = ComputeRecorder()
        service.add_observer(recorder)
        body, headers = request_body()
        statuses: Counter[int] = Counter()
        latencies: list[float] = []

        async def client(c: httpx.AsyncClient) -> None:
            for _ in range(per_client):
                t0 = time.perf_counter()
                r = await c.post(f"/v2/models/{MODEL}/infer", content=body, headers=headers)
                latencies.append(time.perf_counter() - t0)
                statuses[r.status_code] += 1

        async def drive(url: str) -> float:
            limits = httpx.Limits(max_connections=clients)
            async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as c:
                t0 = time.perf_counter()
                await asyncio.gather(*(client(c) for _ in range(clients)))
                return time.perf_counter() - t0

        with BackgroundWorker(service) as w:
            wall_s = asyncio.run(drive(w.url))
            text = httpx.get(w.url + "/metrics").text
    count = next(iter(metric(text, "evenserve_worker_batch_size_count").values()))
    total = next(iter(metric(text, "evenserve_worker_batch_size_sum").values()))
    buckets = {
        k.split('le="')[1].split('"')[0]: v
        for k, v in metric(text, "evenserve_worker_batch_size_bucket").items()
    }
    per_size = []
    for size, times in sorted(recorder.by_size.items()):
        p50 = statistics.median(times)
        want = prof.latency_s(size)
        per_size.append(
            {
                "batch": size,
                "batches": len(times),
                "p50_ms": p50 * 1e3,
                "profile_ms": want * 1e3,
                "error_pct": (p50 / want - 1) * 100,
            }
        )
    lat = np.asarray(latencies) * 1e3
    return {
        "clients": clients,
        "requests": clients * per_client,
        "time_scale": scale,
        "statuses": {str(k): v for k, v in statuses.items()},
        "batches": count,
        "mean_batch": total / count if count else None,
        "size_1": len(recorder.by_size.get(1, [])),
        "histogram_cumulative": buckets,
        "per_size": per_size,
        "latency_p50_ms": float(np.percentile(lat, 50)),
        "latency_p99_ms": float(np.percentile(lat, 99)),
        "throughput_rps": clients * per_client / wall_s,
        "loadavg": os.getloadavg(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests", type=int, default=12, help="requests per client")
    ap.add_argument("--time-scale", type=float, default=10.0, help="multiply batch times")
    ap.add_argument("--json", type=Path, default=None, help="write the figures as JSON")
    args = ap.parse_args()
    console = Console(width=140)
    r = measure(args.clients, args.requests, args.time_scale)
    la = r["loadavg"]
    console.print(
        f"host: {os.cpu_count()} CPUs, load average {la[0]:.2f}; {r['clients']} clients x "
        f"{args.requests} requests, batch times x{r['time_scale']:g}; answers: {r['statuses']}"
    )
    console.print(
        f"{r['batches']:.0f} batches, mean batch {r['mean_batch']:.2f} (max 8), "
        f"{r['size_1']} of size 1; latency P50 {r['latency_p50_ms']:.1f} ms, "
        f"P99 {r['latency_p99_ms']:.1f} ms; {r['throughput_rps']:.0f} req/s"
    )
    console.print(
        "/metrics batch-size buckets (cumulative): "
        + ", ".join(f"le={le}: {v:.0f}" for le, v in r["histogram_cumulative"].items())
    )
    t = Table(title="emulated compute time per batch size (P50) vs the profile")
    for col in ("batch", "batches", "P50 ms", "profile ms", "error"):
        t.add_column(col, justify="right")
    for row in r["per_size"]:
        t.add_row(
            str(row["batch"]),
            str(row["batches"]),
            f"{row['p50_ms']:.3f}",
            f"{row['profile_ms']:.3f}",
            f"{row['error_pct']:+.2f} %",
        )
    console.print(t)
    if args.json is not None:
        args.json.write_text(json.dumps(r, indent=2) + "\n")


if __name__ == "__main__":
    main()
