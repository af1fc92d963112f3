"""Triton's perf_analyzer against evenserve: a worker and the gateway, over HTTP and gRPC.

    bash scripts/setup_perf_analyzer.sh                  # once: .venv-perf with perf_analyzer 2.41
    .venv/bin/python bench/perf_analyzer.py
    .venv/bin/python bench/perf_analyzer.py --interval-ms 5000 --json out/perf-analyzer.json

Two ``evenserve worker`` processes serve ``tiny-emulated`` from examples/models/tiny (FP32
[4] in, [2] out: fixed shapes, so perf_analyzer needs no ``--shape``; batches cost what its
profile says, 4-9 ms, dynamic batching with a 2 ms window) over HTTP and gRPC; one
``evenserve gateway`` fronts both (round-robin, both fronts). For each target (worker 0
alone, the gateway) and protocol (``-i http``, ``-i grpc``) it runs

    perf_analyzer -m tiny-emulated -u HOST:PORT -i PROTO --concurrency-range 1:8:7
                  --measurement-interval MS -f CSV

(concurrency 1 and 8). perf_analyzer reads the model's metadata and config
(``/v2/models/{m}/config``, ModelConfig) and its statistics before and after each window, so
the server-side columns (queue, compute) are the worker's figures, or through the gateway
the sum over both workers. Printed per run and concurrency: throughput (infer/s), P50 and
P99 latency (ms, client side), server queue and compute (input + infer + output) per
request (ms); the same as JSON with ``--json``.

perf_analyzer is the binary in the tritonclient==2.41.0 wheel, kept in its own virtualenv
(``--perf-analyzer``, default .venv-perf/bin/perf_analyzer) so it does not change the
project's tritonclient; it needs libcudart.so.12 from the nvidia-cuda-runtime-cu12 wheel in
that venv (put on LD_LIBRARY_PATH here). Everything listens on 127.0.0.1; every process is
stopped on exit. The figures depend on the host (client, gateway and workers share it).
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gateway_overhead import EVENSERVE, ROOT, free_port, start, stop, wait_ready

MODEL = "tiny-emulated"
REPO = ROOT / "examples" / "models" / "tiny"


def perf_env(perf_analyzer: Path) -> dict[str, str]:
    """The environment perf_analyzer needs: libcudart.so.12 from its venv's CUDA wheel."""
    venv = perf_analyzer.resolve().parent.parent
    libs = glob.glob(
        str(venv / "lib" / "python3*" / "site-packages" / "nvidia" / "cuda_runtime" / "lib")
    )
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = ":".join([*libs, *filter(None, [env.get("LD_LIBRARY_PATH")])])
    return env


def run_pa(
    perf_analyzer: Path, url: str, proto: str, interval_ms: int, out_csv: Path, log: Path
) -> list[dict[str, str]]:
    cmd = [
        str(perf_analyzer), "-m", MODEL, "-u", url, "-i", proto,
        "--concurrency-range", "1:8:7",
        "--measurement-interval", str(interval_ms),
        "--max-trials", "6", "--stability-percentage", "20",
        "-f", str(out_csv),
    ]  # fmt: skip
    done = subprocess.run(
        cmd, env=perf_env(perf_analyzer), capture_output=True, text=True, timeout=300
    )
    log.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
        raise SystemExit(f"perf_analyzer failed ({done.returncode}): {' '.join(cmd)}\n{tail}")
    with out_csv.open() as f:
        return list(csv.DictReader(f))


def summarize(target: str, proto: str, rows: list[dict[str, str]]) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        server = "Server Queue" in r  # absent when perf_analyzer could not read statistics
        compute = sum(
            float(r[k])
            for k in ("Server Compute Input", "Server Compute Infer", "Server Compute Output")
            if k in r
        )
        out.append(
            {
                "target": target,
                "protocol": proto,
                "concurrency": int(r["Concurrency"]),
                "throughput_infer_s": float(r["Inferences/Second"]),
                "p50_ms": float(r["p50 latency"]) / 1e3,
                "p99_ms": float(r["p99 latency"]) / 1e3,
                "server_queue_ms": float(r["Server Queue"]) / 1e3 if server else None,
                "server_compute_ms": compute / 1e3 if server else None,
            }
        )
    return out


def show(results: list[dict[str, Any]]) -> None:
    table = Table(title=f"perf_analyzer 2.41, model {MODEL}")
    for col in ("target", "proto", "conc", "infer/s", "P50 ms", "P99 ms", "queue ms", "compute ms"):
        table.add_column(col, justify="right")
    for r in results:
        table.add_row(
            r["target"], r["protocol"], str(r["concurrency"]),
            f"{r['throughput_infer_s']:.1f}", f"{r['p50_ms']:.3f}", f"{r['p99_ms']:.3f}",
            *("-" if r[k] is None else f"{r[k]:.3f}"
              for k in ("server_queue_ms", "server_compute_ms")),
        )  # fmt: skip
    Console(width=120).print(table)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--perf-analyzer", type=Path, default=ROOT / ".venv-perf" / "bin" / "perf_analyzer"
    )
    ap.add_argument("--interval-ms", type=int, default=3000, help="measurement window")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--logs", type=Path, help="keep the process and perf_analyzer logs here")
    ap.add_argument(
        "--grpc-server",
        choices=("h2", "grpcio"),
        help="gateway.grpc_server (default: not written, the gateway's own default)",
    )
    args = ap.parse_args()
    if not args.perf_analyzer.exists():
        raise SystemExit(
            f"{args.perf_analyzer} not found: run scripts/setup_perf_analyzer.sh first"
        )
    procs: list[subprocess.Popen[bytes]] = []
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="evenserve-perf-") as d:
        tmp = args.logs or Path(d)
        tmp.mkdir(parents=True, exist_ok=True)
        try:
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
            workers = []
            for i in range(2):
                port, gport = free_port(), free_port()
                cmd = [*EVENSERVE, "worker", "--repo", str(REPO), "--models", MODEL, "--device",
                       "cpu", "--port", str(port), "--grpc-port", str(gport)]  # fmt: skip
                procs.append(start(cmd, tmp / f"worker{i}.log", env))
                workers.append((port, gport))
            for (port, _), p in zip(workers, procs, strict=True):
                wait_ready(f"http://127.0.0.1:{port}", p)
            hport, ggrpc = free_port(), free_port()
            cfg = {
                "gateway": {"host": "127.0.0.1", "port": hport, "grpc_port": ggrpc,
                            "routing": "round-robin", "admin": {"token": "bench-token-0000"},
                            "overload": {"enabled": False}},
                "backends": [{"name": f"w{i}", "url": f"http://127.0.0.1:{p}",
                              "grpc_url": f"127.0.0.1:{g}", "models": [MODEL]}
                             for i, (p, g) in enumerate(workers)],
            }  # fmt: skip
            if args.grpc_server is not None:
                cfg["gateway"]["grpc_server"] = args.grpc_server
            cfg_path = tmp / "gateway.yaml"
            cfg_path.write_text(json.dumps(cfg))
            procs.append(start([*EVENSERVE, "gateway", "--config", str(cfg_path)], tmp / "gw.log"))
            wait_ready(f"http://127.0.0.1:{hport}", procs[-1])
            targets = {
                "worker": {
                    "http": f"127.0.0.1:{workers[0][0]}",
                    "grpc": f"127.0.0.1:{workers[0][1]}",
                },
                "gateway": {"http": f"127.0.0.1:{hport}", "grpc": f"127.0.0.1:{ggrpc}"},
            }
            for target, urls in targets.items():
                for proto, url in urls.items():
                    print(f"perf_analyzer: {target} over {proto} ({url})", file=sys.stderr)
                    rows = run_pa(
                        args.perf_analyzer, url, proto, args.interval_ms,
                        tmp / f"{target}-{proto}.csv", tmp / f"pa-{target}-{proto}.log",
                    )  # fmt: skip
                    results += summarize(target, proto, rows)
        finally:
            stop(procs)
    show(results)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        out = {"model": MODEL, "host_cpus": os.cpu_count(), "runs": results}
        args.json.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
