"""What the gateway adds: latency through the gateway vs straight to one worker, and routing
decision time with many backends (``--backends``, 64).

    .venv/bin/python bench/gateway_overhead.py                 # real worker, emulated model
    .venv/bin/python bench/gateway_overhead.py --backend fake  # a minimal v2 echo server

Part 1 (added latency). One backend process serves a model whose compute is near zero (the
``worker`` backend: ``evenserve worker`` on an ``emulated:`` device whose profile says 1 us per
batch; the ``fake`` backend: a bare starlette echo app). A gateway process (``evenserve
gateway``) fronts it. An open-loop client sends ``--rate`` req/s (default 500) of a small JSON
inference request, alternating ``--rounds`` phases straight to the backend and through the
gateway (interleaved so drift hits both alike), and reports P50/P99 of each and the
difference (what the extra hop costs, client and backend costs being the same in both).

Part 2 (routing decision). In-process: a Router with ``--backends`` (64) backends with fresh
signals, every routing policy, ``--decisions`` calls each; P50/P99/max of one
``Router.choose``. Then the live gateway's own decision histogram
(``evenserve_gateway_routing_decision_seconds``) after a run in front of as many backends
(fake servers in one process; the decision does not depend on what the backends are).
``--learned``: the in-process routers' backends have a latency profile and their samples
carry learned figures (profiles that learn: a scale and observed batch times, new every
poll), so the policies that predict work read learned profiles; ``--decision-only`` runs
just that in-process part (no servers).

    .venv/bin/python bench/gateway_overhead.py --decision-only --learned --backends 16

Numbers depend on the host: run on an idle machine; this one is shared (2 cores).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
EVENSERVE = [sys.executable, "-c", "from evenserve.cli.main import main; main()"]
BODY = json.dumps(
    {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
).encode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- a minimal v2 echo backend (run as a subprocess: --serve-fake PORT[,PORT...]) ------------
def serve_fake(ports: list[int]) -> None:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from evenserve.core.load import LoadReport
    from evenserve.core.wire import LOAD_PATH

    async def infer(request: Request) -> Response:
        body = json.loads(await request.body())
        out = {"model_name": request.path_params["model"], "outputs": body["inputs"]}
        return Response(json.dumps(out), media_type="application/json")

    async def ready(request: Request) -> Response:
        return Response(status_code=200)

    async def load(request: Request) -> Response:
        rep = LoadReport(
            timestamp_s=time.time(), device="fake", queue_depth=0, in_flight=0,
            utilization=0.0, utilization_window_s=1.0,
        )  # fmt: skip
        return Response(rep.model_dump_json(), media_type="application/json")

    app = Starlette(
        routes=[
            Route("/v2/models/{model}/infer", infer, methods=["POST"]),
            Route("/v2/health/ready", ready),
            Route(LOAD_PATH, load),
        ]
    )

    async def main() -> None:
        servers = [
            uvicorn.Server(
                uvicorn.Config(app, host="127.0.0.1", port=p, log_level="warning", access_log=False)
            )
            for p in ports
        ]
        await asyncio.gather(*(s.serve() for s in servers))

    asyncio.run(main())


# -- processes --------------------------------------------------------------------------------
def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args} exited with {proc.returncode}")
        with suppress(httpx.HTTPError):
            if httpx.get(url + "/v2/health/ready", timeout=1.0).status_code == 200:
                return
        time.sleep(0.1)
    raise SystemExit(f"{url} not ready after {timeout_s} s")


def start(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    f = open(log, "wb")  # noqa: SIM115 - closed when the process is
    return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()


def make_zero_model(tmp: Path) -> tuple[Path, Path]:
    """A repository with one emulated model whose batch takes 1 us, and its profile set."""
    repo = tmp / "repo" / "zero"
    repo.mkdir(parents=True)
    (repo / "model.yaml").write_text(
        "runtime: emulated\n"
        "inputs: [{name: INPUT0, datatype: FP32, shape: [4]}]\n"
        "outputs: [{name: OUTPUT0, datatype: FP32, shape: [4]}]\n"
        "max_batch_size: 8\n"
    )
    pset = tmp / "profiles"
    pset.mkdir()
    (pset / "zero.yaml").write_text(
        "model: zero\ndevice: none\nruntime: emulated\nprecision: fp32\n"
        "source: near-zero compute for measuring the gateway's own overhead\n"
        "points: [{batch: 1, latency_ms: 0.001}, {batch: 8, latency_ms: 0.001}]\n"
    )
    return repo.parent, pset


def gateway_config(tmp: Path, port: int, backends: list[tuple[str, str]], model: str,
                   routing: str) -> Path:  # fmt: skip
    cfg = {
        # Soft-overload refusals off: the direct path has none, and with one backend a 429
        # would measure the worker's queue under CPU contention, not the gateway's cost.
        "gateway": {"host": "127.0.0.1", "port": port, "routing": routing,
                    "admin": {"token": "bench-token-0000"}, "overload": {"enabled": False}},
        "backends": [{"name": n, "url": u, "models": [model]} for n, u in backends],
    }  # fmt: skip
    path = tmp / f"gateway-{port}.yaml"
    path.write_text(json.dumps(cfg))
    return path


# -- load -------------------------------------------------------------------------------------
class RawClient:
    """A deliberately cheap HTTP/1.1 keep-alive client (tens of microseconds per request), so
    that on a small shared host the load generator does not eat the CPU the servers need."""

    def __init__(self, host: str, port: int, path: str, conns: int) -> None:
        self.host, self.port, self.conns = host, port, conns
        self.request = (
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n\r\n"
        ).encode() + BODY
        self.idle: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = (
            asyncio.Queue()
        )

    async def open(self) -> None:
        for _ in range(self.conns):
            self.idle.put_nowait(await asyncio.open_connection(self.host, self.port))

    async def post(self) -> int:
        reader, writer = await self.idle.get()
        try:
            writer.write(self.request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            if length:
                await reader.readexactly(length)
        except BaseException:
            writer.close()
            self.idle.put_nowait(await asyncio.open_connection(self.host, self.port))
            raise
        self.idle.put_nowait((reader, writer))
        return status

    async def close(self) -> None:
        while not self.idle.empty():
            _, w = self.idle.get_nowait()
            w.close()


async def open_loop(url: str, rate: float, duration_s: float) -> tuple[list[float], int]:
    """Latencies (s) of requests sent at a fixed rate; and the count of failed/non-200."""
    u = httpx.URL(url)
    client = RawClient(u.host, u.port or 80, u.path, conns=64)
    await client.open()
    lat: list[float] = []
    bad = 0
    why: dict[str, int] = {}

    async def one(record: bool) -> None:
        nonlocal bad
        t0 = time.perf_counter()
        try:
            status = await asyncio.wait_for(client.post(), 10.0)
        except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError) as exc:
            bad += 1
            why[type(exc).__name__] = why.get(type(exc).__name__, 0) + 1
            return
        if record:
            lat.append(time.perf_counter() - t0)
        if status != 200:
            bad += 1
            why[str(status)] = why.get(str(status), 0) + 1

    await asyncio.gather(*(one(False) for _ in range(64)))  # warm up
    n = int(rate * duration_s)
    t_start = time.perf_counter()
    tasks = []
    for i in range(n):
        delay = t_start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(True)))
    await asyncio.gather(*tasks)
    await client.close()
    if why:
        print(f"    failures: {why}")
    return lat, bad


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def part1(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        bport, gport = free_port(), free_port()
        if args.backend == "worker":
            repo, pset = make_zero_model(tmp)
            model = "zero"
            cmd = [*EVENSERVE, "worker", "--repo", str(repo),
                   "--device", f"emulated:{pset}", "--port", str(bport)]  # fmt: skip
        else:
            model = "echo"
            cmd = [sys.executable, __file__, "--serve-fake", str(bport)]
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
        procs.append(start(cmd, tmp / "backend.log", env))
        burl = f"http://127.0.0.1:{bport}"
        wait_ready(burl, procs[-1])
        cfg = gateway_config(tmp, gport, [("b0", burl)], model, "queue-aware")
        gcmd = [*EVENSERVE, "gateway", "--config", str(cfg)]
        procs.append(start(gcmd, tmp / "gateway.log"))
        gurl = f"http://127.0.0.1:{gport}"
        wait_ready(gurl, procs[-1])
        direct: list[float] = []
        via: list[float] = []
        bad = 0
        path = f"/v2/models/{model}/infer"
        for r in range(args.rounds):
            for name, url, sink in (("direct", burl, direct), ("gateway", gurl, via)):
                lat, b = asyncio.run(open_loop(url + path, args.rate, args.phase_s))
                sink.extend(lat)
                bad += b
                print(f"  round {r + 1} {name:8s} n={len(lat)} p50={pct(lat, 0.5) * 1e3:.3f} ms "
                      f"p99={pct(lat, 0.99) * 1e3:.3f} ms", flush=True)  # fmt: skip
        return {
            "backend": args.backend,
            "rate_rps": args.rate,
            "requests_each": len(direct),
            "errors": bad,
            "direct_p50_ms": pct(direct, 0.5) * 1e3,
            "direct_p99_ms": pct(direct, 0.99) * 1e3,
            "gateway_p50_ms": pct(via, 0.5) * 1e3,
            "gateway_p99_ms": pct(via, 0.99) * 1e3,
            "added_p50_ms": (pct(via, 0.5) - pct(direct, 0.5)) * 1e3,
            "added_p99_ms": (pct(via, 0.99) - pct(direct, 0.99)) * 1e3,
        }
    finally:
        stop(procs)


def part2_inprocess(
    decisions: int, n_backends: int, learned: bool = False
) -> dict[str, dict[str, float]]:
    """``learned``: every backend has a latency profile for the model and its samples carry
    learned figures (profiles that learn: a scale and observed batch times, different per
    backend and per poll), so the policies that predict work read learned profiles."""
    from evenserve.core.profile import LatencyProfile
    from evenserve.core.types import LoadSample, RequestInfo
    from evenserve.policy.routing import ROUTING, Router

    rng = random.Random(1)
    out: dict[str, dict[str, float]] = {}
    prof = LatencyProfile.from_points("m", {1: 0.004, 8: 0.010, 32: 0.030})
    for name in ROUTING.names():
        router = Router(ROUTING.build(name, random.Random(0)), window=3, stale_after_s=0.5)
        for i in range(n_backends):
            if learned:
                router.add_backend(f"b{i}", ["m"], profiles={"m": prof}, max_batch_size={"m": 8})
            else:
                router.add_backend(f"b{i}", ["m"])
        times = []
        for k in range(decisions):
            if k % 50 == 0:  # a poll tick: fresh samples for every backend
                for i in range(n_backends):
                    extra: dict[str, Any] = {}
                    if learned:
                        q = rng.randint(0, 8)
                        extra = {
                            "queued_by_model": {"m": float(q)},
                            "busy_remaining_s": rng.random() * 0.01,
                            "profile_scale": {"m": 1.0 + rng.random()},
                            "observed_ms": {"m": {8: 10.0 + 10.0 * rng.random()}},
                        }
                    router.observe(f"b{i}", LoadSample(
                        timestamp_s=k, queue_depth=rng.randint(0, 8),
                        utilization=rng.random(), memory_used_bytes=rng.random() * 24e9,
                        memory_total_bytes=24e9, **extra,
                    ))  # fmt: skip
            req = RequestInfo(request_id=k, model="m", arrival_s=float(k))
            t0 = time.perf_counter()
            view = router.choose(req, float(k))
            times.append(time.perf_counter() - t0)
            assert view is not None
            router.sent(view.name, "m")
            router.done(view.name, "m")
        out[name] = {
            "p50_us": pct(times, 0.5) * 1e6,
            "p99_us": pct(times, 0.99) * 1e6,
            "max_us": max(times) * 1e6,
            "mean_us": statistics.fmean(times) * 1e6,
        }
    return out


def histogram_quantile(text: str, metric: str, q: float) -> tuple[float, float]:
    """(upper bound of the bucket holding quantile q, count) from Prometheus text."""
    buckets: list[tuple[float, float]] = []
    for line in text.splitlines():
        if line.startswith(metric + "_bucket"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float("inf") if le == "+Inf" else float(le),
                            float(line.rsplit(" ", 1)[1])))  # fmt: skip
    total = buckets[-1][1]
    for le, c in buckets:
        if c >= q * total:
            return le, total
    return float("inf"), total


def part2_live(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        ports: list[int] = []
        while len(ports) < args.backends:  # the OS may hand out a free port twice
            p = free_port()
            if p not in ports:
                ports.append(p)
        procs.append(start([sys.executable, __file__, "--serve-fake", ",".join(map(str, ports))],
                           tmp / "fakes.log"))  # fmt: skip
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        for u in urls:
            wait_ready(u, procs[0])
        gport = free_port()
        cfg = gateway_config(tmp, gport, [(f"b{i}", u) for i, u in enumerate(urls)], "echo",
                             "queue-aware")  # fmt: skip
        procs.append(start([*EVENSERVE, "gateway", "--config",
                            str(cfg)], tmp / "gateway-many.log"))  # fmt: skip
        gurl = f"http://127.0.0.1:{gport}"
        wait_ready(gurl, procs[-1])
        lat, bad = asyncio.run(open_loop(gurl + "/v2/models/echo/infer", args.rate, args.phase_s))
        text = httpx.get(gurl + "/metrics").text
        metric = "evenserve_gateway_routing_decision_seconds"
        p50, n = histogram_quantile(text, metric, 0.5)
        p99, _ = histogram_quantile(text, metric, 0.99)
        spread: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("evenserve_gateway_requests_total{") and 'outcome="ok"' in line:
                b = line.split('backend="', 1)[1].split('"', 1)[0]
                spread[b] = float(line.rsplit(" ", 1)[1])
        return {
            "backends": args.backends,
            "requests": len(lat),
            "errors": bad,
            "decisions": n,
            "decision_p50_le_ms": p50 * 1e3,
            "decision_p99_le_ms": p99 * 1e3,
            "requests_per_backend_min_max": [min(spread.values()), max(spread.values())],
        }
    finally:
        stop(procs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=["worker", "fake"], default="worker")
    ap.add_argument("--rate", type=float, default=500.0, help="requests per second")
    ap.add_argument("--phase-s", type=float, default=5.0, help="seconds per phase")
    ap.add_argument("--rounds", type=int, default=2, help="direct/gateway phase pairs")
    ap.add_argument("--decisions", type=int, default=20000)
    ap.add_argument("--backends", type=int, default=64, help="backends for part 2")
    ap.add_argument("--skip-live", action="store_true", help="skip part 2's live gateway")
    ap.add_argument(
        "--decision-only", action="store_true", help="part 2 in process only (no servers)"
    )
    ap.add_argument(
        "--learned",
        action="store_true",
        help="part 2 in process: backends with profiles whose samples carry learned figures",
    )
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--serve-fake", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_fake:
        serve_fake([int(p) for p in args.serve_fake.split(",")])
        return
    results: dict[str, Any] = {"host_cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="evenserve-bench-") as d:
        tmp = Path(d)
        if not args.decision_only:
            print(f"part 1: added latency, {args.backend} backend, {args.rate:g} req/s open loop")
            results["added_latency"] = part1(args, tmp)
            r = results["added_latency"]
            print(f"  direct  P50 {r['direct_p50_ms']:.3f} ms  P99 {r['direct_p99_ms']:.3f} ms")
            print(f"  gateway P50 {r['gateway_p50_ms']:.3f} ms  P99 {r['gateway_p99_ms']:.3f} ms")
            print(f"  added   P50 {r['added_p50_ms']:.3f} ms  P99 {r['added_p99_ms']:.3f} ms"
                  f"  (target P50 <= 0.5 ms; errors {r['errors']})")  # fmt: skip
        print(f"part 2: routing decision, {args.backends} backends, "
              f"{args.decisions} decisions per policy"
              f"{', learned profiles' if args.learned else ''}")  # fmt: skip
        results["decision_inprocess"] = part2_inprocess(args.decisions, args.backends, args.learned)
        for name, s in results["decision_inprocess"].items():
            print(f"  {name:22s} p50 {s['p50_us']:6.1f} us  p99 {s['p99_us']:6.1f} us  "
                  f"max {s['max_us']:7.1f} us")  # fmt: skip
        if not args.skip_live and not args.decision_only:
            live = part2_live(args, tmp)
            results["decision_live"] = live
            print(f"  live gateway, {args.backends} backends, queue-aware: "
                  f"{live['decisions']:.0f} decisions, "
                  f"P50 <= {live['decision_p50_le_ms']:.3f} ms, "
                  f"P99 <= {live['decision_p99_le_ms']:.3f} ms (histogram bucket bounds); "
                  f"requests per backend {live['requests_per_backend_min_max']}, "
                  f"errors {live['errors']}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
