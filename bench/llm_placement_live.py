"""A sleeping LLM behind a burst, live beside the simulator (issue 29 item 4; design 0022).

    python bench/llm_placement_live.py [--scenario scenarios/llm-morning-live.yaml]
                                       [--seed 1] [--json out.json]

The scenario (``kind: llm-placement``, one device, the LLM alone, one open-loop workload)
runs twice:

- in the simulator (``sim.llm_placement.run_placement_arm``, its only arm);
- live on 127.0.0.1: one ``evenserve worker`` (an emulated device of the scenario's profile
  set, the device's memory the step profile's) whose repository holds the LLM as a ``kind:
  llm`` folder with the scenario's engine and its ``placement:`` section (kv_tokens, cold and
  warm load, capacity: the fields the simulator reads), started as ``evenserve up`` starts a
  worker under placement (``cluster.worker_commands.worker_command``: explicit model control,
  the LLM loaded at the start); and one ``evenserve gateway`` over it with the arm's
  placement (its policy, ``min_switch_s``, host memory; interval 1 s), whose catalogue reads
  the LLM folder (``gateway.placement_catalogue``). The very requests the simulator offers
  (``iter_llm_open_loop``, its seed) are sent through the gateway by the load generator's
  streaming client (``/v1/completions``, prompt as ids, ``ignore_eos``), TTFT counted from
  each request's scheduled time. The LLM router is round robin (one engine: nothing to
  choose), with no TTFT refusals (the simulator has none). A task reads the worker's
  repository index every 20 ms: when the LLM went to sleep (UNLOADING -> UNAVAILABLE) and
  when it was woken (LOADING -> READY), on the client's clock.

Printed for both: the LLM's requests, SLO attainment (TTFT and TPOT targets), TTFT p50 and
p99; the sleep and the wake (when, how long), the shortest gap between two changes of the LLM
on the device; and the burst: the first request of the morning (the one that misses), its
TTFT, the requests that came during the wake, and ``recovered``: from that first request to
the last arrival (within 60 s after the wake) that missed its TTFT target, against the bound
``wake + one step`` (a full token budget of prefill and the CPU of one token, the step
profile's). Live, the wake is what the worker slept (the folder's warm_load_ms) plus the
time until the index read saw it READY (at most 20 ms late).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from evenserve.cluster.file import load_cluster  # noqa: E402
from evenserve.cluster.worker_commands import worker_command  # noqa: E402
from evenserve.core.clock import RealClock  # noqa: E402
from evenserve.core.llm import GenerationRecord, load_step_profiles  # noqa: E402
from evenserve.experiment.llm_pool_live import stop_process, wait_ready  # noqa: E402
from evenserve.loadgen.openai_client import run_open_loop  # noqa: E402
from evenserve.sim.llm_placement import (  # noqa: E402
    burst_figures,
    run_placement_arm,
    summarize_placement,
)
from evenserve.sim.llm_placement_scenario import (  # noqa: E402
    LlmPlacementScenario,
    load_llm_placement_scenario,
)
from evenserve.workload.llm import LlmRequest, iter_llm_open_loop  # noqa: E402

TOKEN = "bench-llm-placement-0123456789"
INDEX_PERIOD_S = 0.02


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


# -- the scenario, checked -----------------------------------------------------------------
def the_arm(sc: LlmPlacementScenario) -> str:
    doc = sc.doc
    if len(doc.arms) != 1 or doc.classic or len(sc.workloads) != 1:
        raise SystemExit("this bench runs a scenario with one arm, one LLM workload, no classic")
    arm = next(iter(doc.arms))
    a = doc.arms[arm]
    if len(a.devices) != 1 or a.autoscaling is not None:
        raise SystemExit("this bench runs one device without autoscaling")
    return arm


def requests_of(sc: LlmPlacementScenario, seed: int) -> list[LlmRequest]:
    """The simulator's requests (``_Pool.start_arrivals``: workload 0's seed)."""
    return list(iter_llm_open_loop(sc.workloads[0], seed, sc.doc.duration_s))


# -- live ----------------------------------------------------------------------------------
def write_cluster(sc: LlmPlacementScenario, arm: str, tmp: Path) -> tuple[Path, int, int]:
    """The LLM folder and the cluster file (a worker device under the gateway's placement)."""
    doc = sc.doc
    llm = doc.llm
    w = sc.workloads[0]
    pset = sc.profile_dir()
    prof = load_step_profiles(pset)[llm.model]
    folder = tmp / "repo" / llm.model
    folder.mkdir(parents=True)
    engine = llm.engine.model_dump(exclude_none=True)
    model = {
        "kind": "llm",
        "runtime": "emulated",
        "priority": llm.priority,
        "ttft_ms": w.ttft_ms,
        "tpot_ms": w.tpot_ms,
        "engine": {k: v for k, v in engine.items() if k != "num_blocks"},
        "placement": llm.placement.model_dump(),
    }
    (folder / "model.yaml").write_text(yaml.safe_dump(model, sort_keys=False))
    a = doc.arms[arm]
    d = a.devices[0]
    gport, wport = free_port(), free_port()
    mem = prof.device_memory_bytes / 1024**3 if d.memory_gib is None else d.memory_gib
    placement = a.placement if isinstance(a.placement, dict) else {"policy": a.placement}
    cluster = {
        "gateway": {
            "port": gport,
            "routing": "round-robin",
            "llm_routing": "round-robin",
            "admin": {"token": TOKEN},
            "overload": {"enabled": False},
            "forward": {"retries": 0},
            "placement": {
                **placement,
                "interval_ms": a.placement_interval_ms,
                "load_wait_ms": 60_000,
                "host_memory_gb": a.host_memory_gib,
                "min_switch_s": a.min_switch_s,
            },
        },
        "workers": {
            "repo": "repo",
            "devices": [
                {
                    "name": d.name,
                    "device": f"emulated:{pset}",
                    "port": wport,
                    "models": list(d.models),
                    "memory_gb": round(mem, 6),
                }
            ],
        },
    }
    path = tmp / "cluster.yaml"
    path.write_text(yaml.safe_dump(cluster, sort_keys=False))
    return path, gport, wport


async def watch_index(
    url: str, model: str, clock: RealClock, origin: list[float], out: list[tuple[float, str]]
) -> None:
    """The LLM's state on the worker, each change with its time (seconds from ``origin``)."""
    last = None
    async with httpx.AsyncClient(base_url=url, timeout=5) as c:
        while True:
            with contextlib.suppress(httpx.HTTPError):
                index = (await c.post("/v2/repository/index")).json()
                st = next((m["state"] for m in index if m["name"] == model), None)
                if st != last and st is not None:
                    out.append((clock.now() - origin[0], st))
                    last = st
            await asyncio.sleep(INDEX_PERIOD_S)


async def drive(
    gurl: str, wurl: str, model: str, reqs: list[LlmRequest]
) -> tuple[list[GenerationRecord], list[tuple[float, str]], dict[str, Any]]:
    clock = RealClock()
    origin = [clock.now()]
    states: list[tuple[float, str]] = []
    watcher = asyncio.create_task(watch_index(wurl, model, clock, origin, states))
    try:
        origin[0] = clock.now()
        records = await run_open_loop(gurl, reqs, clock, timeout_s=120.0)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    async with httpx.AsyncClient(base_url=gurl, timeout=10) as c:
        view = (
            await c.get("/admin/placement", headers={"authorization": f"Bearer {TOKEN}"})
        ).json()
    return records, states, view


def live_run(sc: LlmPlacementScenario, arm: str, seed: int) -> dict[str, Any]:
    reqs = requests_of(sc, seed)
    with tempfile.TemporaryDirectory(prefix="llm-placement-live-") as t:
        tmp = Path(t)
        path, gport, wport = write_cluster(sc, arm, tmp)
        cluster = load_cluster(path)
        settings = cluster.config.gateway.placement_settings()
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        wcmd, wenv = worker_command(cluster, 0, sys.executable, env, TOKEN, settings, [])
        procs: list[subprocess.Popen[bytes]] = []
        try:
            wlog = tmp / "worker.log"
            with wlog.open("wb") as out:
                procs.append(subprocess.Popen(wcmd, stdout=out, stderr=subprocess.STDOUT,
                                              env=wenv))  # fmt: skip
            wurl = f"http://127.0.0.1:{wport}"
            wait_ready([(procs[0], wurl, wlog)], "/v2/health/ready")
            glog = tmp / "gateway.log"
            gcmd = [sys.executable, "-m", "evenserve", "gateway", "--config", str(path)]
            with glog.open("wb") as out:
                procs.append(subprocess.Popen(gcmd, stdout=out, stderr=subprocess.STDOUT,
                                              env=env))  # fmt: skip
            gurl = f"http://127.0.0.1:{gport}"
            wait_ready([(procs[1], gurl, glog)], "/v2/health/ready")
            time.sleep(1.0)  # the gateway's first index and load reads
            cpu0 = {p.pid: _cpu_s(p.pid) for p in procs}
            t0 = time.process_time()
            records, states, view = asyncio.run(drive(gurl, wurl, sc.doc.llm.model, reqs))
            cpu = {
                "worker_cpu_s": _cpu_s(procs[0].pid) - cpu0[procs[0].pid],
                "gateway_cpu_s": _cpu_s(procs[1].pid) - cpu0[procs[1].pid],
                "client_cpu_s": time.process_time() - t0,
            }
        finally:
            for p in reversed(procs):
                stop_process(p)
    return {"records": records, "states": states, "view": view, "cpu": cpu}


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (its /proc stat; 0.0 if unreadable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- figures -------------------------------------------------------------------------------
def one_step_s(sc: LlmPlacementScenario) -> float:
    prof = load_step_profiles(sc.profile_dir())[sc.doc.llm.model]
    budget = sc.doc.llm.engine.max_num_batched_tokens or 2048
    return prof.step_s(budget, 0, 0) + prof.cpu_s_per_output_token


def figures(
    records: list[GenerationRecord],
    sleep: tuple[float, float] | None,
    wake: tuple[float, float] | None,
    target_s: float,
    step_s: float,
) -> dict[str, Any]:
    """The figures of one side (the module docstring), from its records, its sleep (start,
    end) and its wake (start, end)."""
    ttfts = [r.ttft_s for r in records if r.ttft_s is not None]
    met = sum(1 for r in records if r.met_targets())
    out: dict[str, Any] = {
        "requests": len(records),
        "completed": sum(1 for r in records if r.outcome == "completed"),
        "attainment": met / len(records) if records else None,
        "ttft_p50_s": pct(ttfts, 0.5),
        "ttft_p99_s": pct(ttfts, 0.99),
        "sleep": sleep,
        "wake": wake,
    }
    if sleep is None or wake is None:
        return out
    after = sorted((r for r in records if r.scheduled_s >= sleep[1]), key=lambda r: r.scheduled_s)
    if not after:
        return out
    first = after[0]
    wake_s = wake[1] - wake[0]
    window = [r for r in after if r.scheduled_s < wake[1] + 60.0]
    missed = [
        r.scheduled_s
        for r in window
        if r.outcome != "completed" or r.ttft_s is None or r.ttft_s > target_s
    ]
    later = [r for r in window if r.scheduled_s >= wake[1] + step_s]
    out.update(
        first_at_s=first.scheduled_s,
        first_ttft_s=first.ttft_s,
        wake_s=wake_s,
        gap_s=wake[0] - sleep[0],
        during_wake=sum(1 for r in after if r.scheduled_s < wake[1]),
        recovered_s=(max(missed) - first.scheduled_s) if missed else 0.0,
        bound_s=wake_s + step_s,
        after=len(later),
        after_met=(
            sum(1 for r in later if r.ttft_s is not None and r.ttft_s <= target_s) / len(later)
            if later
            else None
        ),
    )
    return out


def live_transitions(
    states: list[tuple[float, str]],
) -> tuple[tuple[float, float] | None, tuple[float, float] | None]:
    """The first sleep (UNLOADING seen -> UNAVAILABLE seen; a sleep faster than the index
    period shows as UNAVAILABLE straight from READY: both ends at that read) and the first
    wake after it (LOADING -> READY)."""
    sleep = wake = None
    for i, (t, st) in enumerate(states):
        prev = states[i - 1] if i else None
        if sleep is None and st == "UNAVAILABLE" and prev is not None:
            sleep = (prev[0] if prev[1] == "UNLOADING" else t, t)
        elif sleep is not None and wake is None and st == "READY" and prev is not None:
            wake = (prev[0] if prev[1] == "LOADING" else t, t)
    return sleep, wake


def sim_transitions(log: list[tuple[float, str, str, str]], wake_s: float, unload_s: float) -> Any:
    unloads = [t for t, _, _, k in log if k == "unload"]
    loads = [t for t, _, _, k in log if k == "load"]
    sleep = (unloads[0], unloads[0] + unload_s) if unloads else None
    wake = (loads[0], loads[0] + wake_s) if loads else None
    return sleep, wake


def fmt(v: Any, nd: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    if isinstance(v, tuple):
        return "(" + ", ".join(fmt(x, nd) for x in v) + ")"
    return str(v)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenario", type=Path, default=ROOT / "scenarios" / "llm-morning-live.yaml")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--sim-only", action="store_true", help="the simulator's figures only")
    args = ap.parse_args()
    sc = load_llm_placement_scenario(args.scenario)
    arm = the_arm(sc)
    seed = sc.doc.seed if args.seed is None else args.seed
    target = (sc.workloads[0].ttft_ms or 1000.0) / 1e3
    step = one_step_s(sc)
    run = run_placement_arm(sc, arm, seed)
    summary = summarize_placement(sc, run)
    llm_records = [r for r in run.records if r.model == sc.doc.llm.model]
    ssleep, swake = sim_transitions(
        run.counts.switch_log, sc.doc.llm.warm_load_ms / 1e3, sc.doc.arms[arm].unload_ms / 1e3
    )
    sim = figures(llm_records, ssleep, swake, target, step)
    sim["shortest_switch_gap_s"] = summary["shortest_switch_gap_s"]
    sim["bursts"] = burst_figures(run, target, run.budget_tokens)
    rows: dict[str, dict[str, Any]] = {"sim": sim}
    if not args.sim_only:
        live = live_run(sc, arm, seed)
        lsleep, lwake = live_transitions(live["states"])
        lv = figures(live["records"], lsleep, lwake, target, step)
        lv["shortest_switch_gap_s"] = (
            None if lsleep is None or lwake is None else (lwake[0] - lsleep[0])
        )
        lv["states"] = live["states"]
        lv["cpu"] = live["cpu"]
        lv["placement_counts"] = live["view"].get("counts")
        rows["live"] = lv
    keys = [
        "requests", "completed", "attainment", "ttft_p50_s", "ttft_p99_s", "sleep", "wake",
        "shortest_switch_gap_s", "first_at_s", "first_ttft_s", "wake_s", "during_wake",
        "recovered_s", "bound_s", "after", "after_met",
    ]  # fmt: skip
    print(f"{args.scenario.name} seed {seed}, arm {arm}, TTFT target {target:g} s, "
          f"one step {step * 1e3:.1f} ms")  # fmt: skip
    print("| figure | " + " | ".join(rows) + " |")
    print("|---|" + "---|" * len(rows))
    for k in keys:
        print(f"| {k} | " + " | ".join(fmt(r.get(k)) for r in rows.values()) + " |")
    for side, r in rows.items():
        if "recovered_s" in r:
            ok = r["recovered_s"] <= r["bound_s"]
            print(f"{side}: every request met {target:g} s from {r['recovered_s']:.3f} s after "
                  f"the first of the burst (bound: wake + one step = {r['bound_s']:.3f} s): "
                  f"{'met' if ok else 'NOT met'}")  # fmt: skip
        gap = r.get("shortest_switch_gap_s")
        if gap is not None:
            print(f"{side}: sleep to wake {gap:.3f} s (min_switch_s "
                  f"{sc.doc.arms[arm].min_switch_s:g})")  # fmt: skip
    if "live" in rows:
        print("live CPU seconds over the run:", json.dumps(rows["live"]["cpu"]))
        print("live placement counts:", json.dumps(rows["live"]["placement_counts"]))
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
