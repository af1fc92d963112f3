"""Profiles that learn: a device that slows 2x mid-run, least-expected-work with and without
learning (scenarios/slowdown.yaml), in the simulator over several seeds.

Per arm, the mean over seeds of: P99 of the requests that arrived before the slowdown
(warm-up to its start), during it, and after it (its end to the run's end); the P99 of the
requests the slow device served during it; and the recovery time N:

    windows of 1 s by arrival time, from the slowdown's start; N = the end of the first
    window that opens three windows in a row whose P99 is within 20 % of the pre-slowdown
    P99 (<= 1.2x), in seconds from the slowdown's start; "-" when that never happens before
    the slowdown ends. N_after is the same from the slowdown's end.

    python bench/learned_profiles.py [--seeds N] [--set KEY=VALUE ...] [--json PATH]
        [--live [--time-scale K]]

``--live`` also runs every arm once live (seed 1) on a local emulated cluster through the
scenario bench (``evenserve bench --scenario``'s experiment layer): every batch and
inter-arrival time K times longer, the slow device's worker given ``--slowdown-phases`` (K
times later, from its first batch: the load's start) and, for the learning arm, every worker
``--learn-profiles``; the same figures with K-second windows, N in scenario seconds.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from evenserve.core.results import RequestLog
from evenserve.sim.cluster import simulate
from evenserve.sim.loader import load_scenario

ROOT = Path(__file__).resolve().parent.parent
#: A window's P99 within this factor of the pre-slowdown P99 counts as recovered.
WITHIN = 1.2
#: Recovered: this many 1 s windows in a row within it.
IN_A_ROW = 3


def p99_ms(latency: np.ndarray, mask: np.ndarray) -> float | None:
    sel = latency[mask]
    return float(np.percentile(sel, 99) * 1000.0) if sel.size else None


def recovery_s(
    arrival: np.ndarray,
    latency: np.ndarray,
    ok: np.ndarray,
    t0: float,
    t1: float,
    pre: float,
    window_s: float = 1.0,
) -> float | None:
    """Windows from ``t0`` to the end of the first window that opens IN_A_ROW windows
    within WITHIN x ``pre`` (None: none before ``t1``), in windows (1 s each unscaled)."""
    good: list[bool] = []
    t = t0
    while t + window_s <= t1 + 1e-9:
        p = p99_ms(latency, ok & (arrival >= t) & (arrival < t + window_s))
        good.append(p is not None and p <= WITHIN * pre)
        t += window_s
    for i in range(len(good) - IN_A_ROW + 1):
        if all(good[i : i + IN_A_ROW]):
            return float(i + 1)
    return None


def figures(
    log: RequestLog,
    warmup: float,
    start: float,
    end: float,
    stop: float,
    slow: str,
    window_s: float = 1.0,
) -> dict[str, Any]:
    arrival = np.array(log.arrival_s)
    latency = np.array(log.finish_s) - arrival
    ok = ~np.isnan(latency)
    device = np.array(log.device)
    pre = p99_ms(latency, ok & (arrival >= warmup) & (arrival < start))
    assert pre is not None
    during = ok & (arrival >= start) & (arrival < end)
    return {
        "p99_before_ms": pre,
        "p99_during_ms": p99_ms(latency, during),
        "p99_after_ms": p99_ms(latency, ok & (arrival >= end) & (arrival < stop)),
        "p99_slow_device_during_ms": p99_ms(latency, during & (device == slow)),
        "recovery_s": recovery_s(arrival, latency, ok, start, end, pre, window_s),
        "recovery_after_s": recovery_s(arrival, latency, ok, end, stop, pre, window_s),
        "dropped": sum(1 for r in log.drop_reason if r is not None),
    }


def mean(values: list[Any]) -> float | None:
    """The mean, or None when any seed did not recover (a mean would hide it)."""
    return None if any(v is None for v in values) else float(np.mean(values))


def print_table(
    console: Console, title: str, slow: str, per_seed: dict[str, list[dict[str, Any]]]
) -> dict[str, dict[str, Any]]:
    """Print the figures per arm (means over the runs); return the means."""
    arms = list(per_seed)
    keys = list(per_seed[arms[0]][0])
    summary = {a: {k: mean([r[k] for r in per_seed[a]]) for k in keys} for a in arms}
    table = Table(title=title)
    cols = ("arm", "P99 before ms", "P99 during ms", "P99 after ms", f"{slow} P99 during ms")
    for col in (*cols, "N s", "N_after s", "per-run N s"):
        table.add_column(col, justify="left" if col == "arm" else "right")

    def fmt(v: float | None, nd: int = 1) -> str:
        return "-" if v is None else f"{v:.{nd}f}"

    for a in arms:
        s = summary[a]
        table.add_row(
            a,
            fmt(s["p99_before_ms"]),
            fmt(s["p99_during_ms"]),
            fmt(s["p99_after_ms"]),
            fmt(s["p99_slow_device_during_ms"]),
            fmt(s["recovery_s"]),
            fmt(s["recovery_after_s"]),
            " ".join(fmt(r["recovery_s"], 0) for r in per_seed[a]),
        )
    console.print(table)
    console.print(
        f"N: seconds from the slowdown's start to the end of the first 1 s window (by arrival) "
        f"that opens {IN_A_ROW} in a row with P99 <= {WITHIN:g}x the pre-slowdown P99; "
        "'-': not before the slowdown ends (any run). N_after: the same from its end.",
        soft_wrap=True,
    )
    return summary


def run_live(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    """Every arm once live (seed 1) through the scenario bench; the same figures on the
    K-times-slower timeline (windows of K seconds), N in scenario seconds."""
    from evenserve.experiment.scenario_bench import ScenarioBench, run_scenario_bench
    from evenserve.loadgen.records import read_run

    k = args.time_scale
    sc0 = load_scenario(args.scenario, args.set).scenario
    bench = ScenarioBench(
        scenario=Path(args.scenario),
        overrides=list(args.set),
        time_scale=k,
        # The whole scenario, K times longer (the live bench's duration is in live seconds).
        duration_s=k * sc0.duration_s,
        warmup_s=k * sc0.warmup_s,
        seed=1,
        fidelity=False,
        plots=False,
        out=None if args.out is None else Path(args.out),
    )
    res = run_scenario_bench(bench, console, console)
    sc = res.plan.scaled.scenario
    slow = next(d for d in sc.expanded_devices() if d.slowdown_phases)
    ph = slow.slowdown_phases[0]
    per_run: dict[str, list[dict[str, Any]]] = {}
    for arm in res.plan.live_arms:
        rec, _ = read_run(res.plan.folder / "runs" / arm / "rep1")
        f = figures(
            rec.requests, res.plan.warmup_s, ph.start_s, ph.end_s, res.plan.duration_s, slow.name, k
        )
        per_run[arm] = [f]
    summary = print_table(
        console,
        f"live, K = {k:g} (times below in scenario seconds: live seconds / K; latencies live): "
        f"{slow.name} {ph.multiplier:g}x slower from {ph.start_s / k:g} s to {ph.end_s / k:g} s",
        slow.name,
        per_run,
    )
    return {"time_scale": k, "folder": str(res.plan.folder), "summary": summary, "per_run": per_run}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--scenario", default=str(ROOT / "scenarios" / "slowdown.yaml"))
    ap.add_argument("--seeds", type=int, default=3, help="seeds 1..N")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a scenario field (repeatable)",
    )
    ap.add_argument("--json", default=None, help="write the figures as JSON")
    ap.add_argument("--live", action="store_true", help="also run every arm once live")
    ap.add_argument("--time-scale", type=float, default=4.0, help="live: K (default 4)")
    ap.add_argument("--out", default=None, help="live: the bench folder (default: out/...)")
    args = ap.parse_args()
    loaded = load_scenario(args.scenario, args.set)
    sc = loaded.scenario
    slow = [d for d in sc.expanded_devices() if d.slowdown_phases]
    if not slow:
        raise SystemExit(f"{args.scenario}: no device has slowdown_phases")
    phase = slow[0].slowdown_phases[0]
    arms = list(sc.arms)
    per_seed: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
    console = Console(width=160)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("simulating", total=len(arms) * args.seeds)
        for arm in arms:
            for seed in range(1, args.seeds + 1):
                progress.update(task, description=f"{arm} seed {seed}")
                rec = simulate(loaded, arm, seed)
                per_seed[arm].append(
                    figures(
                        rec.requests,
                        sc.warmup_s,
                        phase.start_s,
                        phase.end_s,
                        sc.duration_s,
                        slow[0].name,
                    )
                )
                progress.advance(task)
    summary = print_table(
        console,
        f"{sc.name}: {slow[0].name} {phase.multiplier:g}x slower from {phase.start_s:g} s "
        f"to {phase.end_s:g} s; simulated, mean of seeds 1-{args.seeds}",
        slow[0].name,
        per_seed,
    )
    live: dict[str, Any] | None = None
    if args.live:
        live = run_live(args, console)
    if args.json:
        out = {
            "scenario": sc.name,
            "seeds": args.seeds,
            "phase": phase.model_dump(),
            "device": slow[0].name,
            "summary": summary,
            "per_seed": per_seed,
            "live": live,
        }
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
