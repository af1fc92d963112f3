"""How much of the device's throughput the worker keeps: a real CPU model, fixed batch size.

Phases, all on this machine:
1. ``evenserve worker`` starts as a subprocess serving one model with static batching of
   exactly ``--batch-size`` (and loads it; it then sits idle while the plain loop runs).
   This process loads the same model with the same runtime and warms it up.
2. ``--rounds`` paired rounds, each: a plain loop (the runtime called directly on a synthetic
   batch of ``--batch-size``, ``--batches`` times),
   then the same number of items through the worker, sent by ``2 x batch-size`` closed-loop
   HTTP clients (binary tensors, one item per request) that keep its queue full, so every
   batch it runs is full. Pairing adjacent phases keeps a shared host's changing load from
   biasing the ratio; the median of the rounds' ratios is reported.
3. Added latency at low load: a second worker start with batching ``none``; one request at
   a time, each paired with a plain batch-1 call made just before it.

Prints items/s of each phase, the throughput ratio worker / plain loop, and the added latency
per request: (a) at the fixed batch size, the client's mean latency minus the worker's own
mean queue + compute time per request (what HTTP, parsing and encoding add); (b) at batch 1
with one client, the median over pairs of (client latency - plain batch-1 call).

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


class PlainLoop:
    """The runtime called directly in this process, loaded once and warmed up."""

    def __init__(self, entry: ModelEntry, threads: int, warmup: int = 2) -> None:
        self.entry = entry
        self.runtime = build_runtime(entry, parse_device("cpu"), cpu_threads=threads)
        self.runtime.load()
        self.warmup = warmup
        self._inputs: dict[int, dict[str, Any]] = {}

    def run(self, batch: int, n: int) -> tuple[float, list[float]]:
        """(items/s, per-batch seconds) over ``n`` batches of ``batch``."""
        if batch not in self._inputs:
            self._inputs[batch] = synthetic_batch(self.entry, batch, {}, np.random.default_rng(0))
            for _ in range(self.warmup):
                self.runtime.run(self._inputs[batch])
        inputs = self._inputs[batch]
        times = []
        t0 = time.perf_counter()
        for _ in range(n):
            s = time.perf_counter()
            self.runtime.run(inputs)
            times.append(time.perf_counter() - s)
        return batch * n / (time.perf_counter() - t0), times

    def close(self) -> None:
        self.runtime.close()
        gc.collect()


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
    ap.add_argument("--rounds", type=int, default=3, help="paired plain/worker rounds")
    ap.add_argument("--single-pairs", type=int, default=15, help="paired batch-1 requests")
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
                  f"{args.threads} torch thread(s), {args.rounds} rounds")  # fmt: skip
            asyncio.run(drive(url, args.model, body, headers, 2 * b, 2 * b))  # warm-up
            plain_runs: list[float] = []
            worker_runs: list[float] = []
            round_ratios: list[float] = []
            lat: list[float] = []
            plain_loop = PlainLoop(entry, args.threads)
            before = model_stats(url, args.model)
            for r in range(args.rounds):
                plain, times = plain_loop.run(b, n)
                secs, lat_r = asyncio.run(drive(url, args.model, body, headers, 2 * b, b * n))
                lat += lat_r
                plain_runs.append(plain)
                worker_runs.append(b * n / secs)
                round_ratios.append(worker_runs[-1] / plain)
                print(f"round {r + 1}: plain loop {plain:8.2f} items/s (median "
                      f"{statistics.median(times) * 1e3:.1f} ms per batch), through worker "
                      f"{worker_runs[-1]:8.2f} items/s ({2 * b} closed-loop clients): "
                      f"ratio {round_ratios[-1]:.3f}")  # fmt: skip
            after = model_stats(url, args.model)
        finally:
            stop_worker(proc)
        worker_tput = statistics.mean(worker_runs)
        plain_tput = statistics.mean(plain_runs)
        inf_a, inf_b = before["inference_stats"], after["inference_stats"]
        reqs = inf_b["success"]["count"] - inf_a["success"]["count"]
        queue_ms = (inf_b["queue"]["ns"] - inf_a["queue"]["ns"]) / reqs / 1e6
        compute_ms = sum(
            inf_b[k]["ns"] - inf_a[k]["ns"] for k in ("compute_input", "compute_infer",
                                                       "compute_output")
        ) / reqs / 1e6  # fmt: skip
        execs = after["execution_count"] - before["execution_count"]
        sizes = {s["batch_size"] for s in after["batch_stats"]}
        ratio = statistics.median(round_ratios)
        client_ms = statistics.mean(lat) * 1e3
        added_loaded_ms = client_ms - queue_ms - compute_ms
        print(
            f"worker ran {execs} batches, sizes {sorted(sizes)}; per request: queue "
            f"{queue_ms:.1f} ms + compute {compute_ms:.1f} ms; client saw {client_ms:.1f} ms"
        )
        # Low load: one client, no batching, each request paired with a plain batch-1 call.
        proc, url = start_worker(args.repo, args.model, "none", args.threads, tmp)
        times_1: list[float] = []
        lat1: list[float] = []
        try:
            asyncio.run(drive(url, args.model, body, headers, 1, 2))
            plain_loop.run(1, 1)
            for _ in range(args.single_pairs):
                times_1 += plain_loop.run(1, 1)[1]
                lat1 += asyncio.run(drive(url, args.model, body, headers, 1, 1))[1]
        finally:
            stop_worker(proc)
            plain_loop.close()
        added_single_ms = statistics.median(
            (w - p) * 1e3 for w, p in zip(lat1, times_1, strict=True)
        )
    print(
        f"THROUGHPUT RATIO worker / plain loop at batch {b}: {ratio:.3f} (median of "
        f"{len(round_ratios)} paired rounds; means {worker_tput:.2f} vs {plain_tput:.2f} "
        f"items/s, ratio of means {worker_tput / plain_tput:.3f})"
    )
    print(
        f"ADDED LATENCY per request at batch {b} (client mean - worker queue - compute): "
        f"{added_loaded_ms:.2f} ms"
    )
    print(
        f"ADDED LATENCY per request at batch 1, one client (median of {len(lat1)} paired "
        f"differences, client - plain call): {added_single_ms:.2f} ms (medians "
        f"{statistics.median(lat1) * 1e3:.1f} vs {statistics.median(times_1) * 1e3:.1f} ms)"
    )
    if args.json is not None:
        args.json.write_text(json.dumps({
            "model": args.model, "batch_size": b, "batches": n, "threads": args.threads,
            "plain_items_per_s": plain_runs, "worker_items_per_s": worker_runs,
            "round_ratios": round_ratios,
            "throughput_ratio": ratio, "added_latency_ms_loaded": added_loaded_ms,
            "added_latency_ms_batch1": added_single_ms, "worker_queue_ms": queue_ms,
            "worker_compute_ms_per_request": compute_ms, "client_latency_ms": client_ms,
        }, indent=2) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
