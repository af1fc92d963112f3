"""What the gateway adds over gRPC: ModelInfer latency through the gateway vs straight to
one worker, P50 and P99 at each rate (default 100 and 500 req/s).

    .venv/bin/python bench/grpc_overhead.py                        # 10 s per point
    .venv/bin/python bench/grpc_overhead.py --duration 20 --rates 100,500,1000 --json out/g.json

Needs the grpc extra (``pip install -e '.[grpc]'``). One ``evenserve worker`` process serves
a model whose compute is near zero (an ``emulated:`` device whose profile says 1 us per
batch) over HTTP and gRPC (``--grpc-port``); one ``evenserve gateway`` process fronts it
(the backend's ``grpc_url``, ``gateway.grpc_port``; overload refusals off, as the direct path
has none). A grpc.aio client with the raw stub (``service_pb2_grpc``, ``raw_input_contents``
of one FP32 [1, 4] tensor) sends an open-loop Poisson schedule at each rate for
``--duration`` seconds per target, split into ``--rounds`` phases that alternate direct and
gateway (the order flipped each round, so drift hits both alike); a phase direct and its
gateway twin use the same arrival times (the same seed). Latency is from the scheduled send
time to the answer (no coordinated omission). Per rate: direct P50/P99, gateway P50/P99,
added = gateway - direct, errors (every non-OK answer; should be 0) and the achieved rate
(OK answers / phase time).

The figures depend on the host: the client, the gateway and the worker share its cores.
Ports come from the OS, everything listens on 127.0.0.1, and both processes are stopped on
exit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from tritonclient.grpc import service_pb2, service_pb2_grpc

from gateway_overhead import EVENSERVE, free_port, make_zero_model, pct, start, stop, wait_ready

MODEL = "zero"
CALL_TIMEOUT_S = 10.0
WARMUP_CALLS = 50


def infer_request() -> Any:
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    req = service_pb2.ModelInferRequest(model_name=MODEL)
    req.inputs.add(name="INPUT0", datatype="FP32", shape=list(x.shape))
    req.raw_input_contents.append(x.tobytes())
    return req


def arrivals(rate: float, duration_s: float, seed: int) -> list[float]:
    """Poisson arrival offsets (s) over ``duration_s``."""
    rng = random.Random(seed)
    out: list[float] = []
    t = rng.expovariate(rate)
    while t < duration_s:
        out.append(t)
        t += rng.expovariate(rate)
    return out


async def wait_grpc_ready(address: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    async with grpc.aio.insecure_channel(address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        while time.monotonic() < deadline:
            try:
                r = await stub.ModelReady(service_pb2.ModelReadyRequest(name=MODEL), timeout=1.0)
                if r.ready:
                    return
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.1)
    raise SystemExit(f"gRPC {address}: model {MODEL!r} not ready after {timeout_s} s")


async def phase(
    stub: Any, schedule: list[float], progress: Progress, task: Any
) -> tuple[list[float], dict[str, int], float]:
    """Send ``schedule``; latencies (s) of OK answers, errors by status, the phase's time."""
    req = infer_request()
    await asyncio.gather(*(stub.ModelInfer(req, timeout=CALL_TIMEOUT_S) for _ in range(20)))
    for _ in range(WARMUP_CALLS - 20):
        await stub.ModelInfer(req, timeout=CALL_TIMEOUT_S)
    lat: list[float] = []
    errors: dict[str, int] = {}

    async def one(t_sched: float) -> None:
        try:
            await stub.ModelInfer(req, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            name = exc.code().name
            errors[name] = errors.get(name, 0) + 1
        else:
            lat.append(time.perf_counter() - t_sched)
        progress.advance(task)

    t0 = time.perf_counter()
    tasks = []
    for offset in schedule:
        due = t0 + offset
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(due)))
    await asyncio.gather(*tasks)
    return lat, errors, time.perf_counter() - t0


async def measure(args: argparse.Namespace, direct: str, via: str) -> list[dict[str, Any]]:
    rates = [float(r) for r in args.rates.split(",")]
    phase_s = args.duration / args.rounds
    opts = [("grpc.max_receive_message_length", -1)]
    results = []
    async with (
        grpc.aio.insecure_channel(direct, options=opts) as dch,
        grpc.aio.insecure_channel(via, options=opts) as gch,
    ):
        stubs = {
            "direct": service_pb2_grpc.GRPCInferenceServiceStub(dch),
            "gateway": service_pb2_grpc.GRPCInferenceServiceStub(gch),
        }
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=Console(stderr=True)) as progress:
            for i, rate in enumerate(rates):
                lat: dict[str, list[float]] = {"direct": [], "gateway": []}
                errs: dict[str, dict[str, int]] = {"direct": {}, "gateway": {}}
                ok_time: dict[str, float] = {"direct": 0.0, "gateway": 0.0}
                for r in range(args.rounds):
                    schedule = arrivals(rate, phase_s, args.seed + 1000 * i + r)
                    order = ["direct", "gateway"] if r % 2 == 0 else ["gateway", "direct"]
                    for target in order:
                        task = progress.add_task(
                            f"{rate:g} req/s round {r + 1} {target:7s}", total=len(schedule)
                        )
                        got, e, took = await phase(stubs[target], schedule, progress, task)
                        lat[target] += got
                        ok_time[target] += took
                        for k, v in e.items():
                            errs[target][k] = errs[target].get(k, 0) + v
                row: dict[str, Any] = {"rate_rps": rate, "duration_s": args.duration}
                for target in ("direct", "gateway"):
                    xs = lat[target]
                    row[f"{target}_p50_ms"] = pct(xs, 0.5) * 1e3 if xs else None
                    row[f"{target}_p99_ms"] = pct(xs, 0.99) * 1e3 if xs else None
                    row[f"{target}_errors"] = sum(errs[target].values())
                    row[f"{target}_errors_by_code"] = errs[target]
                    row[f"{target}_achieved_rps"] = len(xs) / ok_time[target]
                    row[f"{target}_requests"] = len(xs)
                if lat["direct"] and lat["gateway"]:
                    row["added_p50_ms"] = row["gateway_p50_ms"] - row["direct_p50_ms"]
                    row["added_p99_ms"] = row["gateway_p99_ms"] - row["direct_p99_ms"]
                results.append(row)
    return results


def show(rows: list[dict[str, Any]]) -> None:
    table = Table(title="gRPC ModelInfer: gateway added latency (ms)")
    for col in (
        "rate",
        "direct P50",
        "direct P99",
        "gateway P50",
        "gateway P99",
        "added P50",
        "added P99",
        "errors d/g",
        "achieved d/g",
    ):
        table.add_column(col, justify="right")
    for r in rows:

        def f(key: str, r: dict[str, Any] = r) -> str:
            v = r.get(key)
            return "-" if v is None else f"{v:.3f}"

        table.add_row(
            f"{r['rate_rps']:g}",
            f("direct_p50_ms"),
            f("direct_p99_ms"),
            f("gateway_p50_ms"),
            f("gateway_p99_ms"),
            f("added_p50_ms"),
            f("added_p99_ms"),
            f"{r['direct_errors']}/{r['gateway_errors']}",
            f"{r['direct_achieved_rps']:.1f}/{r['gateway_achieved_rps']:.1f}",
        )
    Console(width=140).print(table)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="100,500", help="comma-separated req/s")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds per target per rate")
    ap.add_argument("--rounds", type=int, default=2, help="direct/gateway phase pairs per rate")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    if args.rounds < 1 or args.duration <= 0:
        ap.error("--rounds >= 1 and --duration > 0")
    procs = []
    with tempfile.TemporaryDirectory(prefix="evenserve-grpc-bench-") as d:
        tmp = Path(d)
        try:
            repo, pset = make_zero_model(tmp)
            wport, wgrpc, gport, ggrpc = (free_port() for _ in range(4))
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
            wcmd = [*EVENSERVE, "worker", "--repo", str(repo), "--device", f"emulated:{pset}",
                    "--port", str(wport), "--grpc-port", str(wgrpc)]  # fmt: skip
            procs.append(start(wcmd, tmp / "worker.log", env))
            wait_ready(f"http://127.0.0.1:{wport}", procs[-1])
            cfg = {
                "gateway": {"host": "127.0.0.1", "port": gport, "grpc_port": ggrpc,
                            "routing": "queue-aware", "admin": {"token": "bench-token-0000"},
                            "overload": {"enabled": False}},
                "backends": [{"name": "w0", "url": f"http://127.0.0.1:{wport}",
                              "grpc_url": f"127.0.0.1:{wgrpc}", "models": [MODEL]}],
            }  # fmt: skip
            path = tmp / "gateway.yaml"
            path.write_text(json.dumps(cfg))
            procs.append(start([*EVENSERVE, "gateway", "--config", str(path)], tmp / "gw.log"))
            wait_ready(f"http://127.0.0.1:{gport}", procs[-1])
            direct, via = f"127.0.0.1:{wgrpc}", f"127.0.0.1:{ggrpc}"

            async def run() -> list[dict[str, Any]]:
                await wait_grpc_ready(direct)
                await wait_grpc_ready(via)
                return await measure(args, direct, via)

            rows = asyncio.run(run())
        finally:
            stop(procs)
    show(rows)
    out = {"host_cpus": os.cpu_count(), "model": MODEL, "rounds": args.rounds, "rates": rows}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {args.json}")
    bad = sum(r["direct_errors"] + r["gateway_errors"] for r in rows)
    if bad:
        print(f"{bad} requests failed", file=sys.stderr)


if __name__ == "__main__":
    main()
