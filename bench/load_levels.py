"""Batching policies across load levels: the sweep table of scenarios/load-levels.yaml.

For every load level of the scenario and every arm (a sweep of fixed-window delays, the
articles' step-down rule, adaptive and deadline), simulate with the same seeds (1..N) and
print the mean over seeds of goodput within SLO (req/s), P99 (ms) and dropped requests.
Marks the best fixed delay per level and says whether adaptive / deadline are at least as good
as it on both figures (within 0.5 % on goodput and 2 % on P99, the seed-to-seed noise of these
means). "One fixed delay best at every level" also allows that tolerance: it holds when one
delay is within it of the best at every level (0 and 5 ms are ties, not two winners).

    python bench/load_levels.py [--scenario scenarios/load-levels.yaml] [--seeds N]
        [--set devices.0.instances=2 ...] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from evenserve.report.summary import summarize
from evenserve.sim.cluster import simulate
from evenserve.sim.loader import load_scenario, with_level

ROOT = Path(__file__).resolve().parent.parent
#: Seed-to-seed noise of the means: within these, two arms tie.
GOODPUT_TOL = 0.005
P99_TOL = 0.02


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--scenario", default=str(ROOT / "scenarios" / "load-levels.yaml"))
    ap.add_argument("--seeds", type=int, default=3, help="average over this many seeds")
    ap.add_argument("--json", default=None, help="write the figures as JSON")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a scenario field, e.g. devices.0.instances=2 (repeatable)",
    )
    args = ap.parse_args()
    base = load_scenario(args.scenario, args.set)
    levels = list(base.scenario.levels)
    arms = list(base.scenario.arms)
    figures: dict[str, dict[str, Any]] = {}
    console = Console(width=200)
    with console.status("simulating") as status:
        for level in levels:
            loaded = with_level(base, level)
            figures[level] = {}
            for arm in arms:
                status.update(f"simulating {level} / {arm}")
                runs = [
                    summarize(simulate(loaded, arm, seed), timeseries=False)
                    for seed in range(1, args.seeds + 1)
                ]
                n = len(runs)
                figures[level][arm] = {
                    "goodput_rps": round(
                        sum(sum(m["goodput_rps"] for m in s["models"].values()) for s in runs) / n,
                        2,
                    ),
                    "p99_ms": round(sum(s["latency_ms"]["p99"] or 0.0 for s in runs) / n, 2),
                    "dropped": round(sum(s["requests"]["dropped"] for s in runs) / n),
                }
    table = Table(
        title=f"{base.scenario.name}: goodput within SLO (req/s) / P99 (ms) / dropped, "
        f"mean of {args.seeds} seeds"
    )
    table.add_column("policy", no_wrap=True)
    for level in levels:
        table.add_column(level, justify="right")
    fixed = [a for a in arms if a.startswith("fixed-")]
    best_fixed: dict[str, str] = {}
    for level in levels:
        f = figures[level]
        top = max(f[a]["goodput_rps"] for a in fixed)
        tied = [a for a in fixed if f[a]["goodput_rps"] >= top * (1 - GOODPUT_TOL)]
        best_fixed[level] = min(tied, key=lambda a: (f[a]["p99_ms"] or 0, -f[a]["goodput_rps"]))
    for arm in arms:
        cells = []
        for level in levels:
            v = figures[level][arm]
            mark = " *" if best_fixed[level] == arm else ""
            cells.append(f"{v['goodput_rps']:.1f} / {v['p99_ms'] or 0:.0f} / {v['dropped']}{mark}")
        table.add_row(arm, *cells)
    console.print(table)
    console.print("* best fixed delay at that level (lowest P99 among those tied on goodput)")

    def as_good(level: str, arm: str) -> tuple[bool, bool]:
        v, b = figures[level][arm], figures[level][best_fixed[level]]
        good = v["goodput_rps"] >= b["goodput_rps"] * (1 - GOODPUT_TOL)
        p99 = (v["p99_ms"] or 0) <= (b["p99_ms"] or 0) * (1 + P99_TOL)
        return good, p99

    near_best = {lv: {a for a in fixed if all(as_good(lv, a))} for lv in levels}
    everywhere = sorted(set.intersection(*near_best.values())) if levels else []
    for lv in levels:
        console.print(f"{lv}: fixed delays as good as the best: {', '.join(sorted(near_best[lv]))}")
    console.print(
        "one fixed delay best at every level: "
        + (f"yes ({', '.join(everywhere)})" if everywhere else "no")
    )
    for cand in ("adaptive", "deadline"):
        if cand not in arms:
            continue
        ok = []
        for level in levels:
            good, p99 = as_good(level, cand)
            ok.append(
                f"{level}: goodput {'>=' if good else '<'} best fixed, "
                f"P99 {'<=' if p99 else '>'} best fixed"
            )
        console.print(f"{cand}: " + "; ".join(ok))
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "levels": figures,
                    "best_fixed": best_fixed,
                    "near_best_fixed": {lv: sorted(v) for lv, v in near_best.items()},
                    "one_fixed_delay_best_everywhere": everywhere,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
