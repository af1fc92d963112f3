"""How far the simulated LLM pool's figures move under a perturbation as small as a live
client's late sends, and where a live run falls in that spread.

    .venv/bin/python bench/llm_pool_sensitivity.py --arms predicted-ttft
    .venv/bin/python bench/llm_pool_sensitivity.py --arms predicted-ttft,round-robin \\
        --live-json out/llm-pool-live.json --json out/llm-pool-sensitivity.json

The scenario is built as the live bench builds it (``evenserve bench --scenario
scenarios/llm-pool.yaml``: ``experiment.llm_pool_live.scaled_pool`` with the same duration,
warm-up, drain, time scale K and prompt vocabulary), so the unperturbed run is that bench's
simulated side, request for request. Then each replica runs the same arm with every open-loop
LLM request reaching the router U(0, ``--jitter-ms``) later than it was due (scenario ms;
``sim.llm_pool.run_pool_arm``'s ``arrival_jitter_s``, its TTFT still counted from when it
was due), one jitter seed a replica. The default 0.3 ms has a mean of 0.15 ms: the live
bench's median send lateness (about 0.7 ms at K = 5). Nothing else changes: the same
requests, the same prompts, the same engines.

Printed per arm, in the scenario's units: each figure of the live bench's comparison
(goodput, completed and unfinished requests, TTFT mean/P50/P90/P99 and TPOT mean/P90,
overall and per workload, router refusals) unperturbed, and its minimum, median and maximum
over the replicas. With ``--live-json`` (the JSON the live bench wrote, ``--json`` there),
the live figure beside them, its ratio to the replicas' median and whether it lies within
the replicas' range.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from evenserve.experiment.llm_live import BYTE_VOCAB
from evenserve.experiment.llm_pool_live import compare, scale_profile_set, scaled_pool
from evenserve.sim.llm_pool import run_pool_arm, summarize_pool_arm
from evenserve.sim.llm_pool_scenario import load_llm_pool_scenario

ROOT = Path(__file__).resolve().parents[1]
#: The rows of the live bench's comparison this bench reports: the LLM's, overall and per
#: workload (the devices' and the classic models' rows are left out: the jitter touches only
#: the LLM's arrivals).
LLM_ROWS = ("LLM ", "router refusals", "admitted")


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def figures(sim: dict[str, Any], other: dict[str, Any], k: float) -> dict[str, float | None]:
    """``other``'s LLM figures in the scenario's units, by the comparison's row names."""
    starts = (*LLM_ROWS, *(f"{wl}: " for wl in sim.get("by_workload", {})))
    out: dict[str, float | None] = {}
    for row in compare(sim, other, k):
        if row["figure"].startswith(starts):
            out[row["figure"]] = row["live"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", type=Path, default=ROOT / "scenarios" / "llm-pool.yaml")
    ap.add_argument("--arms", default="predicted-ttft", help="comma-separated")
    ap.add_argument("--duration", type=float, default=300.0, help="scenario seconds")
    ap.add_argument("--warmup", type=float, default=15.0, help="scenario seconds left out")
    ap.add_argument("--drain", type=float, default=60.0, help="scenario seconds after arrivals")
    ap.add_argument("--time-scale", type=float, default=5.0, help="K, as the live bench's")
    ap.add_argument("--jitter-ms", type=float, default=0.3, help="scenario ms (U(0, this))")
    ap.add_argument("--replicas", type=int, default=6, help="jittered runs an arm")
    ap.add_argument("--live-json", type=Path, help="the live bench's JSON, to place it")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args(argv)
    if args.jitter_ms <= 0:
        ap.error("--jitter-ms: must be > 0")
    if args.replicas < 2:
        ap.error("--replicas: must be >= 2")
    if args.time_scale < 1:
        ap.error("--time-scale: must be >= 1")
    if not 0 <= args.warmup < args.duration:
        ap.error("--warmup: must be in [0, --duration)")
    base = load_llm_pool_scenario(args.scenario)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    for a in arms:
        if a not in base.doc.arms:
            ap.error(f"--arms: unknown arm {a!r} (arms: {', '.join(base.doc.arms)})")
    live_doc: dict[str, Any] = {}
    if args.live_json is not None:
        live_doc = json.loads(args.live_json.read_text())
        if live_doc.get("time_scale") != args.time_scale:
            ap.error(f"--live-json: its time scale is {live_doc.get('time_scale')}, not "
                     f"--time-scale {args.time_scale:g}")  # fmt: skip
    k = args.time_scale
    console = Console(width=None if sys.stdout.isatty() else 140)
    out: dict[str, Any] = {"scenario": base.doc.name, "time_scale": k,
                           "jitter_ms": args.jitter_ms, "replicas": args.replicas,
                           "units": "the scenario's", "arms": {}}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="llm-pool-sens-") as tmp_name:
        tmp = Path(tmp_name)
        sets = sorted({d.profiles for d in base.doc.devices})
        pdirs = {s: scale_profile_set(base.profile_dir(s), tmp / s, k) for s in sets}
        sc = scaled_pool(base, args.duration, args.warmup, 1.0, BYTE_VOCAB, k, pdirs,
                         args.drain)  # fmt: skip
        with Progress(console=console, transient=True) as bar:
            task = bar.add_task("simulating", total=len(arms) * (args.replicas + 1))
            for arm in arms:
                plain = summarize_pool_arm(sc, run_pool_arm(sc, arm)).to_dict()
                bar.advance(task)
                reps = []
                for j in range(1, args.replicas + 1):
                    run = run_pool_arm(sc, arm, arrival_jitter_s=args.jitter_ms / 1e3 * k,
                                       jitter_seed=j)  # fmt: skip
                    reps.append(figures(plain, summarize_pool_arm(sc, run).to_dict(), k))
                    bar.advance(task)
                unperturbed = figures(plain, plain, k)
                live_side = (live_doc.get("arms", {}).get(arm) or {}).get("live")
                live = figures(plain, live_side, k) if live_side else {}
                rows = []
                for name, v in unperturbed.items():
                    vals = [x for r in reps if (x := r.get(name)) is not None]
                    lo = min(vals) if vals else None
                    hi = max(vals) if vals else None
                    med = statistics.median(vals) if vals else None
                    lv = live.get(name)
                    rows.append({
                        "figure": name, "unperturbed": v, "min": lo, "median": med, "max": hi,
                        "live": lv,
                        "live_over_median": None if lv is None or not med else lv / med,
                        "live_in_range": None if lv is None or lo is None or hi is None
                        else lo <= lv <= hi,
                    })  # fmt: skip
                out["arms"][arm] = {"rows": rows, "replicas": reps}
                t = Table(title=f"arm {arm}: {args.replicas} replicas, arrivals U(0, "
                                f"{args.jitter_ms:g} ms) late (scenario units)")  # fmt: skip
                for h in ("figure", "sim", "min", "median", "max", "live", "live/median",
                          "in range"):  # fmt: skip
                    t.add_column(h, justify="left" if h == "figure" else "right")
                for r in rows:
                    ok = r["live_in_range"]
                    t.add_row(r["figure"], fmt(r["unperturbed"]), fmt(r["min"]),
                              fmt(r["median"]), fmt(r["max"]), fmt(r["live"]),
                              fmt(r["live_over_median"]),
                              "-" if ok is None else ("yes" if ok else "no"))  # fmt: skip
                console.print(t)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
