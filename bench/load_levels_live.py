"""Batching policies across load levels, live on the emulated cluster next to the simulator.

For every load level of scenarios/load-levels.yaml (30pct, 80pct, burst) this runs
``evenserve bench --scenario ... --level LEVEL`` once with the chosen arms (each arm on its own
local emulated cluster: 2 emulated T4-class workers behind the gateway, the arm's routing in
the gateway and its batching in the workers) and reads the bench's summary.json: the live
figures and the simulator's on the very same time-scaled scenario and seed (the bench's
fidelity run). It prints, per level, goodput within SLO (req/s) and P99 (ms), live and
simulated, with each arm's rank, and says whether the live ordering is the simulator's.

Time scale and length (what this script changes, all through the bench's own options):
- K = ``--time-scale`` (default 4): every batch, SLO, deadline and inter-arrival time K times
  longer, rates K times lower (the bench's ``scale_scenario``); batching windows (fixed-window
  delays, step-down's 100/50/30 ms) and the 100 ms signal period are not scaled, as in every
  ``evenserve bench --scenario``. At K = 4 the 2x burst offers 222 req/s (the live system
  used at most 0.52 of the 2 cores, loadgen scheduling-lag P99 <= 1.5 ms); at K = 2 the
  unscaled per-request HTTP cost showed: 80pct P50 20 % above the simulator (8 % at K = 4).
- The scenario's 90 s is shortened. Steady levels (30pct, 80pct) run ``--steady-s`` (14)
  scenario seconds, the first ``--warmup-s`` (1.5) left out. A level with a phase that starts
  later (burst: 2x from 40 to 50 s) has those phases moved so the first starts at
  ``--event-at`` (3.5) with their lengths unchanged (``--set levels.burst.1.start_s=3.5
  --set levels.burst.1.end_s=13.5``: the whole 10 s burst at 2x is inside the run) and runs
  until ``--tail-s`` (3) after the last one ends (16.5 s). Live seconds are these times K.
  With the defaults: 56 s per arm at 30pct and 80pct, 66 s at burst; about 19 minutes for
  6 arms x 3 levels on 2 cores.
- One seed (the scenario's, ``--seed``): live arrivals are the simulator's own Poisson
  streams for that seed, so live and simulated runs see the very same requests.

Same ordering, with a tolerance: two arms whose simulated figures differ by at most the
margin (relative difference = difference / mean of the two; ``--goodput-margin`` 3 %,
``--p99-margin`` 5 %) are a tie. Every pair of arms that the simulator separates by more than
the margin must be ordered the same way live (strictly); ties are not checked. Rank of an arm
= 1 + the number of arms better than it by more than the margin (so tied arms share a rank),
computed the same way on the live and on the simulated figures.

Why 3 % and 5 %: measured on this machine at 80pct (the level whose arms are closest), live
runs of the same arm with the same arrivals (2-3 runs of each of the 6 arms, 56 s each)
differed by at most 0.5 % on goodput and 4.1 % on P99 (fixed-0ms: 423.1, 422.2, 406.0 ms);
the margins are above that live jitter, so a pair the check holds live to is not one that
jitter alone reorders.
What the margins do not cover is the simulator's own seed noise: on other seeds the
difference between two arms moves by several points (printed per level), so a pair just
over the margin on the seed that ran can be a tie on the next. ``--sim-seeds N`` (default 5)
simulates seeds 1..N of each scaled level for that line and, for a pair that disagrees,
says whether the simulator orders it the same way on every seed. It does not change the
verdict.

Each level's bench folder (summary.json, report.html, raw samples, process logs) is kept
under ``--out``.

    python bench/load_levels_live.py [--levels 30pct,80pct,burst] [--arms A,B,...]
        [--time-scale 4] [--json PATH] [--out DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from evenserve.experiment.scaling import scale_scenario
from evenserve.report.summary import summarize
from evenserve.sim.cluster import simulate
from evenserve.sim.loader import LoadedScenario, load_scenario, with_level

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-c", "from evenserve.cli.main import main; main()"]
DEFAULT_ARMS = "fixed-0ms,fixed-20ms,fixed-100ms,step-down,adaptive,deadline"
FIGURES = ("goodput_rps", "p99_ms")
#: Which way is better: +1 higher is better, -1 lower is better.
BETTER = {"goodput_rps": 1, "p99_ms": -1}
LABEL = {"goodput_rps": "goodput", "p99_ms": "P99"}


def plan_level(
    loaded: LoadedScenario, level: str, args: argparse.Namespace
) -> tuple[list[str], float, float]:
    """``--set`` overrides that move the level's later phases, and its length (scenario s)."""
    phases = loaded.scenario.levels[level]
    later = [(i, p) for i, p in enumerate(phases) if p.start_s > 0]
    if not later:
        return [], args.steady_s, args.warmup_s
    shift = args.event_at - min(p.start_s for _, p in later)
    overrides = []
    for i, p in later:
        overrides += [
            f"levels.{level}.{i}.start_s={p.start_s + shift:g}",
            f"levels.{level}.{i}.end_s={p.end_s + shift:g}",
        ]
    if args.warmup_s > args.event_at:
        raise SystemExit("--warmup-s must not be later than --event-at")
    return overrides, max(p.end_s for _, p in later) + shift + args.tail_s, args.warmup_s


def figures_of(arm: dict[str, Any]) -> dict[str, Any]:
    return {
        "goodput_rps": round(sum(m["goodput_rps"] for m in arm["models"].values()), 3),
        "p99_ms": arm["latency_ms"]["p99"],
        "p50_ms": arm["latency_ms"]["p50"],
        "throughput_rps": arm["throughput_rps"],
        "dropped": arm["requests"]["dropped"],
        "arrived": arm["requests"]["arrived"],
    }


def rel_diff(a: float, b: float) -> float:
    """(a - b) / mean(a, b): symmetric, 0 when equal."""
    mean = (a + b) / 2.0
    return 0.0 if mean == 0 else (a - b) / mean


def ranks(values: dict[str, float | None], better: int, margin: float) -> dict[str, int | None]:
    """1 + number of arms better by more than the margin (tied arms share a rank)."""
    out: dict[str, int | None] = {}
    for a, va in values.items():
        if va is None:
            out[a] = None
            continue
        out[a] = 1 + sum(
            1
            for b, vb in values.items()
            if b != a and vb is not None and better * rel_diff(vb, va) > margin
        )
    return out


def check_pairs(
    live: dict[str, dict[str, Any]],
    sim: dict[str, dict[str, Any]],
    margins: dict[str, float],
    sim_seed_diffs: dict[str, dict[str, list[float]]],
) -> dict[str, Any]:
    """Every pair the simulator separates by more than the margin, and how live orders it."""
    out: dict[str, Any] = {}
    for fig in FIGURES:
        checked, agree, disagree, live_only = [], 0, [], []
        for a, b in itertools.combinations(list(sim), 2):
            sa, sb, la, lb = sim[a][fig], sim[b][fig], live[a][fig], live[b][fig]
            if None in (sa, sb, la, lb):
                continue
            ds, dl = rel_diff(sa, sb), rel_diff(la, lb)
            seeds = sim_seed_diffs.get(fig, {}).get(f"{a}|{b}", [])
            row = {
                "a": a,
                "b": b,
                "sim_diff": round(ds, 4),
                "live_diff": round(dl, 4),
                "sim_seed_diff_range": [round(min(seeds), 4), round(max(seeds), 4)]
                if seeds
                else None,
            }
            if abs(ds) > margins[fig]:
                row["same_order"] = (ds > 0) == (dl > 0) and dl != 0
                row["sim_seeds_agree"] = (
                    None if not seeds else all((d > 0) == (ds > 0) and d != 0 for d in seeds)
                )
                checked.append(row)
                if row["same_order"]:
                    agree += 1
                else:
                    disagree.append(row)
            elif abs(dl) > margins[fig]:
                live_only.append(row)
        out[fig] = {
            "margin": margins[fig],
            "checked": checked,
            "agree": agree,
            "disagree": disagree,
            "live_separates_sim_ties": live_only,
        }
    return out


def sim_seed_spread(
    scaled: LoadedScenario, arms: list[str], seeds: int
) -> dict[str, dict[str, list[float]]]:
    """Per figure and pair: the pair's relative difference on simulator seeds 1..N."""
    figs: dict[str, list[dict[str, Any]]] = {
        a: [
            figures_of(summarize(simulate(scaled, a, s), timeseries=False))
            for s in range(1, seeds + 1)
        ]
        for a in arms
    }
    out: dict[str, dict[str, list[float]]] = {f: {} for f in FIGURES}
    for fig in FIGURES:
        for a, b in itertools.combinations(arms, 2):
            out[fig][f"{a}|{b}"] = [
                rel_diff(x[fig], y[fig])
                for x, y in zip(figs[a], figs[b], strict=True)
                if x[fig] is not None and y[fig] is not None
            ]
    return out


def run_bench(
    cmd: list[str], log_path: Path, console: Console, status: Any, what: str, arms: list[str]
) -> None:
    """The bench CLI as a child; its per-arm lines echoed, everything kept in a log."""
    env = dict(os.environ, COLUMNS="200")
    t0 = time.monotonic()
    done = 0
    in_errors = False
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            log.flush()
            stripped = line.strip()
            if any(stripped.startswith(f"{a} #") for a in arms):
                done += 1
                in_errors = False
                console.print(f"    {stripped}", highlight=False, soft_wrap=True)
            elif stripped.startswith(("error", "Traceback")) or (in_errors and line[:2] == "  "):
                # The bench's failure summary ("errors" and its indented lines) and errors.
                in_errors = in_errors or stripped == "errors"
                short = stripped if len(stripped) <= 150 else stripped[:147] + "..."
                console.print(f"    {short}", style="red", highlight=False, markup=False)
            nxt = arms[done] if done < len(arms) else "simulating"
            status.update(
                f"{what}: {done}/{len(arms)} arms done, now {nxt} ({time.monotonic() - t0:.0f} s)"
            )
        rc = proc.wait()
    if rc != 0:
        tail = log_path.read_text().splitlines()[-30:]
        console.print("\n".join(tail), highlight=False, markup=False)
        raise SystemExit(f"bench for {what} failed (exit {rc}); full log: {log_path}")


def level_table(
    arms: list[str],
    live: dict[str, dict[str, Any]],
    sim: dict[str, dict[str, Any]],
    rk: dict[str, dict[str, dict[str, int | None]]],
    extra: dict[str, dict[str, Any]],
    title: str,
) -> Table:
    t = Table(title=title)
    for col, just in [
        ("arm", "left"),
        ("goodput live", "right"),
        ("goodput sim", "right"),
        ("rank live/sim", "center"),
        ("P99 live ms", "right"),
        ("P99 sim ms", "right"),
        ("rank live/sim", "center"),
        ("dropped live/sim", "right"),
        ("lag P99 ms", "right"),
    ]:
        t.add_column(col, justify=just, no_wrap=True)  # type: ignore[arg-type]

    def f(x: Any, nd: int) -> str:
        return "-" if x is None else f"{float(x):.{nd}f}"

    def r(fig: str, a: str) -> str:
        lv, sv = rk["live"][fig][a], rk["sim"][fig][a]
        cell = f"{lv or '-'} / {sv or '-'}"
        return cell if lv == sv else f"[yellow]{cell}[/]"

    for a in arms:
        t.add_row(
            a,
            f(live[a]["goodput_rps"], 2),
            f(sim[a]["goodput_rps"], 2),
            r("goodput_rps", a),
            f(live[a]["p99_ms"], 1),
            f(sim[a]["p99_ms"], 1),
            r("p99_ms", a),
            f"{live[a]['dropped']} / {sim[a]['dropped']}",
            f(extra[a]["lag_p99_ms"], 2),
        )
    return t


def verdict_lines(pairs: dict[str, Any]) -> tuple[bool, list[str]]:
    ok = True
    lines = []
    for fig in FIGURES:
        p = pairs[fig]
        n = len(p["checked"])
        good = not p["disagree"]
        ok = ok and good
        mark = "[green]same order[/]" if good else "[bold red]DIFFERENT order[/]"
        lines.append(
            f"  {LABEL[fig]} (margin {p['margin']:.0%}): the simulator separates {n} pair(s); "
            f"live orders {p['agree']} of them the same way: {mark}"
        )
        for row in p["disagree"]:
            seeds = row["sim_seed_diff_range"]
            seed_note = ""
            if seeds is not None:
                robust = "same sign on every seed" if row["sim_seeds_agree"] else "sign flips"
                seed_note = f"; simulator over seeds: {seeds[0]:+.1%} .. {seeds[1]:+.1%} ({robust})"
            lines.append(
                f"    [red]{row['a']} vs {row['b']}[/]: sim {row['sim_diff']:+.1%}, "
                f"live {row['live_diff']:+.1%}{seed_note}"
            )
        if p["live_separates_sim_ties"]:
            ties = ", ".join(
                f"{row['a']}/{row['b']} ({row['live_diff']:+.1%} live, {row['sim_diff']:+.1%} sim)"
                for row in p["live_separates_sim_ties"]
            )
            lines.append(f"    not checked, simulator tie but live apart: {ties}")
    return ok, lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--scenario", default=str(ROOT / "scenarios" / "load-levels.yaml"))
    ap.add_argument("--levels", default=None, help="comma-separated (default: all)")
    ap.add_argument("--arms", default=DEFAULT_ARMS, help="comma-separated arms")
    ap.add_argument("--time-scale", type=float, default=4.0, help="K (see above)")
    ap.add_argument("--steady-s", type=float, default=14.0, help="scenario s, steady levels")
    ap.add_argument("--warmup-s", type=float, default=1.5, help="scenario s left out")
    ap.add_argument("--event-at", type=float, default=3.5, help="scenario s: first later phase")
    ap.add_argument("--tail-s", type=float, default=3.0, help="scenario s after the last phase")
    ap.add_argument("--seed", type=int, default=None, help="default: the scenario's")
    ap.add_argument("--goodput-margin", type=float, default=0.03)
    ap.add_argument("--p99-margin", type=float, default=0.05)
    ap.add_argument("--sim-seeds", type=int, default=5, help="simulator seeds for the spread")
    ap.add_argument(
        "--set", dest="overrides", action="append", default=[], help="key.path=value (bench)"
    )
    ap.add_argument("--no-realtime", action="store_true", help="passed to the bench")
    ap.add_argument("--out", default=None, help="folder for the bench runs (default: out/...)")
    ap.add_argument("--json", default=None, help="write every figure and the verdict as JSON")
    args = ap.parse_args()

    wall0 = time.monotonic()
    console = Console(width=200)
    k = args.time_scale
    base = load_scenario(args.scenario, args.overrides)
    levels = args.levels.split(",") if args.levels else list(base.scenario.levels)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    for lv in levels:
        if lv not in base.scenario.levels:
            raise SystemExit(f"--levels: unknown level {lv!r} ({', '.join(base.scenario.levels)})")
    for a in arms:
        if a not in base.scenario.arms:
            raise SystemExit(f"--arms: unknown arm {a!r} ({', '.join(base.scenario.arms)})")
    seed = base.scenario.seed if args.seed is None else args.seed
    margins = {"goodput_rps": args.goodput_margin, "p99_ms": args.p99_margin}
    out = Path(args.out or ROOT / "out" / f"load-levels-live-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)

    plans = {lv: plan_level(base, lv, args) for lv in levels}
    total_live = sum(d * k for _, d, _ in plans.values()) * len(arms)
    console.print(
        f"{base.scenario.name} live vs simulated: levels {', '.join(levels)}; arms "
        f"{', '.join(arms)}; time scale K = {k:g}; seed {seed}; about {total_live / 60:.0f} min "
        f"of load plus cluster start/stop; bench runs under {out}",
        highlight=False,
    )
    results: dict[str, Any] = {}
    all_ok = True
    with console.status("starting") as status:
        for lv in levels:
            level_over, dur_s, wu_s = plans[lv]
            overrides = args.overrides + level_over
            # The simulator on seeds 1..N of the same scaled level (cheap; before the live
            # runs so that it never competes with them for the CPUs).
            status.update(f"{lv}: simulating seeds 1..{args.sim_seeds} of the scaled level")
            scaled = scale_scenario(
                with_level(load_scenario(args.scenario, overrides), lv),
                k,
                dur_s * k,
                wu_s * k,
                Path(tempfile.mkdtemp(prefix="load-levels-live-")),
            )
            spread = sim_seed_spread(scaled, arms, args.sim_seeds) if args.sim_seeds > 1 else {}
            folder = out / lv
            folder.mkdir(parents=True, exist_ok=True)
            cmd = [
                *CLI,
                "bench",
                "--scenario", args.scenario,
                "--level", lv,
                "--arms", ",".join(arms),
                "--time-scale", f"{k:g}",
                "--duration", f"{dur_s * k:g}s",
                "--warmup", f"{wu_s * k:g}s",
                "--seed", str(seed),
                "--out", str(folder),
                "--no-plots",
                "--no-progress",
                *[x for o in overrides for x in ("--set", o)],
                *(["--no-realtime"] if args.no_realtime else []),
            ]  # fmt: skip
            console.print(
                f"[bold]{lv}[/]: {dur_s:g} s scenario time (warm-up {wu_s:g} s) = "
                f"{dur_s * k:g} s live per arm"
                + (f"; {' '.join(level_over)}" if level_over else ""),
                highlight=False,
            )
            run_bench(cmd, folder / "bench.log", console, status, lv, arms)
            summary = json.loads((folder / "summary.json").read_text())
            live = {a: figures_of(summary["arms"][a]) for a in arms}
            sim = {a: figures_of(summary["simulated"]["arms"][a]) for a in arms}
            extra = {
                a: {
                    "lag_p99_ms": summary["scheduling_lag_ms"][f"{a}#1"].get("p99"),
                    "cpu_cores": round(sum(summary["cpu"][f"{a}#1"]["cores"].values()), 3),
                    "load_average_1m": summary["cpu"][f"{a}#1"]["load_average_1m"],
                }
                for a in arms
            }
            rk = {
                src: {f: ranks({a: v[a][f] for a in arms}, BETTER[f], margins[f]) for f in FIGURES}
                for src, v in (("live", live), ("sim", sim))
            }
            pairs = check_pairs(live, sim, margins, spread)
            ok, lines = verdict_lines(pairs)
            if spread:
                moves = {
                    f: max((max(v) - min(v) for v in spread[f].values() if v), default=0.0)
                    for f in FIGURES
                }
                lines.append(
                    f"  simulator seeds 1..{args.sim_seeds} of this scaled level: a pair's "
                    f"difference moves by up to {moves['goodput_rps']:.1%} (goodput) and "
                    f"{moves['p99_ms']:.1%} (P99) from seed to seed"
                )
            all_ok = all_ok and ok
            title = (
                f"{base.scenario.name} @ {lv}, K = {k:g}, seed {seed}: goodput within SLO "
                f"(req/s) and P99 (ms), live vs simulated (same scaled scenario and arrivals)"
            )
            table = level_table(arms, live, sim, rk, extra, title)
            verdict = [f"{lv}: " + ("[green]same ordering[/]" if ok else "[red]NOT the same[/]")]
            console.print(table)
            for line in verdict + lines:
                console.print(line, highlight=False, soft_wrap=True)
            results[lv] = {
                "scenario_duration_s": dur_s,
                "scenario_warmup_s": wu_s,
                "live_duration_s": dur_s * k,
                "live_warmup_s": wu_s * k,
                "overrides": overrides,
                "bench_folder": str(folder),
                "live": live,
                "simulated": sim,
                "ranks": rk,
                "run": extra,
                "pairs": pairs,
                "sim_seed_diffs": spread,
                "same_ordering": ok,
            }
    wall = time.monotonic() - wall0
    worst_lag = max(
        (e["lag_p99_ms"] for r in results.values() for e in r["run"].values() if e["lag_p99_ms"]),
        default=math.nan,
    )
    cpus = [e["cpu_cores"] for r in results.values() for e in r["run"].values()]
    loads = [e["load_average_1m"] for r in results.values() for e in r["run"].values()]
    differ = [lv for lv, r in results.items() if not r["same_ordering"]]
    console.print(
        "overall: "
        + (
            f"[red]the live ordering differs from the simulator's at: {', '.join(differ)}[/]"
            if differ
            else "[green]the same ordering as the simulator at every level[/]"
        ),
        highlight=False,
    )
    console.print(
        f"rank = 1 + arms better by more than the margin (goodput {margins['goodput_rps']:.0%}, "
        f"P99 {margins['p99_ms']:.0%}; relative difference to the pair's mean); yellow: live "
        f"rank differs. Load generator: scheduling-lag P99 at most {worst_lag:.2f} ms "
        f"(every batch takes {k:g}x its profile's time); live system CPU {min(cpus):.2f}-"
        f"{max(cpus):.2f} of {os.cpu_count()} cores; 1-min load average {min(loads):.2f}-"
        f"{max(loads):.2f}. Wall time {wall / 60:.1f} min.",
        highlight=False,
        soft_wrap=True,
    )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(
            json.dumps(
                {
                    "scenario": args.scenario,
                    "time_scale": k,
                    "seed": seed,
                    "arms": arms,
                    "margins": margins,
                    "sim_seeds": args.sim_seeds,
                    "levels": results,
                    "same_ordering": all_ok,
                    "wall_s": round(wall, 1),
                },
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
