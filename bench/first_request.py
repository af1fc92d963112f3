"""The first request of each batch size against the steady ones: what the worker's warm-up
(``--warmup``) takes away.

A real ``evenserve worker`` starts as a subprocess (CPU, loopback, a free port) on one model
of ``--repo`` with ``--warmup`` and any ``--worker-arg`` values; once /v2/health/ready
answers 200, for each batch size b (1..max_batch_size, or ``--batch-sizes``) this process
sends ONE request of b items (one request of b items forms one batch of b), timed on the
client's wall clock, then ``--steady`` identical ones. Requests are sent one at a time, so
every batch runs alone. Per batch size: the first request's ms, the steady median ms and
their ratio; ``--check`` exits 1 when a ratio is above ``--max-ratio`` (2.0: no first
request of a batch size more than twice a steady one). Bodies carry synthetic inputs
following model.yaml (example_shape, synthetic ranges) with the KServe binary tensor
extension, so an image batch's time is the model's, not JSON's.

    python bench/first_request.py [--repo examples/models/tiny] [--model tiny-bert]
        [--warmup all] [--worker-arg=--cpu-threads --worker-arg=1] [--steady 5]
        [--batch-sizes 1,2,4] [--json PATH] [--check] [--variant compile] [--starts 2]

``--variant NAME`` serves a copy of the model as one torch variant (a variant.yaml in the
copy: ``compile`` is the case warm-up is for, each new shape a recompile); ``--starts 2``
starts the worker twice on that copy, the second time with the compiled kernels in the
folder's inductor cache.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml
from rich.console import Console
from rich.table import Table

from evenserve.core.wire import HEADER_LENGTH_HEADER
from evenserve.worker.optimize.build import torch_variant
from evenserve.worker.repository import VARIANT_FILE, ModelEntry, load_model, load_repository
from evenserve.worker.warmup import warmup_batch

ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
#: The issue's target: no first request of a batch size more than this times a steady one.
MAX_RATIO = 2.0


@dataclass
class Row:
    """One batch size: its first request, the steady ones after it, their ratio."""

    batch: int
    first_ms: float
    steady_ms: list[float]

    @property
    def steady_median_ms(self) -> float:
        return statistics.median(self.steady_ms) if self.steady_ms else float("nan")

    @property
    def ratio(self) -> float:
        m = self.steady_median_ms
        return self.first_ms / m if m > 0 else float("nan")

    def figures(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "steady_median_ms": self.steady_median_ms,
            "ratio": self.ratio,
        }


def over(rows: list[Row], max_ratio: float = MAX_RATIO) -> list[Row]:
    """The batch sizes whose first request took more than ``max_ratio`` times a steady one
    (a ratio that cannot be computed counts as over: nothing steady to compare with)."""
    return [r for r in rows if not r.ratio <= max_ratio]


def check_status(rows: list[Row], max_ratio: float = MAX_RATIO) -> int:
    """``--check``'s exit status: 1 when a batch size is over the target, else 0."""
    return 1 if over(rows, max_ratio) else 0


def parse_sizes(text: str | None, max_batch_size: int) -> list[int]:
    """``--batch-sizes`` (a comma list; None: 1..max_batch_size), ascending, each in
    1..max_batch_size (SystemExit naming the flag otherwise)."""
    if text is None:
        return list(range(1, max_batch_size + 1))
    try:
        sizes = sorted({int(p) for p in text.split(",") if p.strip()})
    except ValueError:
        raise SystemExit(f"--batch-sizes: expected integers like 1,2,4 (got {text!r})") from None
    if not sizes or sizes[0] < 1 or sizes[-1] > max_batch_size:
        raise SystemExit(f"--batch-sizes: give sizes in 1..{max_batch_size} (got {text!r})")
    return sizes


def request_body(entry: ModelEntry, batch: int, seed: int = 7) -> dict[str, Any]:
    """A KServe v2 JSON body of ``batch`` synthetic items."""
    arrays = warmup_batch(entry, batch, np.random.default_rng(seed))
    return {
        "inputs": [
            {
                "name": t.name,
                "datatype": t.datatype,
                "shape": list(arrays[t.name].shape),
                "data": arrays[t.name].reshape(-1).tolist(),
            }
            for t in entry.config.inputs
        ]
    }


def binary_body(entry: ModelEntry, batch: int, seed: int = 7) -> tuple[bytes, dict[str, str]]:
    """The same items with the binary tensor extension (a JSON header, then the raw bytes):
    neither side spends the request formatting or parsing floats as text, so the time is
    the model's, not JSON's (an image batch is millions of numbers). Outputs come as JSON."""
    arrays = warmup_batch(entry, batch, np.random.default_rng(seed))
    raw = [np.ascontiguousarray(arrays[t.name]).tobytes() for t in entry.config.inputs]
    header = {
        "inputs": [
            {
                "name": t.name,
                "datatype": t.datatype,
                "shape": list(arrays[t.name].shape),
                "parameters": {"binary_data_size": len(data)},
            }
            for t, data in zip(entry.config.inputs, raw, strict=True)
        ]
    }
    head = json.dumps(header).encode()
    headers = {HEADER_LENGTH_HEADER: str(len(head)), "Content-Type": "application/octet-stream"}
    return head + b"".join(raw), headers


def start_worker(
    repo: Path, model: str, warmup: str, extra: list[str], tmp: Path, timeout_s: float
) -> tuple[subprocess.Popen[bytes], str, float]:
    """The worker subprocess, its URL and the seconds until it was ready."""
    port_file = tmp / "port"
    log_path = tmp / "worker.log"
    cmd = [
        sys.executable, "-m", "evenserve", "worker", "--repo", str(repo), "--models", model,
        "--device", "cpu", "--host", HOST, "--port", "0", "--port-file", str(port_file),
        "--warmup", warmup, "--log-level", "info", *extra,
    ]  # fmt: skip
    with log_path.open("ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            raise SystemExit(f"worker exited:\n{log_path.read_text()[-3000:]}")
        text = port_file.read_text().strip() if port_file.exists() else ""
        if text:
            url = f"http://{HOST}:{text}"
            try:
                if httpx.get(url + "/v2/health/ready", timeout=2).status_code == 200:
                    return proc, url, time.monotonic() - t0
            except httpx.TransportError:
                pass
        time.sleep(0.05)
    stop_worker(proc)
    raise SystemExit(f"worker not ready after {timeout_s:g} s:\n{log_path.read_text()[-3000:]}")


def stop_worker(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def timed(client: httpx.Client, path: str, body: tuple[bytes, dict[str, str]], batch: int) -> float:
    """One request's client-side wall time, ms; SystemExit when it is not a batch of
    ``batch`` answered."""
    t0 = time.perf_counter()
    r = client.post(path, content=body[0], headers=body[1])
    ms = (time.perf_counter() - t0) * 1000.0
    if r.status_code != 200:
        raise SystemExit(f"batch {batch}: HTTP {r.status_code}: {r.text[:500]}")
    shape = r.json()["outputs"][0]["shape"]
    if shape[0] != batch:
        raise SystemExit(f"batch {batch}: the answer's shape is {shape}")
    return ms


def measure(
    url: str, entry: ModelEntry, sizes: list[int], steady: int, timeout_s: float
) -> list[Row]:
    rows: list[Row] = []
    path = f"/v2/models/{entry.name}/infer"
    bodies = {b: binary_body(entry, b) for b in sizes}
    with httpx.Client(base_url=url, timeout=timeout_s) as client:
        client.get("/v2/health/ready")  # the connection is open before the first request
        # A body the worker refuses (400, no batch runs): this client's first POST (httpx
        # builds its first request body) is not counted against the first batch.
        client.post(path, content=b"{}", headers={"Content-Type": "application/json"})
        for b in sizes:
            first = timed(client, path, bodies[b], b)
            rows.append(Row(b, first, [timed(client, path, bodies[b], b) for _ in range(steady)]))
    return rows


def worker_load_info(url: str, model: str) -> dict[str, Any]:
    stats = httpx.get(f"{url}/v2/models/{model}/stats", timeout=10).json()
    load: dict[str, Any] = stats["model_stats"][0].get("evenserve_load", {})
    return load


def variant_copy(repo: Path, model: str, variant: str, into: Path) -> Path:
    """A repository holding a copy of ``model`` served as the torch ``variant``."""
    (entry,) = load_repository(repo, [model], check_profiles=False)
    folder = Path(shutil.copytree(entry.directory, into / model))
    doc = torch_variant(load_model(folder, False, {"use_variant": False}), variant)
    if entry.config.profile is not None:  # a relative path would not resolve from the copy
        doc["profile"] = str((entry.directory / entry.config.profile).resolve())
    (folder / VARIANT_FILE).write_text(yaml.safe_dump(doc, sort_keys=False))
    return into


def _start_figures(ready_s: float, load_info: dict[str, Any], rows: list[Row]) -> dict[str, Any]:
    return {
        "ready_s": round(ready_s, 2),
        "warmup_seconds": load_info.get("warmup_seconds"),
        "warmup_first_ms": load_info.get("warmup_first_ms"),
        "worst_ratio": round(max(r.ratio for r in rows), 3),
    }


def table(rows: list[Row], title: str, max_ratio: float) -> Table:
    t = Table(title=title, title_justify="left")
    for col in ("batch", "first ms", "steady median ms", "first / steady"):
        t.add_column(col, justify="right")
    for r in rows:
        mark = "" if r.ratio <= max_ratio else " [red]over[/]"
        t.add_row(
            str(r.batch), f"{r.first_ms:.2f}", f"{r.steady_median_ms:.2f}", f"{r.ratio:.2f}{mark}"
        )
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repo", type=Path, default=ROOT / "examples" / "models" / "tiny")
    ap.add_argument("--model", default="tiny-bert")
    ap.add_argument("--warmup", default="all", help="the worker's --warmup")
    ap.add_argument(
        "--worker-arg",
        action="append",
        default=[],
        help="one more worker CLI argument (repeatable): --worker-arg=--cpu-threads --worker-arg=1",
    )
    ap.add_argument("--batch-sizes", default=None, help="comma list (default 1..max)")
    ap.add_argument("--steady", type=int, default=5, help="identical requests after the first")
    ap.add_argument("--max-ratio", type=float, default=MAX_RATIO, help="--check's bound")
    ap.add_argument("--check", action="store_true", help="exit 1 when a ratio is over")
    ap.add_argument("--timeout-s", type=float, default=300.0, help="startup and request bound")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    ap.add_argument(
        "--variant",
        default=None,
        help="serve a copy of the model as this torch variant (compile, int8-dynamic, bf16...: "
        "a variant.yaml written into the copy)",
    )
    ap.add_argument(
        "--starts",
        type=int,
        default=1,
        help="start the worker this many times on the same folder (a compiled variant's "
        "inductor cache, in the folder, is cold on the first start only)",
    )
    args = ap.parse_args()
    if args.steady < 1:
        raise SystemExit("--steady: must be >= 1")
    if args.starts < 1:
        raise SystemExit("--starts: must be >= 1")
    with tempfile.TemporaryDirectory() as tmp:
        repo = args.repo
        if args.variant is not None:
            repo = variant_copy(args.repo, args.model, args.variant, Path(tmp) / "repo")
        (entry,) = load_repository(repo, [args.model], check_profiles=False)
        sizes = parse_sizes(args.batch_sizes, entry.config.max_batch_size)
        starts = []
        for start in range(args.starts):
            load_before = os.getloadavg()
            proc, url, ready_s = start_worker(
                repo, args.model, args.warmup, args.worker_arg, Path(tmp), args.timeout_s
            )
            try:
                rows = measure(url, entry, sizes, args.steady, args.timeout_s)
                load_info = worker_load_info(url, args.model)
            finally:
                stop_worker(proc)
            load_after = os.getloadavg()
            if start + 1 < args.starts:
                starts.append(_start_figures(ready_s, load_info, rows))
                print(
                    f"start {start + 1}: ready in {ready_s:.1f} s (warm-up "
                    f"{load_info.get('warmup_seconds', 0.0):.1f} s); worst first/steady "
                    f"{max(r.ratio for r in rows):.2f}"
                )
        starts.append(_start_figures(ready_s, load_info, rows))
    print(
        f"{args.model}: worker args --warmup {args.warmup} {' '.join(args.worker_arg)}; ready "
        f"in {ready_s:.1f} s (its warm-up {load_info.get('warmup_seconds', 0.0):.3f} s); "
        f"load average {load_before[0]:.2f} -> {load_after[0]:.2f} on {os.cpu_count()} CPUs"
    )
    title = f"{args.model}, --warmup {args.warmup}: first request per batch size"
    Console(width=120).print(table(rows, title, args.max_ratio))
    bad = over(rows, args.max_ratio)
    worst = max(rows, key=lambda r: r.ratio if r.ratio == r.ratio else float("inf"))
    print(
        f"worst first/steady ratio {worst.ratio:.2f} at batch {worst.batch}; "
        f"{len(bad)} of {len(rows)} batch size(s) over {args.max_ratio:g}"
    )
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "model": args.model,
                    "repo": str(args.repo),
                    "warmup": args.warmup,
                    "worker_args": args.worker_arg,
                    "steady": args.steady,
                    "max_ratio": args.max_ratio,
                    "worker_ready_s": ready_s,
                    "load_average": {"before": load_before, "after": load_after},
                    "cpu_count": os.cpu_count(),
                    "worker_load_info": load_info,
                    "variant": args.variant,
                    "starts": starts,
                    "rows": [r.figures() for r in rows],
                    "over": [r.batch for r in bad],
                },
                indent=2,
            )
            + "\n"
        )
    if args.check:
        sys.exit(check_status(rows, args.max_ratio))


if __name__ == "__main__":
    main()
