"""The hardening probes of issue 26 against a real worker and a real gateway, with figures.

    python bench/http_hardening.py [--rounds 5] [--stream-mib 200] [--json PATH]

Starts one ``evenserve worker`` (CPU, the ``tiny-emulated`` example model copied into a
temporary repository, ``--model-control explicit``, an admin token made for the run and
never printed) and one ``evenserve gateway`` routing to it, both on loopback on free ports,
then sends each probe of the issue to each server and prints what came back:

- ``unterminated``: ``GET /v2/health/live`` with a header line that never ends, streamed in
  64 KiB writes until the server answers or closes, or ``--stream-mib`` MiB are sent (the
  issue: 200 MiB read until the 10 s head timeout, then 408);
- ``complete-50MiB``: the same with a complete 50 MiB header (the issue: 431 after 1.8 s);
- ``HEAD``: ``HEAD /v2/health/live``; ``absolute``: ``GET http://127.0.0.1:PORT/v2/health/live``
  (the issue: 405 and 404; 200 before the HTTP server was replaced);
- ``params-*``: ``PUT /admin/params`` with the admin token: ``1e400`` as a routing weight,
  an empty body, an unknown field, an unknown model; then whether ``GET /admin/params``
  holds a bare ``Infinity`` and whether the version moved;
- worker only, ``load-*``: a load whose override's ``emulated.profile`` names a missing
  file, a load of a folder that does not exist (does the error show the repository's
  absolute path?);
- ``cli-port``: ``evenserve worker --port 99999`` (exit status and first line of stderr).

Figures per probe: the status, the time from the request's first byte sent to the answer's
first byte read (ms; the header probes: the median of ``--rounds`` rounds, with min and max),
how much of the request the client had handed to its socket by then (loopback buffers take
a few MiB the server never reads), and the server process's resident memory
(``VmRSS`` of ``/proc/PID/status``) before the probe's first round, at its highest while the
rounds ran (sampled every 20 ms) and 1 s after the last round's connection closed. Timings
on a shared host are noisy: quote medians and say so. Nothing here is a pass/fail check.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import selectors
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
MODEL_DIR = ROOT / "examples" / "models" / "tiny" / "tiny-emulated"
MODEL = MODEL_DIR.name
HOST = "127.0.0.1"
MIB = 1024 * 1024
CHUNK = 64 * 1024
#: A probe's hang guard (a server that neither answers nor closes).
PROBE_CAP_S = 60.0
READY_CAP_S = 120.0
#: The header probes' request head, up to the header value that follows.
START = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Big: "


def rss_bytes(pid: int) -> int:
    """``VmRSS`` of process ``pid`` in bytes (0 once it is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def status_of(answer: bytes) -> int | None:
    """The status code of an HTTP/1.1 answer's first line (None: no status line read)."""
    line = answer.split(b"\r\n", 1)[0].split(b" ")
    if len(line) >= 2 and line[0].startswith(b"HTTP/") and line[1].isdigit():
        return int(line[1])
    return None


@dataclass
class Exchange:
    """One request sent (maybe streamed) and what came back."""

    status: int | None
    ms: float | None  # first byte sent -> first byte of the answer read (None: no answer)
    sent: int  # bytes of the request sent by then
    answer: bytes
    outcome: str  # answered | closed | cap


def exchange(
    port: int, head: bytes, body: Iterator[bytes] | None = None, cap_s: float = PROBE_CAP_S
) -> Exchange:
    """Send ``head``, then ``body``'s chunks as the socket takes them, reading all along;
    stop once the answer's head has arrived, the server closed, the chunks ran out (then
    wait for the answer) or ``cap_s`` passed."""
    sock = socket.create_connection((HOST, port))
    sock.setblocking(False)
    sel = selectors.DefaultSelector()
    pending = head
    sent = 0
    answer = b""
    t0 = time.perf_counter()
    t_first: float | None = None
    sent_at_answer = 0
    outcome = "cap"
    try:
        sel.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
        while time.perf_counter() - t0 < cap_s:
            for _, events in sel.select(timeout=0.5):
                if events & selectors.EVENT_READ:
                    try:
                        data = sock.recv(65536)
                    except (BlockingIOError, InterruptedError):
                        data = None
                    except ConnectionError:
                        data = b""
                    if data == b"":
                        outcome = "closed" if not answer else "answered"
                        return Exchange(
                            status_of(answer), _ms(t0, t_first), sent_at_answer or sent,
                            answer, outcome,
                        )  # fmt: skip
                    if data:
                        if t_first is None:
                            t_first, sent_at_answer = time.perf_counter(), sent
                        answer += data
                        if b"\r\n\r\n" in answer:
                            return Exchange(
                                status_of(answer), _ms(t0, t_first), sent_at_answer, answer,
                                "answered",
                            )  # fmt: skip
                if events & selectors.EVENT_WRITE:
                    if not pending and body is not None:
                        pending = next(body, b"")
                        if not pending:
                            body = None
                    if pending:
                        try:
                            n = sock.send(pending)
                        except (BlockingIOError, InterruptedError):
                            n = 0
                        except ConnectionError:  # reset: the answer may still be readable
                            sel.modify(sock, selectors.EVENT_READ)
                            pending, body = b"", None
                            continue
                        sent += n
                        pending = pending[n:]
                    if not pending and body is None:
                        sel.modify(sock, selectors.EVENT_READ)  # all sent: wait for the answer
        return Exchange(
            status_of(answer), _ms(t0, t_first), sent_at_answer or sent, answer, outcome
        )
    finally:
        sel.close()
        sock.close()


def _ms(t0: float, t: float | None) -> float | None:
    return None if t is None else (t - t0) * 1000.0


def chunks(total: int, fill: bytes = b"a", tail: bytes = b"") -> Iterator[bytes]:
    """``total`` bytes of ``fill`` in CHUNK writes, then ``tail``."""
    block = fill * CHUNK
    left = total
    while left > 0:
        yield block[: min(CHUNK, left)]
        left -= CHUNK
    if tail:
        yield tail


class RssSampler:
    """The highest VmRSS of a process while it runs (sampled every 20 ms)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = rss_bytes(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes(self.pid))
            self._stop.wait(0.02)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Row:
    server: str
    probe: str
    status: str
    ms_median: float | None = None
    ms_min: float | None = None
    ms_max: float | None = None
    rounds: int = 1
    sent_bytes: int | None = None
    rss_before: int | None = None
    rss_peak: int | None = None
    rss_after: int | None = None
    note: str = ""
    statuses: list[int | None] = field(default_factory=list)


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    port: int
    log: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def _ready(server: Server) -> None:
    deadline = time.monotonic() + READY_CAP_S
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise SystemExit(f"{server.name} exited:\n{server.log.read_text()[-3000:]}")
        with contextlib.suppress(OSError):
            ex = exchange(server.port, b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n", cap_s=5)
            if ex.status == 200:
                return
        time.sleep(0.1)
    raise SystemExit(f"{server.name} not ready:\n{server.log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def start_servers(tmp: Path, token: str) -> tuple[Server, Server, Path]:
    """The worker and the gateway, ready; and the worker's repository."""
    repo = tmp / "repo"
    shutil.copytree(MODEL_DIR, repo / MODEL)
    env = {**os.environ, "EVENSERVE_ADMIN_TOKEN": token}
    cli = [sys.executable, "-m", "evenserve"]
    port_file = tmp / "worker.port"
    wlog = tmp / "worker.log"
    with wlog.open("wb") as out:
        wproc = subprocess.Popen(
            [*cli, "worker", "--repo", str(repo), "--device", "cpu", "--host", HOST,
             "--port", "0", "--port-file", str(port_file), "--model-control", "explicit",
             "--load-model", MODEL, "--log-level", "warning"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        )  # fmt: skip
    deadline = time.monotonic() + READY_CAP_S
    while not (port_file.exists() and port_file.read_text().strip()):
        if wproc.poll() is not None or time.monotonic() > deadline:
            _stop(wproc)
            raise SystemExit(f"the worker did not start:\n{wlog.read_text()[-3000:]}")
        time.sleep(0.05)
    worker = Server("worker", wproc, int(port_file.read_text()), wlog)
    _ready(worker)
    gport = _free_port()
    cluster = {
        "gateway": {"host": HOST, "port": gport, "routing": "queue-aware"},
        "backends": [
            {"name": "w0", "url": f"http://{HOST}:{worker.port}", "models": [MODEL]},
        ],
    }
    (tmp / "cluster.yaml").write_text(yaml.safe_dump(cluster))
    glog = tmp / "gateway.log"
    with glog.open("wb") as out:
        gproc = subprocess.Popen(
            [*cli, "gateway", "--config", str(tmp / "cluster.yaml"), "--log-level", "warning"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        )  # fmt: skip
    gateway = Server("gateway", gproc, gport, glog)
    try:
        _ready(gateway)
    except SystemExit:
        _stop(wproc)
        raise
    return worker, gateway, repo


def streamed(server: Server, name: str, probe: tuple[bytes, int, bytes], rounds: int) -> Row:
    """A header probe ``rounds`` times: ``probe`` is (the head's start, how many bytes of a
    header value follow it, what ends it); the median time to the answer, memory around it."""
    pid = server.proc.pid
    before = rss_bytes(pid)
    results: list[Exchange] = []
    with RssSampler(pid) as sampler:
        for _ in range(rounds):
            start, size, tail = probe
            results.append(exchange(server.port, start, chunks(size, tail=tail)))
    time.sleep(1.0)  # the server's lingering close (2 s at most) has dropped what it read
    after = rss_bytes(pid)
    times = [r.ms for r in results if r.ms is not None]
    statuses = [r.status for r in results]
    shown = sorted(
        {str(s) if s is not None else results[i].outcome for i, s in enumerate(statuses)}
    )
    return Row(
        server.name,
        name,
        "/".join(shown),
        statistics.median(times) if times else None,
        min(times) if times else None,
        max(times) if times else None,
        rounds,
        int(statistics.median(r.sent for r in results)),
        before,
        sampler.peak,
        after,
        statuses=statuses,
    )


def call(server: Server, name: str, raw: bytes) -> tuple[Row, str]:
    """One short request (``Connection: close``): its row (status, time to the answer's
    first byte) and the answer's body as text (an ``error`` message when there is one)."""
    raw = raw.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1)
    with socket.create_connection((HOST, server.port), timeout=PROBE_CAP_S) as s:
        t0 = time.perf_counter()
        s.sendall(raw)
        out = s.recv(65536)
        ms = (time.perf_counter() - t0) * 1000.0
        while chunk := s.recv(65536):
            out += chunk
    status = status_of(out)
    text = out.partition(b"\r\n\r\n")[2].decode(errors="replace")
    with contextlib.suppress(ValueError, AttributeError):
        text = str(json.loads(text).get("error", text))
    row = Row(server.name, name, "closed" if status is None else str(status), ms)
    row.statuses = [status]
    return row, text


def request(method: str, target: str, body: bytes = b"", headers: Sequence[str] = ()) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", f"Host: {HOST}", *headers]
    if body or method in ("PUT", "POST"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def params_probes(server: Server, token: str) -> list[Row]:
    auth = (f"Authorization: Bearer {token}", "Content-Type: application/json")
    get = request("GET", "/admin/params", headers=auth)
    version = json.loads(call(server, "get", get)[1])["version"]
    rows = []
    for name, body in (
        ("params-1e400-weight",
         b'{"params": {"routing": {"policy": "queue-aware", "queue_weight": 1e400}}}'),
        ("params-1e400-delay",
         b'{"params": {"batching_per_model": {"%s": {"policy": "fixed-window", '
         b'"max_batch_delay_ms": 1e400}}}}' % MODEL.encode()),
        ("params-empty-body", b""),
        ("params-unknown-field", b'{"parms": {"class_headroom": 0.5}}'),
        ("params-unknown-model",
         b'{"params": {"batching_per_model": {"nope": {"policy": "none"}}}}'),
    ):  # fmt: skip
        row, text = call(server, name, request("PUT", "/admin/params", body, auth))
        row.note = text[:110]
        rows.append(row)
    after = call(server, "get", get)[1]
    bare = "Infinity" in after or "NaN" in after
    now = json.loads(after, parse_constant=lambda c: None)["version"]
    rows.append(
        Row(server.name, "params-after", "-",
            note=f"version {version} -> {now}; bare Infinity/NaN in GET /admin/params: "
                 f"{'yes' if bare else 'no'}")
    )  # fmt: skip
    return rows


def load_probes(worker: Server, repo: Path) -> list[Row]:
    rows = []
    for name, model, body in (
        ("load-missing-profile", MODEL,
         b'{"parameters": {"config": {"emulated": {"profile": "missing.yaml"}}}}'),
        ("load-no-folder", "nope", b""),
    ):  # fmt: skip
        raw = request("POST", f"/v2/repository/models/{model}/load", body)
        row, text = call(worker, name, raw)
        shows = str(repo.resolve()) in text or str(repo) in text
        row.note = f"abs. repo path shown: {'yes' if shows else 'no'}; {text[:80]}"
        rows.append(row)
    return rows


def cli_port_probe(tmp: Path) -> Row:
    t0 = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-m", "evenserve", "worker", "--repo", str(tmp / "repo"),
         "--port", "99999"],
        capture_output=True, text=True, timeout=PROBE_CAP_S, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    tb = "Traceback" in p.stderr or any("OverflowError" in line for line in lines)
    note = f"{len(lines)} line(s), traceback: {'yes' if tb else 'no'}; last: {lines[-1][:80]}"
    return Row("cli", "worker --port 99999", f"exit {p.returncode}",
               (time.perf_counter() - t0) * 1000.0, note=note)  # fmt: skip


def run(args: argparse.Namespace, console: Console) -> list[Row]:
    token = secrets.token_hex(16)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="evenserve-hardening-") as t:
        tmp = Path(t)
        worker, gateway, repo = start_servers(tmp, token)
        try:
            stream = int(args.stream_mib * MIB)
            unterminated = (START, stream, b"")
            complete = (START, 50 * MIB, b"\r\n\r\n")
            for server in (worker, gateway):
                rows.append(streamed(server, "unterminated", unterminated, args.rounds))
                rows.append(streamed(server, "complete-50MiB", complete, args.rounds))
                rows.append(call(server, "HEAD", request("HEAD", "/v2/health/live"))[0])
                target = f"http://{HOST}:{server.port}/v2/health/live"
                rows.append(call(server, "absolute", request("GET", target))[0])
                rows += params_probes(server, token)
                if server is worker:
                    rows += load_probes(worker, repo)
            rows.append(cli_port_probe(tmp))
        finally:
            _stop(gateway.proc)
            _stop(worker.proc)
    return rows


def _mib(x: int | None) -> str:
    return "" if x is None else f"{x / MIB:.1f}"


def _f(x: float | None) -> str:
    return "" if x is None else f"{x:.1f}"


def render(rows: list[Row], console: Console, rounds: int) -> None:
    table = Table(title=f"HTTP hardening probes (header probes: median of {rounds} rounds)")
    for col in ("server", "probe", "status", "ms to answer", "ms min-max", "sent MiB",
                "RSS before MiB", "RSS peak MiB", "RSS after MiB", "note"):  # fmt: skip
        table.add_column(col, overflow="fold")
    for r in rows:
        spread = "" if r.rounds < 2 or r.ms_min is None else f"{_f(r.ms_min)}-{_f(r.ms_max)}"
        table.add_row(
            r.server,
            r.probe,
            r.status,
            _f(r.ms_median),
            spread,
            "" if r.sent_bytes is None else f"{r.sent_bytes / MIB:.2f}",
            _mib(r.rss_before),
            _mib(r.rss_peak),
            _mib(r.rss_after),
            r.note,
        )
    console.print(table)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5, help="rounds of each header probe")
    ap.add_argument(
        "--stream-mib", type=float, default=200.0, help="the most an unterminated header streams"
    )
    ap.add_argument("--json", type=Path, default=None, help="write every figure here")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds: must be >= 1")
    if not args.stream_mib > 0:
        ap.error("--stream-mib: must be > 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(width=200)
    load_before = os.getloadavg()
    t0 = time.monotonic()
    rows = run(args, console)
    render(rows, console, args.rounds)
    load_after = os.getloadavg()
    import evenserve

    console.print(
        f"host: {os.cpu_count()} CPUs; load average (1/5/15 min) before "
        f"{' '.join(f'{x:.2f}' for x in load_before)}, after "
        f"{' '.join(f'{x:.2f}' for x in load_after)}; wall {time.monotonic() - t0:.0f} s; "
        f"evenserve {evenserve.__version__}",
        highlight=False,
    )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "rows": [asdict(r) for r in rows],
            "rounds": args.rounds,
            "stream_mib": args.stream_mib,
            "load_before": load_before,
            "load_after": load_after,
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
