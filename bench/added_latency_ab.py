"""The gateway's added latency at concurrency 1, two source trees side by side in one run.

    .venv/bin/python bench/added_latency_ab.py --a-src OTHER_CHECKOUT/src --b-src src
    .venv/bin/python bench/added_latency_ab.py --a-src OLD/src --b-src src --protocol grpc
    .venv/bin/python bench/added_latency_ab.py --a-src OLD/src --b-src src --payload resnet

A timed A/B of a change to the request path (for instance an older commit checked out with
``git worktree add``): each tree's ``evenserve worker`` (an ``emulated:`` device, 1 us per
batch, over HTTP and gRPC) and ``evenserve gateway`` in front of it are started from that
tree's sources (``PYTHONPATH``), all four processes live at once. One client then runs, round
by round, four closed loops at concurrency 1 (A direct, A through its gateway, B direct, B
through its gateway), in an order rotated each round so drift and the host's other load hit
all four alike, each after a short warm-up. Per round and arm: P10/P50/P90 of each loop and
``added`` = gateway P50 - direct P50; the medians over the rounds are printed last.

Why not two runs one after the other: at concurrency 1 the latency of a few hundred
microseconds moves with the host's state (other processes, CPU frequency) by more than a
small change to the path does; two sequential runs of the same tree differ by more than two
trees in one interleaved run (what design 0017 records). The payload (``--payload``) is
the tiny tensor (FP32 [1, 4]), a ResNet-50 input (FP32 [1, 3, 224, 224]) or a BERT one (two
INT64 [1, 128]), as HTTP with the binary tensor extension or gRPC with raw contents. Everything
listens on 127.0.0.1; every process is stopped on exit. Numbers depend on the host.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc

from evenserve.httpio.client import HttpClient
from gateway_overhead import free_port, start, stop, wait_ready
from grpc_overhead import (
    INFER_PATH,
    MODELS,
    gateway_cluster,
    grpc_body,
    http_binary_body,
    make_models,
    tensors,
)

#: Both trees are started the same way: the CLI's entry point, which every version has.
BOOT = "from evenserve.cli.main import main; main()"
WARMUP_S = 0.3


def launch(src: Path, tag: str, tmp: Path, repo: Path, pset: Path, procs: list) -> dict:  # type: ignore[type-arg]
    env = {**os.environ, "PYTHONPATH": str(src), "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-c", BOOT]
    wport, wgrpc, gport, ggrpc = (free_port() for _ in range(4))
    worker = [*cmd, "worker", "--repo", str(repo), "--device", f"emulated:{pset}",
              "--port", str(wport), "--grpc-port", str(wgrpc)]  # fmt: skip
    procs.append(start(worker, tmp / f"worker-{tag}.log", env))
    wait_ready(f"http://127.0.0.1:{wport}", procs[-1])
    cfg = gateway_cluster(wport, wgrpc, gport, ggrpc)
    path = tmp / f"gateway-{tag}.yaml"
    path.write_text(json.dumps(cfg))
    procs.append(start([*cmd, "gateway", "--config", str(path)], tmp / f"gateway-{tag}.log", env))
    wait_ready(f"http://127.0.0.1:{gport}", procs[-1])
    return {"direct": (wport, wgrpc), "gateway": (gport, ggrpc)}


Ports = dict[tuple[str, str], tuple[int, int]]
Loops = dict[tuple[str, str], list[list[float]]]


async def measure(
    ports: Ports, protocol: str, rounds: int, duration_s: float, payload: str = "tiny"
) -> Loops:
    model = MODELS[payload]
    arrays = tensors(model, 1)
    body, headers = http_binary_body(model, arrays)
    gbody = grpc_body(model, arrays)
    sends: dict[tuple[str, str], Callable[[], Awaitable[None]]] = {}
    closers: list[Callable[[], object]] = []
    for key, (hport, gport) in ports.items():
        if protocol == "http":
            client = HttpClient(f"http://127.0.0.1:{hport}", 30.0)
            head = client.head("POST", f"/v2/models/{model.name}/infer", headers, len(body))

            async def send_http(client: HttpClient = client, head: bytes = head) -> None:
                reply = await client.send(head, body)
                if reply.status != 200:
                    raise SystemExit(f"answer {reply.status}: {bytes(reply.body)[:200]!r}")

            sends[key] = send_http
            closers.append(client.close)
        else:
            channel = grpc.aio.insecure_channel(f"127.0.0.1:{gport}")
            call = channel.unary_unary(INFER_PATH)

            async def send_grpc(call: grpc.aio.UnaryUnaryMultiCallable = call) -> None:
                await call(gbody, timeout=30.0)

            sends[key] = send_grpc
            closers.append(channel.close)
    out: dict[tuple[str, str], list[list[float]]] = {k: [] for k in sends}
    keys = list(sends)
    try:
        for r in range(rounds):
            for key in keys[r % len(keys) :] + keys[: r % len(keys)]:
                send = sends[key]
                end = time.perf_counter() + WARMUP_S
                while time.perf_counter() < end:
                    await send()
                lat: list[float] = []
                end = time.perf_counter() + duration_s
                while (t0 := time.perf_counter()) < end:
                    await send()
                    lat.append(time.perf_counter() - t0)
                lat.sort()
                n = len(lat)
                out[key].append([lat[n // 10] * 1e3, lat[n // 2] * 1e3, lat[n * 9 // 10] * 1e3, n])
            print(f"  round {r + 1}/{rounds} done", file=sys.stderr, flush=True)
    finally:
        for c in closers:
            got = c()
            if asyncio.iscoroutine(got):
                await got
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a-src", type=Path, required=True, help="arm A: a tree's src/ folder")
    ap.add_argument("--b-src", type=Path, required=True, help="arm B: a tree's src/ folder")
    ap.add_argument("--protocol", choices=("http", "grpc"), default="http")
    ap.add_argument(
        "--payload", choices=tuple(MODELS), default="tiny",
        help="tiny (FP32 [1, 4]), resnet (FP32 [1, 3, 224, 224]) or bert (2 x INT64 [1, 128])",
    )  # fmt: skip
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--duration", type=float, default=2.0, help="seconds per closed loop")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    for src in (args.a_src, args.b_src):
        if not (src / "evenserve").is_dir():
            ap.error(f"{src}: no evenserve package in it (give a tree's src/ folder)")
    if args.rounds < 1 or args.duration <= 0:
        ap.error("--rounds >= 1 and --duration > 0")
    procs: list = []  # type: ignore[type-arg]
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="evenserve-ab-") as d:
        tmp = Path(d)
        repo, pset = make_models(tmp)
        try:
            ports: Ports = {}
            for tag, src in (("A", args.a_src), ("B", args.b_src)):
                for target, pp in launch(src.resolve(), tag, tmp, repo, pset, procs).items():
                    ports[(tag, target)] = pp
            res = asyncio.run(
                measure(ports, args.protocol, args.rounds, args.duration, args.payload)
            )
        finally:
            stop(procs)
    load1 = os.getloadavg()
    summary = {}
    for tag, src in (("A", args.a_src), ("B", args.b_src)):
        d50 = [x[1] for x in res[(tag, "direct")]]
        g50 = [x[1] for x in res[(tag, "gateway")]]
        added = [g - d for d, g in zip(d50, g50, strict=True)]
        summary[tag] = {
            "src": str(src),
            "direct_p50_ms": statistics.median(d50),
            "gateway_p50_ms": statistics.median(g50),
            "gateway_p90_ms": statistics.median(x[2] for x in res[(tag, "gateway")]),
            "added_p50_ms": statistics.median(added),
            "added_by_round_ms": added,
        }
        print(f"{tag} ({src}): added per round " + " ".join(f"{a:.3f}" for a in added))
    print(f"{args.protocol}, {args.payload}, {args.rounds} rounds x {args.duration:g} s, "
          "medians over rounds (ms):")  # fmt: skip
    print(f"{'arm':4s} {'direct P50':>10s} {'gateway P50':>11s} {'gateway P90':>11s} {'added':>7s}")
    for tag, s in summary.items():
        print(f"{tag:4s} {s['direct_p50_ms']:10.3f} {s['gateway_p50_ms']:11.3f} "
              f"{s['gateway_p90_ms']:11.3f} {s['added_p50_ms']:7.3f}")  # fmt: skip
    a, b = summary["A"]["added_p50_ms"], summary["B"]["added_p50_ms"]
    print(f"added B/A {b / a:.2f}; load average (1 min) {load0[0]:.2f}, then {load1[0]:.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"protocol": args.protocol, "arms": summary}, indent=2))


if __name__ == "__main__":
    main()
