"""Several gateways in front of the same workers, without herding (design 0013).

    .venv/bin/python bench/gateways_herding.py            # simulator, then live
    .venv/bin/python bench/gateways_herding.py --sim-only

Simulator. The seed scenario (arms least-expected-work and optimized) and
scenarios/gateways-burst.yaml (2x bursts; least-expected-work, queue-aware), each run behind
1 gateway, 2 naive gateways (each router counts only its own sends: ``gateway_replicas: 1``)
and 2 gateways that count their peers (``gateways: 2``, each router assuming 2). Two report
phases: staggered (gateway g hears the devices g * interval / 2 after the other) and the
same phase (both hear every report at once: the worst case for herding). Figures: P99, its
ratio to 1 gateway, and the herding share (experiment.herding: per 100 ms window, the most a
backend took over its fair part; ``p99`` over windows with >= 2 sends per host).

Live. The seed scenario K times slower (``--time-scale``, 40), arm ``--arm``
(least-expected-work), then gateways-burst K = ``--burst-time-scale`` (4) times slower for
50 s (two of its 2x bursts): the workers and a gateway started as ``evenserve bench`` starts
them (experiment.cluster), with ``gateway.reuse_port: true``; for the 2-gateway runs a
second ``evenserve gateway`` process on the same port, the kernel splitting the load
generator's connections between them, with ``gateway.replicas: 1`` (naive) or ``2``
(aware). The same load each time (same seed). Figures: P99 and the herding share from the
load generator's samples (each records the backend that answered it, from the gateway's
response header).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from evenserve.cluster.admin_token import DEFAULT_TOKEN_ENV
from evenserve.experiment.cluster import arm_cluster, write_arm_cluster, write_profile_sets
from evenserve.experiment.herding import model_hosts, run_herding, with_gateways
from evenserve.experiment.load import scenario_load_spec
from evenserve.experiment.scaling import scale_scenario
from evenserve.loadgen.records import RunLabels, result_records
from evenserve.loadgen.runner import run_load
from evenserve.report.summary import summarize
from evenserve.sim.cluster import simulate
from evenserve.sim.loader import LoadedScenario, load_scenario

ROOT = Path(__file__).resolve().parents[1]

#: (label, gateways, replicas each router assumes (None: the real count)).
VARIANTS = [("1 gateway", 1, None), ("2 naive", 2, 1), ("2 aware", 2, None)]


def p99_ms(rec: Any) -> float:
    return float(summarize(rec, timeseries=False)["latency_ms"]["p99"])


def sim_part(duration_s: float) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    cases = [
        ("seed.yaml", ["least-expected-work", "optimized"]),
        ("gateways-burst.yaml", ["least-expected-work", "queue-aware"]),
    ]
    for file, arms in cases:
        overrides = [] if file != "seed.yaml" else [f"duration_s={duration_s:g}"]
        loaded = load_scenario(ROOT / "scenarios" / file, overrides)
        for arm in arms:
            hosts = model_hosts(loaded, arm)
            base: tuple[float, Any] | None = None
            for phase, offsets in (("staggered", None), ("same phase", [0.0, 0.0])):
                for label, n, replicas in VARIANTS:
                    if n == 1 and phase != "staggered":
                        continue
                    rec = simulate(
                        with_gateways(loaded, arm, n, replicas, offsets if n > 1 else None), arm
                    )
                    p99 = p99_ms(rec)
                    if n == 1:
                        base = (p99, run_herding(rec, hosts))
                    assert base is not None
                    h = run_herding(rec, hosts)
                    row = {
                        "scenario": loaded.scenario.name,
                        "arm": arm,
                        "gateways": label,
                        "reports": phase if n > 1 else "-",
                        "p99_ms": round(p99, 3),
                        "p99_vs_1": round(p99 / base[0], 3),
                        "share_p99": round(h.p99, 3),
                        "share_peak": round(h.peak, 3),
                    }
                    rows.append(row)
                    print(
                        f"  {row['scenario']:<15} {arm:<20} {label:<10} {row['reports']:<10} "
                        f"P99 {p99:7.2f} ms ({row['p99_vs_1']:.2f}x)  share p99 "
                        f"{h.p99:.2f} peak {h.peak:.2f}",
                        flush=True,
                    )
    return rows


def listeners(port: int) -> int:
    """Sockets listening on 127.0.0.1:``port`` (each SO_REUSEPORT one is its own line)."""
    n = 0
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            parts = line.split()
            local, state = parts[1], parts[3]
            if state == "0A" and int(local.split(":")[1], 16) == port:
                n += 1
    return n


def live_run(
    scaled: LoadedScenario,
    arm: str,
    gateways: int,
    profile_dirs: dict[str, Path],
    work: Path,
    replicas: int | None = None,
) -> dict[str, Any]:
    sc = scaled.scenario
    seed = sc.seed
    cluster_path = write_arm_cluster(
        scaled, arm, ROOT / "examples/models/emulated", work, profile_dirs, seed
    )
    raw = yaml.safe_load(cluster_path.read_text())
    raw["gateway"]["reuse_port"] = True
    raw["gateway"]["replicas"] = gateways if replicas is None else replicas
    cluster_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    port = int(raw["gateway"]["port"])
    spec = scenario_load_spec(scaled, seed, 1_000_000, 30.0)
    extra: subprocess.Popen[bytes] | None = None
    with arm_cluster(cluster_path, work / "logs", say=lambda s: None) as la:
        try:
            if gateways > 1:
                env = {**os.environ, DEFAULT_TOKEN_ENV: la.admin_token}
                log = (work / "logs" / "gateway-2.log").open("wb")
                extra = subprocess.Popen(
                    [sys.executable, "-m", "evenserve", "gateway", "--config", str(cluster_path)],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
                deadline = time.monotonic() + 60
                while listeners(port) < 2:
                    if time.monotonic() > deadline or extra.poll() is not None:
                        raise RuntimeError("the second gateway did not listen")
                    time.sleep(0.2)
                time.sleep(1.0)  # its first load reports
            spec.target = la.gateway.url if la.gateway else ""
            result = run_load(spec, None)
        finally:
            if extra is not None:
                extra.terminate()
                extra.wait(timeout=15)
    labels = RunLabels(
        scenario=sc.name,
        arm=arm,
        routing=str(sc.arms[arm].routing),
        batching="",
        seed=seed,
        slo_ms={m: v.slo_ms for m, v in sc.models.items()},
    )
    rec = result_records(result, labels)
    s = summarize(rec, timeseries=False)
    h = run_herding(rec, model_hosts(scaled, arm))
    return {
        "gateways": gateways,
        "replicas": gateways if replicas is None else replicas,
        "p99_ms": s["latency_ms"]["p99"],
        "p50_ms": s["latency_ms"]["p50"],
        "throughput_rps": s["throughput_rps"],
        "requests": len(rec.requests),
        "share_p99": round(h.p99, 3),
        "share_peak": round(h.peak, 3),
        "windows": h.windows,
    }


def live_part(
    scenario: str, arm: str, k: float, duration_s: float, warmup_s: float
) -> list[dict[str, Any]]:
    """1 gateway, 2 naive and 2 aware gateways live on ``scenario`` K times slower."""
    loaded = load_scenario(ROOT / "scenarios" / f"{scenario}.yaml")
    work = Path(tempfile.mkdtemp(prefix="evenserve-gateways-"))
    scaled = scale_scenario(loaded, k, duration_s, warmup_s, work)
    dirs = write_profile_sets(scaled, work)
    rows = []
    base = None
    for label, n, replicas in VARIANTS:
        w = work / f"{label.replace(' ', '-')}"
        w.mkdir()
        r = live_run(scaled, arm, n, dirs, w, replicas)
        r["scenario"], r["variant"] = scenario, label
        base = r["p99_ms"] if base is None else base
        r["p99_vs_1"] = round(r["p99_ms"] / base, 3)
        rows.append(r)
        print(
            f"  live {scenario} K={k:g} {arm} {label}: P99 {r['p99_ms']:.1f} ms "
            f"({r['p99_vs_1']:.2f}x), P50 {r['p50_ms']:.1f} ms, {r['throughput_rps']:.1f} "
            f"req/s, share p99 {r['share_p99']:.2f} peak {r['share_peak']:.2f} "
            f"({r['windows']} windows)",
            flush=True,
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sim-only", action="store_true")
    ap.add_argument("--live-only", action="store_true")
    ap.add_argument("--seed-duration", type=float, default=40.0, help="simulated seed seconds")
    ap.add_argument("--arm", default="least-expected-work")
    ap.add_argument("--time-scale", type=float, default=40.0, help="the seed's K")
    ap.add_argument("--duration", type=float, default=45.0, help="live seconds per seed run")
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument(
        "--burst-time-scale",
        type=float,
        default=4.0,
        help="gateways-burst's K (0: skip it live); its runs last 50 s: two 2x bursts",
    )
    ap.add_argument("--json", type=Path, help="write the figures here")
    a = ap.parse_args()
    out: dict[str, Any] = {}
    if not a.live_only:
        print("simulator:", flush=True)
        out["sim"] = sim_part(a.seed_duration)
    if not a.sim_only:
        print("live:", flush=True)
        out["live"] = live_part("seed", a.arm, a.time_scale, a.duration, a.warmup)
        if a.burst_time_scale > 0:
            k = a.burst_time_scale
            out["live"] += live_part("gateways-burst", "least-expected-work", k, 50.0, 4.0 * k)
    if a.json:
        a.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
