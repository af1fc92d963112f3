"""How much of the device's throughput the worker keeps: a real CPU model, fixed batch size.

Phases, all on this machine:
1. ``evenserve worker`` starts as a subprocess serving one model with static batching of
   exactly ``--batch-size`` (and loads it; it then sits idle).
2. Plain loop A: this process loads the same model with the same runtime and calls it on a
   synthetic batch of ``--batch-size`` in a tight loop.
3. Through the worker: ``2 x batch-size`` closed-loop HTTP clients (binary tensors, one item
   per request) keep the worker's queue full, so every batch it runs is full.
4. Plain loop B, as A (the two plain runs bracket the worker run, so drift in the host's load
   shows up as a difference between A and B rather than as a bias).
5. Added latency at low load: one client, batching ``none``, against the plain loop at
   batch 1 (a second worker start).

Prints items/s of each phase, the throughput ratio worker / mean(A, B), and the added latency
per request: (a) at the fixed batch size, the client's mean latency minus the worker's own
mean queue + compute time per request (what HTTP, parsing and encoding add); (b) at batch 1
with one client, the client's median latency minus the plain loop's median batch-1 time.

Usage: python bench/worker_efficiency.py [--model resnet50] [--batch-size 8] [--batches 10]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from evenserve.runtime.device import parse_device
from evenserve.worker.profiler import build_runtime, synthetic_batch
from evenserve.worker.repository import ModelEntry, load_repository

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-c", "from evenserve.cli.main import main; main()"]


def plain_loop(entry: ModelEntry, batch: int, n: int, threads: int) -> tuple[float, list[float]]:
    """(items/s, per-batch seconds) of the runtime called directly."""
    runtime = build_runtime(entry, parse_device("cpu"), cpu_threads=threads)
    runtime.load()
    inputs = synthetic_batch(entry, batch, {}, np.random.default_rng(0))
    runtime.run(inputs)
    times = []
    t0 = time.perf_counter()
    for _ in range(n):
        s = time.perf_counter()
        runtime.run(inputs)
        times.append(time.perf_counter() - s)
    total = time.perf_counter() - t0
    runtime.close()
    del runtime
    gc.collect()
    return batch * n / total, times


def start_worker(
    repo: Path, model: str, batching: str, threads: int, tmp: Path
) -> tuple[subprocess.Popen[bytes], str]:
    port_file = tmp / f"port-{time.monotonic_ns()}"
    log = (tmp / "worker.log").open("ab")
    proc = subprocess.Popen(
        [*CLI, "worker", "--repo", str(repo), "--models", model, "--device", "cpu",
         "--port", "0", "--port-file", str(port_file), "--batching", batching,
         "--cpu-threads", str(threads), "--log-level", "warning"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    log.close()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"worker exited:\n{(tmp / 'worker.log').read_text()[-3000:]}")
        if port_file.exists() and port_file.read_text().strip():
            url = f"http://127.0.0.1:{port_file.read_text().strip()}"
            try:
                if httpx.get(url + "/v2/health/ready", timeout=2).status_code == 200:
                    return proc, url
            except httpx.TransportError:
                pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("worker did not become ready")


def stop_worker(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def request_body(entry: ModelEntry) -> tuple[bytes, dict[str, str]]:
    one = synthetic_batch(entry, 1, {}, np.random.default_rng(1))
    head: dict[str, Any] = {
        "inputs": [
            {"name": k, "datatype": t.datatype, "shape": list(v.shape),
             "parameters": {"binary_data_size": v.nbytes}}
            for (k, v), t in zip(one.items(), entry.config.inputs, strict=True)
        ],
        "parameters": {"binary_data_output": True},
    }  # fmt: skip
    raw = json.dumps(head).encode()
    body = raw + b"".join(np.ascontiguousarray(v).tobytes() for v in one.values())
    return body, {"Inference-Header-Content-Length": str(len(raw))}


async def drive(
    url: str, model: str, body: bytes, headers: dict[str, str], clients: int, total: int
) -> tuple[float, list[float]]:
    """Closed loop: ``clients`` users until ``total`` requests completed; (seconds, latencies)."""
    latencies: list[float] = []
    sent = 0

    async def user(c: httpx.AsyncClient) -> None:
        nonlocal sent
        while sent < total:
            sent += 1
            s = time.perf_counter()
            r = await c.post(f"/v2/models/{model}/infer", content=body, headers=headers)
            if r.status_code != 200:
                raise SystemExit(f"worker answered {r.status_code}: {r.text}")
            latencies.append(time.perf_counter() - s)

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=600) as c:
        t0 = time.perf_counter()
        await asyncio.gather(*(user(c) for _ in range(clients)))
        return time.perf_counter() - t0, latencies


def model_stats(url: str, model: str) -> dict[str, Any]:
    stats: dict[str, Any] = httpx.get(f"{url}/v2/models/{model}/stats").json()["model_stats"][0]
    return stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repo", type=Path, default=ROOT / "examples" / "models" / "transformers")
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--batches", type=int, default=10, help="measured batches per phase")
    ap.add_argument("--threads", type=int, default=2, help="torch threads, both sides")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()
    b, n = args.batch_size, args.batches
    (entry,) = load_repository(args.repo, [args.model], check_profiles=False)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        static = f"{{policy: static, batch_size: {b}, max_wait_ms: 60000}}"
        proc, url = start_worker(args.repo, args.model, static, args.threads, tmp)
        body, headers = request_body(entry)
        try:
            print(f"model {args.model}, batch size {b}, {n} measured batches per phase, "
                  f"{args.threads} torch threads")  # fmt: skip
            plain_a, times_a = plain_loop(entry, b, n, args.threads)
            print(f"plain loop A:    {plain_a:8.2f} items/s "
                  f"(median {statistics.median(times_a) * 1e3:.1f} ms per batch)")  # fmt: skip
            asyncio.run(drive(url, args.model, body, headers, 2 * b, 2 * b))  # warm-up
            before = model_stats(url, args.model)
            secs, lat = asyncio.run(drive(url, args.model, body, headers, 2 * b, b * n))
            after = model_stats(url, args.model)
            worker_tput = b * n / secs
            print(f"through worker:  {worker_tput:8.2f} items/s ({2 * b} closed-loop clients)")
            plain_b, times_b = plain_loop(entry, b, n, args.threads)
            print(f"plain loop B:    {plain_b:8.2f} items/s "
                  f"(median {statistics.median(times_b) * 1e3:.1f} ms per batch)")  # fmt: skip
        finally:
            stop_worker(proc)
        inf_a, inf_b = before["inference_stats"], after["inference_stats"]
        reqs = inf_b["success"]["count"] - inf_a["success"]["count"]
        queue_ms = (inf_b["queue"]["ns"] - inf_a["queue"]["ns"]) / reqs / 1e6
        compute_ms = sum(
            inf_b[k]["ns"] - inf_a[k]["ns"] for k in ("compute_input", "compute_infer",
                                                       "compute_output")
        ) / reqs / 1e6  # fmt: skip
        execs = after["execution_count"] - before["execution_count"]
        sizes = {s["batch_size"] for s in after["batch_stats"]}
        ratio = worker_tput / ((plain_a + plain_b) / 2)
        client_ms = statistics.mean(lat) * 1e3
        added_loaded_ms = client_ms - queue_ms - compute_ms
        print(
            f"worker ran {execs} batches, sizes {sorted(sizes)}; per request: queue "
            f"{queue_ms:.1f} ms + compute {compute_ms:.1f} ms; client saw {client_ms:.1f} ms"
        )
        # Low load: one client, no batching, against the plain loop at batch 1.
        _, times_1 = plain_loop(entry, 1, max(5, n), args.threads)
        proc, url = start_worker(args.repo, args.model, "none", args.threads, tmp)
        try:
            asyncio.run(drive(url, args.model, body, headers, 1, 2))
            _, lat1 = asyncio.run(drive(url, args.model, body, headers, 1, max(5, n)))
        finally:
            stop_worker(proc)
        added_single_ms = (statistics.median(lat1) - statistics.median(times_1)) * 1e3
    print(
        f"THROUGHPUT RATIO worker / plain loop at batch {b}: {ratio:.3f} "
        f"({worker_tput:.2f} vs {(plain_a + plain_b) / 2:.2f} items/s)"
    )
    print(
        f"ADDED LATENCY per request at batch {b} (client mean - worker queue - compute): "
        f"{added_loaded_ms:.2f} ms"
    )
    print(
        f"ADDED LATENCY per request at batch 1, one client (client median - plain median): "
        f"{added_single_ms:.2f} ms ({statistics.median(lat1) * 1e3:.1f} vs "
        f"{statistics.median(times_1) * 1e3:.1f} ms)"
    )
    if args.json is not None:
        args.json.write_text(json.dumps({
            "model": args.model, "batch_size": b, "batches": n, "threads": args.threads,
            "plain_items_per_s": [plain_a, plain_b], "worker_items_per_s": worker_tput,
            "throughput_ratio": ratio, "added_latency_ms_loaded": added_loaded_ms,
            "added_latency_ms_batch1": added_single_ms, "worker_queue_ms": queue_ms,
            "worker_compute_ms_per_request": compute_ms, "client_latency_ms": client_ms,
        }, indent=2) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
