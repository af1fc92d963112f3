"""LLMs in the pools live: a whole day and night, the autoscaler turning devices on and off
around an LLM engine, beside the simulator (issue 29 item 4; design note 0022).

    python bench/llm_pools_night_live.py [--scenario scenarios/llm-pools-night.yaml]
        [--arm cost-aware] [--time-scale 2] [--seed 1] [--sim-only] [--json out.json]

The scenario (``kind: llm-placement``) is run K times slower (``--time-scale``; the host's two
cores cannot serve its 1,000 classic requests a second and the LLM's streams at once):
``scaled``: durations, phases and every time in it K times longer, every rate K times lower,
prompt ids drawn below 256 (the emulated worker's byte tokenizer takes those as ids),
the profile set's step and batch times K times longer; the arm's placement and autoscaling
parameters too (seconds x K, requests a second / K, each policy's defaults made explicit
first). Only the controller's demand-estimate time constants (10 s and 0.5 s) stay as they
are, on both sides. The simulator (``sim.llm_placement.run_placement_arm``) runs that scaled
scenario; live runs it on 127.0.0.1:

- ``evenserve up``'s Launcher (``experiment.cluster.arm_cluster``) starts one emulated worker
  per device of the arm that is on at the start (the device's memory the step profile's) and
  the gateway, and carries out the autoscaler's ScaleUp / ScaleDown (workers started and
  stopped), as ``evenserve up`` does. The repository holds the LLM as a ``kind: llm`` folder
  with its engine and ``placement:`` section (the fields the simulator reads) and each classic
  model as an emulated folder (its batching, its load and wake times; tiny tensors: the
  profile sets a batch's time).
- The gateway runs the arm's placement (interval, host memory, anti-thrash window) and
  autoscaling; classic requests are routed by ``least-connections`` (the simulator sends each
  to the host with the fewest of that model's requests outstanding), the LLM's by
  ``least-outstanding``, the LLM router's policy of the simulator's rule (the engine with
  the fewest of the router's requests in flight, ties by name). (Round robin, used before
  it existed, loaded a device holding the LLM and both classic models as much as one with
  the LLM alone in the spike: design 0022.)
- The load: the very arrivals the simulator offers, sent through the gateway at their times
  from one t = 0. The LLM's (``iter_llm_open_loop``, its seed) by the streaming client
  (``/v1/completions``, prompt as ids, ``ignore_eos``), TTFT from each request's scheduled
  time; each classic stream's Poisson arrivals (``arrivals_rng(seed, "classic:STREAM")``) as
  KServe v2 requests with the stream's class (``x-evenserve-priority``), latency from the
  scheduled time.

Figures, both sides the same way (``side_figures``): device-seconds over ``[0, duration)``
and per phase of the scenario (live: the gateway's ``device_active_seconds`` counters read at
each phase edge); SLO attainment over ``[warmup, duration)`` (the LLM's: TTFT and TPOT
targets; each classic stream's: within its SLO); TTFT P50 / P99; loads, evictions, scale-ups
and -downs; the shortest time between two changes of one model on one device, and the pairs
of changes closer than the arm's ``min_switch_s``; the morning (the LLM's traffic back after
its idle phase): from its first request to the last one within 60 s (x K) that missed its
TTFT target, against the wake plus one full-budget step. Then live / simulated per figure
(within 15 % or not) and where the two runs' placement decisions part
(``experiment.placement_figures.compare_decisions``). The live run goes first: the simulator
then replays its gateway's controller clock (``/admin/placement``: when its demand estimates
started, when its rebalance and autoscaler ticks fell against t = 0), so that the two sides
tick at the same times.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from evenserve.core.clock import RealClock  # noqa: E402
from evenserve.core.llm import GenerationRecord, load_step_profiles  # noqa: E402
from evenserve.core.profile import load_profile_set  # noqa: E402
from evenserve.core.scenario import default_load_times_s  # noqa: E402
from evenserve.experiment.cluster import arm_cluster, free_port  # noqa: E402
from evenserve.experiment.llm_live import (  # noqa: E402
    BYTE_VOCAB,
    _scale_ms,
    engine_section,
    scale_profile_set,
)
from evenserve.experiment.placement_figures import (  # noqa: E402
    compare_decisions,
    live_decisions,
    live_placement_clock,
    parse_placement_metrics,
)
from evenserve.loadgen.openai_client import run_open_loop  # noqa: E402
from evenserve.policy.placement import AUTOSCALING, PLACEMENT  # noqa: E402
from evenserve.sim.llm import engine_setup  # noqa: E402
from evenserve.sim.llm_placement import run_placement_arm, switch_gaps  # noqa: E402
from evenserve.sim.llm_placement_scenario import (  # noqa: E402
    LlmPlacementScenario,
    load_llm_placement_scenario,
)
from evenserve.sim.placement import PlacementClock  # noqa: E402
from evenserve.workload.llm import LlmRequest, iter_llm_open_loop  # noqa: E402
from evenserve.workload.poisson import PoissonProcess  # noqa: E402
from evenserve.workload.seeding import arrivals_rng  # noqa: E402

TOKEN = "bench-llm-pools-night-0123456789"
BOUND = 0.15
CLASSIC_BODY = json.dumps(
    {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0.0] * 4}]}
).encode()
ACTIVE = "evenserve_gateway_device_active_seconds"


# -- the scenario K times slower ----------------------------------------------------------
def _scale_policy(spec: dict[str, Any], k: float) -> dict[str, Any]:
    """A policy's parameters (defaults made explicit) K times slower: seconds x K, requests
    a second / K; None stays None."""
    out: dict[str, Any] = {}
    for key, v in spec.items():
        if isinstance(v, int | float) and not isinstance(v, bool):
            if key.endswith("_s") or key.endswith("_ms"):
                v = float(v) * k
            elif "rps" in key:
                v = float(v) / k
        out[key] = v
    return out


def scaled(sc: LlmPlacementScenario, k: float, profile_dir: Path) -> LlmPlacementScenario:
    """``sc`` K times slower on ``profile_dir`` (its profile set, already scaled)."""
    raw = sc.doc.model_dump()
    classic_profiles = load_profile_set(sc.profile_dir())
    raw["profiles"] = str(profile_dir.resolve())
    for key in ("duration_s", "warmup_s", "drain_s"):
        raw[key] = float(raw[key]) * k
    llm = raw["llm"]
    _scale_ms(llm, k)
    for w in llm["workloads"]:
        # Prompt ids the emulated worker's byte tokenizer takes as ids.
        w["vocab"] = min(int(w.get("vocab", BYTE_VOCAB)), BYTE_VOCAB)
        if w.get("rate_rps") is not None:
            w["rate_rps"] = float(w["rate_rps"]) / k
        for ph in w.get("phases") or []:
            ph["start_s"], ph["end_s"] = float(ph["start_s"]) * k, float(ph["end_s"]) * k
        _scale_ms(w, k)
    for c in raw["classic"]:
        c["rate_rps"] = float(c["rate_rps"]) / k
        for ph in c.get("phases") or []:
            ph["start_s"], ph["end_s"] = float(ph["start_s"]) * k, float(ph["end_s"]) * k
        cold, warm = default_load_times_s(classic_profiles[c["model"]].weights_bytes)
        c["cold_load_ms"] = c["cold_load_ms"] if c["cold_load_ms"] is not None else cold * 1e3
        c["warm_load_ms"] = c["warm_load_ms"] if c["warm_load_ms"] is not None else warm * 1e3
        _scale_ms(c, k)
        _scale_ms(c["batching"], k)
    for name, a in raw["arms"].items():
        where = f"arms.{name}"
        a["placement"] = _scale_policy(PLACEMENT.resolved(a["placement"], f"{where}.placement"), k)
        if a.get("autoscaling") is not None:
            a["autoscaling"] = _scale_policy(
                AUTOSCALING.resolved(a["autoscaling"], f"{where}.autoscaling"), k
            )
        for key in ("placement_interval_ms", "unload_ms", "min_switch_s"):
            a[key] = float(a[key]) * k
        for d in a["devices"]:
            d["start_ms"] = float(d["start_ms"]) * k
    return LlmPlacementScenario(type(sc.doc).model_validate(raw), sc.source, sc.base_dir)


def llm_requests(sc: LlmPlacementScenario, seed: int) -> list[LlmRequest]:
    """The simulator's LLM requests (``_Pool.start_arrivals``: workload k's seed + 1000 k)."""
    out: list[LlmRequest] = []
    for k, wl in enumerate(sc.workloads):
        out += iter_llm_open_loop(wl, seed + 1000 * k, sc.doc.duration_s)
    return sorted(out, key=lambda r: r.arrival_s)


@dataclass(frozen=True, slots=True)
class ClassicArrival:
    t_s: float
    stream: str
    model: str
    priority: int
    slo_s: float


def classic_arrivals(sc: LlmPlacementScenario, seed: int) -> list[ClassicArrival]:
    """Each classic stream's arrivals, as the simulator draws them (``_Pool._classic``)."""
    out: list[ClassicArrival] = []
    end = sc.doc.duration_s
    for c in sc.doc.classic:
        proc = PoissonProcess(c.rate_rps, c.phases, arrivals_rng(seed, f"classic:{c.stream}"))
        t = proc.next_after(0.0)
        while t < end:
            out.append(ClassicArrival(t, c.stream, c.model, c.priority, c.slo_ms / 1e3))
            t = proc.next_after(t)
    return sorted(out, key=lambda a: a.t_s)


def phase_edges(sc: LlmPlacementScenario) -> list[float]:
    """0, every phase edge of every stream within the run, and the duration."""
    doc = sc.doc
    edges = {0.0, doc.duration_s}
    for w in sc.workloads:
        for p in w.phases:
            edges |= {p.start_s, p.end_s}
    for c in doc.classic:
        for p in c.phases:
            edges |= {p.start_s, p.end_s}
    return sorted(e for e in edges if 0.0 <= e <= doc.duration_s)


# -- live ----------------------------------------------------------------------------------
def write_cluster(sc: LlmPlacementScenario, arm: str, tmp: Path) -> Path:
    """The repository (the LLM folder, each classic model's) and the cluster file."""
    doc = sc.doc
    llm = doc.llm
    a = doc.arms[arm]
    pdir = sc.profile_dir()
    prof = load_step_profiles(pdir)[llm.model]
    repo = tmp / "repo"
    tpots = [w.tpot_ms for w in sc.workloads if w.tpot_ms is not None]
    ttfts = [w.ttft_ms for w in sc.workloads if w.ttft_ms is not None]
    setup = engine_setup(llm.engine, prof, min(tpots) / 1e3 if tpots else None)
    models: dict[str, dict[str, Any]] = {
        llm.model: {
            "kind": "llm",
            "runtime": "emulated",
            "description": f"{llm.model} of {doc.name} (emulated engine steps)",
            "tokenizer": "byte",
            "priority": llm.priority,
            "ttft_ms": min(ttfts) if ttfts else None,
            "tpot_ms": min(tpots) if tpots else None,
            "engine": engine_section(setup, None),
            "placement": llm.placement.model_dump(),
        }
    }
    for c in doc.classic:
        if c.model in models:
            continue  # the first stream of a model gives its settings (as the simulator)
        slo = min(s.slo_ms for s in doc.classic if s.model == c.model)
        models[c.model] = {
            "runtime": "emulated",
            "description": f"{c.model} (emulated; tiny tensors: the profile sets the time)",
            "max_batch_size": c.max_batch_size,
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [2]}],
            "batching": {**c.batching, "max_batch_size": c.max_batch_size},
            "slo_ms": slo,
            "emulated": {
                "profile_name": c.model,
                "load_ms": c.cold_load_ms,
                "warm_load_ms": c.warm_load_ms,
            },
        }
    for m, cfg in models.items():
        (repo / m).mkdir(parents=True)
        (repo / m / "model.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    ports: set[int] = set()
    devices = []
    for d in a.devices:
        mem = prof.device_memory_bytes / 1024**3 if d.memory_gib is None else d.memory_gib
        entry: dict[str, Any] = {
            "name": d.name,
            "device": f"emulated:{pdir}",
            "port": free_port(ports),
            "memory_gb": round(mem, 6),
            "extra_args": ["--log-level", "warning"],
        }
        entry.update({"models": list(d.models)} if d.active else {"active": False})
        devices.append(entry)
    placement = dict(a.placement) if isinstance(a.placement, dict) else {"policy": a.placement}
    gateway: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": free_port(ports),
        "routing": "least-connections",
        "llm_routing": "least-outstanding",
        "seed": doc.seed,
        "admin": {"token": TOKEN},
        "overload": {"enabled": False},
        "forward": {"retries": 0},
        "placement": {
            **placement,
            "interval_ms": a.placement_interval_ms,
            # The simulator parks a request for as long as its load takes.
            "load_wait_ms": max(llm.cold_load_ms, 60_000.0) * 2,
            "host_memory_gb": a.host_memory_gib,
            "min_switch_s": a.min_switch_s,
        },
    }
    if a.autoscaling is not None:
        gateway["autoscaling"] = a.autoscaling
    cluster = {
        "name": f"bench-{doc.name}-{arm}",
        "gateway": gateway,
        "workers": {
            "repo": str(repo.resolve()),
            "devices": devices,
            "ready_timeout_s": 120,
            "drain_timeout_s": 5,
            "restart": False,
        },
    }
    path = tmp / "cluster.yaml"
    path.write_text(yaml.safe_dump(cluster, sort_keys=False))
    return path


@dataclass
class ClassicRecord:
    t_s: float
    stream: str
    outcome: str
    latency_s: float | None
    slo_s: float


@dataclass
class LiveRun:
    records: list[GenerationRecord] = field(default_factory=list)
    classic: list[ClassicRecord] = field(default_factory=list)
    #: The gateway's device active seconds (summed) read at each phase edge: (t, seconds).
    active_at: list[tuple[float, float]] = field(default_factory=list)
    view: dict[str, Any] = field(default_factory=dict)
    #: (t, {device: utilization}): what the controller held for each device on, sampled
    #: every placement interval.
    utilization: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    t0_unix_s: float = 0.0
    send_late_s: list[float] = field(default_factory=list)


async def _active_seconds(s: aiohttp.ClientSession, url: str) -> float:
    async with s.get(f"{url}/metrics") as r:
        text = await r.text()
    return float(parse_placement_metrics(text)["device_seconds"])


async def drive(
    url: str,
    sc: LlmPlacementScenario,
    arm: str,
    reqs: list[LlmRequest],
    arrivals: list[ClassicArrival],
    progress: bool = True,
) -> LiveRun:
    clock = RealClock()
    run = LiveRun()
    sent, bad = [0], [0]
    conn = aiohttp.TCPConnector(limit=512, force_close=False)
    timeout = aiohttp.ClientTimeout(total=max(120.0, sc.doc.drain_s))
    auth = {"authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as s:
        origin = clock.now()
        run.t0_unix_s = time.time()

        async def until(t: float) -> None:
            dt = origin + t - clock.now()
            if dt > 0:
                await asyncio.sleep(dt)

        async def one(a: ClassicArrival) -> None:
            headers = {"content-type": "application/json"}
            if a.priority != 0:
                headers["x-evenserve-priority"] = str(a.priority)
            try:
                async with s.post(
                    f"{url}/v2/models/{a.model}/infer", data=CLASSIC_BODY, headers=headers
                ) as r:
                    await r.read()
                    outcome = "completed" if r.status == 200 else f"http-{r.status}"
            except (TimeoutError, aiohttp.ClientError) as exc:
                outcome = type(exc).__name__
            done = clock.now() - origin
            lat = done - a.t_s if outcome == "completed" else None
            bad[0] += outcome != "completed"
            run.classic.append(ClassicRecord(a.t_s, a.stream, outcome, lat, a.slo_s))

        async def classic() -> None:
            tasks = set()
            for a in arrivals:
                await until(a.t_s)
                run.send_late_s.append(clock.now() - origin - a.t_s)
                sent[0] += 1
                t = asyncio.create_task(one(a))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.gather(*tasks)

        async def meter() -> None:
            for e in phase_edges(sc):
                await until(e)
                with contextlib.suppress(aiohttp.ClientError):
                    run.active_at.append((e, await _active_seconds(s, url)))

        async def sample() -> None:
            """The utilization the controller holds for each device on, every interval."""
            every = sc.doc.arms[arm].placement_interval_ms / 1e3
            t = every
            while t < sc.doc.duration_s:
                await until(t)
                with contextlib.suppress(aiohttp.ClientError, ValueError):
                    async with s.get(f"{url}/admin/placement", headers=auth) as r:
                        devs = (await r.json())["devices"]
                    run.utilization.append(
                        (
                            t,
                            {
                                n: float(d["utilization"] or 0.0)
                                for n, d in devs.items()
                                if d["active"] and not d["starting"]
                            },
                        )
                    )
                t += every

        async def llm() -> list[GenerationRecord]:
            return await run_open_loop(url, reqs, clock, timeout_s=max(120.0, sc.doc.drain_s))

        async def show(bar: Progress, task: TaskID) -> None:
            while True:
                await asyncio.sleep(1.0)
                at = run.active_at[-1] if run.active_at else None
                bar.update(
                    task,
                    completed=min(clock.now() - origin, sc.doc.duration_s),
                    info=f"classic sent {sent[0]}, answered {len(run.classic)} ({bad[0]} not 200)"
                    + ("" if at is None else f"; device-seconds {at[1]:.0f} at {at[0]:g} s"),
                )

        meter_task = asyncio.create_task(meter())
        sampler = asyncio.create_task(sample())
        with Progress(
            TextColumn("live"),
            BarColumn(),
            TextColumn("{task.completed:.0f}/{task.total:.0f} s {task.fields[info]}"),
            console=Console(stderr=True),
            disable=not progress,
        ) as bar:
            shower = asyncio.create_task(show(bar, bar.add_task("live", total=sc.doc.duration_s,
                                                                info="")))  # fmt: skip
            try:
                run.records, _ = await asyncio.gather(llm(), classic())
            finally:
                shower.cancel()
        await meter_task
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        async with s.get(f"{url}/admin/placement", headers=auth) as r:
            run.view = await r.json()
    return run


def live_run(
    sc: LlmPlacementScenario, arm: str, seed: int, keep: Path | None, progress: bool = True
) -> LiveRun:
    with tempfile.TemporaryDirectory(prefix="llm-pools-live-") as t:
        tmp = Path(t)
        path = write_cluster(sc, arm, tmp)
        logs = (keep or tmp) / "logs"
        with arm_cluster(path, logs, say=lambda m: print(m, file=sys.stderr)) as la:
            assert la.gateway is not None
            time.sleep(1.0)  # the gateway's first index and load reads
            return asyncio.run(
                drive(
                    la.gateway.url,
                    sc,
                    arm,
                    llm_requests(sc, seed),
                    classic_arrivals(sc, seed),
                    progress,
                )
            )


# -- figures -------------------------------------------------------------------------------
def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def switch_figures(switches: list[list[Any]], window_s: float) -> dict[str, Any]:
    """The switches, the shortest time between two changes of one (model, device) and the
    pairs closer than ``window_s`` (``sim.llm_placement.switch_gaps``)."""
    shortest, within = switch_gaps(switches, window_s - 1e-9)
    return {"switches": len(switches), "shortest_switch_gap_s": shortest, "within_window": within}


def morning(
    sc: LlmPlacementScenario, records: list[GenerationRecord], k: float
) -> dict[str, Any] | None:
    """The LLM's traffic back after its idle phase (the first phase of multiplier 0 of its
    first workload): the first request then, and from it to the last request within 60 s
    (x ``k``, the time scale) that missed its TTFT target (0: none did)."""
    w = sc.workloads[0]
    idle = next((p for p in w.phases if p.multiplier == 0), None)
    if idle is None or w.ttft_ms is None:
        return None
    target = w.ttft_ms / 1e3
    after = sorted((r for r in records if r.scheduled_s >= idle.end_s), key=lambda r: r.scheduled_s)
    if not after:
        return None
    first = after[0]
    window = [r for r in after if r.scheduled_s < first.scheduled_s + 60.0 * k]
    missed = [
        r.scheduled_s
        for r in window
        if r.outcome != "completed" or r.ttft_s is None or r.ttft_s > target
    ]
    return {
        "first_at_s": first.scheduled_s,
        "first_ttft_s": first.ttft_s,
        "recovered_s": (max(missed) - first.scheduled_s) if missed else 0.0,
        "missed": len(missed),
        "requests": len(window),
    }


def side_figures(
    sc: LlmPlacementScenario,
    k: float,
    arm: str,
    records: list[GenerationRecord],
    classic: list[ClassicRecord],
    phase_seconds: list[float],
    decisions: list[list[Any]],
    switches: list[list[Any]],
) -> dict[str, Any]:
    """One side's figures (the module docstring). Decisions and switches count within
    ``[0, duration)``: the simulator's controller stops there, the gateway's goes on."""
    doc = sc.doc
    lo, hi = doc.warmup_s, doc.duration_s
    recs = [r for r in records if lo <= r.scheduled_s < hi]
    ttft = [t for r in recs if (t := r.ttft_s) is not None]
    out: dict[str, Any] = {
        "device_seconds": sum(phase_seconds),
        "device_seconds_by_phase": phase_seconds,
        "llm_requests": len(recs),
        "llm_attainment": sum(1 for r in recs if r.met_targets()) / len(recs) if recs else None,
        "llm_ttft_p50_s": pct(ttft, 50),
        "llm_ttft_p99_s": pct(ttft, 99),
    }
    n = met = 0
    for c in doc.classic:
        qs = [q for q in classic if q.stream == c.stream and lo <= q.t_s < hi]
        ok = [q.latency_s for q in qs if q.latency_s is not None]
        m = sum(1 for x in ok if x <= c.slo_ms / 1e3)
        n, met = n + len(qs), met + m
        out[f"{c.stream}_attainment"] = m / len(qs) if qs else None
        out[f"{c.stream}_p50_ms"] = None if not ok else pct(ok, 50) * 1e3  # type: ignore[operator]
        out[f"{c.stream}_p99_ms"] = None if not ok else pct(ok, 99) * 1e3  # type: ignore[operator]
        out[f"{c.stream}_refused"] = sum(1 for q in qs if q.outcome != "completed")
    out["classic_attainment"] = met / n if n else None
    end = doc.duration_s
    kinds = [d[2] for d in decisions if d[0] < end]
    out.update(
        loads=kinds.count("load"),
        evictions=kinds.count("unload"),
        scale_ups=kinds.count("up"),
        scale_downs=kinds.count("down"),
    )
    within = [x for x in switches if float(x[0]) < end]
    out.update(switch_figures(within, doc.arms[arm].min_switch_s or 30.0 * k))
    out["morning"] = morning(sc, records, k)
    return out


def utilization_by_phase(
    samples: list[tuple[float, dict[str, float]]], edges: list[float]
) -> dict[str, list[float | None]]:
    """Per device, its mean utilization (as the controller held it) in each phase, over the
    samples where it was on (None: never on then)."""
    devices = sorted({d for _, u in samples for d in u})
    out: dict[str, list[float | None]] = {}
    for dev in devices:
        row: list[float | None] = []
        for lo, hi in itertools.pairwise(edges):
            xs = [u[dev] for t, u in samples if lo <= t < hi and dev in u]
            row.append(sum(xs) / len(xs) if xs else None)
        out[dev] = row
    return out


def sim_side(
    sc: LlmPlacementScenario, k: float, arm: str, seed: int, clock: PlacementClock | None = None
) -> tuple[dict[str, Any], list[Any]]:
    run = run_placement_arm(sc, arm, seed, clock)
    classic = [
        ClassicRecord(
            q.arrival_s,
            q.stream,
            q.outcome or "",
            (q.done_s - q.arrival_s) if q.outcome == "completed" and q.done_s else None,
            q.slo_s or 0.0,
        )
        for q in run.classic
    ]
    c = run.counts
    decisions = [list(d) for d in c.decisions]
    every = sc.doc.arms[arm].placement_interval_ms / 1e3
    # Sampled as live: every placement interval (the first tick at or after it).
    samples, nxt = [], every
    for t, u in run.utilization:
        if t >= nxt - 1e-9:
            samples.append((t, u))
            nxt += every
    switches = [list(s) for s in c.switch_log]
    edges = phase_edges(sc)
    phases = [run.device_seconds(lo, hi) for lo, hi in itertools.pairwise(edges)]
    figs = side_figures(sc, k, arm, run.records, classic, phases, decisions, switches)
    figs["utilization_by_phase"] = utilization_by_phase(samples, edges)
    return figs, decisions


def live_side(
    sc: LlmPlacementScenario, k: float, arm: str, live: LiveRun
) -> tuple[dict[str, Any], list[Any]]:
    at = live.active_at
    phases = [b[1] - a[1] for a, b in itertools.pairwise(at)]
    t0 = live.t0_unix_s
    switches = live_decisions(live.view, t0, "switches") or []
    decisions = live_decisions(live.view, t0) or []
    figs = side_figures(sc, k, arm, live.records, live.classic, phases, decisions, switches)
    figs["utilization_by_phase"] = utilization_by_phase(live.utilization, phase_edges(sc))
    late = sorted(live.send_late_s)
    figs["send_late_p99_ms"] = pct(late, 99) * 1e3 if late else None  # type: ignore[operator]
    counts = live.view.get("counts", {})
    figs["live_warm_loads"], figs["live_cold_loads"] = (
        counts.get("live_warm_loads"),
        counts.get("live_cold_loads"),
    )
    return figs, decisions


ROWS = [
    "device_seconds", "llm_requests", "llm_attainment", "llm_ttft_p50_s", "llm_ttft_p99_s",
    "classic_attainment", "loads", "evictions", "scale_ups", "scale_downs", "switches",
    "shortest_switch_gap_s", "within_window",
]  # fmt: skip


def compare(sim: dict[str, Any], live: dict[str, Any], streams: list[str]) -> list[list[Any]]:
    rows = []
    keys = ROWS[:6] + [f"{s}_{x}" for s in streams for x in ("attainment", "p50_ms", "p99_ms",
                                                              "refused")] + ROWS[6:]  # fmt: skip
    for key in keys:
        a, b = sim.get(key), live.get(key)
        ratio = None
        if isinstance(a, int | float) and isinstance(b, int | float) and a:
            ratio = b / a
        within = None if ratio is None else abs(ratio - 1.0) <= BOUND
        rows.append([key, a, b, ratio, within])
    return rows


def fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenario", type=Path, default=ROOT / "scenarios" / "llm-pools-night.yaml")
    ap.add_argument("--arm", default="cost-aware")
    ap.add_argument("--time-scale", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--sim-only", action="store_true", help="the simulator's side only")
    ap.add_argument("--logs", type=Path, default=None, help="keep the processes' logs here")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if not args.time_scale > 0:
        ap.error("--time-scale: must be > 0")
    base = load_llm_placement_scenario(args.scenario)
    if args.arm not in base.doc.arms:
        ap.error(f"--arm: no arm {args.arm!r} (arms: {', '.join(base.doc.arms)})")
    seed = base.doc.seed if args.seed is None else args.seed
    with tempfile.TemporaryDirectory(prefix="llm-pools-profiles-") as pt:
        pdir = scale_profile_set(base.profile_dir(), Path(pt) / "profiles", args.time_scale)
        sc = scaled(base, args.time_scale, pdir)
        out: dict[str, Any] = {"scenario": str(args.scenario), "arm": args.arm, "seed": seed,
                               "time_scale": args.time_scale}  # fmt: skip
        live = clock = None
        if not args.sim_only:
            live = live_run(sc, args.arm, seed, args.logs, not args.no_progress)
            clock = live_placement_clock(live.view, live.t0_unix_s)
            out["placement_clock"] = None if clock is None else asdict(clock)
        # The simulator replays the live gateway's controller clock (when its estimates
        # started, when its ticks fell against the load's t = 0).
        sim, sim_dec = sim_side(sc, args.time_scale, args.arm, seed, clock)
        out["sim"] = sim
        if live is not None:
            lv, live_dec = live_side(sc, args.time_scale, args.arm, live)
            out["live"] = lv
            out["decisions"] = compare_decisions(live_dec, sim_dec)
            out["decision_logs"] = {"live": live_dec, "sim": sim_dec}
    streams = [c.stream for c in base.doc.classic]
    k = args.time_scale
    print(f"{args.scenario.name}, arm {args.arm}, seed {seed}, time scale K = {k:g} "
          f"({sc.doc.duration_s:g} s live)")  # fmt: skip
    edges = phase_edges(sc)
    if "live" in out:
        rows = compare(sim, out["live"], streams)
        out["comparison"] = rows
        print("| figure | sim | live | live / sim | within 15 % |")
        print("|---|---|---|---|---|")
        for key, a, b, r, w in rows:
            print(f"| {key} | {fmt(a)} | {fmt(b)} | {fmt(r)} | {fmt(w)} |")
        print("\ndevice-seconds per phase (scenario seconds / K):")
        print("| phase | sim | live |")
        print("|---|---|---|")
        for i, (lo, hi) in enumerate(itertools.pairwise(edges)):
            a = sim["device_seconds_by_phase"][i]
            lvp = out["live"]["device_seconds_by_phase"]
            b = lvp[i] if i < len(lvp) else None
            print(f"| {lo / k:g}-{hi / k:g} s | {fmt(a)} | {fmt(b)} |")
        print("\nutilization the controller held, mean per phase (sim / live):")
        su, lu = sim["utilization_by_phase"], out["live"]["utilization_by_phase"]
        phases = [f"{lo / k:g}-{hi / k:g} s" for lo, hi in itertools.pairwise(edges)]
        print("| device | " + " | ".join(phases) + " |")
        print("|---|" + "---|" * len(phases))
        for dev in sorted(set(su) | set(lu)):
            a, b = su.get(dev, []), lu.get(dev, [])
            cells = [
                f"{fmt(a[i] if i < len(a) else None)} / {fmt(b[i] if i < len(b) else None)}"
                for i in range(len(phases))
            ]
            print(f"| {dev} | " + " | ".join(cells) + " |")
        print("morning: sim", json.dumps(sim["morning"]))
        print("morning: live", json.dumps(out["live"]["morning"]))
        d = out["decisions"]
        print(f"decisions: live {d['decisions']['live']} / sim {d['decisions']['sim']}, the first "
              f"{d['agreed']} agree; first parting: live {d['live']} / sim {d['sim']}")  # fmt: skip
    else:
        for key in ROWS:
            print(f"{key}: {fmt(sim.get(key))}")
        print("morning:", json.dumps(sim["morning"]))
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
