"""How closely an emulated device keeps its profile's batch times on this machine.

An emulated model costs no compute: a batch sleeps for the profile's time for its size (a
learned-short ``time.sleep``, then a short spin; see ``evenserve.runtime.emulated``). How
accurate that is depends on the host (its sleep overshoot, how loaded it is, getting the GIL
back), so it is measured here and quoted, never asserted in a test. The tests check the
decision instead, on a fake host clock (``tests/unit/runtime/test_emulated.py``): every batch
ends at entry + the profile's time, never before, whatever the host's overshoot.

Two tables:
1. ``EmulatedRuntime.run`` called directly, for each batch size of each profile: P50 and P99
   of the wall time against the profile's figure, and the P50 error;
2. what ``evenserve profile`` measures (``worker.profiler.measure``, the median wall time per
   batch) of ``examples/models/tiny/tiny-emulated`` against the profile it emulates.

    python bench/emulated_timing.py [--profiles a10-trt-fp16/resnet50,t4-framework-fp32/bert-base]
        [--runs 15] [--json PATH]

Exits 0 whatever the figures are. Run it on an idle machine for the figures a dedicated host
gets; on a loaded one it shows what the load costs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from evenserve.core.profile import load_profile
from evenserve.runtime.base import RuntimeContext, TensorSpec
from evenserve.runtime.device import parse_device
from evenserve.runtime.emulated import EmulatedRuntime
from evenserve.worker.profiler import build_runtime, measure
from evenserve.worker.repository import load_repository

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PROFILES = "a10-trt-fp16/resnet50,a10-trt-fp16/bert-base,t4-framework-fp32/bert-base"


def percentile(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q))


def runtime_rows(profile_names: list[str], runs: int) -> list[dict[str, Any]]:
    ctx = RuntimeContext(
        model="m",
        model_dir=ROOT,
        device=parse_device("cpu"),
        inputs=(TensorSpec("ids", "INT64", (-1,)),),
        outputs=(TensorSpec("logits", "FP32", (2,)),),
    )
    rows = []
    for name in profile_names:
        prof = load_profile(ROOT / "profiles" / f"{name}.yaml")
        rt = EmulatedRuntime(ctx, prof)
        rt.load()
        for batch in prof.batches:
            inputs = {"ids": np.zeros((batch, 8), dtype=np.int64)}
            want = prof.latency_s(batch)
            n = runs if want < 0.02 else max(3, runs // 3)
            took = []
            for _ in range(n):
                t0 = time.perf_counter()
                rt.run(inputs)
                took.append(time.perf_counter() - t0)
            p50 = statistics.median(took)
            rows.append(
                {
                    "profile": name,
                    "batch": batch,
                    "profile_ms": want * 1e3,
                    "runs": n,
                    "p50_ms": p50 * 1e3,
                    "p99_ms": percentile(took, 99) * 1e3,
                    "p50_error_pct": (p50 / want - 1) * 100,
                }
            )
    return rows


def profiler_rows(iters: int) -> list[dict[str, Any]]:
    tiny = ROOT / "examples" / "models" / "tiny"
    (entry,) = load_repository(tiny, ["tiny-emulated"])
    want = load_profile(tiny / "tiny-emulated" / "profile.yaml")
    dev = parse_device("cpu")
    rt = build_runtime(entry, dev)
    rt.load()
    points = measure(rt, entry, dev, list(want.batches), warmup=1, iters=iters)
    return [
        {
            "batch": p.batch,
            "profile_ms": want.latency_s(p.batch) * 1e3,
            "measured_median_ms": p.median_ms,
            "error_pct": (p.median_ms / (want.latency_s(p.batch) * 1e3) - 1) * 100,
        }
        for p in points
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--profiles", default=DEFAULT_PROFILES, help="SET/MODEL names, comma-separated")
    ap.add_argument("--runs", type=int, default=15, help="runs per batch size under 20 ms")
    ap.add_argument("--json", type=Path, default=None, help="write the figures as JSON")
    args = ap.parse_args()
    console = Console(width=140)
    load = os.getloadavg()
    console.print(
        f"host: {os.cpu_count()} CPUs, load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}"
    )
    rows = runtime_rows(args.profiles.split(","), args.runs)
    t = Table(title="EmulatedRuntime.run: wall time per batch vs the profile")
    for col in ("profile", "batch", "profile ms", "runs", "P50 ms", "P99 ms", "P50 error"):
        t.add_column(col, justify="left" if col == "profile" else "right")
    for r in rows:
        t.add_row(
            r["profile"],
            str(r["batch"]),
            f"{r['profile_ms']:.3f}",
            str(r["runs"]),
            f"{r['p50_ms']:.3f}",
            f"{r['p99_ms']:.3f}",
            f"{r['p50_error_pct']:+.2f} %",
        )
    console.print(t)
    errors = [abs(r["p50_error_pct"]) for r in rows]
    console.print(
        f"largest |P50 error|: {max(errors):.2f} %; median: {statistics.median(errors):.2f} %"
    )

    prows = profiler_rows(iters=9)
    t2 = Table(title="evenserve profile (worker.profiler.measure, 9 runs) of tiny-emulated")
    for col in ("batch", "profile ms", "measured median ms", "error"):
        t2.add_column(col, justify="right")
    for r in prows:
        t2.add_row(
            str(r["batch"]),
            f"{r['profile_ms']:.3f}",
            f"{r['measured_median_ms']:.3f}",
            f"{r['error_pct']:+.2f} %",
        )
    console.print(t2)
    if args.json is not None:
        args.json.write_text(
            json.dumps({"loadavg": load, "runtime": rows, "profiler": prows}, indent=2) + "\n"
        )


if __name__ == "__main__":
    main()
