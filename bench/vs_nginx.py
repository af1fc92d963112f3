"""nginx and evenserve side by side: the same emulated devices, the same loads, one run.

    python bench/vs_nginx.py --quick                     # fewer policies and rates, 5 s runs
    python bench/vs_nginx.py --seconds 10 --json out/vs-nginx.json
    python bench/vs_nginx.py --only p800,p800-hog --hog 0.5
    python bench/vs_nginx.py --only max,max-hog --payload json --rates 40,60,80,100,120

nginx is not installed by this script: it uses ``--nginx PATH``, else ``nginx`` on PATH, else
``/usr/sbin/nginx`` (Debian/Ubuntu: ``sudo apt-get install -y nginx-light``).

Devices. Four ``evenserve worker`` processes, each an emulated device hosting both models
with tiny tensors (4 FP32 in, 2 out; ``--payload json|binary``: a ResNet-50 image [1, 3, 224,
224] FP32 and BERT-base's input_ids and attention_mask [1, 128] INT64, as JSON (about 3 MB for
the image, as tritonclient sends it with binary data off) or as binary tensors):
``resnet-like`` t(b) = 4 + 0.6 b ms and ``bert-like``
t(b) = 12 + 3.5 b ms (profile points at b = 1 and 8, interpolated linearly), at most 8 per
batch, ``fixed-window`` batching with a 2 ms window. The slow-device scenario makes device 3's
profiles 2.5x longer. The nginx arm and the gateway arms front the very same four worker
processes; ``evenserve up`` starts its own four from the same repository, profile folders and
flags.

Arms, run one at a time (never two at once), interleaved within each scenario (the order
reversed from one scenario or rate step to the next) so drift hits every arm alike; every
balancer is started for its run and stopped after it, so no idle balancer runs beside
another arm:
- ``nginx``: an ``upstream`` with ``least_conn`` over the four workers, keep-alive to them
  (``keepalive``, ``proxy_http_version 1.1``, an empty ``Connection`` header, upstream idle
  connections retired after 4 s, below the workers' 15 s), ``worker_processes 1``,
  ``access_log off``;
- ``gw:POLICY``: ``evenserve gateway --config`` with the four workers as ``backends`` (each
  with its profile folder, which least-expected-work reads), every routing policy asked for;
- ``up:POLICY``: ``evenserve up`` on a cluster file with the same four device definitions;
- ``ref`` (the max-rate scenarios; ``--no-ref`` leaves it out): the same nginx in front of
  four reference devices (bench/reference_device.py): the same models, profiles, batch cap
  and window, each device a thread that forms its batch itself the moment it can start it,
  topping it up with every request that has arrived by then; no evenserve code decides
  anything there. It tells whether evenserve's devices batch as fully and run as many batches
  as a device that does nothing clever.
The harness uses only the CLI, the cluster file, the worker's flags and ``evenserve.loadgen``.

Load: evenserve's own load generator (``evenserve.loadgen.run_load``, what ``evenserve bench
URL --rate R --mix ...`` runs), open-loop Poisson at R req/s, mix 70/30 resnet-like/bert-like,
the same seed (so the same arrivals) for every arm of a scenario, no scraping. It runs at
normal priority, as a user's client does, competing for the CPU with the balancer and the
workers (``--realtime`` gives its sending thread real-time priority, which hides that
contention: it made nginx look 3 ms slower than an independent harness found it). Per run, over
the window after ``--warmup`` seconds: P50/P99 latency of answered requests (from the
intended send time, as the load generator counts it), achieved rate (requests answered 200 in
the window / window) and offered rate (requests due in the window / window); errors are every
request of the whole run not answered 200, by status (``429``, ``502``, ...) or failure kind
(``timeout``, ``unfinished``, ...).

CPU: utime + stime from ``/proc/PID/stat`` of the balancer's processes (nginx: master and
workers; the gateway process; for ``up``: the gateway, the workers and the ``up`` process
itself, each reported separately) from just before the load to just after it, divided by the
requests answered (any HTTP status). The workers' CPU per request is shown for every arm.

Scenarios (``--only`` takes their names):
- ``added``: one worker serving a zero-cost model (1 us per batch, no batching window), at
  each of ``--added-rates`` (500 and 800 req/s) that model direct to the worker, through the
  gateway (queue-aware) and through nginx, interleaved ``--rounds`` times; added P50 = P50
  through the balancer - P50 direct, and each balancer's CPU per request (medians over
  rounds). nginx's own added P50 checks the harness: below 0 or above
  ``NGINX_ADDED_SANE_MS`` (1 ms; an independent harness measured +0.13 ms) is flagged.
- ``idle``: each balancer in front of the four workers, no load, ``--idle-seconds``; CPU in
  percent of one core (the gateway polls its backends; nginx does nothing).
- ``p400``, ``p800``: P99 at 400 and 800 req/s; ``p800-hog``: 800 req/s with a CPU hog
  beside every arm (a subprocess spinning and sleeping in turn so that it uses ``--hog`` of a
  core; what it got is printed; ``--hog 0`` skips it).
- ``slow600``: 600 req/s with device 3 2.5x slower.
- ``max``: the rate stepped up (``--rates``); ``max-hog``: the same with the hog beside
  every run. Rule: a step is sustained when achieved >= 0.98 x offered, there are 0 errors
  and P99 <= ``--p99-bound-ms`` (250); an arm's maximum sustained rate is the highest step
  at which it was sustained, and an arm is not run at steps above the first it did not
  sustain (an overloaded run only drains), so it is the step below the arm's first failure
  (0 when the first step fails). Each step also reads the devices' mean batch size per model
  (workers' batch-size histograms, the reference devices' counts), printed beside its P99.

Targets (printed PASS/FAIL beside each ratio; a FAIL is a measurement, the exit status is
non-zero only when the harness itself fails): at each ``added`` rate, gateway CPU per request
<= 2x nginx's and added P50 <= 0.3 ms; max sustained rate of ``evenserve up`` >= 1x nginx's in
front of the same workers and >= 1x the reference devices' (``max``), >= 0.9x both with the
hog (``max-hog``), of the gateway arms >= 0.9x nginx's; P99 at 800 <= 1.3x nginx with 0 errors
for every policy, quiet and with the hog; with the slow device at 600, least-expected-work and
queue-aware P99 <= nginx; idle gateway < 1 % of a core; no backend ejected in any run.

Every process started here runs in its own session and is stopped on exit, Ctrl-C or error
(each also gets SIGTERM should this process die first); ports come from the OS; files go to a
temporary folder (``--logs DIR`` keeps the process logs there). The figures depend on the
host: on a small shared machine the load generator, the balancer and four workers compete
for the same cores, which is what the hog scenario makes explicit.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import re
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any

import httpx
import numpy as np
import yaml
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from evenserve.loadgen.runner import run_load
from evenserve.loadgen.spec import LiveStats, LoadResult, LoadSpec

ROOT = Path(__file__).resolve().parents[1]
EVENSERVE = [sys.executable, "-c", "from evenserve.cli.main import main; main()"]
HEALTH = "/v2/health/ready"

#: model -> (fixed ms, ms per item): t(b) = fixed + per_item * b.
MODELS: dict[str, tuple[float, float]] = {"resnet-like": (4.0, 0.6), "bert-like": (12.0, 3.5)}
MIX = {"resnet-like": 0.7, "bert-like": 0.3}
MAX_BATCH = 8
WINDOW_MS = 2.0
DEVICES = 4
SLOW_DEVICE = 3
SLOW_FACTOR = 2.5
ZERO_MODEL = "zero"

GW_POLICIES = [
    "round-robin", "least-connections", "power-of-two", "least-expected-work", "queue-aware",
]  # fmt: skip
UP_POLICIES = ["power-of-two", "least-expected-work", "queue-aware"]
QUICK_GW = ["least-connections", "least-expected-work", "queue-aware"]
QUICK_UP = ["least-expected-work"]
#: Up to past the devices' limit (about 1,700 req/s for the mix: nginx and every arm fail at 1,800).
RATES = [400.0, 600.0, 800.0, 1000.0, 1200.0, 1400.0, 1600.0, 1800.0]
QUICK_RATES = [400.0, 800.0, 1200.0]
SCENARIOS = ["added", "idle", "p400", "p800", "p800-hog", "slow600", "max", "max-hog"]
#: Scenario -> (rate, slow device?, hog?).
LOAD_SCENARIOS: dict[str, tuple[float, bool, bool]] = {
    "p400": (400.0, False, False),
    "p800": (800.0, False, False),
    "p800-hog": (800.0, False, True),
    "slow600": (600.0, True, False),
}
#: The rates the balancers' own cost is measured at (``added``).
ADDED_RATES = [500.0, 800.0]
ACHIEVED_FRACTION = 0.98
#: What nginx may add to a direct request's P50 before this harness calls its own figures
#: suspect (an independent harness measured +0.13 ms on this kind of host): below zero or
#: above this, the load generator or the host is distorting the comparison.
NGINX_ADDED_SANE_MS = 1.0
#: The arm of nginx in front of four reference devices (bench/reference_device.py).
REF_ARM = "ref"
#: Request bodies (``--payload``): tiny tensors, or tensors of real size (a ResNet-50 image
#: [1, 3, 224, 224] FP32 and BERT-base's input_ids and attention_mask [1, 128] INT64) as JSON
#: (about 3 MB for the image, as tritonclient sends it with binary data off) or binary.
PAYLOADS = ("tiny", "json", "binary")
#: Each model's inputs by payload (the model.yaml inputs; the reference device's metadata).
REAL_INPUTS: dict[str, list[dict[str, Any]]] = {
    "resnet-like": [{"name": "pixel_values", "datatype": "FP32", "shape": [3, 224, 224]}],
    "bert-like": [
        {"name": "input_ids", "datatype": "INT64", "shape": [128]},
        {"name": "attention_mask", "datatype": "INT64", "shape": [128]},
    ],
}
TINY_INPUTS = [{"name": "x", "datatype": "FP32", "shape": [4]}]


def model_inputs(model: str, payload: str) -> list[dict[str, Any]]:
    return TINY_INPUTS if payload == "tiny" or model not in REAL_INPUTS else REAL_INPUTS[model]


#: The hog: busy (spinning) and asleep in turn so that its CPU time keeps up with FRACTION of
#: the wall time; it counts CPU time, not wall time, so on a busy host it still asks for its
#: share (a debt beyond 50 ms is forgiven rather than paid back in a burst).
HOG_CODE = """
import sys, time
f = float(sys.argv[1])
w0, c0 = time.perf_counter(), time.process_time()
while True:
    ahead = (time.process_time() - c0) - f * (time.perf_counter() - w0)
    if ahead > 0.002:
        time.sleep(ahead / f)
    elif ahead < -0.05:
        c0 += ahead + 0.05
"""


# -- the devices: profiles and model repository ---------------------------------------------
def profile_doc(model: str, fixed_ms: float, per_item_ms: float, factor: float) -> dict[str, Any]:
    """One linear profile, t(b) = factor * (fixed + per_item * b), at b = 1 and MAX_BATCH."""
    return {
        "model": model,
        "device": f"emulated device{' (2.5x slower)' if factor != 1.0 else ''}",
        "runtime": "emulated",
        "precision": "fp32",
        "source": f"synthetic: t(b) = {factor:g} x ({fixed_ms:g} + {per_item_ms:g} b) ms",
        "points": [
            {"batch": b, "latency_ms": round(factor * (fixed_ms + per_item_ms * b), 6)}
            for b in (1, MAX_BATCH)
        ],
    }


def model_doc(
    window_ms: float = WINDOW_MS, inputs: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """model.yaml of an emulated model here: tiny tensors (or ``inputs``), a fixed window,
    batch <= 8."""
    return {
        "runtime": "emulated",
        "max_batch_size": MAX_BATCH,
        "inputs": inputs or TINY_INPUTS,
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [2]}],
        "batching": {
            "policy": "fixed-window",
            "max_batch_size": MAX_BATCH,
            "max_batch_delay_ms": window_ms,
        },
    }


def write_profile_set(folder: Path, factor: float) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for m, (fixed, per) in MODELS.items():
        doc = profile_doc(m, fixed, per, factor)
        (folder / f"{m}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return folder.resolve()


def write_repo(
    folder: Path, models: Sequence[str], window_ms: float = WINDOW_MS, payload: str = "tiny"
) -> Path:
    for m in models:
        (folder / m).mkdir(parents=True, exist_ok=True)
        doc = model_doc(window_ms, model_inputs(m, payload))
        (folder / m / "model.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return folder.resolve()


def write_zero(tmp: Path, payload: str = "tiny") -> tuple[Path, Path]:
    """A repository with the zero-cost model and its profile set (1 us per batch), batched
    without a window (a window would add its own wait to every path alike); its input is
    the ResNet-like model's with a real-size payload."""
    repo = tmp / f"repo-zero-{payload}"
    (repo / ZERO_MODEL).mkdir(parents=True, exist_ok=True)
    doc = model_doc(0.0, model_inputs("resnet-like", payload))
    (repo / ZERO_MODEL / "model.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    repo = repo.resolve()
    pset = tmp / "profiles-zero"
    pset.mkdir(parents=True, exist_ok=True)
    doc = {
        "model": ZERO_MODEL, "device": "none", "runtime": "emulated", "precision": "fp32",
        "source": "near-zero compute, for the balancer's own latency",
        "points": [{"batch": 1, "latency_ms": 0.001}, {"batch": MAX_BATCH, "latency_ms": 0.001}],
    }  # fmt: skip
    (pset / f"{ZERO_MODEL}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return repo, pset.resolve()


# -- configuration files ----------------------------------------------------------------------
def nginx_conf(
    listen_port: int,
    upstreams: Sequence[str],
    workdir: Path,
    *,
    user: str | None = None,
    worker_connections: int = 4096,
    rlimit_nofile: int | None = None,
    keepalive: int = 128,
) -> str:
    """A least_conn reverse proxy on 127.0.0.1:listen_port to ``upstreams`` (host:port).

    Keep-alive to the upstreams (HTTP/1.1, empty Connection header; idle upstream connections
    retired after 4 s, below the workers' 15 s keep-alive, so none is reused as it closes), one
    worker process, no access log, every path (pid, logs, temp files) under ``workdir``.
    """
    if not upstreams:
        raise ValueError("nginx_conf: no upstreams")
    w = workdir.resolve()
    servers = "\n".join(f"        server {u} max_fails=0;" for u in upstreams)
    temps = "\n".join(
        f"    {kind}_temp_path {w / kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    head = [
        f"user {user};" if user else None,
        "worker_processes 1;",
        f"worker_rlimit_nofile {rlimit_nofile};" if rlimit_nofile else None,
        "daemon off;",
        f"pid {w / 'nginx.pid'};",
        f"error_log {w / 'error.log'} warn;",
    ]
    return (
        "\n".join(x for x in head if x)
        + f"""
events {{
    worker_connections {worker_connections};
}}
http {{
    access_log off;
{temps}
    client_body_buffer_size 64k;
    keepalive_requests 1000000;
    keepalive_timeout 75s;
    upstream evenserve_workers {{
        least_conn;
{servers}
        keepalive {keepalive};
        keepalive_requests 1000000;
        keepalive_timeout 4s;
    }}
    server {{
        listen 127.0.0.1:{listen_port} backlog=4096;
        location / {{
            proxy_pass http://evenserve_workers;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_connect_timeout 1s;
            proxy_read_timeout 60s;
        }}
    }}
}}
"""
    )


def gateway_cluster(
    port: int, routing: str, backends: Sequence[tuple[str, str, Path]], models: Sequence[str]
) -> dict[str, Any]:
    """Cluster file for ``evenserve gateway`` in front of running workers (name, url, profiles)."""
    return {
        "name": "vs-nginx",
        "gateway": {
            "host": "127.0.0.1",
            "port": port,
            "routing": routing,
            "admin": {"token": secrets.token_urlsafe(18)},
        },
        "backends": [
            {"name": n, "url": u, "models": list(models), "profiles": str(p)}
            for n, u, p in backends
        ],
    }


def up_cluster(
    port: int, routing: str, repo: Path, devices: Sequence[tuple[str, Path, int]]
) -> dict[str, Any]:
    """Cluster file for ``evenserve up``: one worker per (name, profile folder, port)."""
    return {
        "name": "vs-nginx-up",
        "gateway": {
            "host": "127.0.0.1",
            "port": port,
            "routing": routing,
            "admin": {"token": secrets.token_urlsafe(18)},
        },
        "workers": {
            "repo": str(repo),
            "devices": [
                {"name": n, "device": f"emulated:{p}", "port": wp, "extra_args": WORKER_FLAGS}
                for n, p, wp in devices
            ],
            "ready_timeout_s": 90,
            "drain_timeout_s": 3,
            "restart": False,
        },
    }


#: Flags every worker gets, whoever starts it.
WORKER_FLAGS = ["--log-level", "warning"]


# -- figures of one run -----------------------------------------------------------------------
@dataclass
class RunFigures:
    scenario: str
    arm: str
    rate_rps: float
    seconds: float
    offered_rps: float
    achieved_rps: float
    p50_ms: float | None
    p99_ms: float | None
    answered: int
    errors: dict[str, int]
    #: CPU seconds over the run per role (balancer, workers, launcher).
    cpu_s: dict[str, float]
    lag_p99_ms: float | None = None
    hog: float = 0.0
    #: The host's 1-minute load average when the run ended (the machine may be shared).
    load_1m: float | None = None
    #: Backends the gateway ejected during the run (its ejection counter; None for nginx).
    ejections: int | None = None
    #: Mean batch size per model on the devices during the run (warm-up included).
    batch: dict[str, float] = field(default_factory=dict)

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    def cpu_us_per_request(self, role: str) -> float | None:
        if role not in self.cpu_s or self.answered == 0:
            return None
        return self.cpu_s[role] / self.answered * 1e6

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["error_count"] = self.error_count
        out["cpu_us_per_request"] = {r: self.cpu_us_per_request(r) for r in self.cpu_s}
        return out


def ejections_of(url: str) -> int | None:
    """The gateway's ``evenserve_gateway_backend_ejections_total``, summed over backends and
    reasons (None when it cannot be read)."""
    try:
        text = httpx.get(url + "/metrics", timeout=10.0).text
    except httpx.HTTPError:
        return None
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("evenserve_gateway_backend_ejections_total{")
    ]
    return int(sum(values))


def percentile(xs: Sequence[float], q: float) -> float | None:
    return None if not xs else float(np.percentile(np.asarray(xs, dtype=float), q))


def error_key(status: int, outcome: str) -> str:
    """A failed request's key in the errors table: its HTTP status, else the failure kind."""
    return str(status) if status else outcome


def figures_of(
    result: LoadResult, scenario: str, arm: str, cpu_s: dict[str, float], hog: float = 0.0
) -> RunFigures:
    spec = result.spec
    wu, end = spec.warmup_s, result.end_s
    window = max(1e-9, end - wu)
    lat = [
        (s.done_s - s.intended_s) * 1000.0
        for s in result.samples
        if s.outcome == "ok" and s.intended_s >= wu
    ]
    done_in = sum(1 for s in result.samples if s.outcome == "ok" and wu <= s.done_s <= end)
    due_in = sum(1 for s in result.samples if wu <= s.intended_s < end)
    errors: dict[str, int] = {}
    for s in result.samples:
        if s.outcome != "ok":
            k = error_key(s.status, s.outcome)
            errors[k] = errors.get(k, 0) + 1
    lag = result.lag_ms.get("p99")
    return RunFigures(
        scenario=scenario,
        arm=arm,
        rate_rps=float(spec.rate_rps or 0.0),
        seconds=spec.duration_s,
        offered_rps=due_in / window,
        achieved_rps=done_in / window,
        p50_ms=percentile(lat, 50),
        p99_ms=percentile(lat, 99),
        answered=sum(1 for s in result.samples if s.status),
        errors=dict(sorted(errors.items())),
        cpu_s=cpu_s,
        lag_p99_ms=None if lag is None else float(lag),
        hog=hog,
        load_1m=round(os.getloadavg()[0], 2),
    )


def sustained(f: RunFigures, p99_bound_ms: float, fraction: float = ACHIEVED_FRACTION) -> bool:
    """The max-rate rule for one step: achieved >= fraction x offered, 0 errors, P99 <= bound."""
    return (
        f.error_count == 0
        and f.p99_ms is not None
        and f.p99_ms <= p99_bound_ms
        and f.achieved_rps >= fraction * f.offered_rps
    )


def max_sustained(
    steps: Sequence[RunFigures], p99_bound_ms: float, fraction: float = ACHIEVED_FRACTION
) -> float:
    """The highest rate (nominal) among the steps that were sustained; 0 when none was."""
    ok = [f.rate_rps for f in steps if sustained(f, p99_bound_ms, fraction)]
    return max(ok, default=0.0)


def _median(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return float(np.median(vals)) if vals else None


def added_summary(by_rate: dict[float, dict[str, list[RunFigures]]]) -> dict[str, Any]:
    """Per rate (a string key, for JSON): each arm's median P50 over the rounds, what each
    balancer adds to the direct P50, and each balancer's median CPU per request (us)."""
    out: dict[str, Any] = {}
    for rate, lat in by_rate.items():
        p50 = {a: _median([f.p50_ms for f in fs]) for a, fs in lat.items()}
        d = p50.get("direct")
        out[f"{rate:g}"] = {
            "rate_rps": rate,
            "p50_ms": p50,
            "added_p50_ms": {
                a: None if p50.get(a) is None or d is None else p50[a] - d  # type: ignore[operator]
                for a in ("gateway", "nginx")
            },
            "cpu_us_per_request": {
                a: _median([f.cpu_us_per_request("balancer") for f in lat.get(a, [])])
                for a in ("gateway", "nginx")
            },
            "runs": {a: [f.to_json() for f in fs] for a, fs in lat.items()},
        }
    return out


# -- targets ----------------------------------------------------------------------------------
@dataclass
class TargetRow:
    target: str
    arm: str
    value: float | None
    nginx: float | None
    ratio: float | None
    bound: str
    verdict: str  # PASS, FAIL, info, n/a, FLAG (a harness check that failed)
    note: str = ""


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "FAIL")


def build_targets(
    runs: dict[str, dict[str, RunFigures]],
    max_rates: dict[str, dict[str, float]],
    idle_pct: dict[str, float],
    added: dict[str, Any],
    steps: Sequence[RunFigures] = (),
) -> list[TargetRow]:
    """Every ratio and target row from what was measured (scenarios not run are left out).

    ``runs``: scenario -> arm -> figures; ``max_rates``: max-rate scenario (``max``,
    ``max-hog``) -> arm -> max sustained req/s; ``idle_pct``: arm -> balancer CPU % of a
    core at idle; ``added``: ``added_summary``'s figures by rate. Arms are ``nginx``,
    ``ref`` (nginx in front of reference devices), ``gw:POLICY`` and ``up:POLICY``.
    """
    rows: list[TargetRow] = []

    def ours(arms: Sequence[str]) -> list[str]:
        return [a for a in arms if a not in ("nginx", REF_ARM)]

    for key, fig in added.items():
        cpu = fig.get("cpu_us_per_request", {})
        g, n = cpu.get("gateway"), cpu.get("nginx")
        r = _ratio(g, n)
        rows.append(TargetRow(
            f"balancer CPU/request, us (one zero-cost backend, {key} req/s)", "gateway", g, n, r,
            "<= 2x nginx", _verdict(None if r is None else r <= 2.0),
        ))  # fmt: skip
        ad = fig.get("added_p50_ms", {})
        ga, na = ad.get("gateway"), ad.get("nginx")
        if ga is not None:
            rows.append(TargetRow(
                f"added P50 latency, ms ({key} req/s)", "gateway", ga, na, None, "<= 0.3 ms",
                _verdict(ga <= 0.3),
            ))  # fmt: skip
        if na is not None:
            sane = 0.0 <= na <= NGINX_ADDED_SANE_MS
            rows.append(TargetRow(
                f"nginx's added P50, ms ({key} req/s): harness check", "nginx", na, None, None,
                f"0..{NGINX_ADDED_SANE_MS:g} ms", "info" if sane else "FLAG",
                "" if sane else "outside what nginx adds: the host or the client distorts",
            ))  # fmt: skip
    cpu_src = next((s for s in ("p800", "p400", "p800-hog", "slow600") if s in runs), None)
    if cpu_src is not None and "nginx" in runs[cpu_src]:
        base = runs[cpu_src]["nginx"].cpu_us_per_request("balancer")
        for a in ours(list(runs[cpu_src])):
            v = runs[cpu_src][a].cpu_us_per_request("balancer")
            rows.append(TargetRow(
                f"balancer CPU/request, us ({cpu_src}, 4 devices)", a, v, base,
                _ratio(v, base), "-", "info",
            ))  # fmt: skip
    for scen, (need_up, need_gw) in (("max", (1.0, 0.9)), ("max-hog", (0.9, None))):
        rates = max_rates.get(scen, {})
        for base_arm in ("nginx", REF_ARM):
            if base_arm not in rates:
                continue
            base_m = rates[base_arm]
            what = "nginx" if base_arm == "nginx" else "nginx + reference devices"
            for a in ours(list(rates)):
                r = _ratio(rates[a], base_m)
                need = need_up if a.startswith("up:") else need_gw
                verdict = "info" if need is None else _verdict(None if r is None else r >= need)
                bound = "-" if need is None else f">= {need:g}x {what}"
                rows.append(TargetRow(
                    f"max sustained rate, req/s ({scen}, vs {what})", a, rates[a], base_m, r,
                    bound, verdict,
                ))  # fmt: skip
    for scen, bound in (("p400", None), ("p800", 1.3), ("p800-hog", 1.3), ("slow600", 1.0)):
        if scen not in runs or "nginx" not in runs[scen]:
            continue
        n = runs[scen]["nginx"]
        for a in ours(list(runs[scen])):
            f = runs[scen][a]
            r = _ratio(f.p99_ms, n.p99_ms)
            policy = a.split(":", 1)[1]
            bounded = bound is not None and (
                scen != "slow600" or policy in ("least-expected-work", "queue-aware")
            )
            note = f"{f.error_count} errors" if f.error_count else ""
            if n.error_count:
                note = (note + "; " if note else "") + f"nginx {n.error_count} errors"
            if not bounded:
                rows.append(TargetRow(f"P99 ms ({scen})", a, f.p99_ms, n.p99_ms, r, "-", "info",
                                      note))  # fmt: skip
                continue
            assert bound is not None
            errors_rule = scen != "slow600"
            ok = None if r is None else (r <= bound and (not errors_rule or f.error_count == 0))
            text = f"<= {bound:g}x nginx" + (", 0 errors" if errors_rule else "")
            rows.append(TargetRow(f"P99 ms ({scen})", a, f.p99_ms, n.p99_ms, r, text,
                                  _verdict(ok), note))  # fmt: skip
    for a, pct in idle_pct.items():
        if a == "nginx":
            continue
        rows.append(TargetRow("idle balancer CPU, % of a core", a, pct, idle_pct.get("nginx"),
                              None, "< 1 %", _verdict(pct < 1.0)))  # fmt: skip
    ejected = [
        (f"{scen} {f.arm} @ {f.rate_rps:g}", f.ejections)
        for scen, arms in runs.items()
        for f in arms.values()
        if f.ejections is not None
    ] + [(f"{f.scenario} {f.arm} @ {f.rate_rps:g}", f.ejections) for f in steps
         if f.ejections is not None]  # fmt: skip
    if ejected:
        total = sum(n for _, n in ejected if n is not None)
        worst = [w for w, n in ejected if n]
        rows.append(TargetRow(
            "backends ejected by a gateway (every run, saturated ones too)", "all gateway arms",
            float(total), None, None, "0", _verdict(total == 0), ", ".join(worst[:4]),
        ))  # fmt: skip
    return rows


def fmt(x: float | None, nd: int = 2) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def targets_table(rows: Sequence[TargetRow]) -> Table:
    t = Table(title="evenserve vs nginx: ratios and targets")
    for col, just in [("figure", "left"), ("arm", "left"), ("evenserve", "right"),
                      ("nginx", "right"), ("ratio", "right"), ("target", "left"),
                      ("", "center"), ("note", "left")]:  # fmt: skip
        t.add_column(col, justify=just, no_wrap=True)  # type: ignore[arg-type]
    style = {"PASS": "green", "FAIL": "bold red", "FLAG": "bold yellow"}
    for r in rows:
        v = r.verdict
        t.add_row(r.target, r.arm, fmt(r.value), fmt(r.nginx), fmt(r.ratio),
                  r.bound, f"[{style[v]}]{v}[/]" if v in style else v, r.note)  # fmt: skip
    return t


def runs_table(title: str, runs: Sequence[RunFigures]) -> Table:
    t = Table(title=title)
    for col in ("arm", "rate", "offered", "achieved", "P50 ms", "P99 ms", "errors",
                "bal. CPU us/req", "workers CPU us/req", "lag P99 ms", "load 1m"):  # fmt: skip
        t.add_column(col, justify="left" if col in ("arm", "errors") else "right", no_wrap=True)
    for f in runs:
        errs = ", ".join(f"{k} {v}" for k, v in f.errors.items()) or "0"
        t.add_row(
            f.arm, f"{f.rate_rps:g}", fmt(f.offered_rps, 1), fmt(f.achieved_rps, 1),
            fmt(f.p50_ms), fmt(f.p99_ms), errs,
            fmt(f.cpu_us_per_request("balancer"), 0), fmt(f.cpu_us_per_request("workers"), 0),
            fmt(f.lag_p99_ms), fmt(f.load_1m),
        )  # fmt: skip
    return t


# -- processes --------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class HarnessError(RuntimeError):
    """Something this script started did not work (not a measurement)."""


@dataclass
class Child:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    log_file: IO[bytes]

    def tail(self, n: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        return ""


@dataclass
class Processes:
    """Every child of this run: started in its own session, stopped whatever happens."""

    log_dir: Path
    children: list[Child] = field(default_factory=list)

    def start(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> Child:
        log = self.log_dir / f"{name}.log"
        f = open(log, "ab")  # noqa: SIM115 - closed when the child is stopped
        preexec = _die_with_parent if sys.platform.startswith("linux") else None
        p = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=f,
            stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=preexec,
        )  # fmt: skip
        c = Child(name, p, log, f)
        self.children.append(c)
        return c

    def stop(self, c: Child, sig: int = signal.SIGTERM, timeout_s: float = 15.0) -> None:
        if c.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                c.popen.send_signal(sig)
            try:
                c.popen.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(c.popen.pid, signal.SIGKILL)
                c.popen.wait()
        # Anything the child left in its session (its own children) goes too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(c.popen.pid, signal.SIGKILL)
        c.log_file.close()
        if c in self.children:
            self.children.remove(c)

    def stop_all(self) -> None:
        for c in reversed(list(self.children)):
            self.stop(c, timeout_s=10.0)


def wait_ready(url: str, child: Child, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if child.popen.poll() is not None:
            raise HarnessError(
                f"{child.name} exited with {child.popen.returncode} while starting:\n{child.tail()}"
            )
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + HEALTH, timeout=1.0, trust_env=False).status_code == 200:
                return
        time.sleep(0.1)
    raise HarnessError(f"{child.name} ({url}) not ready after {timeout_s:g} s:\n{child.tail()}")


def wait_file(path: Path, child: Child, timeout_s: float = 90.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.is_file() and path.stat().st_size > 0:
            time.sleep(0.05)  # written in one go, but give it a moment
            return path.read_text()
        if child.popen.poll() is not None:
            raise HarnessError(
                f"{child.name} exited with {child.popen.returncode} while starting:\n{child.tail()}"
            )
        time.sleep(0.1)
    raise HarnessError(f"{child.name}: no {path.name} after {timeout_s:g} s:\n{child.tail()}")


TICK = os.sysconf("SC_CLK_TCK")


def parse_stat(text: str) -> tuple[int, float]:
    """(ppid, utime + stime in seconds) from the text of /proc/PID/stat."""
    rest = text[text.rindex(")") + 2 :].split()
    # After the comm: state(3) ppid(4) ... utime(14) stime(15), so index field - 3.
    return int(rest[1]), (int(rest[11]) + int(rest[12])) / TICK


def cpu_seconds(pid: int) -> float:
    try:
        return parse_stat(Path(f"/proc/{pid}/stat").read_text())[1]
    except (OSError, ValueError, IndexError):
        return 0.0


def children_of(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                if parse_stat((d / "stat").read_text())[0] == pid:
                    out.append(int(d.name))
    return out


# -- what runs ------------------------------------------------------------------------------
@dataclass
class Env:
    procs: Processes
    tmp: Path
    nginx: str
    nginx_user: str | None
    profile_sets: dict[str, Path]  # "normal", "slow"
    repo: Path
    progress: Callable[[str], None] = lambda s: None
    payload: str = "tiny"


@dataclass
class Running:
    """A balancer ready for load: its URL, the pids of each role, and where its devices'
    batch counts are read (evenserve workers' ``/metrics``, reference devices' ``/stats``)."""

    url: str
    roles: dict[str, list[int]]
    device_urls: list[str] = field(default_factory=list)
    reference: bool = False

    def cpu(self) -> dict[str, float]:
        return {r: sum(cpu_seconds(p) for p in pids) for r, pids in self.roles.items()}

    def batches(self) -> dict[str, tuple[float, float]]:
        """Per model, (items, batches) run so far on the devices (summed)."""
        return batch_counts(self.device_urls, self.reference)


_BATCH_RE = re.compile(r'^evenserve_worker_batch_size_(sum|count)\{model="([^"]+)"\} (\S+)$')


def batch_counts(urls: Sequence[str], reference: bool) -> dict[str, tuple[float, float]]:
    """Per model, (items, batches) so far over ``urls`` (workers' histogram of batch sizes;
    the reference devices' own counts); empty when a device does not answer."""
    out: dict[str, list[float]] = {}
    for u in urls:
        try:
            if reference:
                for m, d in httpx.get(u + "/stats", timeout=5.0).json().items():
                    acc = out.setdefault(m, [0.0, 0.0])
                    acc[0] += d["items"]
                    acc[1] += d["batches"]
                continue
            text = httpx.get(u + "/metrics", timeout=5.0).text
        except (httpx.HTTPError, ValueError):
            return {}
        for line in text.splitlines():
            m = _BATCH_RE.match(line)
            if m:
                acc = out.setdefault(m.group(2), [0.0, 0.0])
                acc[0 if m.group(1) == "sum" else 1] += float(m.group(3))
    return {m: (v[0], v[1]) for m, v in out.items()}


def mean_batches(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
) -> dict[str, float]:
    """Per model, the mean batch size between two readings of ``batch_counts``."""
    out = {}
    for m, (items, batches) in after.items():
        i0, b0 = before.get(m, (0.0, 0.0))
        if batches > b0:
            out[m] = round((items - i0) / (batches - b0), 2)
    return out


class Devices:
    """Four device processes that each write their port to a file when they listen."""

    def __init__(self, env: Env, slow: bool) -> None:
        self.env, self.slow = env, slow
        self.children: list[Child] = []
        self.urls: list[str] = []

    def launch(self, name: str, cmd: Callable[[Path], list[str]]) -> None:
        """Start each device (``cmd(port_file)``), then wait until every one answers."""
        files = []
        for i in range(DEVICES):
            port_file = self.env.tmp / f"{name}{i}-{time.monotonic_ns()}.port"
            self.children.append(self.env.procs.start(f"{name}{i}", cmd(port_file), worker_env()))
            files.append(port_file)
        for port_file, c in zip(files, self.children, strict=True):
            url = f"http://127.0.0.1:{int(wait_file(port_file, c).strip())}"
            wait_ready(url, c)
            self.urls.append(url)

    @property
    def pids(self) -> list[int]:
        return [c.popen.pid for c in self.children]

    def stop(self) -> None:
        for c in self.children:
            with contextlib.suppress(ProcessLookupError):
                c.popen.send_signal(signal.SIGTERM)
        for c in self.children:
            self.env.procs.stop(c)


class Pool(Devices):
    """Four ``evenserve worker`` processes (the nginx and gateway arms share them)."""

    def __init__(self, env: Env, slow: bool, name: str = "w") -> None:
        super().__init__(env, slow)
        sets = env.profile_sets
        self.sets = [
            sets["slow" if slow and i == SLOW_DEVICE else "normal"] for i in range(DEVICES)
        ]
        it = iter(self.sets)

        def cmd(port_file: Path) -> list[str]:
            return [*EVENSERVE, "worker", "--repo", str(env.repo), "--device",
                    f"emulated:{next(it)}", "--port", "0", "--port-file", str(port_file),
                    *WORKER_FLAGS]  # fmt: skip

        self.launch(name, cmd)


class RefPool(Devices):
    """Four reference devices (bench/reference_device.py): what the ``ref`` arm's nginx
    fronts, with the same models, batch cap and window as the workers."""

    def __init__(self, env: Env, slow: bool) -> None:
        super().__init__(env, slow)
        inputs = {
            m: [{**t, "shape": [-1, *t["shape"]]} for t in model_inputs(m, env.payload)]
            for m in MODELS
        }
        model_args = [a for m, (f, b) in MODELS.items() for a in ("--model", f"{m}={f},{b}")]
        factors = iter(SLOW_FACTOR if slow and i == SLOW_DEVICE else 1.0 for i in range(DEVICES))

        def cmd(port_file: Path) -> list[str]:
            return [sys.executable, str(ROOT / "bench" / "reference_device.py"), "--port", "0",
                    "--port-file", str(port_file), "--max-batch", str(MAX_BATCH),
                    "--window-ms", str(WINDOW_MS), "--slowdown", str(next(factors)),
                    "--inputs", json.dumps(inputs), *model_args]  # fmt: skip

        self.launch("ref", cmd)


def worker_env() -> dict[str, str]:
    return {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"}


@contextlib.contextmanager
def nginx_arm(
    env: Env, upstreams: Sequence[str], worker_pids: list[int], reference: bool = False
) -> Iterator[Running]:
    port = free_port()
    d = Path(tempfile.mkdtemp(prefix=f"nginx-{port}-", dir=env.tmp))
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nofile = 16384 if hard == resource.RLIM_INFINITY else min(16384, hard)
    conf = nginx_conf(
        port, [u.removeprefix("http://") for u in upstreams], d, user=env.nginx_user,
        worker_connections=max(512, min(4096, nofile // 2 - 16)), rlimit_nofile=nofile,
    )  # fmt: skip
    (d / "nginx.conf").write_text(conf)
    cmd = [env.nginx, "-p", str(d), "-c", str(d / "nginx.conf")]
    if nginx_version(env.nginx) >= (1, 19, 5):
        cmd += ["-e", str(d / "error.log")]
    c = env.procs.start(f"nginx-{port}", cmd)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, c, 30.0)
        pids = [c.popen.pid, *children_of(c.popen.pid)]
        yield Running(url, {"balancer": pids, "workers": worker_pids}, list(upstreams), reference)
    finally:
        env.procs.stop(c)


@contextlib.contextmanager
def gateway_arm(
    env: Env, routing: str, backends: Sequence[tuple[str, str, Path]], models: Sequence[str],
    worker_pids: list[int],
) -> Iterator[Running]:  # fmt: skip
    port = free_port()
    cfg = Path(tempfile.mkdtemp(prefix=f"gateway-{port}-", dir=env.tmp)) / "cluster.yaml"
    cfg.write_text(yaml.safe_dump(gateway_cluster(port, routing, backends, models)))
    c = env.procs.start(f"gateway-{routing}-{port}", [*EVENSERVE, "gateway", "--config", str(cfg)])
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, c, 60.0)
        yield Running(
            url, {"balancer": [c.popen.pid], "workers": worker_pids}, [u for _, u, _ in backends]
        )
    finally:
        env.procs.stop(c)


@contextlib.contextmanager
def up_arm(env: Env, routing: str, slow: bool) -> Iterator[Running]:
    port = free_port()
    devices = []
    for i in range(DEVICES):
        pset = env.profile_sets["slow" if slow and i == SLOW_DEVICE else "normal"]
        devices.append((f"dev{i}", pset, free_port()))
    d = Path(tempfile.mkdtemp(prefix=f"up-{port}-", dir=env.tmp))
    cfg = d / "cluster.yaml"
    cfg.write_text(yaml.safe_dump(up_cluster(port, routing, env.repo, devices)))
    ready = d / "ready.json"
    logs = env.procs.log_dir / f"up-{routing}-{port}"
    cmd = [*EVENSERVE, "up", str(cfg), "--ready-file", str(ready), "--log-dir", str(logs)]
    c = env.procs.start(f"up-{routing}-{port}", cmd, worker_env())
    try:
        info = json.loads(wait_file(ready, c, 120.0))
        url = info["gateway"]["url"]
        wait_ready(url, c, 30.0)
        yield Running(url, {
            "balancer": [int(info["gateway"]["pid"])],
            "workers": [int(w["pid"]) for w in info["workers"]],
            "launcher": [c.popen.pid],
        }, [f"http://127.0.0.1:{p}" for _, _, p in devices])  # fmt: skip
    finally:
        env.procs.stop(c, timeout_s=30.0)


@contextlib.contextmanager
def direct_arm(url: str, worker_pids: list[int]) -> Iterator[Running]:
    yield Running(url, {"workers": worker_pids})


@contextlib.contextmanager
def hog(env: Env, fraction: float, taken: list[float]) -> Iterator[None]:
    """A CPU hog beside whatever runs inside; appends what it took (fraction of a core)."""
    if fraction <= 0:
        yield
        return
    c = env.procs.start("hog", [sys.executable, "-c", HOG_CODE, f"{fraction:g}"])
    try:
        time.sleep(0.5)
        cpu0, t0 = cpu_seconds(c.popen.pid), time.monotonic()
        yield
        taken.append((cpu_seconds(c.popen.pid) - cpu0) / (time.monotonic() - t0))
    finally:
        env.procs.stop(c, sig=signal.SIGKILL)


def nginx_version(path: str) -> tuple[int, ...]:
    out = subprocess.run([path, "-v"], capture_output=True, text=True, timeout=10)
    m = re.search(r"nginx/(\d+)\.(\d+)\.(\d+)", out.stderr + out.stdout)
    return tuple(int(x) for x in m.groups()) if m else (0, 0, 0)


def find_nginx(given: str | None) -> str | None:
    for cand in ([given] if given else []) + [shutil.which("nginx") or "", "/usr/sbin/nginx"]:
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return cand
    return None


# -- the run ----------------------------------------------------------------------------------
@dataclass
class Plan:
    scenarios: list[str]
    gw: list[str]
    up: list[str]
    rates: list[float]
    seconds: float
    warmup_s: float
    idle_s: float
    rounds: int
    hog: float
    p99_bound_ms: float
    seed: int
    realtime: bool
    payload: str = "tiny"
    #: The ``ref`` arm (nginx in front of reference devices) in the max-rate scenarios.
    ref: bool = True
    added_rates: list[float] = field(default_factory=lambda: list(ADDED_RATES))

    def arms(self) -> list[str]:
        return ["nginx", *(f"gw:{p}" for p in self.gw), *(f"up:{p}" for p in self.up)]

    def max_arms(self) -> list[str]:
        """The max-rate scenarios' arms: the reference devices' beside the others."""
        arms = self.arms()
        return [arms[0], REF_ARM, *arms[1:]] if self.ref else arms

    def run_count(self) -> int:
        n = 0
        for s in self.scenarios:
            if s == "added":
                n += 3 * self.rounds * len(self.added_rates)
            elif s == "idle":
                n += 2 + (1 if self.up else 0)
            elif s in ("max", "max-hog"):
                if s == "max-hog" and self.hog <= 0:
                    continue
                n += len(self.max_arms()) * len(self.rates)
            elif s == "p800-hog" and self.hog <= 0:
                continue
            else:
                n += len(self.arms())
        return n


class Bench:
    def __init__(self, env: Env, plan: Plan, console: Console, progress: Progress) -> None:
        self.env, self.plan, self.console, self.progress = env, plan, console, progress
        self.task = progress.add_task("starting", total=plan.run_count())
        self.pool: Pool | None = None
        self.refs: RefPool | None = None
        self.results: dict[str, Any] = {}
        self.runs: dict[str, dict[str, RunFigures]] = {}
        #: Max-rate scenario -> arm -> its steps, and -> arm -> its max sustained rate.
        self.steps: dict[str, dict[str, list[RunFigures]]] = {}
        self.max_rates: dict[str, dict[str, float]] = {}
        self.idle_pct: dict[str, float] = {}
        self.added: dict[str, Any] = {}
        self.flip = False

    # -- helpers ----------------------------------------------------------------------------
    def say(self, text: str) -> None:
        self.console.print(text, highlight=False, soft_wrap=True)

    def status(self, what: str) -> None:
        self.progress.update(self.task, description=what)

    def ordered(self, arms: list[str]) -> list[str]:
        self.flip = not self.flip
        return arms if self.flip else list(reversed(arms))

    def get_pool(self, slow: bool) -> Pool:
        if self.pool is not None and self.pool.slow != slow:
            self.pool.stop()
            self.pool = None
        if self.pool is None:
            self.status(f"starting 4 workers{' (device 3 slow)' if slow else ''}")
            self.pool = Pool(self.env, slow)
        return self.pool

    def get_refs(self, slow: bool) -> RefPool:
        if self.refs is not None and self.refs.slow != slow:
            self.refs.stop()
            self.refs = None
        if self.refs is None:
            self.status("starting 4 reference devices")
            self.refs = RefPool(self.env, slow)
        return self.refs

    def arm_cm(self, arm: str, slow: bool) -> contextlib.AbstractContextManager[Running]:
        if arm.startswith("up:"):
            return up_arm(self.env, arm[3:], slow)
        if arm == REF_ARM:
            refs = self.get_refs(slow)
            return nginx_arm(self.env, refs.urls, refs.pids, reference=True)
        pool = self.get_pool(slow)
        if arm == "nginx":
            return nginx_arm(self.env, pool.urls, pool.pids)
        backends = [(f"dev{i}", u, s) for i, (u, s) in enumerate(zip(pool.urls, pool.sets,
                                                                         strict=True))]  # fmt: skip
        return gateway_arm(self.env, arm[3:], backends, list(MODELS), pool.pids)

    def load(self, url: str, rate: float, mix: dict[str, float], what: str) -> LoadResult:
        p = self.plan
        spec = LoadSpec(
            target=url, mix=mix, duration_s=p.seconds, warmup_s=p.warmup_s, rate_rps=rate,
            seed=p.seed, timeout_s=5.0, drain_s=3.0, scrape={},
            encoding="json" if p.payload == "json" else "binary",
        )  # fmt: skip

        def show(st: LiveStats) -> None:
            fails = f" failed {st.failed}" if st.failed else ""
            self.status(
                f"{what}: {min(st.elapsed_s, p.seconds):.0f}/{p.seconds:g} s sent {st.sent} "
                f"ok {st.ok}{fails}" + (" (draining)" if st.draining else "")
            )

        result = run_load(spec, show, realtime=p.realtime)
        if result.aborted:
            raise HarnessError(f"{what}: {result.aborted}")
        return result

    def measured(
        self, running: Running, rate: float, mix: dict[str, float], scenario: str, arm: str,
        hog_f: float = 0.0,
    ) -> RunFigures:  # fmt: skip
        gateway = arm.startswith(("gw:", "up:"))
        b0 = running.batches()
        before = running.cpu()
        ej0 = ejections_of(running.url) if gateway else None
        result = self.load(running.url, rate, mix, f"{scenario} {arm} @ {rate:g}/s")
        after = running.cpu()
        cpu = {r: round(after[r] - before[r], 4) for r in before}
        f = figures_of(result, scenario, arm, cpu, hog_f)
        f.batch = mean_batches(b0, running.batches())
        if ej0 is not None:
            ej1 = ejections_of(running.url)
            f.ejections = None if ej1 is None else ej1 - ej0
        self.progress.advance(self.task)
        errs = ", ".join(f"{k} {v}" for k, v in f.errors.items()) or "0 errors"
        if f.ejections:
            errs += f", {f.ejections} ejections"
        cpu_b = f.cpu_us_per_request("balancer")
        batch = " ".join(f"{m.split('-')[0]} {b:.2f}" for m, b in sorted(f.batch.items()))
        self.say(
            f"  {scenario:8s} {arm:24s} {rate:6g}/s  achieved {f.achieved_rps:7.1f}  "
            f"P50 {fmt(f.p50_ms):>7s}  P99 {fmt(f.p99_ms):>7s} ms  {errs}"
            + (f"  balancer {cpu_b:.0f} us/req" if cpu_b is not None else "")
            + (f"  mean batch {batch}" if batch else "")
        )
        return f

    # -- scenarios --------------------------------------------------------------------------
    def scenario_load(self, name: str) -> None:
        rate, slow, with_hog = LOAD_SCENARIOS[name]
        hog_f = self.plan.hog if with_hog else 0.0
        if with_hog and hog_f <= 0:
            return
        out: dict[str, RunFigures] = {}
        taken: list[float] = []
        with hog(self.env, hog_f, taken):
            for arm in self.ordered(self.plan.arms()):
                with self.arm_cm(arm, slow) as running:
                    out[arm] = self.measured(running, rate, MIX, name, arm, hog_f)
        if taken:
            self.results.setdefault("hog_taken_cores", {})[name] = round(taken[0], 3)
            self.say(f"  the hog took {taken[0]:.2f} of a core over the scenario (asked {hog_f:g})")
        self.runs[name] = {a: out[a] for a in self.plan.arms()}

    def scenario_max(self, name: str) -> None:
        """The rate stepped up (``max``; ``max-hog`` with the hog beside every run), the
        reference devices' arm beside the others."""
        hog_f = self.plan.hog if name == "max-hog" else 0.0
        if name == "max-hog" and hog_f <= 0:
            return
        arms = self.plan.max_arms()
        alive = list(arms)
        steps: dict[str, list[RunFigures]] = {a: [] for a in arms}
        self.steps[name] = steps  # filled in place: a partial run still shows its steps
        rates = self.max_rates.setdefault(name, {})
        taken: list[float] = []
        with hog(self.env, hog_f, taken):
            for rate in self.plan.rates:
                now = [a for a in arms if a in alive]
                self.progress.advance(self.task, len(arms) - len(now))  # not run at this step
                for arm in self.ordered(now):
                    with self.arm_cm(arm, False) as running:
                        f = self.measured(running, rate, MIX, name, arm, hog_f)
                    steps[arm].append(f)
                    rates[arm] = max_sustained(steps[arm], self.plan.p99_bound_ms)
                    if not sustained(f, self.plan.p99_bound_ms):
                        alive.remove(arm)
        if taken:
            self.results.setdefault("hog_taken_cores", {})[name] = round(taken[0], 3)
            self.say(f"  the hog took {taken[0]:.2f} of a core over the scenario (asked {hog_f:g})")

    def scenario_idle(self) -> None:
        arms = ["nginx", "gw:queue-aware"] + (["up:queue-aware"] if self.plan.up else [])
        out: dict[str, Any] = {}
        for arm in self.ordered(arms):
            with self.arm_cm(arm, False) as running:
                self.status(f"idle {arm}: {self.plan.idle_s:g} s")
                time.sleep(1.0)
                before, t0 = running.cpu(), time.monotonic()
                time.sleep(self.plan.idle_s)
                after, wall = running.cpu(), time.monotonic() - t0
            pct = {r: round((after[r] - before[r]) / wall * 100.0, 3) for r in before}
            out[arm] = pct
            self.idle_pct[arm] = pct["balancer"]
            self.progress.advance(self.task)
            self.say(f"  idle     {arm:24s} CPU % of a core: "
                     + ", ".join(f"{r} {v:.2f}" for r, v in pct.items()))  # fmt: skip
        self.results["idle_cpu_pct"] = {a: out[a] for a in arms}
        self.idle_pct = {a: self.idle_pct[a] for a in arms}

    def scenario_added(self) -> None:
        """One zero-cost backend, each rate of ``added_rates``: direct, through the gateway
        and through nginx, interleaved ``rounds`` times. Per rate: the median P50 of each,
        what each balancer adds to the direct P50, and each balancer's CPU per request (the
        median over rounds)."""
        env, p = self.env, self.plan
        repo, pset = write_zero(env.tmp, p.payload)
        port_file = env.tmp / "zero.port"
        cmd = [*EVENSERVE, "worker", "--repo", str(repo), "--device", f"emulated:{pset}",
               "--port", "0", "--port-file", str(port_file), *WORKER_FLAGS]  # fmt: skip
        c = env.procs.start("zero-worker", cmd, worker_env())
        by_rate: dict[float, dict[str, list[RunFigures]]] = {}
        try:
            url = f"http://127.0.0.1:{int(wait_file(port_file, c).strip())}"
            wait_ready(url, c)
            pids = [c.popen.pid]
            mix = {ZERO_MODEL: 1.0}
            for rate in p.added_rates:
                lat = by_rate[rate] = {"direct": [], "gateway": [], "nginx": []}
                for _ in range(p.rounds):
                    for arm in self.ordered(list(lat)):
                        cm: contextlib.AbstractContextManager[Running]
                        if arm == "direct":
                            cm = direct_arm(url, pids)
                        elif arm == "nginx":
                            cm = nginx_arm(env, [url], pids)
                        else:
                            cm = gateway_arm(env, "queue-aware", [("zero0", url, pset)],
                                             [ZERO_MODEL], pids)  # fmt: skip
                        with cm as running:
                            lat[arm].append(self.measured(running, rate, mix, "added", arm))
        finally:
            env.procs.stop(c)
        self.added = added_summary(by_rate)
        self._added_runs = [f for lat in by_rate.values() for fs in lat.values() for f in fs]

    def run(self) -> None:
        for s in self.plan.scenarios:
            self.say(f"[bold]{s}[/]")
            if s == "added":
                self.scenario_added()
            elif s == "idle":
                self.scenario_idle()
            elif s in ("max", "max-hog"):
                self.scenario_max(s)
            else:
                self.scenario_load(s)
        if self.pool is not None:
            self.pool.stop()
            self.pool = None
        if self.refs is not None:
            self.refs.stop()
            self.refs = None
        self.status("done")

    # -- output -----------------------------------------------------------------------------
    def max_rates_in_order(self) -> dict[str, dict[str, float]]:
        """Scenario -> arm -> max sustained rate, in the plan's arm order (the runs alternate
        their order)."""
        arms = self.plan.max_arms()
        return {
            scen: {a: rates[a] for a in arms if a in rates}
            for scen, rates in self.max_rates.items()
        }

    def print_tables(self) -> list[TargetRow]:
        for name, runs in self.runs.items():
            rate, slow, with_hog = LOAD_SCENARIOS[name]
            what = ("device 3 2.5x slower" if slow else "") + (
                f"CPU hog {self.plan.hog:g} of a core" if with_hog else "")  # fmt: skip
            self.console.print(runs_table(f"{name}: {rate:g} req/s" + (f", {what}" if what
                                          else ""), list(runs.values())))  # fmt: skip
        if self.added:
            t = runs_table("added: zero-cost model, one backend",
                           getattr(self, "_added_runs", []))  # fmt: skip
            self.console.print(t)
            for key, fig in self.added.items():
                pa, ad = fig["p50_ms"], fig["added_p50_ms"]
                cpu = fig["cpu_us_per_request"]
                self.say(f"  {key} req/s, P50 (median over rounds): direct "
                         f"{fmt(pa['direct'], 3)} ms, gateway {fmt(pa['gateway'], 3)} ms "
                         f"(+{fmt(ad['gateway'], 3)}), nginx {fmt(pa['nginx'], 3)} ms "
                         f"(+{fmt(ad['nginx'], 3)}); CPU per request: gateway "
                         f"{fmt(cpu['gateway'], 1)} us, nginx "
                         f"{fmt(cpu['nginx'], 1)} us")  # fmt: skip
        for scen, steps_by_arm in self.steps.items():
            t = Table(title=f"{scen}: max sustained rate (achieved >= {ACHIEVED_FRACTION:g}x "
                      f"offered, 0 errors, P99 <= {self.plan.p99_bound_ms:g} ms); each cell: "
                      "P99 ms / mean ResNet-like batch")  # fmt: skip
            t.add_column("arm", no_wrap=True)
            for r in self.plan.rates:
                t.add_column(f"{r:g}/s", justify="right", no_wrap=True)
            t.add_column("max req/s", justify="right", no_wrap=True)
            for arm, steps in steps_by_arm.items():
                by = {f.rate_rps: f for f in steps}
                cells = []
                for r in self.plan.rates:
                    f = by.get(r)
                    if f is None:
                        cells.append("-")
                        continue
                    ok = sustained(f, self.plan.p99_bound_ms)
                    cell = fmt(f.p99_ms, 1) + ("" if not f.error_count else f" e{f.error_count}")
                    b = f.batch.get("resnet-like")
                    cell += "" if b is None else f" / {b:.2f}"
                    cells.append(cell if ok else f"[red]{cell}[/]")
                m = self.max_rates.get(scen, {}).get(arm)
                t.add_row(arm, *cells, "-" if m is None else f"{m:g}")
            self.console.print(t)
        rows = build_targets(
            self.runs, self.max_rates_in_order(), self.idle_pct, self.added,
            [f for arms in self.steps.values() for fs in arms.values() for f in fs],
        )  # fmt: skip
        if rows:
            self.console.print(targets_table(rows))
        return rows

    def to_json(self, rows: list[TargetRow]) -> dict[str, Any]:
        return {
            "runs": {s: {a: f.to_json() for a, f in r.items()} for s, r in self.runs.items()},
            "max_rate": {
                "rule": f"achieved >= {ACHIEVED_FRACTION}x offered, 0 errors, "
                f"P99 <= {self.plan.p99_bound_ms} ms",
                "max_sustained_rps": self.max_rates_in_order(),
                "steps": {
                    scen: {a: [f.to_json() for f in fs] for a, fs in arms.items()}
                    for scen, arms in self.steps.items()
                },
            },
            "idle_cpu_pct": self.results.get("idle_cpu_pct", {}),
            "hog_taken_cores": self.results.get("hog_taken_cores", {}),
            "added_latency": self.added,
            "targets": [asdict(r) for r in rows],
        }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=None, help="per run (default 10; quick 5)")
    ap.add_argument("--warmup", type=float, default=None, help="s left out (default 1)")
    ap.add_argument("--quick", action="store_true", help="fewer policies and rates, 5 s runs")
    ap.add_argument(
        "--only", default=None, help=f"scenarios, comma-separated: {','.join(SCENARIOS)}"
    )
    ap.add_argument("--policies", default=None, help="gateway arms' policies (comma-separated)")
    ap.add_argument("--up-policies", default=None, help="`evenserve up` arms' policies ('' none)")
    ap.add_argument("--rates", default=None, help="max-rate steps, req/s (comma-separated)")
    ap.add_argument("--hog", type=float, default=0.5, help="CPU hog, fraction of a core (0: off)")
    ap.add_argument("--p99-bound-ms", type=float, default=250.0, help="max-rate rule's P99 bound")
    ap.add_argument("--idle-seconds", type=float, default=None, help="default 10; quick 5")
    ap.add_argument("--rounds", type=int, default=None, help="added-latency rounds (2; quick 1)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--nginx", default=None, help="nginx binary (default: PATH, /usr/sbin/nginx)")
    ap.add_argument(
        "--realtime",
        action="store_true",
        help="load generator at real-time priority (default: normal, as a user's client runs)",
    )
    ap.add_argument(
        "--payload", choices=PAYLOADS, default="tiny",
        help="request bodies: tiny tensors, or ResNet-50/BERT-base inputs of real size as json "
        "or binary (default tiny)",
    )  # fmt: skip
    ap.add_argument("--no-ref", action="store_true", help="no reference devices' arm in max")
    ap.add_argument(
        "--added-rates", default=None,
        help="the added scenario's rates, req/s (default "
        + ",".join(f"{r:g}" for r in ADDED_RATES) + ")",
    )  # fmt: skip
    ap.add_argument("--logs", type=Path, default=None, help="keep process logs in this folder")
    ap.add_argument("--json", type=Path, default=None, help="write every figure here")
    return ap.parse_args(argv)


def make_plan(args: argparse.Namespace) -> Plan:
    def names(text: str | None, default: list[str]) -> list[str]:
        return default if text is None else [x.strip() for x in text.split(",") if x.strip()]

    q = args.quick
    scen = names(args.only, SCENARIOS)
    bad = [s for s in scen if s not in SCENARIOS]
    if bad:
        raise SystemExit(f"--only: unknown scenario(s) {', '.join(bad)} ({', '.join(SCENARIOS)})")
    rates = [float(r) for r in names(args.rates, [f"{r:g}" for r in (QUICK_RATES if q else RATES)])]
    seconds = args.seconds if args.seconds is not None else (5.0 if q else 10.0)
    warmup = args.warmup if args.warmup is not None else min(1.0, seconds / 4)
    if not 0 <= warmup < seconds:
        raise SystemExit("--warmup must be >= 0 and below --seconds")
    return Plan(
        scenarios=[s for s in SCENARIOS if s in scen],
        gw=names(args.policies, QUICK_GW if q else GW_POLICIES),
        up=names(args.up_policies, QUICK_UP if q else UP_POLICIES),
        rates=sorted(rates),
        seconds=seconds,
        warmup_s=warmup,
        idle_s=args.idle_seconds if args.idle_seconds is not None else (5.0 if q else 10.0),
        rounds=args.rounds if args.rounds is not None else (1 if q else 2),
        hog=args.hog,
        p99_bound_ms=args.p99_bound_ms,
        seed=args.seed,
        realtime=args.realtime,
        payload=args.payload,
        ref=not args.no_ref,
        added_rates=[float(r) for r in names(args.added_rates, [f"{r:g}" for r in ADDED_RATES])],
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    plan = make_plan(args)
    console = Console(width=max(170, shutil.get_terminal_size((170, 40)).columns))
    nginx = find_nginx(args.nginx)
    if nginx is None:
        console.print(
            "nginx not found (--nginx PATH, `nginx` on PATH, /usr/sbin/nginx). Install it, e.g. "
            "on Debian/Ubuntu: sudo apt-get install -y nginx-light (or nginx); this script "
            "installs nothing.",
            style="red", highlight=False,
        )  # fmt: skip
        return 2
    from evenserve.policy.routing import ROUTING

    known = set(ROUTING.names())
    for p in plan.gw + plan.up:
        if p not in known:
            raise SystemExit(f"unknown routing policy {p!r} (see `evenserve policies`)")

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    wall0 = time.monotonic()
    load0 = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="evenserve-vs-nginx-"))
    try:
        return run_all(args, plan, console, nginx, tmp, wall0, load0)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_all(
    args: argparse.Namespace, plan: Plan, console: Console, nginx: str, tmp: Path,
    wall0: float, load0: tuple[float, float, float],
) -> int:  # fmt: skip
    """Everything after the checks: set up, run, print, write the JSON; the exit status."""
    log_dir = args.logs or tmp / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    procs = Processes(log_dir)
    env = Env(
        procs=procs,
        tmp=tmp,
        nginx=nginx,
        nginx_user="root" if os.geteuid() == 0 else None,
        profile_sets={
            "normal": write_profile_set(tmp / "profiles" / "normal", 1.0),
            "slow": write_profile_set(tmp / "profiles" / "slow", SLOW_FACTOR),
        },
        repo=write_repo(tmp / "repo", list(MODELS), payload=plan.payload),
        payload=plan.payload,
    )
    console.print(
        f"evenserve vs nginx ({nginx}, {'.'.join(map(str, nginx_version(nginx)))}): "
        f"{', '.join(plan.scenarios)}; arms {', '.join(plan.arms())}; {plan.seconds:g} s per run "
        f"(warm-up {plan.warmup_s:g} s); max-rate steps {', '.join(f'{r:g}' for r in plan.rates)}"
        f"; hog {plan.hog:g}; payload {plan.payload}; load generator at "
        f"{'real-time' if plan.realtime else 'normal (a user client)'} priority; "
        f"{os.cpu_count()} CPUs, load average "
        f"{' '.join(f'{x:.2f}' for x in load0)}",
        highlight=False,
    )
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(), console=console, refresh_per_second=2,
    )  # fmt: skip
    code = 0
    bench: Bench | None = None
    try:
        with progress:
            bench = Bench(env, plan, console, progress)
            bench.run()
    except KeyboardInterrupt:
        console.print("interrupted: stopping every process started here", style="yellow")
        code = 130
    except HarnessError as exc:
        console.print(f"harness error: {exc}", style="red", highlight=False, markup=False)
        code = 1
    except Exception:
        console.print_exception()
        console.print("harness error (above)", style="red")
        code = 1
    finally:
        procs.stop_all()
    wall = time.monotonic() - wall0
    if bench is not None:
        if code:
            console.print("[yellow]partial results: the run did not finish[/]")
        rows = bench.print_tables()
        load1 = os.getloadavg()
        console.print(
            f"wall time {wall / 60:.1f} min; load average before {load0[0]:.2f}, after "
            f"{load1[0]:.2f} (1 min); {os.cpu_count()} CPUs. PASS/FAIL are measurements on this "
            "host, not the exit status.",
            highlight=False,
        )
        if args.json:
            doc = {
                "host": {
                    "cpus": os.cpu_count(),
                    "load_average_before": load0,
                    "load_average_after": load1,
                },
                "nginx": {"path": nginx, "version": ".".join(map(str, nginx_version(nginx)))},
                "plan": asdict(plan),
                "setup": {
                    "models": {
                        m: {"fixed_ms": a, "per_item_ms": b} for m, (a, b) in MODELS.items()
                    },
                    "mix": MIX,
                    "max_batch": MAX_BATCH,
                    "window_ms": WINDOW_MS,
                    "devices": DEVICES,
                    "slow_device": SLOW_DEVICE,
                    "slow_factor": SLOW_FACTOR,
                },
                **bench.to_json(rows),
                "complete": code == 0,
                "wall_s": round(wall, 1),
            }
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(doc, indent=2) + "\n")
            console.print(f"wrote {args.json}", highlight=False)
    return code


if __name__ == "__main__":
    sys.exit(main())
