"""Simulator speed: 1 million requests across 64 simulated A10-class devices.

Open-loop Poisson traffic (ResNet-50 and BERT-base, published A10 TensorRT fp16 profiles) at
about 70 % of the cluster's capacity, pushed through the real Router and batching policies.
Prints wall time (one process, one core) and, on the last line, ``simulated requests/s: N``.

    python bench/sim_speed.py [--requests N] [--devices D] [--routing NAME] [--batching NAME]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from evenserve.report.summary import summarize
from evenserve.sim.cluster import simulate
from evenserve.sim.loader import parse_scenario

ROOT = Path(__file__).resolve().parent.parent


def scenario(
    requests: int, devices: int, routing: str, batching: str, seed: int
) -> tuple[float, dict[str, Any]]:
    """The bench's scenario (simulated seconds, raw scenario): ``requests`` expected
    arrivals over ``devices`` devices."""
    # Per device at batch 8: resnet 2.29 ms/8, bert 3.63 ms/8 -> with a 70/30 mix one device
    # serves about 3,100 req/s; drive 70 % of that.
    rate_total = 0.7 * 3100.0 * devices
    duration_s = requests / rate_total
    half = devices // 2
    raw = {
        "name": "sim-speed",
        "seed": seed,
        "duration_s": duration_s,
        "warmup_s": 0.0,
        "profile_sets": {"a10": str(ROOT / "profiles" / "a10-trt-fp16")},
        "devices": [
            {"name": "both", "count": half, "models": ["resnet50", "bert-base"]},
            {"name": "resnet", "count": devices - half, "models": ["resnet50"]},
        ],
        "models": {"resnet50": {"slo_ms": 50}, "bert-base": {"slo_ms": 50}},
        "workload": {
            "type": "open-loop",
            "rates_rps": {"resnet50": 0.7 * rate_total, "bert-base": 0.3 * rate_total},
        },
        "arms": {
            "bench": {
                "routing": routing,
                "batching": {"policy": batching, "max_batch_size": 8, "max_batch_delay_ms": 2}
                if batching == "fixed-window"
                else batching,
            }
        },
    }
    return duration_s, raw


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--devices", type=int, default=64)
    ap.add_argument("--routing", default="power-of-two")
    ap.add_argument("--batching", default="fixed-window")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    duration_s, raw = scenario(args.requests, args.devices, args.routing, args.batching, args.seed)
    loaded = parse_scenario(raw, ROOT, "bench")
    t0 = time.perf_counter()
    rec = simulate(loaded, "bench")
    wall_sim = time.perf_counter() - t0
    t1 = time.perf_counter()
    s = summarize(rec, timeseries=False)
    wall_summary = time.perf_counter() - t1
    n = s["requests"]["arrived"]
    print(f"devices: {args.devices}, routing: {args.routing}, batching: {args.batching}")
    done = s["requests"]["completed"]
    print(f"simulated time: {duration_s:.2f} s, requests: {n}, completed: {done}")
    print(
        f"P50/P99 latency: {s['latency_ms']['p50']:.2f} / {s['latency_ms']['p99']:.2f} ms, "
        f"mean utilization {100 * s['utilization_mean']:.1f} %"
    )
    print(f"wall time: simulate {wall_sim:.2f} s, summarize {wall_summary:.2f} s")
    print(f"simulated requests/s: {n / wall_sim:,.0f}")


if __name__ == "__main__":
    main()
