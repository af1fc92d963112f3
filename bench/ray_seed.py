"""The seed cluster with its workers as Ray actors, against the same cluster as local processes.

    .venv/bin/python bench/ray_seed.py                  # 45 s per run, time scale K = 40

Needs Ray (pip install 'evenserve[ray]'). Three live runs of the seed scenario's load
(scenarios/seed.yaml: 4 emulated A10s, ResNet-50 everywhere, BERT-base on gpu0, 100
closed-loop users; the cluster examples/cluster-seed.yaml describes), each at time scale K
(experiment/scaling.py: profiles and think times K times slower, so a small host is not what
limits the figures), each with the same seed and so the same load:

1. ``local``: ``evenserve up``'s workers as child processes (the scenario bench's own run);
2. ``ray``: ``evenserve up --ray auto``'s workers, one Ray actor each, on a local Ray head
   started for the run (no dashboard);
3. ``ray + kill``: as 2, and one actor's process is SIGKILLed under load (``--kill-at-s``).

It prints P50 / P99 / throughput / mean utilization and spread side by side for 1 and 2, then
for 3: every request's outcome (the load generator's count: answered 200, answered with an
error status, or no answer at all), the gateway's retries, and from the gateway's event log
(``/admin/events``, CLOCK_MONOTONIC as here) when the killed worker's backend was ejected and
readmitted, relative to the kill, and how many requests it served after its readmission.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from evenserve.cluster.ray_workers import ActorWorker
from evenserve.experiment.cluster import arm_cluster, write_arm_cluster
from evenserve.experiment.load import scenario_load_spec
from evenserve.experiment.scenario_bench import (
    BenchPlan,
    RepeatRun,
    ScenarioBench,
    plan_bench,
    run_repeat,
)
from evenserve.loadgen.runner import run_load

ROOT = Path(__file__).resolve().parents[1]


def plan(args: argparse.Namespace, out: Path) -> BenchPlan:
    return plan_bench(
        ScenarioBench(
            scenario=ROOT / "scenarios" / "seed.yaml",
            arms=[args.arm],
            time_scale=args.time_scale,
            duration_s=args.duration_s,
            warmup_s=args.warmup_s,
            repo=ROOT / "examples" / "models" / "emulated",
            out=out,
            plots=False,
            progress=False,
            fidelity=False,
        )
    )


def figures(run: RepeatRun) -> dict[str, Any]:
    s = run.summary
    return {
        "p50_ms": s["latency_ms"]["p50"],
        "p99_ms": s["latency_ms"]["p99"],
        "throughput_rps": s["throughput_rps"],
        "utilization_mean": s["utilization_mean"],
        "utilization_spread_pts": s["utilization_spread_pts"],
        "requests_completed": s["requests"]["completed"],
        "requests_dropped": s["requests"]["dropped"],
        "cpu_cores": round(sum(run.cpu["cores"].values()), 2),
    }


def kill_run(p: BenchPlan, arm: str, victim: str, kill_at_s: float) -> dict[str, Any]:
    """The Ray cluster under the same load; the victim's actor SIGKILLed at ``kill_at_s``."""
    work = p.workroot / "kill"
    work.mkdir()
    cluster = write_arm_cluster(p.scaled, arm, p.bench.repo, work, p.profile_dirs, p.seed)
    spec = scenario_load_spec(p.scaled, p.seed, p.bench.max_requests, p.bench.timeout_s)
    err = Console(stderr=True)
    t: dict[str, float] = {}
    events: list[dict[str, Any]] = []
    with arm_cluster(cluster, p.folder / "logs" / "kill", say=err.print, ray_address="auto") as la:
        assert la.gateway is not None
        gw = la.gateway.url
        spec.target = gw
        spec.scrape = {w.name: w.url for w in la.workers}
        actor = next(w for w in la.workers if w.name == victim)
        assert isinstance(actor, ActorWorker) and actor.actor_pid is not None
        auth = {"authorization": f"Bearer {la.admin_token}"}
        actor_pid = actor.actor_pid

        def kill_then_watch() -> None:
            time.sleep(kill_at_s)
            t["kill"], t["kill_unix"] = time.monotonic(), time.time()
            os.kill(actor_pid, signal.SIGKILL)
            with httpx.Client(timeout=5, trust_env=False) as c:
                give_up = time.monotonic() + 120
                while time.monotonic() < give_up:
                    time.sleep(0.1)
                    try:
                        got = c.get(f"{gw}/admin/events", headers=auth).json()["events"]
                    except (httpx.HTTPError, ValueError):
                        continue
                    mine = [e for e in got if e["backend"] == victim and e["t_s"] > t["kill"]]
                    if any(e["event"] == "admitted" for e in mine):
                        events.extend(mine)
                        return

        watcher = threading.Thread(target=kill_then_watch, daemon=True)
        watcher.start()
        result = run_load(spec, None, realtime=True)
        watcher.join(timeout=130)
        metrics = httpx.get(f"{gw}/metrics", timeout=10, trust_env=False).text.splitlines()
        info = actor.refresh()
    retries = sum(
        float(ln.rsplit(" ", 1)[1])
        for ln in metrics
        if ln.startswith("evenserve_gateway_retries_total{")
    )
    ejected = next((e for e in events if e["event"] == "ejected"), None)
    admitted = next((e for e in events if e["event"] == "admitted"), None)
    outcomes = Counter(f"{s.outcome} {s.status}" for s in result.samples)
    after_admit = None
    if admitted is not None and result.t0_unix_s is not None:
        admit_rel = t["kill_unix"] + (admitted["t_s"] - t["kill"]) - result.t0_unix_s
        after_admit = sum(1 for s in result.samples if s.backend == victim and s.sent_s > admit_rel)
    return {
        "victim": victim,
        "killed_actor_pid": actor_pid,
        "actor_pid_after": info["actor_pid"],
        "worker_starts_in_actor": info["starts"],
        "requests": len(result.samples),
        "outcomes": dict(sorted(outcomes.items())),
        "no_answer": sum(1 for s in result.samples if s.status == 0),
        "errors": result.errors,
        "gateway_retries": retries,
        "ejected_after_kill_s": None if ejected is None else round(ejected["t_s"] - t["kill"], 3),
        "ejection_reason": None if ejected is None else ejected.get("reason"),
        "readmitted_after_kill_s": (
            None if admitted is None else round(admitted["t_s"] - t["kill"], 3)
        ),
        "served_by_victim_after_readmission": after_admit,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--arm", default="optimized")
    ap.add_argument("--duration-s", type=float, default=45.0)
    ap.add_argument("--warmup-s", type=float, default=5.0)
    ap.add_argument("--time-scale", type=float, default=40.0)
    ap.add_argument("--kill-at-s", type=float, default=15.0)
    ap.add_argument("--victim", default="gpu1")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    console, err = Console(), Console(stderr=True)
    out = Path(tempfile.mkdtemp(prefix="evenserve-ray-seed-"))
    runs: dict[str, dict[str, Any]] = {}
    for label, address in (("local", None), ("ray", "auto")):
        p = plan(args, out / label)
        runs[label] = figures(run_repeat(p, args.arm, 0, console, err, ray_address=address))
    kill = kill_run(plan(args, out / "kill"), args.arm, args.victim, args.kill_at_s)
    console.print(
        f"\nseed scenario, arm {args.arm}, K = {args.time_scale:g}, {args.duration_s:g} s "
        f"per run (warm-up {args.warmup_s:g} s), same seed and load",
        highlight=False,
    )
    console.print(f"{'':<26}{'local processes':>18}{'Ray actors':>14}", highlight=False)
    for key in runs["local"]:
        a, b = runs["local"][key], runs["ray"][key]
        console.print(f"{key:<26}{a!s:>18}{b!s:>14}", highlight=False)
    console.print(f"\nkill: {json.dumps(kill, indent=2)}", highlight=False)
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "kill": kill}, indent=2) + "\n")


if __name__ == "__main__":
    main()
