"""Faults injected live, for ``evenserve diagnose`` to name: the seed cluster on the emulated
devices, short runs, each run's summary JSON and a labels file naming the fault it carries.

Runs (each on its own local cluster, the seed scenario's arm compiled by the scenario bench's
own machinery: ``experiment.scenario_bench.plan_bench`` and ``run_repeat``, the same code
``evenserve bench --scenario scenarios/seed.yaml`` runs):
- ``run-baseline.json``: the ``baseline`` arm (round robin + static batches of 4). gpu0
  hosts BERT and a quarter of ResNet: it is the hot node; static batches wait to fill.
- ``run-optimized.json``: the ``optimized`` arm (queue-aware + greedy batching up to 8), the
  healthy reference.
- ``run-slow-device.json``: ``optimized`` with gpu1 two times slower than its profile
  (``devices.1.slowdown=2``: the worker's ``--slowdown 2``).
- ``run-transfer-stall.json``: ``optimized`` with gpu1 staging each batch's inputs for
  ``--staging-ms`` (0.5) scenario ms per item before it computes
  (``devices.1.staging_ms_per_item``: the worker's ``--staging-ms-per-item``, times K).

``labels.json`` maps each run file to the findings its faults should give (kind, device,
model; null where any; ``[]``: healthy), as bench/diagnose_set.py scores them (``--live``);
``key-figures.json`` has each run's per-device
figures a detector reads. Time scale K = ``--time-scale`` (the bench's default, 40: every
batch, think time and staging K times longer, so the devices' figures are the policies', not
the 2-core host's); ``--duration-s`` (45) live seconds per run, the first ``--warmup-s`` (8)
left out of the figures; ``--set KEY=VALUE`` adds a scenario override to every run
(``workload.users=40``). About 4 minutes in all.

Measured on 2 cores with the defaults (160 to 200 req/s, the live system using under half a
core): baseline, gpu0 99.9 % busy with 21 requests queued on average against 1.5 on the
others, which sit held idle 49 % of the time (static batches of 4 waiting to fill; gpu0's
queue always fills them); optimized, every device 95 to 99.7 % busy, nothing held, observed
vs profile 1.00, staging 0.1 to 0.3 % (the executor's assembling), SLO attainment 1.0; slow
device, gpu1 2.00x its profile; transfer stall, gpu1's staging 61 % of its busy time. At
K = 4 (``--time-scale 4``: 800 to 1040 req/s, 1.4 to 1.7 cores) the HTTP path (ResNet's
600 KB inputs) outweighs the devices' 4 to 9 ms batches: P50 50 to 80 ms, SLO attainment
5 to 37 % in every run, the healthy one included, and observed vs profile 1.07 to 1.10 on
healthy devices; the faults still show (2.09x, staging 53 %).

    python bench/diagnose_live.py [--out out/diagnose-live] [--duration-s 45] [--runs a,b]
        [--set workload.users=40]
    evenserve diagnose out/diagnose-live/run-baseline.json --json out/dx-baseline.json
    python bench/diagnose_live.py --check out/dx-baseline.json   # the fix, live
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from evenserve.experiment.scaling import DEFAULT_TIME_SCALE
from evenserve.experiment.scenario_bench import (
    BenchPlan,
    RepeatRun,
    ScenarioBench,
    bench_source,
    plan_bench,
    run_repeat,
)
from evenserve.report.summary import run_summary

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "seed.yaml"
FAULTY = "gpu1"


def _label(kind: str, device: str | None = None, model: str | None = None) -> dict[str, Any]:
    return {"kind": kind, "device": device, "model": model}


#: The seed baseline's faults, as bench/diagnose_set.py labels its simulated run: the hot
#: BERT host, static batches of 4 waiting to fill on gpu1-3, and on gpu0 (saturated) those
#: batches of 4 of two memory-bound models, where a larger cap pays.
BASELINE = (
    [_label("hot-node", "gpu0")]
    + [_label("static-batch-wait", d, "resnet50") for d in ("gpu1", "gpu2", "gpu3")]
    + [_label("memory-bound-small-batches", "gpu0", m) for m in ("resnet50", "bert-base")]
)


def runs(staging_ms: float) -> dict[str, tuple[str, list[str], list[dict[str, Any]]]]:
    """Run name -> (arm, scenario overrides, the findings it should give: kind, device and
    model, None where any)."""
    return {
        "baseline": ("baseline", [], BASELINE),
        "optimized": ("optimized", [], []),
        "slow-device": ("optimized", ["devices.1.slowdown=2"], [_label("slow-device", FAULTY)]),
        "transfer-stall": (
            "optimized",
            [f"devices.1.staging_ms_per_item={staging_ms!r}"],
            [_label("transfer-stall", FAULTY)],
        ),
    }


def key_figures(s: dict[str, Any]) -> dict[str, Any]:
    """What to check a detector against: per device, and the run's headline."""
    keys = (
        "utilization",
        "mean_queue_depth",
        "held_idle_fraction",
        "observed_vs_profile",
        "staging_fraction",
        "memory_peak_fraction",
    )
    return {
        "throughput_rps": s["throughput_rps"],
        "p99_ms": s["latency_ms"]["p99"],
        "devices": {d: {k: v.get(k) for k in keys} for d, v in s["devices"].items()},
        "fill": {
            d: {m: p["fill"] for m, p in v["per_model"].items()} for d, v in s["devices"].items()
        },
    }


def live_run(
    args: argparse.Namespace,
    name: str,
    arm: str,
    overrides: list[str],
    console: Console,
    err: Console,
) -> tuple[BenchPlan, RepeatRun]:
    """One live run of ``arm`` of the seed scenario with ``overrides`` (the scenario bench's
    own machinery), its work folder ``OUT/bench/NAME``."""
    work = args.out / "bench" / name
    shutil.rmtree(work, ignore_errors=True)
    bench = ScenarioBench(
        scenario=SCENARIO,
        overrides=[*args.extra, *overrides],
        arms=[arm],
        time_scale=args.time_scale,
        duration_s=args.duration_s,
        warmup_s=args.warmup_s,
        repo=ROOT / "examples" / "models" / "emulated",
        out=work,
        plots=False,
        progress=False,
        fidelity=False,
    )
    plan = plan_bench(bench)
    run = run_repeat(plan, arm, 0, console, err)
    shutil.rmtree(plan.workroot, ignore_errors=True)
    return plan, run


def overrides_for(arm: str, params: dict[str, Any]) -> list[str]:
    """A parameter set as scenario overrides on ``arm`` (JSON is YAML)."""
    out = []
    if params.get("routing") is not None:
        out.append(f"arms.{arm}.routing={json.dumps(params['routing'])}")
    for m, spec in (params.get("batching_per_model") or {}).items():
        out.append(f"arms.{arm}.batching_per_model.{m}={json.dumps(spec)}")
    if params.get("learn_profiles") is not None:
        out.append(f"arms.{arm}.learn_profiles={json.dumps(params['learn_profiles'])}")
    return out


def check(args: argparse.Namespace, console: Console, err: Console) -> int:
    """The baseline live again with the recommendation of ``args.check`` applied."""
    report = json.loads(args.check.read_text())
    arm_report = report["runs"][0]["arms"]["baseline"]
    recs = [f["recommendation"] for f in arm_report["findings"] if f.get("recommendation")]
    recs = [r for r in recs if r["pushable"]]
    together = arm_report.get("combined")
    if together and together.get("better"):
        recs.append(together)
    if not recs:
        print("--check: the report has no verified parameter change", file=sys.stderr)
        return 2
    best = min(recs, key=lambda r: r["predicted"]["p99_ms"]["after"])
    plan, run = live_run(
        args, "baseline-fixed", "baseline", overrides_for("baseline", best["params"]), console, err
    )
    before = json.loads((args.out / "run-baseline.json").read_text())["arms"]["baseline"]
    after = run.summary
    summary = run_summary(plan.loaded.scenario.name, plan.seed, {"baseline": after})
    (args.out / "run-baseline-fixed.json").write_text(json.dumps(summary, indent=2) + "\n")
    goodput = sum(m["goodput_rps"] or 0.0 for m in after["models"].values())
    goodput0 = sum(m["goodput_rps"] or 0.0 for m in before["models"].values())
    p = best["predicted"]
    console.print(f"applied: {best['change']}", highlight=False)
    console.print(
        f"P99 ms: live before {before['latency_ms']['p99']:.1f}, live after "
        f"{after['latency_ms']['p99']:.1f}; simulated before {p['p99_ms']['before']:.1f}, "
        f"predicted {p['p99_ms']['after']:.1f}",
        highlight=False,
    )
    console.print(
        f"goodput rps: live before {goodput0:.1f}, live after {goodput:.1f}; simulated before "
        f"{p['goodput_rps']['before']:.1f}, predicted {p['goodput_rps']['after']:.1f}",
        highlight=False,
    )
    console.print(
        f"SLO attainment: live {before['slo_attainment']:.4f} -> {after['slo_attainment']:.4f}; "
        f"spread pts live {before['utilization_spread_pts']:.1f} -> "
        f"{after['utilization_spread_pts']:.1f}",
        highlight=False,
    )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "diagnose-live")
    ap.add_argument("--time-scale", type=float, default=DEFAULT_TIME_SCALE)
    ap.add_argument("--duration-s", type=float, default=45.0)
    ap.add_argument("--warmup-s", type=float, default=8.0)
    ap.add_argument("--staging-ms", type=float, default=0.5)
    ap.add_argument("--runs", default=None, help="comma-separated subset of the runs")
    ap.add_argument(
        "--check",
        type=Path,
        default=None,
        help="a diagnose --json report of run-baseline.json: run baseline live again with its "
        "best verified parameter change applied, and print live vs predicted",
    )
    ap.add_argument(
        "--set", dest="extra", action="append", default=[], help="scenario override, every run"
    )
    args = ap.parse_args()
    console, err = Console(), Console(stderr=True)
    plan_runs = runs(args.staging_ms)
    chosen = list(plan_runs) if args.runs is None else [r.strip() for r in args.runs.split(",")]
    unknown = [r for r in chosen if r not in plan_runs]
    if unknown:
        print(f"--runs: unknown {unknown} (runs: {', '.join(plan_runs)})", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    if args.check is not None:
        return check(args, console, err)
    labels_path = args.out / "labels.json"
    labels: dict[str, Any] = json.loads(labels_path.read_text()) if labels_path.is_file() else {}
    figures: dict[str, Any] = {}
    for name in chosen:
        arm, overrides, faults = plan_runs[name]
        t0 = time.perf_counter()
        plan, run = live_run(args, name, arm, overrides, console, err)
        summary = run_summary(plan.loaded.scenario.name, plan.seed, {arm: run.summary})
        summary["source"] = bench_source(plan) | {"arm": arm}
        summary["fault"] = {
            "run": name,
            "overrides": [*args.extra, *overrides],
            "time_scale": args.time_scale,
        }
        path = args.out / f"run-{name}.json"
        path.write_text(json.dumps(summary, indent=2) + "\n")
        labels[path.name] = faults
        figures[path.name] = key_figures(summary["arms"][arm])
        console.print(
            f"{name}: {time.perf_counter() - t0:.0f} s -> {path}\n"
            + json.dumps(figures[path.name], indent=1),
            highlight=False,
        )
    labels_path.write_text(json.dumps(labels, indent=2) + "\n")
    (args.out / "key-figures.json").write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
