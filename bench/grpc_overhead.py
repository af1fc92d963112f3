"""What the gateway adds over gRPC, next to what it adds over HTTP, in the same run.

    .venv/bin/python bench/grpc_overhead.py                               # every payload
    .venv/bin/python bench/grpc_overhead.py --payload tiny --duration 3 --rounds 5
    .venv/bin/python bench/grpc_overhead.py --payload resnet,bert --json out/g.json

Needs the grpc extra (``pip install -e '.[grpc]'``). One ``evenserve worker`` process serves
three models whose compute is near zero (an ``emulated:`` device whose profile says 1 us per
batch) over HTTP and gRPC (``--grpc-port``); one ``evenserve gateway`` process fronts it over
both (the backend's ``url`` and ``grpc_url``, ``gateway.grpc_port``; overload refusals off, as
the direct path has none). Through the gateway a gRPC call reaches the worker as the
gateway's ``grpc_forward`` says: by default (the gateway's own default, no key written)
translated to HTTP with the binary tensor extension, so the worker serves it over HTTP;
``--grpc-forward grpc`` relays it as bytes to the worker's gRPC endpoint instead (the key is
written only when the option is given, so the script runs against older gateways too);
``--grpc-server grpcio`` or ``h2`` chooses what serves the gateway's gRPC port (likewise).
Payloads (``--payload``, comma-separated):

- ``tiny``: one FP32 [1, 4] tensor (16 bytes);
- ``resnet``: a ResNet-50 input, FP32 [1, 3, 224, 224] (588 KiB);
- ``bert``: a BERT input, two INT64 [1, 128] tensors (input_ids, attention_mask).

Each is sent three ways, to the worker (``direct``) and through the gateway: ``grpc``
(ModelInfer with ``raw_input_contents``; the grpc.aio client sends the serialized request as
bytes and takes the answer as bytes, so the client costs the same both ways), ``http-bin``
(the binary tensor extension, binary outputs asked for) and ``http-json`` (``data`` lists,
JSON outputs), the last two with the project's own HTTP client (``httpio.client.HttpClient``,
one pooled keep-alive connection per concurrent user).

Per payload, ``--rounds`` rounds; each round runs every (protocol, target) cell in an order
rotated round by round (so drift hits all alike), each cell as two closed loops like
perf_analyzer's: concurrency 1 for ``--duration`` seconds (the latency: P50, P99) and
concurrency 8 for ``--duration`` seconds (the rate at saturation: OK answers / time), each
after a short warm-up. For each cell the CPU seconds the gateway and the worker processes
spent per request (``/proc/PID/stat``) are read around the concurrency-8 loop: the figure
least moved by other load on a shared host. Printed: the medians over the rounds, then per
payload and HTTP flavour the two targets:

- ``added``: gateway P50 - direct P50 (concurrency 1), gRPC's over HTTP's (target <= 1.5);
- ``rate``: the rate through the gateway at concurrency 8, gRPC's over HTTP's (target >= 0.8).

The grpcio floor (unless ``--no-floor``): two more processes with no evenserve code in
them, a bare grpc.aio server answering every ModelInfer with a fixed small answer
(``floor-echo``, bytes in and out) and a bare grpc.aio proxy in front of it (``floor-proxy``:
a generic handler forwarding the bytes over one kept channel with the gateway's channel
options: no size limits, no transparent retries), measured as the cells above.
``floor-proxy - floor-echo`` is what any gateway built on grpcio adds on this host before it
does anything of its own; it is printed next to the gateway's added latency and over HTTP's.

The rate of a zero-compute model is bounded by CPU: the client, the gateway and the worker
share the host's cores, and the gRPC Python client and the worker's grpcio server cost more
per request than their HTTP counterparts, so the rate ratio is also shown against each
protocol's direct rate (``gw/direct``). The host's load average before and after the run
is printed with the figures: on a shared host, quote medians of several runs. Ports come from
the OS, everything listens on 127.0.0.1, every process is stopped on exit; every non-OK
answer is counted as an error, by kind (there should be none).
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from rich.console import Console
from rich.table import Table
from tritonclient.grpc import service_pb2, service_pb2_grpc

from evenserve.httpio.client import HttpClient, HttpClientError
from gateway_overhead import EVENSERVE, free_port, pct, start, stop, wait_ready

INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"
CALL_TIMEOUT_S = 30.0
WARMUP_S = 0.5
PROTOCOLS = ("grpc", "http-bin", "http-json")
TARGETS = ("direct", "gateway")
FLOOR = ("floor-echo", "floor-proxy")
#: The floor proxy's channel: as the gateway's (no size limits, no transparent retries).
FLOOR_CHANNEL_OPTIONS = (
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    ("grpc.enable_retries", 0),
)
#: The closed loops: concurrency 1 (latency) and 8 (rate at saturation, as perf_analyzer's).
LATENCY_USERS = 1
RATE_USERS = 8
#: The targets (see the module docstring).
ADDED_TARGET = 1.5
RATE_TARGET = 0.8


@dataclass(frozen=True)
class Tensor:
    name: str
    datatype: str
    dims: tuple[int, ...]  # without the batch dimension


@dataclass(frozen=True)
class Model:
    """A payload: the emulated model that takes it, its inputs and its output."""

    name: str
    inputs: tuple[Tensor, ...]
    output: Tensor


MODELS = {
    "tiny": Model("zero", (Tensor("INPUT0", "FP32", (4,)),), Tensor("OUTPUT0", "FP32", (4,))),
    "resnet": Model(
        "resnet50", (Tensor("input", "FP32", (3, 224, 224)),), Tensor("output", "FP32", (1000,))
    ),
    "bert": Model(
        "bert",
        (Tensor("input_ids", "INT64", (128,)), Tensor("attention_mask", "INT64", (128,))),
        Tensor("logits", "FP32", (2,)),
    ),
}
NUMPY = {"FP32": np.float32, "INT64": np.int64}


# -- the grpcio floor (each run as a subprocess: --serve-floor-echo / --serve-floor-proxy) -------
def serve_floor(port: int, upstream: str | None) -> None:
    """A bare grpc.aio server on ``port``: with no ``upstream``, ModelInfer answers a fixed
    small response; with one, it forwards the request's bytes there and relays the answer."""
    answer = service_pb2.ModelInferResponse(model_name="floor", model_version="1")
    answer.outputs.add(name="OUTPUT0", datatype="FP32", shape=[1, 4])
    answer.raw_output_contents.append(bytes(16))
    reply = bytes(answer.SerializeToString())

    async def serve() -> None:
        if upstream is None:

            async def infer(raw: bytes, context: Any) -> bytes:
                return reply

        else:
            channel = grpc.aio.insecure_channel(upstream, options=list(FLOOR_CHANNEL_OPTIONS))
            forward = channel.unary_unary(INFER_PATH)

            async def infer(raw: bytes, context: Any) -> bytes:
                return bytes(await forward(raw, timeout=CALL_TIMEOUT_S))

        server = grpc.aio.server(options=[("grpc.max_receive_message_length", -1)])
        handler = grpc.unary_unary_rpc_method_handler(infer)
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "inference.GRPCInferenceService", {"ModelInfer": handler}
                ),
            )
        )
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()

    asyncio.run(serve())


def make_models(tmp: Path) -> tuple[Path, Path]:
    """A repository with every payload's model (emulated, 1 us per batch) and the profiles."""
    repo, pset = tmp / "repo", tmp / "profiles"
    pset.mkdir(parents=True)
    for m in MODELS.values():
        d = repo / m.name
        d.mkdir(parents=True)
        ins = ", ".join(
            f"{{name: {t.name}, datatype: {t.datatype}, shape: {list(t.dims)}}}" for t in m.inputs
        )
        o = m.output
        (d / "model.yaml").write_text(
            f"runtime: emulated\ninputs: [{ins}]\n"
            f"outputs: [{{name: {o.name}, datatype: {o.datatype}, shape: {list(o.dims)}}}]\n"
            "max_batch_size: 8\n"
        )
        (pset / f"{m.name}.yaml").write_text(
            f"model: {m.name}\ndevice: none\nruntime: emulated\nprecision: fp32\n"
            "source: near-zero compute for measuring the gateway's own overhead\n"
            "points: [{batch: 1, latency_ms: 0.001}, {batch: 8, latency_ms: 0.001}]\n"
        )
    return repo, pset


def gateway_cluster(wport: int, wgrpc: int, gport: int, ggrpc: int) -> dict[str, Any]:
    """The gateway's cluster file in front of one worker serving every payload's model over
    HTTP and gRPC (overload refusals off: the direct path has none)."""
    names = [m.name for m in MODELS.values()]
    return {
        "gateway": {"host": "127.0.0.1", "port": gport, "grpc_port": ggrpc,
                    "routing": "queue-aware", "admin": {"token": "bench-token-0000"},
                    "overload": {"enabled": False}},
        "backends": [{"name": "w0", "url": f"http://127.0.0.1:{wport}",
                      "grpc_url": f"127.0.0.1:{wgrpc}", "models": names}],
    }  # fmt: skip


def tensors(model: Model, seed: int) -> list[np.ndarray]:
    """One request's inputs (batch 1), random."""
    rng = np.random.default_rng(seed)
    out = []
    for t in model.inputs:
        shape = (1, *t.dims)
        if t.datatype == "FP32":
            out.append(rng.standard_normal(shape).astype(np.float32))
        else:
            out.append(rng.integers(0, 30000, size=shape).astype(NUMPY[t.datatype]))
    return out


def grpc_body(model: Model, arrays: list[np.ndarray]) -> bytes:
    """A serialized ModelInferRequest with ``raw_input_contents``."""
    req = service_pb2.ModelInferRequest(model_name=model.name)
    for t, a in zip(model.inputs, arrays, strict=True):
        req.inputs.add(name=t.name, datatype=t.datatype, shape=list(a.shape))
        req.raw_input_contents.append(a.astype(a.dtype.newbyteorder("<")).tobytes())
    return bytes(req.SerializeToString())


def http_binary_body(model: Model, arrays: list[np.ndarray]) -> tuple[bytes, dict[str, str]]:
    """A binary tensor extension body (JSON header, raw bytes) asking for binary outputs."""
    raws = [a.astype(a.dtype.newbyteorder("<")).tobytes() for a in arrays]
    head = {
        "inputs": [
            {"name": t.name, "datatype": t.datatype, "shape": list(a.shape),
             "parameters": {"binary_data_size": len(r)}}
            for t, a, r in zip(model.inputs, arrays, raws, strict=True)
        ],
        "outputs": [{"name": model.output.name, "parameters": {"binary_data": True}}],
    }  # fmt: skip
    hj = json.dumps(head).encode()
    headers = {
        "content-type": "application/octet-stream",
        "inference-header-content-length": str(len(hj)),
    }
    return hj + b"".join(raws), headers


def http_json_body(model: Model, arrays: list[np.ndarray]) -> tuple[bytes, dict[str, str]]:
    body = {
        "inputs": [
            {"name": t.name, "datatype": t.datatype, "shape": list(a.shape),
             "data": a.reshape(-1).tolist()}
            for t, a in zip(model.inputs, arrays, strict=True)
        ]
    }  # fmt: skip
    return json.dumps(body).encode(), {"content-type": "application/json"}


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def median(xs: list[float | None]) -> float | None:
    got = [x for x in xs if x is not None]
    return statistics.median(got) if got else None


#: Sends one request: None when it was answered OK, else what went wrong.
Send = Callable[[], Awaitable[str | None]]


class Senders:
    """One ``send`` per (protocol, target)."""

    def __init__(self, model: Model, addrs: dict[str, dict[str, str]], seed: int) -> None:
        arrays = tensors(model, seed)
        self.grpc_body = grpc_body(model, arrays)
        self.bodies = {
            "http-bin": http_binary_body(model, arrays),
            "http-json": http_json_body(model, arrays),
        }
        self.path = f"/v2/models/{model.name}/infer"
        self.addrs = addrs
        self.channels: list[Any] = []
        self.clients: list[HttpClient] = []

    def make(self, proto: str, target: str) -> Send:
        addr = self.addrs[target][proto.split("-")[0]]
        if proto == "grpc":
            opts = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
            channel = grpc.aio.insecure_channel(addr, options=opts)
            self.channels.append(channel)
            call = channel.unary_unary(INFER_PATH)  # bytes in, bytes out
            body = self.grpc_body

            async def send_grpc() -> str | None:
                try:
                    await call(body, timeout=CALL_TIMEOUT_S)
                except grpc.aio.AioRpcError as exc:
                    return str(exc.code().name)
                return None

            return send_grpc
        client = HttpClient(f"http://{addr}", CALL_TIMEOUT_S)
        self.clients.append(client)
        payload, headers = self.bodies[proto]
        head = client.head("POST", self.path, headers, len(payload))

        async def send_http() -> str | None:
            try:
                reply = await client.send(head, payload)
            except (HttpClientError, OSError) as exc:
                return type(exc).__name__
            return None if reply.status == 200 else str(reply.status)

        return send_http

    async def aclose(self) -> None:
        for c in self.channels:
            await c.close()
        for h in self.clients:
            h.close()


async def closed_loop(
    send: Send, users: int, duration_s: float, errors: dict[str, int]
) -> tuple[list[float], float]:
    """``users`` users each sending the next request when the last is answered, for
    ``duration_s``: latencies (s) of OK answers and the loop's time; failures counted in
    ``errors`` by kind."""
    lat: list[float] = []
    end = time.perf_counter() + duration_s

    async def user() -> None:
        while True:
            t0 = time.perf_counter()
            if t0 >= end:
                return
            failed = await send()
            if failed is None:
                lat.append(time.perf_counter() - t0)
            else:
                errors[failed] = errors.get(failed, 0) + 1

    t0 = time.perf_counter()
    await asyncio.gather(*(user() for _ in range(users)))
    return lat, time.perf_counter() - t0


async def cell(
    send: Send, duration_s: float, pids: dict[str, int]
) -> dict[str, float | int | None]:
    """One (protocol, target) cell of a round: concurrency 1, then concurrency 8."""
    errors: dict[str, int] = {}
    await closed_loop(send, RATE_USERS, WARMUP_S, errors)
    lat, _ = await closed_loop(send, LATENCY_USERS, duration_s, errors)
    cpu0 = {k: cpu_s(p) for k, p in pids.items()}
    lat8, took = await closed_loop(send, RATE_USERS, duration_s, errors)
    cpu1 = {k: cpu_s(p) for k, p in pids.items()}
    n = len(lat8)
    return {
        "p50_ms": pct(lat, 0.5) * 1e3 if lat else None,
        "p99_ms": pct(lat, 0.99) * 1e3 if lat else None,
        "rate_rps": n / took,
        "c8_p50_ms": pct(lat8, 0.5) * 1e3 if lat8 else None,
        "errors": sum(errors.values()),
        "errors_by_kind": errors,
        **{f"{k}_cpu_us": (cpu1[k] - cpu0[k]) / n * 1e6 if n else None for k in pids},
    }


async def measure_payload(
    name: str, args: argparse.Namespace, addrs: dict[str, dict[str, str]], pids: dict[str, int]
) -> dict[str, Any]:
    model = MODELS[name]
    senders = Senders(model, addrs, args.seed)
    cells = [(p, t) for p in PROTOCOLS for t in TARGETS]
    if "floor-echo" in addrs:
        cells += [("grpc", t) for t in FLOOR]
    sends = {c: senders.make(*c) for c in cells}
    rounds: dict[str, list[dict[str, Any]]] = {f"{p}/{t}": [] for p, t in cells}
    try:
        for r in range(args.rounds):
            k = r % len(cells)
            for c in cells[k:] + cells[:k]:
                got = await cell(sends[c], args.duration, pids)
                rounds[f"{c[0]}/{c[1]}"].append(got)
                print(f"  {name} round {r + 1} {c[0]:9s} {c[1]:7s} P50 {fmt(got['p50_ms'])} ms "
                      f"rate {got['rate_rps']:.0f}/s errors {got['errors_by_kind'] or 0}",
                      file=sys.stderr, flush=True)  # fmt: skip
    finally:
        await senders.aclose()
    out: dict[str, Any] = {
        "payload": name,
        "model": model.name,
        "grpc_request_bytes": len(senders.grpc_body),
        "cells": {},
    }
    for key, rs in rounds.items():
        kinds: dict[str, int] = {}
        for r in rs:
            for k, v in r["errors_by_kind"].items():
                kinds[k] = kinds.get(k, 0) + v
        out["cells"][key] = {
            **{f: median([r[f] for r in rs]) for f in rs[0] if f.endswith(("_ms", "_rps", "_us"))},
            "errors": sum(kinds.values()),
            "errors_by_kind": kinds,
        }
    out["summary"] = summarize(out["cells"])
    return out


def summarize(cells: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Added latency and rates per protocol, gRPC's over each HTTP flavour's, and the grpcio
    floor when measured."""
    per: dict[str, dict[str, float | None]] = {}
    for p in PROTOCOLS:
        d, g = cells[f"{p}/direct"], cells[f"{p}/gateway"]
        added = None if d["p50_ms"] is None or g["p50_ms"] is None else g["p50_ms"] - d["p50_ms"]
        per[p] = {
            "added_p50_ms": added,
            "gateway_rate_rps": g["rate_rps"],
            "gw_over_direct_rate": ratio(g["rate_rps"], d["rate_rps"]),
            "gateway_cpu_us": g.get("gateway_cpu_us"),
        }
    vs = {}
    for h in ("http-bin", "http-json"):
        vs[h] = {
            "added_ratio": ratio(per["grpc"]["added_p50_ms"], per[h]["added_p50_ms"]),
            "rate_ratio": ratio(per["grpc"]["gateway_rate_rps"], per[h]["gateway_rate_rps"]),
            "normalized_rate_ratio": ratio(
                per["grpc"]["gw_over_direct_rate"], per[h]["gw_over_direct_rate"]
            ),
            "gateway_cpu_ratio": ratio(per["grpc"]["gateway_cpu_us"], per[h]["gateway_cpu_us"]),
        }
    out: dict[str, Any] = {"protocols": per, "grpc_vs": vs}
    if "grpc/floor-echo" in cells:
        e, p = cells["grpc/floor-echo"], cells["grpc/floor-proxy"]
        added = None if e["p50_ms"] is None or p["p50_ms"] is None else p["p50_ms"] - e["p50_ms"]
        out["grpcio_floor"] = {
            "added_p50_ms": added,
            "proxy_cpu_us": p.get("floor-proxy_cpu_us"),
            "over_http_bin_added": ratio(added, per["http-bin"]["added_p50_ms"]),
        }
    return out


def fmt(v: float | None, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def show(results: list[dict[str, Any]], rounds: int) -> None:
    console = Console(width=150)
    for res in results:
        table = Table(
            title=f"payload {res['payload']} (model {res['model']}, gRPC request "
            f"{res['grpc_request_bytes']} bytes): medians of {rounds} rounds"
        )
        for col in ("protocol", "target", "c1 P50 ms", "c1 P99 ms", "c8 rate/s", "c8 P50 ms",
                    "proxy CPU us/req", "worker CPU us/req", "errors"):  # fmt: skip
            table.add_column(col, justify="right")
        for key, c in res["cells"].items():
            p, t = key.split("/")
            own = {"gateway": "gateway_cpu_us", "floor-proxy": "floor-proxy_cpu_us"}.get(t)
            table.add_row(
                p, t, fmt(c["p50_ms"]), fmt(c["p99_ms"]), fmt(c["rate_rps"], ".0f"),
                fmt(c["c8_p50_ms"]),
                fmt(c.get(own), ".0f") if own else "-",
                fmt(c["worker_cpu_us"], ".0f"),
                ", ".join(f"{k} {v}" for k, v in c["errors_by_kind"].items()) or "0",
            )  # fmt: skip
        console.print(table)
        s = res["summary"]
        for p, v in s["protocols"].items():
            console.print(
                f"  {p:9s} added P50 {fmt(v['added_p50_ms'])} ms; through the gateway "
                f"{fmt(v['gateway_rate_rps'], '.0f')}/s ({fmt(v['gw_over_direct_rate'], '.2f')} "
                f"of direct), gateway CPU {fmt(v['gateway_cpu_us'], '.0f')} us/req"
            )
        for h, v in s["grpc_vs"].items():
            a, r = v["added_ratio"], v["rate_ratio"]
            ok_a = "-" if a is None else ("ok" if a <= ADDED_TARGET else "MISSED")
            ok_r = "-" if r is None else ("ok" if r >= RATE_TARGET else "MISSED")
            console.print(
                f"  gRPC vs {h:9s}: added {fmt(a, '.2f')}x (target <= {ADDED_TARGET}: {ok_a}), "
                f"rate {fmt(r, '.2f')}x (target >= {RATE_TARGET}: {ok_r}), rate gw/direct "
                f"{fmt(v['normalized_rate_ratio'], '.2f')}x, gateway CPU "
                f"{fmt(v['gateway_cpu_ratio'], '.2f')}x"
            )
        floor = s.get("grpcio_floor")
        if floor is not None:
            console.print(
                f"  grpcio floor: a bare grpc.aio proxy adds {fmt(floor['added_p50_ms'])} ms "
                f"(CPU {fmt(floor['proxy_cpu_us'], '.0f')} us/req), "
                f"{fmt(floor['over_http_bin_added'], '.2f')}x the gateway's HTTP-bin added latency"
            )


async def wait_grpc_ready(address: str, models: list[str], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    async with grpc.aio.insecure_channel(address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for m in models:
            while True:
                try:
                    r = await stub.ModelReady(service_pb2.ModelReadyRequest(name=m), timeout=1.0)
                    if r.ready:
                        break
                except grpc.aio.AioRpcError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit(f"gRPC {address}: model {m!r} not ready after {timeout_s} s")
                await asyncio.sleep(0.1)


async def wait_floor_ready(addresses: list[str], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    for address in addresses:
        async with grpc.aio.insecure_channel(address) as channel:
            call = channel.unary_unary(INFER_PATH)
            while True:
                try:
                    await call(b"", timeout=1.0)
                    break
                except grpc.aio.AioRpcError:
                    if time.monotonic() > deadline:
                        raise SystemExit(f"{address}: not serving after {timeout_s} s") from None
                    await asyncio.sleep(0.1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--payload", default="tiny,resnet,bert", help="tiny, resnet, bert (commas)")
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per closed loop")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per payload (medians)")
    ap.add_argument("--seed", type=int, default=1, help="of the random tensors")
    ap.add_argument(
        "--no-floor", action="store_true", help="skip the bare grpcio echo and proxy cells"
    )
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument(
        "--grpc-forward",
        choices=("http", "grpc"),
        help="gateway.grpc_forward (default: not written, the gateway's own default)",
    )
    ap.add_argument(
        "--grpc-server",
        choices=("h2", "grpcio"),
        help="gateway.grpc_server (default: not written, the gateway's own default)",
    )
    ap.add_argument("--serve-floor-echo", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--serve-floor-proxy", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_floor_echo:
        serve_floor(args.serve_floor_echo, None)
        return
    if args.serve_floor_proxy:
        serve_floor(int(args.serve_floor_proxy[0]), args.serve_floor_proxy[1])
        return
    payloads = [p.strip() for p in args.payload.split(",") if p.strip()]
    unknown = [p for p in payloads if p not in MODELS]
    if unknown or not payloads:
        ap.error(f"--payload: {', '.join(unknown) or 'none given'} (known: {', '.join(MODELS)})")
    if args.rounds < 1 or args.duration <= 0:
        ap.error("--rounds >= 1 and --duration > 0")
    procs = []
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="evenserve-grpc-bench-") as d:
        tmp = Path(d)
        try:
            repo, pset = make_models(tmp)
            wport, wgrpc, gport, ggrpc = (free_port() for _ in range(4))
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
            wcmd = [*EVENSERVE, "worker", "--repo", str(repo), "--device", f"emulated:{pset}",
                    "--port", str(wport), "--grpc-port", str(wgrpc)]  # fmt: skip
            procs.append(start(wcmd, tmp / "worker.log", env))
            wait_ready(f"http://127.0.0.1:{wport}", procs[-1])
            names = [m.name for m in MODELS.values()]
            cfg = gateway_cluster(wport, wgrpc, gport, ggrpc)
            if args.grpc_forward is not None:
                cfg["gateway"]["grpc_forward"] = args.grpc_forward
            if args.grpc_server is not None:
                cfg["gateway"]["grpc_server"] = args.grpc_server
            path = tmp / "gateway.yaml"
            path.write_text(json.dumps(cfg))
            procs.append(start([*EVENSERVE, "gateway", "--config", str(path)], tmp / "gw.log"))
            wait_ready(f"http://127.0.0.1:{gport}", procs[-1])
            addrs = {
                "direct": {"grpc": f"127.0.0.1:{wgrpc}", "http": f"127.0.0.1:{wport}"},
                "gateway": {"grpc": f"127.0.0.1:{ggrpc}", "http": f"127.0.0.1:{gport}"},
            }
            pids = {"gateway": procs[1].pid, "worker": procs[0].pid}
            if not args.no_floor:
                eport, pport = free_port(), free_port()
                me = [sys.executable, str(Path(__file__).resolve())]
                procs.append(start([*me, "--serve-floor-echo", str(eport)], tmp / "echo.log"))
                procs.append(start([*me, "--serve-floor-proxy", str(pport), f"127.0.0.1:{eport}"],
                                   tmp / "proxy.log"))  # fmt: skip
                addrs["floor-echo"] = {"grpc": f"127.0.0.1:{eport}"}
                addrs["floor-proxy"] = {"grpc": f"127.0.0.1:{pport}"}
                pids["floor-proxy"] = procs[-1].pid

            async def run() -> list[dict[str, Any]]:
                await wait_grpc_ready(addrs["direct"]["grpc"], names)
                await wait_grpc_ready(addrs["gateway"]["grpc"], names)
                if not args.no_floor:
                    await wait_floor_ready([addrs[t]["grpc"] for t in FLOOR])
                return [await measure_payload(p, args, addrs, pids) for p in payloads]

            results = asyncio.run(run())
        finally:
            stop(procs)
    load1 = os.getloadavg()
    show(results, args.rounds)
    forward = args.grpc_forward or "default"
    print(f"load average (1 min) before {load0[0]:.2f}, after {load1[0]:.2f}; "
          f"{os.cpu_count()} CPUs; gateway.grpc_forward {forward}; "
          f"gateway.grpc_server {args.grpc_server or 'default'}")  # fmt: skip
    out = {
        "host_cpus": os.cpu_count(),
        "grpc_forward": args.grpc_forward,
        "grpc_server": args.grpc_server,
        "load_avg_1m": [load0[0], load1[0]],
        "rounds": args.rounds,
        "duration_s": args.duration,
        "payloads": results,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {args.json}")
    bad = sum(c["errors"] for r in results for c in r["cells"].values())
    if bad:
        print(f"{bad} requests failed", file=sys.stderr)


if __name__ == "__main__":
    main()
