"""The watch loop live (issue 14): ``evenserve tune --watch``'s loop on a local emulated
cluster running scenarios/drift.yaml through its day -> night rate change, with a deliberately
bad parameter set pushed by hand half-way.

    python bench/watch_live.py [--time-scale 4] [--window 30] [--budget 10]
        [--inject-after 5] [--json PATH]

The scenario is scaled K times (every batch, SLO and inter-arrival time K times longer, as
``evenserve bench --scenario`` does) and its ``default`` arm (the articles' weights, one
hand-set window) runs live: a gateway with its request log on and four emulated workers, one
of them 2x slower than its profile. Beside the load, the watch loop (``WatchPolicy``, the
code behind ``--watch``) runs every ``--window`` live seconds on the gateway's recorded
requests, with ``--budget`` simulator evaluations a window, on the same scaled scenario. After
the loop's ``--inject-after``-th window the bench itself pushes a bad set (every model's
window 8x the SLO/4 cap the tuner may use, and routing by memory alone) through
``PUT /admin/params``, as an operator's mistake would come.

Checks (measured, never assumed): the loop applied a change of its own; the bad set was
rolled back at the first window that ends after it (within one window); at most one change
in any window; no parameter set applied again after it was rolled back.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from evenserve.experiment.cluster import arm_cluster, write_arm_cluster, write_profile_sets
from evenserve.experiment.load import scenario_load_spec
from evenserve.experiment.scaling import scale_scenario
from evenserve.experiment.watch import (
    HttpWatchClient,
    SimPredictor,
    WatchEvent,
    WatchPolicy,
    live_figures,
    run_watch,
)
from evenserve.httpio.params_client import push_params
from evenserve.loadgen.display import live_progress
from evenserve.loadgen.runner import run_load
from evenserve.sim.loader import load_scenario

ROOT = Path(__file__).resolve().parent.parent
CHANGES = ("apply", "rollback")


def bad_params(models: list[str]) -> dict[str, Any]:
    """Routing by free memory alone and long windows: what a mistaken operator might push."""
    return {
        "routing": {
            "policy": "queue-aware",
            "queue_weight": 0.0,
            "utilization_weight": 0.0,
            "memory_weight": 1.0,
            "overload_utilization": 1.0,
            "overload_free_gb": 0.0,
        },
        "batching_per_model": {
            m: {"policy": "fixed-window", "max_batch_size": 32, "max_batch_delay_ms": 200.0}
            for m in models
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", type=Path, default=ROOT / "scenarios" / "drift.yaml")
    ap.add_argument("--arm", default="default")
    ap.add_argument("--time-scale", type=float, default=4.0)
    ap.add_argument("--window", type=float, default=30.0, help="live seconds per window")
    ap.add_argument("--budget", type=int, default=10, help="simulator evaluations a window")
    ap.add_argument("--inject-after", type=int, default=5, help="push the bad set after it")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--set", action="append", default=[], help="scenario override KEY=VALUE")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    console = Console(stderr=True)
    k = args.time_scale

    loaded = load_scenario(args.scenario, args.set)
    sc = loaded.scenario
    work = Path(tempfile.mkdtemp(prefix="evenserve-watch-live-"))
    scaled = scale_scenario(loaded, k, sc.duration_s * k, sc.warmup_s * k, work)
    dirs = write_profile_sets(scaled, work)
    repo = ROOT / "examples" / "models" / "drift"
    cluster_path = write_arm_cluster(scaled, args.arm, repo, work, dirs, args.seed)
    raw = yaml.safe_load(cluster_path.read_text())
    raw["gateway"]["record"] = {"window": 200_000}  # the request log, in memory only
    cluster_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    spec = scenario_load_spec(scaled, args.seed, 2_000_000, 30.0)
    ssc = scaled.scenario
    slo = {m: v.slo_ms for m, v in ssc.models.items()}
    windows = int(ssc.duration_s // args.window)
    console.print(
        f"drift x{k:g} live: {ssc.duration_s:.0f} s, {windows} windows of {args.window:g} s, "
        f"budget {args.budget} a window; bad set pushed after window {args.inject_after}"
    )

    injected: dict[str, Any] = {}
    events: list[WatchEvent] = []
    errors: list[str] = []
    with arm_cluster(cluster_path, work / "logs", say=lambda s: console.print(s)) as la:
        assert la.gateway is not None
        url, token = la.gateway.url, la.admin_token
        spec.target = url
        spec.scrape = {p.name: p.url for p in la.workers}
        client = HttpWatchClient(url, token)
        predictor = SimPredictor(scaled, args.arm, budget=args.budget, seed=args.seed)
        policy = WatchPolicy(slo_ms=slo, window_s=args.window)

        def on_event(ev: WatchEvent) -> None:
            console.print(
                f"  window {ev.window} ({time.strftime('%H:%M:%S')}): {ev.action}: {ev.reason}",
                highlight=False,
            )
            if not injected and ev.window >= args.inject_after and policy.pending is None:
                cur = client.get_params()
                reply = push_params(
                    url, token, bad_params(list(ssc.models)), cur["version"], "bench: bad set"
                )
                injected.update(
                    {"after_window": ev.window, "version": reply["version"], "unix_s": time.time()}
                )
                console.print(f"  bench: pushed the bad set as version {reply['version']}")

        def watch() -> None:
            try:
                events.extend(
                    run_watch(
                        client,
                        predictor,
                        policy,
                        now=time.time,
                        sleep=time.sleep,
                        windows=windows,
                        on_event=on_event,
                    )
                )
            except Exception as exc:  # reported below; the load goes on
                errors.append(f"{type(exc).__name__}: {exc}")

        th = threading.Thread(target=watch, name="watch", daemon=True)
        th.start()
        with live_progress(console, f"drift x{k:g} live") as show:
            result = run_load(spec, show)
        th.join(timeout=args.window * 2 + 60)
        history = client.get_params()["history"]
        all_records = client.pull_log(0.0)

    # -- figures and checks ----------------------------------------------------------------
    whole = live_figures(all_records, slo, ssc.duration_s)
    changes_per_window: dict[int, int] = {}
    for e in events:
        if e.action in CHANGES:
            changes_per_window[e.window] = changes_per_window.get(e.window, 0) + 1
    own_applies = [e for e in events if e.action == "apply"]
    bad_rolled = None
    if injected:
        after = [e for e in events if e.window > injected["after_window"]]
        bad_rolled = bool(after) and after[0].action == "rollback"
    # In history order: a rollback bans the set it replaced; a later put of that set is a
    # re-apply (the oscillation the cooldown is there to prevent).
    banned: set[str] = set()
    reapplied = False
    prev_key = None
    for h in history:
        key = json.dumps(h["params"], sort_keys=True)
        if h["source"] == "rollback" and prev_key is not None:
            banned.add(prev_key)
        elif key in banned:
            reapplied = True
        prev_key = key
    checks = {
        "the loop applied a change of its own": bool(own_applies),
        "the bad set was rolled back within one window": bool(bad_rolled),
        "at most one change per window": all(n <= 1 for n in changes_per_window.values()),
        "no rolled-back set applied again": not reapplied,
        "the watch loop ran without an error": not errors,
    }
    t = Table(title=f"watch loop on drift x{k:g} live ({args.window:g} s windows)")
    for col in ("window", "action", "version", "live P99 ms", "predicted ms", "why"):
        t.add_column(col)
    for e in events:
        t.add_row(
            str(e.window),
            e.action,
            "-" if e.version is None else str(e.version),
            "-" if e.live_p99_ms is None else f"{e.live_p99_ms:.1f}",
            "-" if e.predicted_p99_ms is None else f"{e.predicted_p99_ms:.1f}",
            e.reason[:100],
        )
    out = Console(width=200)
    out.print(t)
    out.print(
        f"whole run: {whole.answered} answered, P99 {whole.p99_ms or 0:.1f} ms, goodput "
        f"{whole.goodput_rps:.1f} rps; sent {len(result.samples)}; simulator evaluations "
        f"{predictor.evaluations}"
    )
    for name, ok in checks.items():
        out.print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    for err in errors:
        out.print(f"  error: {err}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "time_scale": k,
                    "window_s": args.window,
                    "budget": args.budget,
                    "events": [e.as_dict() for e in events],
                    "injected": injected,
                    "history": history,
                    "checks": checks,
                    "errors": errors,
                },
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
