"""The seed cluster under requests of real size: ResNet-50 and BERT-base inputs as JSON and as
binary tensors, through ``evenserve up examples/cluster-seed.yaml``.

    .venv/bin/python bench/seed_real_payloads.py                     # 100 req/s, 15 s each
    .venv/bin/python bench/seed_real_payloads.py --rate 100 --seconds 15 --encodings json
    .venv/bin/python bench/seed_real_payloads.py --json out/seed-real.json

``evenserve up`` runs on a copy of the cluster file with its ports moved to free ones (the
four emulated A10 workers and the gateway, queue-aware routing, everything else as the file
has it). The load is evenserve's own generator (``evenserve bench``'s), open loop, Poisson at
``--rate`` req/s, ResNet-50 70 % / BERT-base 30 %, for ``--seconds`` after ``--warmup``
seconds, at normal priority (as a user's client runs). Bodies are made from each model's
metadata: ``json`` is a whole JSON request, each tensor a flat list of numbers as tritonclient
writes it with binary data off (a [1, 3, 224, 224] FP32 image is about 3 MB; its values are
uniform in [0, 1), so about 1 % of them are written with fractions of 19-20 digits); ``binary``
is the binary tensor extension (602 KB for the image). Each encoding is one run on the same
cluster, one after the other.

Per run: requests sent, answered by status, P50/P99 latency (from the intended send time),
achieved rate, the gateway's backend ejections during the run (its
``evenserve_gateway_backend_ejections_total``, summed), CPU seconds of the gateway and of
the workers over the run, and the host's load average. The must-show: every request 200 and
no backend ejected at 100 req/s of JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml
from rich.console import Console
from rich.table import Table

from evenserve.loadgen.runner import run_load
from evenserve.loadgen.spec import LoadSpec

ROOT = Path(__file__).resolve().parents[1]
EVENSERVE = [sys.executable, "-c", "from evenserve.cli.main import main; main()"]
MIX = {"resnet50": 0.7, "bert-base": 0.3}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_s(pid: int) -> float:
    """utime + stime of one process, seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ejections(url: str) -> int:
    text = httpx.get(url + "/metrics", timeout=10.0).text
    return int(
        sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("evenserve_gateway_backend_ejections_total{")
        )
    )


def start_cluster(cluster: Path, tmp: Path) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    raw = yaml.safe_load(cluster.read_text())
    raw["gateway"]["port"] = free_port()
    raw["gateway"]["admin"] = {"token": "bench-" + os.urandom(9).hex()}
    w = raw["workers"]
    w["repo"] = str((cluster.parent / w["repo"]).resolve())
    for d in w["devices"]:
        d["port"] = free_port()
        dev = d["device"]
        if dev.startswith("emulated:") and not Path(dev.split(":", 1)[1]).is_absolute():
            d["device"] = f"emulated:{(ROOT / 'profiles' / dev.split(':', 1)[1]).resolve()}"
    cfg = tmp / "cluster.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    ready = tmp / "ready.json"
    up = subprocess.Popen(
        [*EVENSERVE, "up", str(cfg), "--log-dir", str(tmp / "logs"), "--ready-file", str(ready)],
        cwd=ROOT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while not ready.exists():
        if up.poll() is not None or time.monotonic() > deadline:
            up.kill()
            raise SystemExit(f"evenserve up did not get ready (exit code {up.poll()})")
        time.sleep(0.2)
    time.sleep(0.3)
    return up, json.loads(ready.read_text())


def one_run(
    url: str, pids: dict[str, int], encoding: str, args: argparse.Namespace
) -> dict[str, Any]:
    spec = LoadSpec(
        target=url, mix=dict(MIX), duration_s=args.warmup + args.seconds, warmup_s=args.warmup,
        rate_rps=args.rate, seed=args.seed, timeout_s=10.0, drain_s=5.0, encoding=encoding,
    )  # fmt: skip
    ej0 = ejections(url)
    cpu0 = {k: cpu_s(p) for k, p in pids.items()}
    result = run_load(spec, realtime=False)
    cpu1 = {k: cpu_s(p) for k, p in pids.items()}
    ej1 = ejections(url)
    wu, end = spec.warmup_s, result.end_s
    lat = [
        (s.done_s - s.intended_s) * 1000.0
        for s in result.samples
        if s.outcome == "ok" and s.intended_s >= wu
    ]
    statuses: dict[str, int] = {}
    for s in result.samples:
        key = str(s.status) if s.status else s.outcome
        statuses[key] = statuses.get(key, 0) + 1
    done_in = sum(1 for s in result.samples if s.outcome == "ok" and wu <= s.done_s <= end)
    gw_cpu = cpu1["gateway"] - cpu0["gateway"]
    wk_cpu = sum(cpu1[k] - cpu0[k] for k in pids if k != "gateway")
    return {
        "encoding": encoding,
        "rate_rps": args.rate,
        "seconds": args.seconds,
        "sent": len(result.samples),
        "statuses": dict(sorted(statuses.items())),
        "all_200": set(statuses) == {"200"},
        "p50_ms": float(np.percentile(lat, 50)) if lat else None,
        "p99_ms": float(np.percentile(lat, 99)) if lat else None,
        "achieved_rps": done_in / max(1e-9, end - wu),
        "ejections": ej1 - ej0,
        "gateway_cpu_s": round(gw_cpu, 3),
        "workers_cpu_s": round(wk_cpu, 3),
        "load_1m": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cluster", type=Path, default=ROOT / "examples" / "cluster-seed.yaml")
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--encodings", default="json,binary")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    console = Console()
    tmp = Path(tempfile.mkdtemp(prefix="evenserve-seed-real-"))
    up, info = start_cluster(args.cluster, tmp)
    rows = []
    try:
        url = info["gateway"]["url"]
        pids = {"gateway": info["gateway"]["pid"]}
        pids.update({wk["name"]: wk["pid"] for wk in info["workers"]})
        for enc in args.encodings.split(","):
            console.print(f"[bold]{enc}[/]: {args.rate:g} req/s for {args.seconds:g} s ...")
            rows.append(one_run(url, pids, enc, args))
    finally:
        os.killpg(up.pid, signal.SIGTERM)
        up.wait(timeout=60)
    table = Table(title=f"evenserve up {args.cluster.name}, mix resnet50 70 % / bert-base 30 %")
    for col in ("encoding", "sent", "statuses", "P50 ms", "P99 ms", "achieved/s", "ejections",
                "gateway CPU s", "workers CPU s", "load 1m"):  # fmt: skip
        table.add_column(col)
    for r in rows:
        table.add_row(
            r["encoding"], str(r["sent"]), json.dumps(r["statuses"]),
            f"{r['p50_ms']:.1f}" if r["p50_ms"] is not None else "-",
            f"{r['p99_ms']:.1f}" if r["p99_ms"] is not None else "-",
            f"{r['achieved_rps']:.1f}", str(r["ejections"]), str(r["gateway_cpu_s"]),
            str(r["workers_cpu_s"]), str(r["load_1m"]),
        )  # fmt: skip
    console.print(table)
    for r in rows:
        ok = r["all_200"] and r["ejections"] == 0
        console.print(
            f"{r['encoding']}: every request 200 and no backend ejected: {'PASS' if ok else 'FAIL'}"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
