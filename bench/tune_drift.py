"""The tune must-shows on scenarios/drift.yaml, in the simulator.

Tunes the ``default`` arm (queue-aware at the articles' weights 0.5/0.3/0.2 and soft
overload, one hand-set fixed-window for every model) with ``evenserve tune``'s search
(budget 30 simulator evaluations, the scenario's seed), runs the 3 x 3 x 3 x 2 sweep, and then
evaluates the default, the tuned and the sweep's best parameters on the scenario's seed and
two held-out seeds (seed + 1, seed + 2; the search never saw them). Prints, per seed, P99,
goodput and SLO attainment, then one line per target with PASS or FAIL: what was measured,
never an exit status (the script exits 0 either way).

Targets (issue 14):
- tuned parameters cut P99 by >= 25 % against the default arm at equal or better goodput
  (equal: within the objective's tolerance, goodput >= default x (1 - 0.5 %); the raw
  difference is printed), on every seed;
- within 5 % of the sweep's best after <= 30 simulator evaluations: regret = (tuned P99 -
  sweep best P99) / sweep best P99 <= 0.05 on the tuning seed.

    python bench/tune_drift.py [--budget 30] [--json PATH]
        [--live [--time-scale 4] [--params JSON]]

``--live`` then runs the default and the tuned parameters live, one after the other, on a
local emulated cluster through the scenario bench (``evenserve bench --scenario``'s
experiment layer: the whole scenario K times slower, ``examples/models/drift``'s emulated
models, the slow device's worker ``--slowdown 2``, the tuned arm's workers
``--learn-profiles`` when the tuned set turns learning on), seed 1, and the simulator on the
same scaled scenario beside it; the same target on the live figures. ``--params`` takes
the tuned set from an earlier run's ``--json`` (``tune.params``) instead of searching again.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from evenserve.experiment.tune import GOODPUT_TOLERANCE, GRID, apply, evaluate, figures, tune
from evenserve.sim.loader import LoadedScenario, load_scenario

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "drift.yaml"
ARM = "default"


def row(label: str, f: dict[str, Any], base: dict[str, Any]) -> str:
    cut = 1.0 - f["p99_ms"] / base["p99_ms"]
    dg = f["goodput_rps"] / base["goodput_rps"] - 1.0
    return (
        f"  {label:11s} P99 {f['p99_ms']:7.2f} ms ({cut:+6.1%} cut)  P50 {f['p50_ms']:6.2f} ms  "
        f"goodput {f['goodput_rps']:7.1f} rps ({dg:+.2%})  SLO {f['slo_attainment']:.2%}"
    )


def cut_check(label: str, d: dict[str, Any], t: dict[str, Any]) -> tuple[str, bool, str]:
    cut = 1.0 - t["p99_ms"] / d["p99_ms"]
    good = t["goodput_rps"] >= d["goodput_rps"] * (1.0 - GOODPUT_TOLERANCE)
    return (
        f"{label}: P99 cut >= 25 % at equal or better goodput",
        cut >= 0.25 and good,
        f"cut {cut:.1%}, goodput {t['goodput_rps']:.1f} vs {d['goodput_rps']:.1f} "
        f"({t['goodput_rps'] / d['goodput_rps'] - 1.0:+.2%})",
    )


def run_live(
    loaded: LoadedScenario, params: dict[str, Any], k: float
) -> tuple[dict[str, Any], list[tuple[str, bool, str]]]:
    """The default and the tuned arm live (seed 1, the whole scenario K times slower), the
    simulator on the same scaled scenario beside them."""
    from rich.console import Console

    from evenserve.experiment.scenario_bench import ScenarioBench, run_scenario_bench

    tuned = apply(loaded, ARM, params).scenario.arms[ARM]
    arm_json = json.dumps(tuned.model_dump(mode="json", exclude_none=True))
    sc = loaded.scenario
    console = Console(stderr=True)
    res = run_scenario_bench(
        ScenarioBench(
            scenario=SCENARIO,
            overrides=[f"arms.tuned={arm_json}"],
            arms=[ARM, "tuned"],
            time_scale=k,
            duration_s=k * sc.duration_s,
            warmup_s=k * sc.warmup_s,
            seed=1,
            repo=ROOT / "examples" / "models" / "drift",
            plots=False,
        ),
        console,
        console,
    )
    live = {a: figures(res.summary["arms"][a]) for a in (ARM, "tuned")}
    sim = {a: figures(res.summary["simulated"]["arms"][a]) for a in (ARM, "tuned")}
    print(f"live, K = {k:g} (latencies live ms; bench folder {res.plan.folder}):")
    for label, arm in (("default", ARM), ("tuned", "tuned")):
        print(row(label, live[arm], live[ARM]))
    print("simulated, the same scaled scenario and seed:")
    for label, arm in (("default", ARM), ("tuned", "tuned")):
        print(row(label, sim[arm], sim[ARM]))
    checks = [cut_check("live", live[ARM], live["tuned"])]
    return {"time_scale": k, "live": live, "simulated": sim, "folder": str(res.plan.folder)}, checks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget", type=int, default=30)
    ap.add_argument("--held-out", type=int, default=2, help="held-out seeds")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--live", action="store_true", help="also run default and tuned live")
    ap.add_argument("--time-scale", type=float, default=4.0, help="live: K")
    ap.add_argument("--params", type=Path, default=None, help="live: tuned params from --json")
    args = ap.parse_args()

    loaded = load_scenario(SCENARIO)
    if args.params is not None:
        params = json.loads(args.params.read_text())["tune"]["params"]
        live, checks = run_live(loaded, params, args.time_scale)
        for name, ok, what in checks:
            print(f"  {'PASS' if ok else 'FAIL'}  {name}: {what}")
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(
                json.dumps(
                    {
                        "params": params,
                        "live": live,
                        "checks": [{"name": n, "pass": ok, "measured": w} for n, ok, w in checks],
                    },
                    indent=2,
                )
                + "\n"
            )
        return
    seed = loaded.scenario.seed
    t0 = time.perf_counter()
    r = tune(loaded, ARM, seed=seed, budget=args.budget, sweep=True)
    search_s = time.perf_counter() - t0
    sweep_best = r.sweep_best
    assert sweep_best is not None
    print(
        f"drift / {ARM}: search {r.evaluations} evaluations + sweep {len(r.sweep)} "
        f"({' x '.join(str(len(v)) for v in GRID.values())} over {', '.join(GRID)}) "
        f"in {search_s:.0f} s"
    )
    seeds = [seed] + [seed + 1 + k for k in range(args.held_out)]
    per_seed: list[dict[str, Any]] = []
    for s in seeds:
        figs = {
            "default": figures(evaluate(loaded, ARM, s, None)),
            "tuned": figures(evaluate(loaded, ARM, s, r.best.params)),
            "sweep-best": figures(evaluate(loaded, ARM, s, sweep_best.params)),
        }
        per_seed.append({"seed": s, "held_out": s != seed, **figs})
        print(f"seed {s}{' (held out)' if s != seed else ' (tuned on)'}:")
        for label in ("default", "tuned", "sweep-best"):
            print(row(label, figs[label], figs["default"]))

    checks: list[tuple[str, bool, str]] = []
    for ps in per_seed:
        checks.append(cut_check(f"seed {ps['seed']}", ps["default"], ps["tuned"]))
    regret = r.regret
    checks.append(
        (
            f"within 5 % of the sweep's best after <= 30 evaluations ({r.evaluations})",
            regret is not None and regret <= 0.05 and r.evaluations <= 30,
            "no feasible grid point" if regret is None else f"regret {regret:+.1%}",
        )
    )
    live = None
    if args.live:
        assert r.best.params is not None
        live, live_checks = run_live(loaded, r.best.params, args.time_scale)
        checks += live_checks
    print("checks:")
    for name, ok, what in checks:
        print(f"  {'PASS' if ok else 'FAIL'}  {name}: {what}")
    print("tuned params: " + json.dumps(r.best.params))
    if args.json is not None:
        out = {
            "scenario": "drift",
            "arm": ARM,
            "tune": {k: v for k, v in r.to_json().items() if k not in ("current", "best")},
            "seeds": per_seed,
            "checks": [{"name": n, "pass": ok, "measured": w} for n, ok, w in checks],
            "live": live,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
