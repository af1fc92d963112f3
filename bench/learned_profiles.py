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
    arrival: np.ndarray, latency: np.ndarray, ok: np.ndarray, t0: float, t1: float, pre: float
) -> float | None:
    """Seconds from ``t0`` to the end of the first 1 s window that opens IN_A_ROW windows
    within WITHIN x ``pre`` (None: none before ``t1``)."""
    good: list[bool] = []
    t = t0
    while t + 1.0 <= t1 + 1e-9:
        p = p99_ms(latency, ok & (arrival >= t) & (arrival < t + 1.0))
        good.append(p is not None and p <= WITHIN * pre)
        t += 1.0
    for i in range(len(good) - IN_A_ROW + 1):
        if all(good[i : i + IN_A_ROW]):
            return float(i + 1)
    return None


def figures(
    log: RequestLog, warmup: float, start: float, end: float, stop: float, slow: str
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
        "recovery_s": recovery_s(arrival, latency, ok, start, end, pre),
        "recovery_after_s": recovery_s(arrival, latency, ok, end, stop, pre),
        "dropped": sum(1 for r in log.drop_reason if r is not None),
    }


def mean(values: list[Any]) -> float | None:
    """The mean, or None when any seed did not recover (a mean would hide it)."""
    return None if any(v is None for v in values) else float(np.mean(values))


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
    keys = list(per_seed[arms[0]][0])
    summary = {a: {k: mean([r[k] for r in per_seed[a]]) for k in keys} for a in arms}
    table = Table(
        title=f"{sc.name}: {slow[0].name} {phase.multiplier:g}x slower from {phase.start_s:g} s "
        f"to {phase.end_s:g} s; mean of seeds 1-{args.seeds}"
    )
    for col in (
        "arm",
        "P99 before ms",
        "P99 during ms",
        "P99 after ms",
        f"{slow[0].name} P99 during ms",
        "N s",
        "N_after s",
        "per-seed N s",
    ):
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
            fmt(s["recovery_s"], 0),
            fmt(s["recovery_after_s"], 0),
            " ".join(fmt(r["recovery_s"], 0) for r in per_seed[a]),
        )
    console.print(table)
    console.print(
        f"N: seconds from the slowdown's start to the end of the first 1 s window (by arrival) "
        f"that opens {IN_A_ROW} in a row with P99 <= {WITHIN:g}x the pre-slowdown P99; "
        "'-': not before the slowdown ends (any seed). N_after: the same from its end."
    )
    if args.json:
        out = {
            "scenario": sc.name,
            "seeds": args.seeds,
            "phase": phase.model_dump(),
            "device": slow[0].name,
            "summary": summary,
            "per_seed": per_seed,
        }
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
