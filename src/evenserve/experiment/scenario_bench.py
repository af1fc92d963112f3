"""``evenserve bench --scenario``: every arm of a scenario, live on a local emulated cluster.

Theory of operation. For each arm (``central-queue`` is a simulator yardstick and has no live
counterpart) and each repeat: write a temporary cluster for the arm (``cluster``: scaled
profile sets, a model repository whose ``model.yaml`` carry the arm's batching, a cluster
YAML whose gateway routing is the arm's), start it with the ``evenserve up`` Launcher, drive
the scenario's workload with the load generator against the gateway while it scrapes every
worker (``load``: the simulator's own arrivals, or its closed-loop users), stop the cluster,
and keep the raw samples. The figures come from ``report.summary.summarize`` over RunRecords,
exactly as the simulator's do. Then the simulator runs the same scenario at the same time
scale (``scaling``) with the same seeds, and the fidelity table compares the two per arm.
Placement arms: the gateway's decision log is laid beside the simulator's of the same seed
(``placement_figures.compare_decisions``): the summary's ``placement_trace`` says where the
two runs parted, and ``runs/ARM/repN/decisions.json`` keeps both logs. The simulation of a
placement repeat replays its live controller's clock (``placement_clock`` in the summary:
when its demand estimates started and its ticks fell, against the load's t = 0), so the two
sides tick at the same times.
A scenario model without a ``max_batch_size`` gets its model.yaml's in ``--repo`` (an
override the summary's source carries): the workers and the simulator then apply the same
batch-cap rule (``sched.setup``) with the same cap.
Repeat ``r`` (from 0) of every arm runs with seed ``seed + r``.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from evenserve.core.errors import ConfigError
from evenserve.core.scenario import CENTRAL_QUEUE
from evenserve.experiment.cluster import (
    arm_cluster,
    model_cap_overrides,
    write_arm_cluster,
    write_payloads,
    write_profile_sets,
)
from evenserve.experiment.fidelity import fidelity
from evenserve.experiment.load import scenario_load_spec
from evenserve.experiment.notes import print_errors
from evenserve.experiment.placement_figures import (
    burst_starts_s,
    compare_decisions,
    live_decisions,
    live_placement_clock,
    run_placement_figures,
    scale_up_after_burst_s,
    scale_ups_unix_s,
    scrape_placement,
    scrape_placement_view,
    sim_scale_up_decision_s,
)
from evenserve.experiment.report import finish_report
from evenserve.experiment.scaling import DEFAULT_TIME_SCALE, scale_scenario
from evenserve.experiment.stats import FigureStats, headline, repeat_stats
from evenserve.experiment.tables import fmt
from evenserve.loadgen.display import live_progress
from evenserve.loadgen.records import (
    RunLabels,
    measured_batch_figures,
    result_records,
    write_run,
)
from evenserve.loadgen.runner import run_load
from evenserve.policy.batching import BATCHING
from evenserve.policy.registry import batching_label, spec_label
from evenserve.policy.routing import ROUTING
from evenserve.report.summary import run_summary, summarize
from evenserve.report.table import compare_rows
from evenserve.sim.cluster import simulate
from evenserve.sim.loader import LoadedScenario, load_scenario, with_level
from evenserve.sim.placement import PlacementClock

BENCH_META = "bench.json"


@dataclass
class ScenarioBench:
    """What to bench. ``None``: the scenario's (duration, seed, every arm); the warm-up then
    keeps the scenario's share of the duration; ``out`` defaults to ``out/bench-NAME-TIME``."""

    scenario: Path
    overrides: list[str] = field(default_factory=list)
    level: str | None = None
    arms: list[str] | None = None
    repeats: int = 1
    time_scale: float = DEFAULT_TIME_SCALE
    duration_s: float | None = None
    warmup_s: float | None = None
    repo: Path = Path("examples/models/emulated")
    seed: int | None = None
    out: Path | None = None
    plots: bool = True
    progress: bool = True
    fidelity: bool = True
    max_requests: int = 1_000_000
    timeout_s: float = 30.0
    realtime: bool = True


@dataclass
class BenchPlan:
    """A checked bench: the scenario scaled, the arms to run live, where everything goes."""

    bench: ScenarioBench
    loaded: LoadedScenario
    scaled: LoadedScenario
    duration_s: float
    warmup_s: float
    live_arms: list[str]
    skipped_arms: list[str]
    seed: int
    folder: Path
    workroot: Path
    profile_dirs: dict[str, Path]
    #: The scenario's overrides: the bench's, then each model's max_batch_size from the
    #: repository where the scenario gives none (``model_cap_overrides``).
    overrides: list[str] = field(default_factory=list)


@dataclass
class RepeatRun:
    """One live run of one arm: its summary and what the load generator and hosts measured."""

    arm: str
    rep: int  # from 1
    summary: dict[str, Any]
    lag_ms: dict[str, Any]
    connections: dict[str, int]
    cpu: dict[str, Any]
    #: A placement arm's decisions (``placement_figures.live_decisions``; None otherwise).
    decisions: list[list[Any]] | None = None
    #: Where its gateway's controller stood at t = 0 (``live_placement_clock``), which the
    #: simulation of this repeat replays.
    placement_clock: PlacementClock | None = None

    @property
    def key(self) -> str:
        return f"{self.arm}#{self.rep}"


@dataclass
class ScenarioBenchResult:
    plan: BenchPlan
    summary: dict[str, Any]
    runs: list[RepeatRun]


def plan_bench(bench: ScenarioBench) -> BenchPlan:
    """Check the options against the scenario, scale it, write the profile sets."""
    k = bench.time_scale
    if bench.repeats < 1:
        raise ConfigError("--repeats: must be >= 1")
    if not (k > 0 and math.isfinite(k)):
        raise ConfigError("--time-scale: must be a number > 0")
    if not bench.repo.is_dir():
        raise ConfigError(f"--repo: not a directory: {bench.repo} (run from the project root?)")
    # Each model's batch cap as the workers have it (the simulator applies the same rule).
    caps = model_cap_overrides(load_scenario(bench.scenario, bench.overrides), bench.repo)
    overrides = [*bench.overrides, *caps]
    loaded = with_level(load_scenario(bench.scenario, overrides), bench.level)
    sc = loaded.scenario
    dur = sc.duration_s if bench.duration_s is None else bench.duration_s
    wu = sc.warmup_s * dur / sc.duration_s if bench.warmup_s is None else bench.warmup_s
    names = list(sc.arms) if bench.arms is None else bench.arms
    for a in names:
        if a not in sc.arms:
            raise ConfigError(f"--arms: unknown arm {a!r} (arms: {', '.join(sc.arms)})")
    skipped = [a for a in names if sc.arms[a].routing == CENTRAL_QUEUE]
    live_arms = [a for a in names if a not in skipped]
    if not live_arms:
        raise ConfigError(
            "--arms: no arm with a live counterpart (central-queue is simulator-only)"
        )
    label = sc.name if bench.level is None else f"{sc.name}-{bench.level}"
    folder = bench.out or Path("out") / f"bench-{label}-{time.strftime('%Y%m%d-%H%M%S')}"
    folder.mkdir(parents=True, exist_ok=True)
    workroot = Path(tempfile.mkdtemp(prefix="evenserve-bench-"))
    scaled = scale_scenario(loaded, k, dur, wu, workroot)
    return BenchPlan(
        bench=bench,
        loaded=loaded,
        scaled=scaled,
        duration_s=dur,
        warmup_s=wu,
        live_arms=live_arms,
        skipped_arms=skipped,
        seed=sc.seed if bench.seed is None else bench.seed,
        folder=folder,
        workroot=workroot,
        profile_dirs=write_profile_sets(scaled, workroot),
        overrides=overrides,
    )


def process_cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds of a process so far (Linux /proc), None if unknown."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def run_repeat(
    plan: BenchPlan,
    arm: str,
    rep: int,
    console: Console,
    err_console: Console,
    ray_address: str | None = None,
) -> RepeatRun:
    """Repeat ``rep`` (from 0) of ``arm``: its cluster up, the load, the cluster down; the raw
    samples under ``runs/ARM/repN``, process logs under ``logs/ARM-N``. ``ray_address``: the
    workers as Ray actors (``evenserve up --ray``)."""
    bench, scaled = plan.bench, plan.scaled
    sc = scaled.scenario
    rseed = plan.seed + rep
    work = plan.workroot / f"{arm}-{rep}"
    work.mkdir(parents=True)
    cluster_path = write_arm_cluster(scaled, arm, bench.repo, work, plan.profile_dirs, rseed)
    spec = scenario_load_spec(scaled, rseed, bench.max_requests, bench.timeout_s)
    if sc.arms[arm].placement is not None:
        spec.payload_files = write_payloads(scaled, bench.repo, work)
    title = f"{arm} #{rep + 1}"
    log_dir = plan.folder / "logs" / f"{arm}-{rep + 1}"
    with arm_cluster(cluster_path, log_dir, say=err_console.print, ray_address=ray_address) as la:
        spec.target = la.gateway.url if la.gateway else ""
        spec.scrape = {p.name: p.url for p in la.workers}
        pids = {p.name: p.pid for p in la.workers}
        if la.gateway is not None:
            pids["gateway"] = la.gateway.pid
        placed = sc.arms[arm].placement is not None
        pl_before = scrape_placement(spec.target) if placed else None
        before = {n: process_cpu_s(p) for n, p in pids.items()}
        cpu0, wall0 = time.process_time(), time.perf_counter()
        with live_progress(err_console, title, enabled=bench.progress) as show:
            result = run_load(spec, show, realtime=bench.realtime)
        wall = time.perf_counter() - wall0
        after = {n: process_cpu_s(p) for n, p in pids.items()}
        pl_after = scrape_placement(spec.target) if placed else None
        view = scrape_placement_view(spec.target, la.admin_token) if placed else None
        load_avg = os.getloadavg()[0]
    use = {
        n: round((a - b) / wall, 4)
        for n, b in before.items()
        if b is not None and (a := after.get(n)) is not None
    }
    use["loadgen"] = round((time.process_time() - cpu0) / wall, 4)
    cpu = {"cores": use, "load_average_1m": load_avg}
    spec_arm = sc.arms[arm]
    labels = RunLabels(
        scenario=plan.loaded.scenario.name,
        arm=arm,
        routing=spec_label(spec_arm.routing),
        batching=batching_label(spec_arm.batching, spec_arm.batching_per_model),
        seed=rseed,
        slo_ms={m: v.slo_ms for m, v in sc.models.items()},
        timeseries_interval_s=plan.loaded.scenario.timeseries_interval_s,
        routing_spec=dict(ROUTING.resolved(spec_arm.routing, "routing")),
        batching_spec={
            m: dict(
                BATCHING.resolved(spec_arm.batching_per_model.get(m, spec_arm.batching), "batching")
            )
            for m in sorted(sc.models)
        },
        profiles={
            d.name: {
                m: (list(p.batches), list(p.latency_ms))
                for m, p in sorted(plan.scaled.profiles_for(d).items())
            }
            for d in sc.arm_devices(arm)
            if d.active
        },
    )
    extra = {"time_scale": bench.time_scale, "cpu": cpu}
    write_run(plan.folder / "runs" / arm / f"rep{rep + 1}", result, labels, extra)
    print_errors(result, err_console)
    s = measured_batch_figures(summarize(result_records(result, labels)))
    decisions = clock = None
    if placed:
        # The gateway's counts over the load (device-seconds, loads, evictions, scale-ups).
        s.update(run_placement_figures(pl_before, pl_after))
        t0 = result.t0_unix_s
        ups_unix = scale_ups_unix_s(view)
        decisions = live_decisions(view, t0)
        clock = live_placement_clock(view, t0)
        s["scale_up_after_burst_s"] = (
            None
            if ups_unix is None or t0 is None
            else scale_up_after_burst_s(
                burst_starts_s(sc.workload, sc.duration_s), [t - t0 for t in ups_unix]
            )
        )
        console.print(
            f"  {title}: placement: {fmt(s['device_seconds'], 1)} device-seconds, "
            f"{s['loads']} loads, {s['evictions']} evictions, scale-up "
            f"{fmt(s.get('scale_up_after_burst_s'), 2)} s after the burst's start "
            f"({fmt(s.get('scale_up_decision_s'), 2)} s after the over-demand's first request)",
            highlight=False,
        )
    console.print(
        f"  {title}: P50 {fmt(s['latency_ms']['p50'], 1)} ms, P99 "
        f"{fmt(s['latency_ms']['p99'], 1)} ms, {s['throughput_rps']:.1f} req/s, spread "
        f"{s['utilization_spread_pts']:.1f} pts; lag P99 {fmt(result.lag_ms['p99'], 3)} "
        f"ms ({result.priority}); CPU {sum(use.values()):.2f} cores of {os.cpu_count()} "
        f"(load avg {load_avg:.2f})",
        highlight=False,
    )
    return RepeatRun(arm, rep + 1, s, result.lag_ms, result.connections, cpu, decisions, clock)


@dataclass
class Simulated:
    """The simulator's side of a bench: per arm, the repeats' statistics, the headline
    summary, and each repeat's placement decisions (``RunRecords.placement_decisions``;
    placement arms only)."""

    stats: dict[str, dict[str, FigureStats]]
    summaries: dict[str, dict[str, Any]]
    decisions: dict[str, list[list[list[Any]]]] = field(default_factory=dict)
    #: The live controller clocks replayed, by repeat (``ARM#N``).
    clocks: dict[str, PlacementClock] = field(default_factory=dict)


def simulate_arms(plan: BenchPlan, live: Sequence[RepeatRun] = ()) -> Simulated:
    """The simulator on the scaled scenario, every arm (skipped ones too) with each repeat's
    seed; a placement arm's repeat replays its live run's controller clock where ``live``
    has one (``RepeatRun.placement_clock``)."""
    out = Simulated({}, {})
    sc = plan.scaled.scenario
    clocks = {(r.arm, r.rep): r.placement_clock for r in live}
    for arm in plan.live_arms + plan.skipped_arms:
        runs = []
        for rep in range(plan.bench.repeats):
            clock = clocks.get((arm, rep + 1))
            if clock is not None:
                out.clocks[f"{arm}#{rep + 1}"] = clock
            rec = simulate(plan.scaled, arm, plan.seed + rep, clock)
            s = summarize(rec, timeseries=False)
            if sc.arms[arm].placement is not None:
                out.decisions.setdefault(arm, []).append([list(d) for d in rec.placement_decisions])
                s["scale_up_decision_s"] = sim_scale_up_decision_s(rec)
                s["scale_up_after_burst_s"] = scale_up_after_burst_s(
                    burst_starts_s(sc.workload, sc.duration_s), rec.scale_ups_s
                )
            runs.append(s)
        out.stats[arm] = repeat_stats(runs)
        out.summaries[arm] = headline(runs)
    return out


def _sim_decisions(simulated: Simulated | None, r: RepeatRun) -> list[list[Any]] | None:
    """The simulator's decisions of live repeat ``r``'s arm and seed (None: none)."""
    sims = None if simulated is None else simulated.decisions.get(r.arm)
    return sims[r.rep - 1] if sims is not None and r.rep <= len(sims) else None


def placement_traces(runs: list[RepeatRun], simulated: Simulated) -> dict[str, Any]:
    """Per live repeat of a placement arm (``ARM#N``), where its decisions and the
    simulator's of the same seed part (``compare_decisions``)."""
    out: dict[str, Any] = {}
    for r in runs:
        sim = _sim_decisions(simulated, r)
        if r.decisions is not None and sim is not None:
            out[r.key] = compare_decisions(r.decisions, sim)
    return out


def write_decisions(plan: BenchPlan, runs: list[RepeatRun], simulated: Simulated | None) -> None:
    """``runs/ARM/repN/decisions.json``: both sides' decision logs of a placement repeat."""
    for r in runs:
        if r.decisions is None:
            continue
        sim = _sim_decisions(simulated, r)
        folder = plan.folder / "runs" / r.arm / f"rep{r.rep}"
        folder.mkdir(parents=True, exist_ok=True)
        doc = {
            "columns": ["t_s", "source", "kind", "model", "device", "rate_rps", "utilization"],
            "live": r.decisions,
            "sim": sim,
        }
        (folder / "decisions.json").write_text(json.dumps(doc) + "\n")


def bench_summary(
    plan: BenchPlan, runs: list[RepeatRun], simulated: Simulated | None
) -> dict[str, Any]:
    """summary.json: the headline repeat per arm side by side, repeats, lag, connections,
    CPU, and with a simulation the fidelity table, the simulated figures and, for placement
    arms, where the decisions part (``placement_trace``)."""
    live: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        live.setdefault(r.arm, []).append(r.summary)
    name = plan.loaded.scenario.name
    repeat_block = {a: repeat_stats(v) for a, v in live.items()}
    summary = run_summary(name, plan.seed, {a: headline(v) for a, v in live.items()})
    summary["comparison"] = compare_rows(summary)
    summary["source"] = bench_source(plan)
    summary["time_scale"] = plan.bench.time_scale
    if plan.bench.level is not None:
        summary["level"] = plan.bench.level
    summary["repeats"] = repeat_block
    summary["scheduling_lag_ms"] = {r.key: r.lag_ms for r in runs}
    summary["connections"] = {r.key: r.connections for r in runs}
    summary["cpu"] = {r.key: r.cpu for r in runs}
    if simulated is not None:
        placed = [a for a, v in plan.scaled.scenario.arms.items() if v.placement is not None]
        summary["fidelity"] = fidelity(repeat_block, simulated.stats, placed)
        summary["simulated"] = {"arms": simulated.summaries, "repeats": simulated.stats}
        traces = placement_traces(runs, simulated)
        if traces:
            summary["placement_trace"] = traces
        if simulated.clocks:
            summary["placement_clock"] = {k: asdict(c) for k, c in simulated.clocks.items()}
    return summary


def bench_source(plan: BenchPlan, seed: int | None = None) -> dict[str, Any]:
    """What a live bench summary came from, so ``diagnose`` can replay its arrivals in the
    simulator: the scenario K times slower, as the bench ran it (``experiment.diagnose.
    Replay``). ``seed``: a repeat's (default the first's)."""
    b = plan.bench
    return {
        "scenario": str(b.scenario.resolve()),
        "arm": None,
        "seed": plan.seed if seed is None else seed,
        "set": list(plan.overrides),
        "level": b.level,
        "trace": None,
        "duration_s": None,
        "time_scale": b.time_scale,
        "run_duration_s": plan.duration_s,
        "run_warmup_s": plan.warmup_s,
    }


def trace_line(tr: dict[str, Any]) -> str:
    """One line of a ``compare_decisions`` result."""
    n = tr["decisions"]
    head = (
        f"placement decisions live {n['live']} / simulated {n['sim']}, the first "
        f"{tr['agreed']} agree ({tr['reordered']} pairs reordered"
        + (f", live later by {tr['lag_s']['median']:.3f} s median" if tr["lag_s"] else "")
        + ")"
    )
    if not tr["parted"]:
        return head + "; they never part"

    def one(d: dict[str, Any] | None) -> str:
        if d is None:
            return "nothing more"
        what = d["model"] + "@" + d["device"] if d["model"] else d["device"]
        return f"{d['source']} {d['kind']} {what} at {d['t_s']:.2f} s ({d['rate_rps']:.2f} req/s)"

    return head + f"; first parting: live {one(tr['live'])}, simulated {one(tr['sim'])}"


def bench_meta(plan: BenchPlan) -> dict[str, Any]:
    """bench.json: what was run."""
    b = plan.bench
    return {
        "scenario": str(b.scenario),
        "overrides": b.overrides,
        "level": b.level,
        "time_scale": b.time_scale,
        "duration_s": plan.duration_s,
        "warmup_s": plan.warmup_s,
        "repeats": b.repeats,
        "arms": plan.live_arms,
        "skipped_arms": plan.skipped_arms,
        "seed": plan.seed,
    }


def bench_notes(plan: BenchPlan, runs: list[RepeatRun]) -> list[str]:
    k, dur, wu = plan.bench.time_scale, plan.duration_s, plan.warmup_s
    worst_lag = max(
        (r.lag_ms["p99"] for r in runs if r.lag_ms.get("p99") is not None), default=None
    )
    sc = plan.loaded.scenario
    workers = max(len(sc.arm_devices(a)) for a in plan.live_arms)
    notes = [
        f"Live: {len(plan.live_arms)} arm(s) on a local emulated cluster (gateway + up to "
        f"{workers} workers per arm), {dur:g} s per run, warm-up "
        f"{wu:g} s, {plan.bench.repeats} repeat(s); time scale K = {k:g} (batch, think and "
        f"inter-arrival times x{k:g}; load, start and placement-interval times x{k:g}; "
        f"batching windows and the signal period unscaled).",
        f"Table: the repeat with the median P99 per arm. Worst scheduling-lag P99 of the load "
        f"generator over all runs: {fmt(worst_lag, 3)} ms.",
    ]
    if plan.skipped_arms:
        notes.append(f"Simulator-only arms (no live run): {', '.join(plan.skipped_arms)}.")
    return notes


def run_scenario_bench(
    bench: ScenarioBench, console: Console, err_console: Console
) -> ScenarioBenchResult:
    """Plan, run every live arm's repeats, simulate, and write the bench folder."""
    plan = plan_bench(bench)
    k, level = bench.time_scale, bench.level
    skipped = plan.skipped_arms
    console.print(
        f"bench {bench.scenario}"
        + (f" at level {level}" if level is not None else "")
        + f": {len(plan.live_arms)} arm(s) x {bench.repeats} repeat(s), {plan.duration_s:g} s "
        f"each (warm-up {plan.warmup_s:g} s), time scale K = {k:g}: every batch and "
        f"think/inter-arrival time x{k:g}, policies unchanged"
        + (f"; simulator-only arms skipped live: {', '.join(skipped)}" if skipped else ""),
        highlight=False,
        soft_wrap=True,
    )
    runs = [
        run_repeat(plan, arm, rep, console, err_console)
        for arm in plan.live_arms
        for rep in range(bench.repeats)
    ]
    simulated = None
    if bench.fidelity:
        with console.status("simulating the same scenario at the same time scale ..."):
            simulated = simulate_arms(plan, runs)
    summary = bench_summary(plan, runs, simulated)
    write_decisions(plan, runs, simulated)
    for key, tr in summary.get("placement_trace", {}).items():
        console.print(f"  {key}: {trace_line(tr)}", highlight=False, soft_wrap=True)
    (plan.folder / BENCH_META).write_text(json.dumps(bench_meta(plan), indent=2) + "\n")
    name = plan.loaded.scenario.name
    finish_report(
        plan.folder,
        summary,
        title=name
        + (f" at level {level}" if level is not None else "")
        + f": live bench (K = {k:g})",
        notes=bench_notes(plan, runs),
        plots=bench.plots,
        console=console,
    )
    return ScenarioBenchResult(plan, summary, runs)
