"""Issue 29's must-show figures in the simulator (``scenarios/llm-pool.yaml``).

    .venv/bin/python bench/llm_pool_sim.py                        # the file's seed
    .venv/bin/python bench/llm_pool_sim.py --seeds 1,2,3 --json out/llm-pool.json

Runs each arm of the scenario (``sim.llm_pool``: four engines of two speeds hosting ResNet-50
and BERT, one router in front) and, per seed, prints:
- the arms side by side: goodput (completed requests per second that met both their TTFT and
  TPOT targets, over the measured window), within targets (of all requests, refused ones
  included), TTFT P50/P90, the prefix-heavy tenants' TTFT P90, refusals, preemptions;
- ours (``predicted-ttft``) over each baseline's goodput (targets: >= 2 over round robin,
  >= 1.5 over ``kv-load``), and round robin's tenants' TTFT P90 over ours (target >= 50);
- every engine's signals 5 s stale: ours' goodput over ours fresh (target >= 0.90), and
  ``kv-load``'s for contrast;
- overload: ours with every LLM rate scaled by ``--scales``: the offered rate, goodput and
  its ratio to the peak of every load up to this one and of the whole sweep (target at 3x:
  >= 0.95; a goodput that keeps rising with the load has its peak at the heaviest), and
  among the admitted (completed) requests the largest TTFT over its target (target at 3x:
  <= 2) and how many went over it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from evenserve.sim.llm_pool import (
    PoolFigures,
    run_pool_arm,
    summarize_pool_arm,
    ttft_over_target,
)
from evenserve.sim.llm_pool_scenario import PoolArm, load_llm_pool_scenario

ROOT = Path(__file__).resolve().parents[1]
OURS = "predicted-ttft"
TENANTS = "tenants"


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def fmt(x: float | None, nd: int = 2) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", type=Path, default=ROOT / "scenarios" / "llm-pool.yaml")
    ap.add_argument("--seeds", default=None, help="comma-separated (default: the file's)")
    ap.add_argument("--scales", default="0.5,1,2,3,4,6,8", help="overload sweep of ours")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    sc = load_llm_pool_scenario(args.scenario)
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else [sc.doc.seed]
    scales = [float(s) for s in args.scales.split(",")]
    for s in scales:
        sc.doc.arms[f"{OURS}-x{s:g}"] = PoolArm(routing=OURS, rate_scale=s)
    arms = [a for a in sc.doc.arms if not a.startswith(f"{OURS}-x")]
    lo, hi = sc.doc.warmup_s, sc.doc.duration_s
    con = Console()
    report: dict[str, Any] = {"scenario": sc.doc.name, "seeds": {}}
    with Progress(console=con, transient=True) as prog:
        task = prog.add_task("arms", total=len(seeds) * (len(arms) + len(scales)))
        for seed in seeds:
            figs: dict[str, PoolFigures] = {}
            worst: dict[str, tuple[float | None, int, int]] = {}
            for a in arms + [f"{OURS}-x{s:g}" for s in scales]:
                prog.update(task, description=f"seed {seed}: {a}")
                if a == f"{OURS}-x1" and OURS in figs:
                    figs[a], worst[a] = figs[OURS], worst[OURS]
                else:
                    run = run_pool_arm(sc, a, seed)
                    figs[a] = summarize_pool_arm(sc, run)
                    worst[a] = ttft_over_target(run.records, lo, hi)
                prog.advance(task)
            report["seeds"][seed] = _print_seed(con, sc.doc.name, seed, arms, scales, figs, worst)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return 0


def _print_seed(
    con: Console, name: str, seed: int, arms: list[str], scales: list[float],
    figs: dict[str, PoolFigures], worst: dict[str, tuple[float | None, int, int]],
) -> dict[str, Any]:  # fmt: skip
    t = Table(title=f"{name}, seed {seed}: arms (simulated)")
    for h in ("arm", "goodput rps", "within targets", "TTFT P50 s", "TTFT P90 s",
              "tenants TTFT P90 s", "refused", "preemptions", "classic within SLO"):  # fmt: skip
        t.add_column(h, justify="right")
    for a in arms:
        f = figs[a]
        ten = f.by_workload.get(TENANTS)
        refused = sum(f.llm.refused.values())
        classic = (
            min((c["goodput_fraction"] or 0.0) for c in f.classic.values()) if f.classic else None
        )
        t.add_row(a, fmt(f.llm.goodput_rps), fmt(f.llm.goodput_fraction, 3),
                  fmt(f.llm.ttft_s.p50, 3), fmt(f.llm.ttft_s.p90, 3),
                  fmt(ten.ttft_s.p90 if ten else None, 3), str(refused),
                  str(f.llm.preemptions), fmt(classic, 3))  # fmt: skip
    con.print(t)
    g = {a: figs[a].llm.goodput_rps for a in figs}
    ours = g.get(OURS)
    ten = {a: (figs[a].by_workload[TENANTS].ttft_s.p90 if TENANTS in figs[a].by_workload else None)
           for a in figs}  # fmt: skip
    checks = Table(title=f"seed {seed}: must-show")
    for h in ("figure", "value", "target"):
        checks.add_column(h, justify="right")
    out: dict[str, Any] = {"arms": {a: figs[a].to_dict() for a in figs}}
    rows: list[tuple[str, float | None, str]] = [
        ("goodput ours / round-robin", ratio(ours, g.get("round-robin")), ">= 2"),
        ("goodput ours / kv-load", ratio(ours, g.get("kv-load")), ">= 1.5"),
        ("goodput ours / prefix-approx", ratio(ours, g.get("prefix-approx")), "-"),
        ("tenants TTFT P90 round-robin / ours", ratio(ten.get("round-robin"), ten.get(OURS)),
         ">= 50"),
        ("goodput ours 5 s stale / fresh", ratio(g.get(f"{OURS}-stale5"), ours), ">= 0.90"),
        ("goodput kv-load 5 s stale / fresh", ratio(g.get("kv-load-stale5"), g.get("kv-load")),
         "-"),
    ]  # fmt: skip
    for label, v, target in rows:
        checks.add_row(label, fmt(v, 3), target)
        out[label] = v
    con.print(checks)
    sweep = Table(title=f"seed {seed}: ours under overload (every LLM rate scaled)")
    for h in ("rate x", "offered rps", "goodput rps", "of peak so far", "of peak, all",
              "refused", "admitted over TTFT target", "worst TTFT / target"):  # fmt: skip
        sweep.add_column(h, justify="right")
    sw = {s: figs[f"{OURS}-x{s:g}"] for s in sorted(scales)}
    peak_all = max((f.llm.goodput_rps or 0.0) for f in sw.values())
    out["overload"] = {}
    so_far = 0.0
    for s, f in sw.items():
        w, over, n = worst[f"{OURS}-x{s:g}"]
        gp = f.llm.goodput_rps or 0.0
        so_far = max(so_far, gp)
        offered = f.llm.requests / f.llm.window_s if f.llm.window_s else None
        sweep.add_row(f"{s:g}", fmt(offered), fmt(gp), fmt(gp / so_far if so_far else None, 3),
                      fmt(gp / peak_all if peak_all else None, 3),
                      str(sum(f.llm.refused.values())), f"{over} of {n}", fmt(w, 2))  # fmt: skip
        out["overload"][f"{s:g}"] = {
            "offered_rps": offered, "goodput_rps": gp,
            "of_peak_so_far": gp / so_far if so_far else None,
            "of_peak_all": gp / peak_all if peak_all else None,
            "worst_ttft_over_target": w, "over_target": over, "admitted": n,
        }  # fmt: skip
    con.print(sweep)
    return out


if __name__ == "__main__":
    sys.exit(main())
