"""The data plane's HTTP stack: CPU per request of the servers and clients we could use.

    .venv/bin/python bench/http_server_choice.py                      # 1000 req/s, 5 s, 2 rounds
    .venv/bin/python bench/http_server_choice.py --rate 2000 --json out/http_choice.json

One load, one tiny request: a POST of a ~100-byte KServe v2 JSON body to
``/v2/models/m/infer``, answered 200 with a fixed ~100-byte JSON body (the handler reads the
body and does no other work, so what is measured is the HTTP stack). Open loop: requests are
due at a fixed ``--rate`` (a request is sent when due, however many are still in flight, up to
``--connections`` keep-alive connections; beyond that it waits for one), for ``--seconds``
after a ``--warmup``. The load generator wakes every millisecond (uvloop's timer resolution)
and sends every request due by then. Latency (P50/P99) is from when a request was handed to
the client to when its whole answer was read, so waiting for a connection counts; "late P99"
is how late the generator handed requests over (from when each was due): ~1 ms when the
client process keeps up, more when the client's own CPU cost stalls its loop.

Server variants (the load generator is the cheapest client, ``httpio.client.HttpClient``
sending a prebuilt request):
  1. uvicorn (uvloop, httptools) + a starlette app (what the gateway and the worker ran);
  2. uvicorn + a bare ASGI callable (uvicorn's own cost, no framework);
  3. granian (a Rust HTTP server; ASGI interface, 1 worker, 1 runtime thread, single-threaded
     runtime, uvloop, HTTP/1 only), serving the same bare ASGI callable; skipped, with a note,
     when granian is not installed;
  4. ``evenserve.httpio`` (``HttpServer`` under ``Serving``), a handler returning a Response;
  4f. the same server, answering from its fast path (a ``FastHandler``: a callback, no task;
     the gateway forwards on it), skipped when this evenserve has none.
Client variants (what a gateway forwards with), each sending to server 4, building each
request from method, path, headers and body as a forwarder does:
  5. aiohttp ``ClientSession`` on a keep-alive ``TCPConnector(limit=connections)``;
  6. ``httpx.AsyncClient`` (``max_connections=connections``);
  7. ``evenserve.httpio.client.HttpClient`` (``request()``, ``max_connections=connections``);
  7f. the same client's ``send_cb`` (no task; ``send`` when no idle connection is ready), as
     the gateway forwards, skipped when this evenserve has none;
and a baseline, the harness with no client (a "request" is one pass through the event loop):
what the client rows cost above it is the client's own.

Each server runs in its own process (its own session), and so does each load generator (on
uvloop), so the CPU of one process is that of one side only. The server side's CPU is
``utime + stime`` from ``/proc/<pid>/stat`` of the server process and its descendants
(granian's worker is a child process), read by the load generator as the measured window
opens and after its last answer; the client side's is the load generator's own
``time.process_time()`` over the same window (it includes the open-loop scheduling, alike for
every client). CPU per request = that CPU over the requests of the window that finished
(answered, or failed). A side that cannot keep up shows ``done/s`` below the rate: the window
then lasts until its last answer, up to ``DRAIN_S`` after the last send, and what is still
unanswered then counts as errors (so do non-200 answers, client exceptions, and requests shed:
due while ``--max-in-flight`` were unanswered, not sent, which bounds how long a client that
has fallen behind takes to finish; the JSON has the counts of each). Variants run
in a rotated order in each of ``--rounds`` rounds, a fresh server process each time; the table
shows the median over rounds (errors: the total). ``/proc/<pid>/stat`` counts in clock ticks
(10 ms): over 5 s at 1000 req/s that is ±0.002 ms per request.

Numbers depend on the host: this one is small and shared (the load average before and after
is printed and written to ``--json``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import importlib.util
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
HOST = "127.0.0.1"
PATH = "/v2/models/m/infer"
JSON = "application/json"
REQUEST_BODY = json.dumps(
    {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]},
    separators=(",", ":"),
).encode()
RESPONSE_BODY = json.dumps(
    {
        "model_name": "m",
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 4], "data": [4, 3, 2, 1]}],
    },
    separators=(",", ":"),
).encode()
CLK_TCK = os.sysconf("SC_CLK_TCK")
READY_TIMEOUT_S = 30.0
DRAIN_S = 30.0
TICK_S = 0.001

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


# -- the servers (each runs in a process of its own: --serve KIND --port PORT) ---------------
async def bare_asgi(scope: Scope, receive: Receive, send: Send) -> None:
    """The bare ASGI application (uvicorn and granian serve it): read the body, answer."""
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    more = True
    while more:
        msg = await receive()
        more = bool(msg.get("more_body", False))
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", JSON.encode()),
                (b"content-length", str(len(RESPONSE_BODY)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": RESPONSE_BODY})


def serve_uvicorn(port: int, framework: bool) -> None:
    import uvicorn

    app: Any = bare_asgi
    if framework:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import Response
        from starlette.routing import Route

        async def infer(request: Request) -> Response:
            await request.body()
            return Response(RESPONSE_BODY, media_type=JSON)

        app = Starlette(routes=[Route("/v2/models/{model}/infer", infer, methods=["POST"])])
    uvicorn.run(
        app,
        host=HOST,
        port=port,
        loop="uvloop",
        http="httptools",
        ws="none",
        lifespan="off",
        log_level="warning",
        access_log=False,
    )


def serve_httpio(port: int, fast: bool) -> None:
    from evenserve.httpio.server import Request, Response
    from evenserve.httpio.serving import Serving

    headers = {"content-type": JSON}

    class App:
        #: Serving hands this to the server as its fast path (tried first for each request).
        fast: Callable[[Request, Callable[[Response], None]], bool] | None = None

        async def __call__(self, request: Request) -> Response:
            return Response(200, RESPONSE_BODY, headers)

        def answer_now(self, request: Request, respond: Callable[[Response], None]) -> bool:
            """The server's fast path (``FastHandler``): answer from the callback, no task."""
            respond(Response(200, RESPONSE_BODY, headers))
            return True

        async def startup(self) -> None:
            return None

        def begin_drain(self) -> None:
            return None

        async def shutdown(self) -> None:
            return None

    app = App()
    if fast:
        app.fast = app.answer_now
    Serving(app, HOST, port, drain_timeout_s=1.0).run()


def httpio_has(module: str, dotted: str) -> bool:
    """Whether the evenserve that runs here has ``dotted`` in ``evenserve.httpio.<module>``
    (the fast paths came after the first httpio)."""
    import importlib

    obj: object = importlib.import_module(f"evenserve.httpio.{module}")
    for name in dotted.split("."):
        if not hasattr(obj, name):
            return False
        obj = getattr(obj, name)
    return True


def granian_command(port: int) -> list[str]:
    return [
        sys.executable, "-m", "granian", "--interface", "asgi", "--host", HOST,
        "--port", str(port), "--http", "1", "--no-ws", "--workers", "1",
        "--runtime-threads", "1", "--runtime-blocking-threads", "1", "--blocking-threads", "1",
        "--runtime-mode", "st", "--loop", "uvloop", "--log-level", "warning",
        "--working-dir", str(BENCH), f"{Path(__file__).stem}:bare_asgi",
    ]  # fmt: skip


# -- CPU of a process tree ------------------------------------------------------------------
def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()  # fields from 3 (state) on


def tree_pids(root: int) -> list[int]:
    """``root`` and its descendants (granian's worker is a child of its supervisor)."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None:
                parent[int(entry)] = int(fields[1])
    out, frontier = [root], [root]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out.extend(kids)
        frontier.extend(kids)
    return out


def cpu_s(pids: list[int]) -> float:
    """utime + stime of ``pids``, in seconds (``/proc/<pid>/stat``)."""
    ticks = 0
    for pid in pids:
        fields = _stat_fields(pid)
        if fields is not None:
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / CLK_TCK


# -- the load generator (a process of its own: --load CLIENT ...) ----------------------------
SendFn = Callable[[], Awaitable[int]]
CloseFn = Callable[[], Awaitable[None]]


async def make_client(kind: str, port: int, connections: int) -> tuple[SendFn, CloseFn]:
    """A function that sends the request once and returns the status, and a closer."""
    base = f"http://{HOST}:{port}"
    headers = {"content-type": JSON}
    if kind in ("raw", "httpio", "httpio-cb"):
        from evenserve.httpio.client import HttpClient, Reply

        client = HttpClient(base, 5.0, max_connections=connections)
        if kind == "raw":  # the load generator's way: one prebuilt request
            head = client.head("POST", PATH, headers, len(REQUEST_BODY))

            async def send_raw() -> int:
                return (await client.send(head, REQUEST_BODY)).status

            send = send_raw
        elif kind == "httpio-cb":  # the gateway's forwarding way: send_cb, else send
            loop = asyncio.get_running_loop()

            async def send_cb() -> int:
                h = client.head("POST", PATH, headers, len(REQUEST_BODY))
                fut: asyncio.Future[int] = loop.create_future()

                def done(reply: Reply | None, error: BaseException | None) -> None:
                    if error is not None:
                        fut.set_exception(error)
                    elif reply is not None:
                        fut.set_result(reply.status)

                if not client.send_cb(h, REQUEST_BODY, done):
                    return (await client.send(h, REQUEST_BODY)).status
                return await fut

            send = send_cb
        else:  # a forwarder's way: the head built per request

            async def send_request() -> int:
                return (await client.request("POST", PATH, REQUEST_BODY, headers)).status

            send = send_request

        async def close_httpio() -> None:
            client.close()

        return send, close_httpio
    if kind == "none":  # the open-loop harness alone: each "request" one pass of the loop

        async def send_none() -> int:
            await asyncio.sleep(0)
            return 200

        async def close_none() -> None:
            return None

        return send_none, close_none
    if kind == "aiohttp":
        import aiohttp

        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=connections, keepalive_timeout=30.0),
            timeout=aiohttp.ClientTimeout(total=5.0),
        )
        url = base + PATH

        async def send_aiohttp() -> int:
            async with session.post(url, data=REQUEST_BODY, headers=headers) as resp:
                await resp.read()
                return resp.status

        return send_aiohttp, session.close
    if kind == "httpx":
        import httpx

        hx = httpx.AsyncClient(
            base_url=base,
            timeout=5.0,
            limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
        )

        async def send_httpx() -> int:
            resp = await hx.post(PATH, content=REQUEST_BODY, headers=headers)
            return resp.status_code

        return send_httpx, hx.aclose
    raise ValueError(f"unknown client {kind!r}")


def percentile(sorted_xs: list[float], q: float) -> float:
    if not sorted_xs:
        return float("nan")
    k = max(0, min(len(sorted_xs) - 1, int(q * len(sorted_xs) + 0.999999) - 1))
    return sorted_xs[k]


async def run_load(args: argparse.Namespace) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    clock = time.perf_counter  # uvloop's loop.time() counts whole milliseconds
    send, close = await make_client(args.load, args.port, args.connections)
    try:
        # Ready when the server answers (granian's supervisor listens before its worker runs).
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            try:
                if await send() == 200:
                    break
            except Exception as exc:
                if time.monotonic() > deadline:
                    raise SystemExit(
                        f"server not answering after {READY_TIMEOUT_S} s: {exc!r}"
                    ) from exc
            await asyncio.sleep(0.05)

        period = 1.0 / args.rate
        latencies: list[float] = []
        lateness: list[float] = []  # from when a request was due to when it was sent
        errors: Counter[str] = Counter()
        tasks: set[asyncio.Task[None]] = set()

        async def one(due: float, record: bool) -> None:
            sent = clock()
            try:
                status = await send()
                if status != 200:
                    errors[f"status {status}"] += 1
            except Exception as exc:
                errors[type(exc).__name__] += 1
            if record:
                latencies.append(clock() - sent)
                lateness.append(sent - due)

        async def phase(start: float, n: int, record: bool) -> None:
            i = 0
            while i < n:
                now = clock()
                if start + i * period > now:
                    # uvloop's timers count whole milliseconds: a shorter sleep returns at
                    # once and the loop would spin. Wake every TICK_S; send what is due.
                    await asyncio.sleep(TICK_S)
                    continue
                while i < n and start + i * period <= now:  # everything due by now, at once
                    i += 1
                    if len(tasks) >= args.max_in_flight:  # a client far behind: shed
                        if record:
                            errors["shed"] += 1
                        continue
                    t = loop.create_task(one(start + (i - 1) * period, record))
                    tasks.add(t)
                    t.add_done_callback(tasks.discard)

        n_warm = round(args.warmup * args.rate)
        n = round(args.seconds * args.rate)
        t0 = clock() + 0.01
        await phase(t0, n_warm, False)
        pids = tree_pids(args.server_pid)
        server0, client0, wall0 = cpu_s(pids), time.process_time(), clock()
        await phase(t0 + n_warm * period, n, True)
        if tasks:  # the window closes with the last answer (or DRAIN_S after the last send)
            await asyncio.wait(tasks, timeout=DRAIN_S)
        server1, client1, wall1 = cpu_s(pids), time.process_time(), clock()
    except BaseException:
        await close()
        raise
    if tasks:
        # Requests still queued in a client that fell behind: tearing it down can take longer
        # than the run did (httpx), so the caller reports and exits without it.
        abandon = True
    else:
        abandon = False
        await close()
    latencies.sort()
    lateness.sort()
    done = max(1, len(latencies))  # finished: answered or failed
    unfinished = n - len(latencies) - errors["shed"]
    return {
        "requests": n,
        "finished": len(latencies),
        "shed": errors["shed"],
        "unfinished": unfinished,
        "errors": sum(errors.values()) + unfinished,
        "error_kinds": dict(errors),
        "server_pids": len(pids),
        "server_cpu_s": server1 - server0,
        "client_cpu_s": client1 - client0,
        "window_s": wall1 - wall0,
        "server_cpu_ms_per_req": (server1 - server0) * 1e3 / done,
        "client_cpu_ms_per_req": (client1 - client0) * 1e3 / done,
        "p50_ms": percentile(latencies, 0.50) * 1e3,
        "p99_ms": percentile(latencies, 0.99) * 1e3,
        "late_p99_ms": percentile(lateness, 0.99) * 1e3,
        "abandoned": abandon,
        "finished_per_s": len(latencies) / (wall1 - wall0),
    }


def load_main(args: argparse.Namespace) -> None:
    import uvloop

    runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    result = runner.run(run_load(args))
    print(json.dumps(result), flush=True)
    if result["abandoned"]:
        os._exit(0)  # the kernel closes its sockets; the server is stopped next
    runner.close()


# -- the orchestrator --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Variant:
    num: str  # as numbered in the module docstring
    key: str
    label: str
    measured: str  # "server" or "client": the side this variant is about
    server: str
    client: str


VARIANTS = [
    Variant("1", "uvicorn-starlette", "uvicorn + starlette", "server", "uvicorn-starlette", "raw"),
    Variant("2", "uvicorn-asgi", "uvicorn + bare ASGI", "server", "uvicorn-asgi", "raw"),
    Variant("3", "granian-asgi", "granian (ASGI, 1 worker, 1 thread)", "server", "granian", "raw"),
    Variant("4", "httpio-server", "evenserve.httpio HttpServer", "server", "httpio", "raw"),
    Variant("4f", "httpio-server-fast", "evenserve.httpio HttpServer, fast path", "server",
            "httpio-fast", "raw"),
    Variant("0", "harness", "no client (the load harness alone)", "client", "httpio", "none"),
    Variant("5", "aiohttp", "aiohttp ClientSession (TCPConnector)", "client", "httpio", "aiohttp"),
    Variant("6", "httpx", "httpx.AsyncClient", "client", "httpio", "httpx"),
    Variant("7", "httpio-client", "evenserve.httpio HttpClient", "client", "httpio", "httpio"),
    Variant("7f", "httpio-client-cb", "evenserve.httpio HttpClient.send_cb", "client", "httpio",
            "httpio-cb"),
]  # fmt: skip

_children: list[subprocess.Popen[bytes]] = []


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM if the bench process dies (Linux)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def spawn(cmd: list[str], stdout: int | None = None, stderr: Any = None) -> subprocess.Popen[bytes]:
    p = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=stdout if stdout is not None else subprocess.DEVNULL,
        stderr=stderr if stderr is not None else subprocess.PIPE,
        start_new_session=True,  # its own process group: stopped with its children
        preexec_fn=_die_with_parent,
    )
    _children.append(p)
    return p


def stop(p: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the child's process group, SIGKILL after 5 s; then reap it."""
    if p.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)  # anything of its group left behind
    if p.stderr is not None:
        p.stderr.close()
    if p in _children:
        _children.remove(p)


def stop_all() -> None:
    for p in list(_children):
        stop(p)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def server_command(kind: str, port: int) -> list[str]:
    if kind == "granian":
        return granian_command(port)
    return [sys.executable, str(Path(__file__).resolve()), "--serve", kind, "--port", str(port)]


def run_variant(v: Variant, args: argparse.Namespace) -> dict[str, Any]:
    # The server's stderr goes to a file: a pipe nobody reads could fill and stall it.
    with tempfile.TemporaryFile() as log:
        return _run_variant(v, args, log)


def _run_variant(v: Variant, args: argparse.Namespace, log: IO[bytes]) -> dict[str, Any]:
    port = free_port()
    server = spawn(server_command(v.server, port), stderr=log)
    try:
        load = spawn(
            [
                sys.executable, str(Path(__file__).resolve()), "--load", v.client,
                "--port", str(port), "--server-pid", str(server.pid), "--rate", str(args.rate),
                "--seconds", str(args.seconds), "--warmup", str(args.warmup),
                "--connections", str(args.connections), "--max-in-flight", str(args.max_in_flight),
            ],
            stdout=subprocess.PIPE,
        )  # fmt: skip
        try:
            limit = READY_TIMEOUT_S + args.warmup + args.seconds + DRAIN_S + 30.0
            out, err = load.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            return {"failed": f"the load generator ran past {limit:.0f} s"}
        finally:
            stop(load)
        if load.returncode != 0 or not out.strip():
            tail = err.decode(errors="replace").strip().splitlines()[-3:]
            if server.poll() is not None:
                log.seek(0)
                tail += log.read().decode(errors="replace").strip().splitlines()[-3:]
            return {"failed": f"load generator exit {load.returncode}: {' | '.join(tail)}"}
        result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
        if server.poll() is not None:
            result["note"] = f"server exited ({server.returncode}) during the run"
        return result
    finally:
        stop(server)


def median_of(results: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in results))


def summarize(v: Variant, results: list[dict[str, Any]], skipped: str | None) -> dict[str, Any]:
    ok = [r for r in results if "failed" not in r]
    row: dict[str, Any] = {
        "num": v.num,
        "key": v.key,
        "variant": v.label,
        "measured": v.measured,
        "server": v.server,
        "client": v.client,
        "rounds": results,
    }
    if skipped:
        row["skipped"] = skipped
        return row
    if not ok:
        row["failed"] = results[-1].get("failed", "no result") if results else "no result"
        return row
    mine = f"{v.measured}_cpu_ms_per_req"
    row |= {
        "cpu_ms_per_req": median_of(ok, mine),
        "cpu_ms_per_req_min": min(r[mine] for r in ok),
        "cpu_ms_per_req_max": max(r[mine] for r in ok),
        "server_cpu_ms_per_req": median_of(ok, "server_cpu_ms_per_req"),
        "client_cpu_ms_per_req": median_of(ok, "client_cpu_ms_per_req"),
        "p50_ms": median_of(ok, "p50_ms"),
        "p99_ms": median_of(ok, "p99_ms"),
        "late_p99_ms": median_of(ok, "late_p99_ms"),
        "finished_per_s": median_of(ok, "finished_per_s"),
        "errors": sum(int(r["errors"]) for r in ok),
        "shed": sum(int(r["shed"]) for r in ok),
        "failed_rounds": len(results) - len(ok),
    }
    return row


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": sys.version.split()[0]}
    for name in ("uvicorn", "starlette", "uvloop", "httptools", "granian", "aiohttp", "httpx"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    out["evenserve"] = evenserve_source()
    return out


def evenserve_source() -> str:
    """Which evenserve the subprocesses import: this checkout (its commit, and whether
    ``httpio`` has uncommitted changes) or another copy (e.g. an export on PYTHONPATH)."""
    import evenserve

    pkg = Path(evenserve.__file__).resolve().parent
    if ROOT not in pkg.parents:
        return "not this checkout"

    def git(*a: str) -> str:
        r = subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True, check=False)
        return r.stdout.strip()

    dirty = git("status", "--porcelain", "--", "src/evenserve/httpio")
    return git("rev-parse", "--short", "HEAD") + (" + uncommitted httpio" if dirty else "")


def render(rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(
        title=(
            f"CPU per request, tiny POST ({len(REQUEST_BODY)} B in, {len(RESPONSE_BODY)} B out), "
            f"open loop {meta['rate']:g} req/s x {meta['seconds']:g} s, <= {meta['connections']} "
            f"connections, median of {meta['rounds']} rounds"
        ),
        title_justify="left",
    )
    t.add_column("#", justify="right")
    t.add_column("variant")
    t.add_column("measured")
    t.add_column("CPU ms/req", justify="right")
    t.add_column("rounds min-max", justify="right")
    t.add_column("server ms/req", justify="right")
    t.add_column("client ms/req", justify="right")
    t.add_column("P50 ms", justify="right")
    t.add_column("P99 ms", justify="right")
    t.add_column("late P99 ms", justify="right")
    t.add_column("done/s", justify="right")
    t.add_column("errors", justify="right")
    notes: list[str] = []
    for r in rows:
        if "cpu_ms_per_req" not in r:
            note = r.get("skipped") or f"failed: {r.get('failed')}"
            t.add_row(r["num"], r["variant"], r["measured"], note.split(":")[0])
            notes.append(f"{r['num']}: {note}")
            continue
        errors = str(r["errors"])
        if r["shed"]:
            errors += f" ({r['shed']} shed)"
        if r["failed_rounds"]:
            errors += f" ({r['failed_rounds']} rounds failed)"
        t.add_row(
            r["num"],
            r["variant"],
            r["measured"],
            f"{r['cpu_ms_per_req']:.3f}",
            f"[{r['cpu_ms_per_req_min']:.3f}-{r['cpu_ms_per_req_max']:.3f}]",
            f"{r['server_cpu_ms_per_req']:.3f}",
            f"{r['client_cpu_ms_per_req']:.3f}",
            f"{r['p50_ms']:.2f}",
            f"{r['p99_ms']:.2f}",
            f"{r['late_p99_ms']:.2f}",
            f"{r['finished_per_s']:.0f}",
            errors,
        )
    console = Console(width=200)
    console.print(t)
    for n in notes:
        console.print(n, markup=False, highlight=False)
    la0, la1 = meta["loadavg_before"], meta["loadavg_after"]
    console.print(
        f"host: {meta['cpus']} CPUs; load average (1/5/15 min) before "
        f"{la0[0]:.2f} {la0[1]:.2f} {la0[2]:.2f}, after {la1[0]:.2f} {la1[1]:.2f} {la1[2]:.2f}; "
        f"wall {meta['wall_s']:.0f} s"
    )
    console.print(
        "server rows: CPU of the server process tree, load from HttpClient with a prebuilt "
        "request; client rows: CPU of the client process, sending to the httpio server"
    )
    console.print(" ".join(f"{k} {v}" for k, v in meta["versions"].items()))


def unsupported(v: Variant) -> str | None:
    """Why ``v`` cannot run here (a package missing, an API this evenserve lacks), or None."""
    if v.server == "granian" and importlib.util.find_spec("granian") is None:
        return "skipped: granian is not installed"
    if v.server == "httpio-fast" and not httpio_has("server", "FastHandler"):
        return "skipped: this evenserve's HttpServer has no fast path"
    if v.client == "httpio-cb" and not httpio_has("client", "HttpClient.send_cb"):
        return "skipped: this evenserve's HttpClient has no send_cb"
    return None


def bench_main(args: argparse.Namespace) -> None:
    t_start = time.monotonic()
    started = time.strftime("%Y-%m-%d %H:%M:%S %z")
    loadavg_before = os.getloadavg()
    chosen = [v for v in VARIANTS if not args.only or v.key in args.only.split(",")]
    skip = {v.key: why for v in chosen if (why := unsupported(v))}
    results: dict[str, list[dict[str, Any]]] = {v.key: [] for v in chosen}
    runnable = [v for v in chosen if v.key not in skip]
    for rnd in range(args.rounds):
        k = rnd % len(runnable) if runnable else 0
        for v in runnable[k:] + runnable[:k]:  # rotated, so drift does not favour one
            print(f"round {rnd + 1}/{args.rounds}: {v.label} ...", file=sys.stderr, flush=True)
            results[v.key].append(run_variant(v, args))
    rows = [summarize(v, results[v.key], skip.get(v.key)) for v in chosen]
    meta: dict[str, Any] = {
        "command": " ".join(["python", "bench/http_server_choice.py", *sys.argv[1:]]),
        "date": started,
        "rate": args.rate,
        "seconds": args.seconds,
        "warmup": args.warmup,
        "rounds": args.rounds,
        "connections": args.connections,
        "max_in_flight": args.max_in_flight,
        "request_bytes": len(REQUEST_BODY),
        "response_bytes": len(RESPONSE_BODY),
        "cpus": os.cpu_count(),
        "loadavg_before": loadavg_before,
        "loadavg_after": os.getloadavg(),
        "wall_s": time.monotonic() - t_start,
        "versions": versions(),
    }
    render(rows, meta)
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--rate", type=float, default=1000.0, help="requests per second (open loop)")
    ap.add_argument("--seconds", type=float, default=5.0, help="measured window per variant")
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds sent before the window")
    ap.add_argument("--rounds", type=int, default=2, help="rounds (the median is reported)")
    ap.add_argument("--connections", type=int, default=16, help="most connections a client opens")
    ap.add_argument(
        "--max-in-flight",
        type=int,
        default=1000,
        help="a request due while this many are unanswered is not sent (an error: shed)",
    )
    ap.add_argument("--only", default="", help="comma-separated variant keys (default: all)")
    ap.add_argument("--json", default="", help="write the results here")
    # internal: one side of a run, in its own process
    ap.add_argument("--serve", default="", help=argparse.SUPPRESS)
    ap.add_argument("--load", default="", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--server-pid", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rate <= 0 or args.seconds <= 0 or args.warmup < 0 or args.rounds < 1:
        ap.error("--rate and --seconds must be positive, --warmup >= 0, --rounds >= 1")
    if args.connections < 1 or args.max_in_flight < 1:
        ap.error("--connections and --max-in-flight must be >= 1")
    unknown = set(filter(None, args.only.split(","))) - {v.key for v in VARIANTS}
    if unknown:
        ap.error(f"unknown variants {sorted(unknown)}; known: {[v.key for v in VARIANTS]}")
    return args


def _on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main() -> None:
    args = parse_args()
    if args.serve:
        if args.serve in ("httpio", "httpio-fast"):
            serve_httpio(args.port, fast=args.serve == "httpio-fast")
        elif args.serve in ("uvicorn-starlette", "uvicorn-asgi"):
            serve_uvicorn(args.port, framework=args.serve == "uvicorn-starlette")
        else:
            raise SystemExit(f"unknown server {args.serve!r}")
        return
    if args.load:
        load_main(args)
        return
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)
    try:
        bench_main(args)
    finally:
        stop_all()


if __name__ == "__main__":
    main()
