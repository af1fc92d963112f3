"""``evenserve bench`` (load-test a live target or a scenario's arms) and ``evenserve report``.

Theory of operation of ``bench --scenario``. For each arm (``central-queue`` is a simulator
yardstick and has no live counterpart) and each repeat: write a temporary cluster for the
arm (scaled profile sets, a model repository whose ``model.yaml`` carry the arm's batching,
a cluster YAML whose gateway routing is the arm's), start it with the ``evenserve up``
Launcher, drive the scenario's workload with the load generator against the gateway while
it scrapes every worker, stop the cluster, and keep the raw samples. The figures come from
``report.summary.summarize`` over RunRecords, exactly as the simulator's do. Then the
simulator runs the same scenario at the same time scale with the same seeds, and the
fidelity table compares the two per arm.

Time scale K: every emulated batch takes K times its profile's time (the scaled profile set
is written next to the cluster), every think time and inter-arrival time is K times longer
(rates K times lower), trace times and rate phases K times later, SLOs and deadlines K times
longer. Policy parameters (batching windows, batch sizes, the 100 ms signal period, queue
thresholds) are left alone. The simulator runs the very same scaled scenario, so live and
simulated figures are compared like for like; see docs/design/0004-loadgen-bench.md for what
the unscaled parts do to the comparison with the unscaled scenario.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import re
import socket
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
import yaml
from rich.table import Table

from evenserve.cli.app import console, err_console, fail
from evenserve.core.errors import ConfigError, EvenserveError
from evenserve.core.scenario import CENTRAL_QUEUE, ClosedLoop, OpenLoop, Phase, TraceWorkload
from evenserve.gateway.config import parse_cluster
from evenserve.gateway.launcher import Launcher
from evenserve.loadgen.display import live_progress
from evenserve.loadgen.records import RunLabels, read_run, result_records, write_run
from evenserve.loadgen.runner import LoadResult, LoadSpec, run_load
from evenserve.loadgen.target import check_url, error_lines
from evenserve.policy.batching import BATCHING
from evenserve.policy.registry import spec_label, split_spec
from evenserve.report.html import Section, write_html
from evenserve.report.plots import write_plots
from evenserve.report.summary import clean_json, run_summary, summarize
from evenserve.report.table import compare_rows, compare_table
from evenserve.sim.cluster import simulate
from evenserve.sim.loader import LoadedScenario, load_scenario, with_level
from evenserve.workload import Arrival, PoissonProcess, parse_mix, read_trace, write_trace

#: Default time scale of a scenario bench on a small host (see the module docstring).
DEFAULT_TIME_SCALE = 40.0
#: Fidelity target: live vs simulated relative error, per figure.
FIDELITY_TOLERANCE = 0.15
BENCH_META = "bench.json"
SUMMARY = "summary.json"


def parse_duration(text: str, what: str) -> float:
    """``60s``, ``2m``, ``1h``, ``500ms`` or a bare number of seconds."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h)?\s*", text)
    if not m:
        raise ConfigError(f"{what} {text!r}: expected a duration like 60s, 2m, 500ms")
    value = float(m.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[m.group(2) or "s"]
    return value


def _pairs(items: list[str] | None, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        k, sep, v = item.partition("=")
        if not sep or not k.strip() or not v.strip():
            raise ConfigError(f"{what} {item!r}: expected NAME=VALUE")
        out[k.strip()] = v.strip()
    return out


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# -- time scale --------------------------------------------------------------------------------
def _scaled_phases(phases: list[Phase], k: float) -> list[Phase]:
    return [
        Phase(start_s=p.start_s * k, end_s=p.end_s * k, multiplier=p.multiplier) for p in phases
    ]


def scale_scenario(
    loaded: LoadedScenario, k: float, duration_s: float, warmup_s: float, workdir: Path
) -> LoadedScenario:
    """The scenario K times slower: profiles, think times, arrivals, SLOs; policies unchanged."""
    sc = loaded.scenario
    wl: Any = sc.workload
    if isinstance(wl, ClosedLoop):
        wl = wl.model_copy(update={"think_ms": wl.think_ms * k})
    elif isinstance(wl, OpenLoop):
        wl = wl.model_copy(
            update={
                "rates_rps": {m: r / k for m, r in wl.rates_rps.items()},
                "phases": _scaled_phases(wl.phases, k),
                "streams": [
                    st.model_copy(
                        update={
                            "rate_rps": st.rate_rps / k,
                            "deadline_ms": None if st.deadline_ms is None else st.deadline_ms * k,
                            "phases": None if st.phases is None else _scaled_phases(st.phases, k),
                        }
                    )
                    for st in wl.streams
                ],
            }
        )
    elif isinstance(wl, TraceWorkload):
        entries = read_trace(loaded.resolve(wl.path), list(sc.models))
        path = workdir / "trace-scaled.jsonl"
        write_trace(path, [dataclasses.replace(e, t_s=e.t_s * k) for e in entries])
        wl = wl.model_copy(update={"path": str(path.resolve())})
    models = {
        m: spec.model_copy(
            update={
                "slo_ms": spec.slo_ms * k,
                "deadline_ms": None if spec.deadline_ms is None else spec.deadline_ms * k,
            }
        )
        for m, spec in sc.models.items()
    }
    if not 0 <= warmup_s < duration_s:
        raise ConfigError("--warmup: must be >= 0 and less than --duration")
    sc2 = sc.model_copy(
        update={"workload": wl, "models": models, "duration_s": duration_s, "warmup_s": warmup_s}
    )
    sets = {
        name: {
            m: dataclasses.replace(
                p,
                latency_ms=tuple(x * k for x in p.latency_ms),
                source=f"{p.source.strip()} [time scale x{k:g} for a live bench]",
            )
            for m, p in profs.items()
        }
        for name, profs in loaded.profile_sets.items()
    }
    return LoadedScenario(scenario=sc2, base_dir=loaded.base_dir, profile_sets=sets)


def open_loop_arrivals(loaded: LoadedScenario, seed: int) -> list[Arrival]:
    """The (scaled) scenario's open-loop arrivals: the simulator's own Poisson streams."""
    sc = loaded.scenario
    wl = sc.workload
    assert isinstance(wl, OpenLoop)
    streams: list[tuple[str, float, int | None, float | None, list[Phase]]] = [
        (m, wl.rates_rps[m], None, None, wl.phases) for m in sorted(wl.rates_rps)
    ]
    for st in wl.streams:
        phases = wl.phases if st.phases is None else st.phases
        streams.append((st.model, st.rate_rps, st.priority_value(), st.deadline_ms, phases))
    out: list[Arrival] = []
    for i, (m, rate, prio, dl, phases) in enumerate(streams):
        if rate <= 0:
            continue
        name = m if i < len(wl.rates_rps) else f"{m}:{i}"
        proc = PoissonProcess(rate, phases, random.Random(f"{seed}:arrivals:{name}"))
        t = proc.next_after(0.0)
        while t < sc.duration_s:
            out.append(Arrival(t, m, prio, dl if dl is not None else sc.models[m].deadline_ms))
            t = proc.next_after(t)
    out.sort(key=lambda a: a.t_s)
    return out


# -- one arm's local cluster -------------------------------------------------------------------
def write_profile_sets(loaded: LoadedScenario, workdir: Path) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for name, profs in loaded.profile_sets.items():
        d = workdir / "profiles" / name
        d.mkdir(parents=True, exist_ok=True)
        for m, p in profs.items():
            raw = p.to_file_model().model_dump(exclude_none=True)
            (d / f"{m}.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
        out[name] = d.resolve()
    return out


def live_batching(spec: Any, where: str) -> tuple[dict[str, Any], int]:
    """The batching spec for a worker's model.yaml, batching exactly as the simulator does.

    A worker fills a policy's missing ``max_batch_size`` with the model's (64 for the shipped
    models); the simulator uses the policy's default. The spec is written with the simulator's
    value made explicit, and that value is returned for the gateway's least-expected-work.
    """
    policy = BATCHING.build(spec, where=where)
    name, raw = split_spec(spec, where)
    if "max_batch_size" in BATCHING.entry(name, where).params_model.model_fields:
        raw.setdefault("max_batch_size", policy.max_batch_size)
    return {"policy": name, **raw}, int(policy.max_batch_size)


def write_arm_cluster(
    loaded: LoadedScenario,
    arm: str,
    source_repo: Path,
    workdir: Path,
    profile_dirs: dict[str, Path],
    seed: int,
) -> Path:
    """Repository and cluster YAML of one arm; returns the cluster file."""
    sc = loaded.scenario
    spec = sc.arms[arm]
    class_args: list[str] = []
    if spec.starvation_ms is not None:
        class_args += ["--starvation-ms", f"{spec.starvation_ms:g}"]
    if spec.class_headroom is not None:
        class_args += ["--class-headroom", f"{spec.class_headroom:g}"]
    if spec.ignore_priority:
        raise ConfigError(f"arms.{arm}.ignore_priority: not supported by the live worker")
    repo = workdir / "repo"
    max_batch: dict[str, int] = {}
    for m, mspec in sc.models.items():
        src = source_repo / m / "model.yaml"
        if not src.is_file():
            raise ConfigError(
                f"models.{m}: no {src} (the live bench takes each model's inputs and outputs "
                "from --repo; add the model there)"
            )
        raw = yaml.safe_load(src.read_text())
        if not isinstance(raw, dict) or raw.get("runtime") != "emulated":
            raise ConfigError(f"{src}: runtime: the live bench runs emulated models only")
        raw.pop("profile", None)
        raw["emulated"] = {"profile_name": mspec.profile or m}
        raw["batching"], max_batch[m] = live_batching(
            spec.batching_per_model.get(m, spec.batching), f"arms.{arm}.batching"
        )
        raw["max_batch_size"] = max(int(raw.get("max_batch_size") or 1), max_batch[m])
        raw["slo_ms"] = mspec.slo_ms
        raw["priority"] = mspec.priority
        if mspec.deadline_ms is not None:
            raw["queue_timeout_ms"] = mspec.deadline_ms
        if spec.max_queue_per_model is not None:
            raw["max_queue_size"] = spec.max_queue_per_model
        (repo / m).mkdir(parents=True, exist_ok=True)
        (repo / m / "model.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    util_window_s = sc.signals.utilization_window_ms / 1000.0
    devices = []
    for d in sc.expanded_devices():
        devices.append(
            {
                "name": d.name,
                "device": f"emulated:{profile_dirs[sc.profile_set_of(d)]}",
                "models": list(d.models),
                "port": _free_port(),
                "max_batch_size": {m: max_batch[m] for m in d.models},
                "extra_args": [
                    "--memory-gb", f"{d.memory_gb:g}",
                    "--utilization-window-s", f"{util_window_s:g}",
                    "--log-level", "warning",
                    "--instances", str(d.instances),
                    "--interference", repr(d.interference),
                    *class_args,
                ],
            }
        )  # fmt: skip
    cluster = {
        "name": f"bench-{sc.name}-{arm}",
        "gateway": {
            "host": "127.0.0.1",
            "port": _free_port(),
            "routing": spec.routing,
            "seed": seed,
            "signals": {"interval_ms": sc.signals.interval_ms, "window": sc.signals.window},
        },
        "workers": {
            "repo": str(repo.resolve()),
            "devices": devices,
            "ready_timeout_s": 60,
            "drain_timeout_s": 3,
            "restart": False,
        },
    }
    path = workdir / "cluster.yaml"
    path.write_text(yaml.safe_dump(cluster, sort_keys=False))
    return path


def _cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds of a process so far (Linux /proc), None if unknown."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


@contextlib.contextmanager
def arm_cluster(cluster_path: Path, log_dir: Path) -> Iterator[Launcher]:
    with cluster_path.open() as f:
        raw = yaml.safe_load(f)
    cluster = parse_cluster(raw, cluster_path.parent, str(cluster_path))
    log_dir.mkdir(parents=True, exist_ok=True)
    la = Launcher(cluster, cluster_path, log_dir, say=lambda s: err_console.print(s))
    la.plan()
    try:
        la.start()
        yield la
    finally:
        la.stop()


# -- figures across repeats and against the simulator ------------------------------------------
def scalar_figures(arm: dict[str, Any]) -> dict[str, float | None]:
    out: dict[str, float | None] = {
        "p50_ms": arm["latency_ms"]["p50"],
        "p99_ms": arm["latency_ms"]["p99"],
        "throughput_rps": arm["throughput_rps"],
        "utilization_mean": arm["utilization_mean"],
        "utilization_spread_pts": arm["utilization_spread_pts"],
        "max_queue_depth": arm["max_queue_depth"],
    }
    for d, v in arm["devices"].items():
        out[f"util {d}"] = v["utilization"]
    return out


def repeat_stats(summaries: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Mean, standard deviation, min and max of each scalar figure over repeats."""
    figs = [scalar_figures(s) for s in summaries]
    out: dict[str, dict[str, float | None]] = {}
    for key in figs[0]:
        vals = [float(v) for f in figs if (v := f.get(key)) is not None]
        if not vals:
            out[key] = {"mean": None, "sd": None, "min": None, "max": None, "n": 0}
            continue
        out[key] = {
            "mean": round(statistics.fmean(vals), 6),
            "sd": round(statistics.stdev(vals), 6) if len(vals) > 1 else 0.0,
            "min": round(min(vals), 6),
            "max": round(max(vals), 6),
            "n": len(vals),
        }
    return out


def headline(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """The repeat with the median P99 stands for the arm in tables and plots."""
    order = sorted(summaries, key=lambda s: s["latency_ms"]["p99"] or math.inf)
    return order[(len(order) - 1) // 2]


FIDELITY_FIGURES = ("p50_ms", "p99_ms", "throughput_rps")
#: Figures the fidelity target applies to (throughput is shown too).
FIDELITY_CHECKED = ("p50_ms", "p99_ms", "util")


def fidelity(
    live: dict[str, dict[str, dict[str, float | None]]],
    sim: dict[str, dict[str, dict[str, float | None]]],
) -> dict[str, Any]:
    """Per arm and figure: live mean, simulated mean, relative error (live/sim - 1)."""
    out: dict[str, Any] = {}
    for arm, lstats in live.items():
        if arm not in sim:
            continue
        rows = {}
        for key, lv in lstats.items():
            if key not in FIDELITY_FIGURES and not key.startswith("util "):
                continue
            sv = sim[arm].get(key, {})
            lm, sm = lv.get("mean"), sv.get("mean")
            err = None
            if lm is not None and sm is not None and sm != 0:
                err = round(lm / sm - 1.0, 4)
            checked = key in FIDELITY_CHECKED[:2] or key.startswith("util ")
            rows[key] = {
                "live": lm,
                "simulated": sm,
                "rel_error": err,
                "checked": checked,
                "within": None if err is None else abs(err) <= FIDELITY_TOLERANCE,
            }
        out[arm] = rows
    return out


def _f(x: Any, nd: int = 1) -> str:
    return "-" if x is None else f"{float(x):.{nd}f}"


def repeats_table(repeats: dict[str, dict[str, dict[str, float | None]]]) -> Table:
    t = Table(title="spread across repeats: mean ± sd [min-max]")
    t.add_column("figure", style="bold")
    arms = list(repeats)
    for a in arms:
        t.add_column(a, justify="right")
    keys = ["p50_ms", "p99_ms", "throughput_rps", "utilization_spread_pts", "utilization_mean"]
    for k in keys:
        cells = []
        for a in arms:
            s = repeats[a].get(k)
            if not s or s["mean"] is None:
                cells.append("-")
                continue
            scale, nd = (100.0, 1) if k == "utilization_mean" else (1.0, 2)
            cells.append(
                f"{s['mean'] * scale:.{nd}f} ± {(s['sd'] or 0) * scale:.{nd}f} "
                f"[{s['min'] * scale:.{nd}f}-{s['max'] * scale:.{nd}f}]"  # type: ignore[operator]
            )
        t.add_row(k, *cells)
    t.add_row("repeats", *[str(repeats[a]["p99_ms"]["n"]) for a in arms])
    return t


def fidelity_rows(fid: dict[str, Any]) -> tuple[list[str], list[list[str]], dict[Any, str]]:
    header = ["arm", "figure", "live", "simulated", "rel. error", "within 15 %"]
    rows: list[list[str]] = []
    marks: dict[tuple[int, int], str] = {}
    for arm, figs in fid.items():
        for key, v in figs.items():
            pct = key.startswith("util ")
            scale = 100.0 if pct else 1.0
            live = None if v["live"] is None else v["live"] * scale
            sim = None if v["simulated"] is None else v["simulated"] * scale
            err = "-" if v["rel_error"] is None else f"{100 * v['rel_error']:+.1f} %"
            ok = "" if not v["checked"] else ("yes" if v["within"] else "NO")
            unit = " %" if pct else ""
            rows.append([arm, key, _f(live, 2) + unit, _f(sim, 2) + unit, err, ok])
            if v["checked"] and v["within"] is not None:
                marks[(len(rows) - 1, 5)] = "good" if v["within"] else "bad"
    return header, rows, marks


def fidelity_table(fid: dict[str, Any], k: float | None) -> Table:
    title = "fidelity: live vs simulated (same scenario, same time scale, same seeds)"
    if k is not None:
        title += f", K = {k:g}"
    header, rows, marks = fidelity_rows(fid)
    t = Table(title=title)
    for i, h in enumerate(header):
        t.add_column(h, justify="left" if i < 2 else "right")
    for i, r in enumerate(rows):
        cells = list(r)
        if marks.get((i, 5)) == "bad":
            cells[5] = "[bold red]NO[/]"
        t.add_row(*cells)
    return t


# -- writing and printing a bench --------------------------------------------------------------
def _rows_of(table_rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    arms = [r["arm"] for r in table_rows]
    header = ["figure", *arms]
    rows = []
    keys = [
        ("routing", "routing", None),
        ("batching", "batching", None),
        ("util mean %", "utilization_mean", 100.0),
        ("spread (pts)", "utilization_spread_pts", 1.0),
        ("P50 ms", "p50_ms", 1.0),
        ("P99 ms", "p99_ms", 1.0),
        ("throughput rps", "throughput_rps", 1.0),
        ("max queue depth", "max_queue_depth", 1.0),
        ("throughput / baseline", "throughput_vs_baseline", 1.0),
        ("P99 / baseline", "p99_vs_baseline", 1.0),
    ]
    devices = list(table_rows[0]["devices"]) if table_rows else []
    for label, key, _ in keys[:2]:
        rows.append([label, *[str(r.get(key, "")) for r in table_rows]])
    for d in devices:
        rows.append(
            [f"util {d} %", *[_f(100.0 * (r["devices"].get(d) or 0.0)) for r in table_rows]]
        )
    for label, key, scale in keys[2:]:
        rows.append(
            [
                label,
                *[
                    _f(None if r.get(key) is None else r[key] * (scale or 1.0), 2)
                    for r in table_rows
                ],
            ]
        )
    models = list(table_rows[0]["slo_attainment"]) if table_rows else []
    for m in models:
        rows.append(
            [
                f"SLO met {m} %",
                *[
                    _f(None if (v := r["slo_attainment"].get(m)) is None else 100 * v, 2)
                    for r in table_rows
                ],
            ]
        )
    return header, rows


def finish_report(
    out: Path,
    summary: dict[str, Any],
    *,
    title: str,
    notes: list[str],
    plots: bool,
) -> None:
    """Print the tables, write summary.json, plots and report.html into ``out``."""
    console.print(compare_table(summary, title=title))
    repeats = summary.get("repeats")
    if repeats and any(v["p99_ms"]["n"] > 1 for v in repeats.values()):
        console.print(repeats_table(repeats))
    fid = summary.get("fidelity")
    if fid:
        console.print(fidelity_table(fid, summary.get("time_scale")))
    for line in notes:
        console.print(line, highlight=False, soft_wrap=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / SUMMARY).write_text(json.dumps(clean_json(summary), indent=2) + "\n")
    images: list[Path] = []
    if plots:
        images = write_plots(summary, out / "plots")
    header, rows = _rows_of(summary["comparison"])
    sections = [
        Section("Arms side by side", text=" ".join(notes[:2]), header=header, rows=rows),
    ]
    if repeats:
        rh = ["figure", *repeats]
        rr = []
        for k in ("p50_ms", "p99_ms", "throughput_rps", "utilization_spread_pts"):
            rr.append(
                [
                    k,
                    *[
                        "-"
                        if (s := repeats[a][k])["mean"] is None
                        else f"{s['mean']:.2f} ± {s['sd']:.2f} [{s['min']:.2f}-{s['max']:.2f}]"
                        for a in repeats
                    ],
                ]
            )
        sections.append(Section("Spread across repeats (mean ± sd [min-max])", header=rh, rows=rr))
    if fid:
        fh, fr, fm = fidelity_rows(fid)
        sections.append(
            Section(
                "Fidelity: live vs simulated",
                text=f"Same scenario, time scale and seeds; target: within "
                f"{FIDELITY_TOLERANCE:.0%} on P50, P99 and per-device utilization.",
                header=fh,
                rows=fr,
                marks=fm,
            )
        )
    sections.append(Section("Notes", preformatted="\n".join(notes)))
    if images:
        sections.append(Section("Plots", images=images))
    html_path = write_html(out / "report.html", title, sections)
    console.print(
        f"wrote {out / SUMMARY}, {html_path}" + (f", plots in {out / 'plots'}" if images else "")
    )


# -- the commands ------------------------------------------------------------------------------
def bench(
    target: Annotated[
        str | None, typer.Argument(help="KServe v2 base URL (a gateway or a worker).")
    ] = None,
    scenario: Annotated[
        Path | None,
        typer.Option(help="Bench every arm of this scenario on a local emulated cluster."),
    ] = None,
    users: Annotated[int | None, typer.Option(help="Closed loop: concurrent users.")] = None,
    think_ms: Annotated[
        float, typer.Option(help="Closed loop: mean exponential think time, ms.")
    ] = 0.0,
    rate: Annotated[float | None, typer.Option(help="Open loop: Poisson rate, req/s.")] = None,
    trace: Annotated[
        Path | None, typer.Option(help="Replay a JSONL trace (the simulator's format).")
    ] = None,
    mix: Annotated[
        str | None, typer.Option(help="Models and weights: resnet50=0.85,bert-base=0.15.")
    ] = None,
    duration: Annotated[str | None, typer.Option(help="Run length: 60s, 2m ...")] = None,
    warmup: Annotated[
        str | None, typer.Option(help="Left out of the figures at the start (e.g. 5s).")
    ] = None,
    payload: Annotated[
        list[str] | None,
        typer.Option(help="MODEL=FILE: a KServe v2 JSON request to send for MODEL."),
    ] = None,
    var_dim: Annotated[int, typer.Option(help="Size of variable (-1) input dims.")] = 1,
    slo: Annotated[
        list[str] | None, typer.Option(help="MODEL=MS: SLO for the attainment figures.")
    ] = None,
    scrape: Annotated[
        list[str] | None,
        typer.Option(help="NAME=URL of a backend to scrape (load endpoint, /metrics)."),
    ] = None,
    admin_token: Annotated[
        str | None,
        typer.Option(
            envvar="EVENSERVE_ADMIN_TOKEN",
            help="Gateway admin token: scrape the backends the gateway lists.",
        ),
    ] = None,
    max_requests: Annotated[int, typer.Option(help="Hard cap on requests sent.")] = 1_000_000,
    timeout: Annotated[float, typer.Option(help="Per-request time limit, seconds.")] = 30.0,
    seed: Annotated[int | None, typer.Option(help="Seed (default: scenario's, or 0).")] = None,
    out: Annotated[Path | None, typer.Option(help="Folder for the run (default: out/...).")] = None,
    allow_remote: Annotated[
        bool, typer.Option(help="Allow a target that is not a loopback address.")
    ] = False,
    plots: Annotated[bool, typer.Option(help="Write PNG plots.")] = True,
    progress: Annotated[bool, typer.Option(help="Show live progress.")] = True,
    arms: Annotated[
        str | None, typer.Option(help="Scenario: only these arms (comma-separated).")
    ] = None,
    repeats: Annotated[int, typer.Option(help="Scenario: runs per arm.")] = 1,
    time_scale: Annotated[
        float,
        typer.Option(help="Scenario: K; batches, think and inter-arrival times K times longer."),
    ] = DEFAULT_TIME_SCALE,
    repo: Annotated[
        Path, typer.Option(help="Scenario: model repository the models' inputs come from.")
    ] = Path("examples/models/emulated"),
    fidelity_check: Annotated[
        bool, typer.Option("--fidelity/--no-fidelity", help="Scenario: also simulate it.")
    ] = True,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="Scenario: override a field, key.path=value (repeatable)."),
    ] = None,
    level: Annotated[
        str | None,
        typer.Option(
            "--level",
            help="Scenario: run at this named load level (its open-loop phases, time-scaled).",
        ),
    ] = None,
    realtime: Annotated[
        bool,
        typer.Option(
            "--realtime/--no-realtime",
            help="Run the sending thread at real-time priority when permitted (else nice -10).",
        ),
    ] = True,
) -> None:
    """Load-test a live KServe v2 target, or every arm of a scenario on a local cluster."""
    try:
        if (target is None) == (scenario is None):
            raise ConfigError("give a TARGET_URL or --scenario FILE (one of them)")
        if level is not None and scenario is None:
            raise ConfigError("--level: only with --scenario (a load level of the scenario)")
        if scenario is not None:
            _bench_scenario(
                scenario,
                overrides=set_ or [],
                level=level,
                arms_opt=arms,
                repeats=repeats,
                k=time_scale,
                duration=duration,
                warmup=warmup,
                repo=repo,
                seed=seed,
                out=out,
                plots=plots,
                progress=progress,
                fidelity_check=fidelity_check,
                max_requests=max_requests,
                timeout_s=timeout,
                realtime=realtime,
            )
            return
        assert target is not None
        _bench_target(
            target,
            users=users,
            think_ms=think_ms,
            rate=rate,
            trace=trace,
            mix=mix,
            duration=duration,
            warmup=warmup,
            payload=payload,
            var_dim=var_dim,
            slo=slo,
            scrape=scrape,
            admin_token=admin_token,
            max_requests=max_requests,
            timeout_s=timeout,
            seed=seed or 0,
            out=out,
            allow_remote=allow_remote,
            plots=plots,
            progress=progress,
            realtime=realtime,
        )
    except EvenserveError as exc:
        fail(str(exc))


def _discover_scrapes(
    target: str, scrape: dict[str, str], admin_token: str | None, allow_remote: bool
) -> dict[str, str]:
    if scrape:
        return {n: check_url(u, allow_remote, f"--scrape {n}") for n, u in scrape.items()}
    found: dict[str, str] = {}
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        if admin_token:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                r = client.get(
                    target + "/admin/backends", headers={"Authorization": f"Bearer {admin_token}"}
                )
                if r.status_code == 200:
                    body = r.json()
                    items = body.get("backends", body) if isinstance(body, dict) else body
                    for b in items if isinstance(items, list) else []:
                        if isinstance(b, dict) and b.get("name") and b.get("url"):
                            found[str(b["name"])] = check_url(
                                str(b["url"]), allow_remote, f"backend {b['name']}"
                            )
        if not found:
            with contextlib.suppress(httpx.HTTPError):
                if client.get(target + "/v2/evenserve/load").status_code == 200:
                    found["target"] = target
    return found


def _bench_target(
    target: str,
    *,
    users: int | None,
    think_ms: float,
    rate: float | None,
    trace: Path | None,
    mix: str | None,
    duration: str | None,
    warmup: str | None,
    payload: list[str] | None,
    var_dim: int,
    slo: list[str] | None,
    scrape: list[str] | None,
    admin_token: str | None,
    max_requests: int,
    timeout_s: float,
    seed: int,
    out: Path | None,
    allow_remote: bool,
    plots: bool,
    progress: bool,
    realtime: bool,
) -> None:
    url = check_url(target, allow_remote)
    entries: list[Arrival] | None = None
    if trace is not None:
        entries = [Arrival(e.t_s, e.model, e.priority, e.deadline_ms) for e in read_trace(trace)]
        if not entries:
            raise ConfigError(f"--trace {trace}: no requests in the trace")
    if mix is None and entries is None:
        raise ConfigError("--mix: which models to send (e.g. --mix resnet50=0.85,bert-base=0.15)")
    weights = parse_mix(mix) if mix is not None else {}
    if users is None and rate is None and entries is None:
        raise ConfigError("give --users N (closed loop), --rate R (open loop) or --trace FILE")
    dur = parse_duration(duration or "60s", "--duration")
    wu = parse_duration(warmup or "0s", "--warmup")
    payload_files = {m: Path(p) for m, p in _pairs(payload, "--payload").items()}
    slos = {}
    for m, v in _pairs(slo, "--slo").items():
        try:
            slos[m] = float(v)
        except ValueError:
            raise ConfigError(f"--slo {m}={v}: not a number of milliseconds") from None
    spec = LoadSpec(
        target=url,
        mix=weights,
        duration_s=dur,
        warmup_s=wu,
        users=users,
        think_s=think_ms / 1000.0,
        rate_rps=rate,
        trace=entries,
        max_requests=max_requests,
        timeout_s=timeout_s,
        seed=seed,
        var_dim=var_dim,
        payload_files=payload_files,
    )
    spec.validate()
    spec.scrape = _discover_scrapes(url, _pairs(scrape, "--scrape"), admin_token, allow_remote)
    for m in spec.models():
        slos.setdefault(m, math.inf)
    folder = out or Path("out") / f"bench-{time.strftime('%Y%m%d-%H%M%S')}"
    console.print(
        f"bench {url}: {spec.mode()}"
        + (f", {users} users, think {think_ms:g} ms" if users is not None else "")
        + (f", {rate:g} req/s Poisson" if rate is not None else "")
        + (f", trace {trace}" if trace is not None else "")
        + f", {dur:g} s (warm-up {wu:g} s); scraping: {', '.join(spec.scrape) or 'nothing'}",
        highlight=False,
    )
    cpu0 = time.process_time()
    with live_progress(err_console, "load", enabled=progress) as show:
        result = run_load(spec, show, realtime=realtime)
    cpu_s = time.process_time() - cpu0
    labels = RunLabels(
        scenario=f"bench {url}",
        arm="live",
        routing="(target's)",
        batching="(target's)",
        seed=seed,
        slo_ms=slos,
    )
    write_run(folder / "runs" / "live", result, labels, {"loadgen_cpu_s": round(cpu_s, 3)})
    _print_errors(result)
    arm_summary = summarize(result_records(result, labels))
    summary = run_summary(labels.scenario, seed, {"live": arm_summary})
    summary["comparison"] = compare_rows(summary)
    summary["scheduling_lag_ms"] = result.lag_ms
    summary["connections"] = result.connections
    notes = [_lag_line(result), f"load generator CPU: {cpu_s / max(1e-9, dur):.1%} of one core"]
    if result.aborted:
        notes.insert(0, result.aborted)
    finish_report(folder, summary, title=f"bench {url}", notes=notes, plots=plots)
    ok = sum(1 for s in result.samples if s.outcome == "ok")
    if ok == 0:
        raise typer.Exit(1)


def _lag_line(result: LoadResult) -> str:
    lag = result.lag_ms
    if not lag.get("count"):
        return "scheduling lag: no sends measured"
    return (
        f"scheduling lag (actual - intended send time) over {lag['count']} sends: "
        f"P50 {lag['p50']:.3f} ms, P99 {lag['p99']:.3f} ms, max {lag['max']:.3f} ms "
        f"(generator thread: {result.priority})"
    )


def _print_errors(result: LoadResult) -> None:
    total = len(result.samples)
    if result.aborted:
        err_console.print(f"[bold red]{result.aborted}[/]", highlight=False, soft_wrap=True)
    if result.errors:
        err_console.print("[bold]errors[/]", highlight=False)
        for line in error_lines(result.errors, total):
            err_console.print("  " + line, highlight=False, soft_wrap=True)
    resent = result.connections.get("resent_stale", 0)
    if resent:
        err_console.print(
            f"resent: {resent} of {total} requests went out again on a fresh connection: the "
            "server closed the reused keep-alive connection before answering (a keep-alive "
            "race; per request: samples.jsonl 'resent'; run.json 'connections')",
            highlight=False,
            soft_wrap=True,
        )


def _bench_scenario(
    scenario: Path,
    *,
    overrides: list[str],
    level: str | None,
    arms_opt: str | None,
    repeats: int,
    k: float,
    duration: str | None,
    warmup: str | None,
    repo: Path,
    seed: int | None,
    out: Path | None,
    plots: bool,
    progress: bool,
    fidelity_check: bool,
    max_requests: int,
    timeout_s: float,
    realtime: bool,
) -> None:
    if repeats < 1:
        raise ConfigError("--repeats: must be >= 1")
    if not (k > 0 and math.isfinite(k)):
        raise ConfigError("--time-scale: must be a number > 0")
    loaded = with_level(load_scenario(scenario, overrides), level)
    sc = loaded.scenario
    dur = parse_duration(duration, "--duration") if duration else sc.duration_s
    if warmup is not None:
        wu = parse_duration(warmup, "--warmup")
    else:
        wu = sc.warmup_s * dur / sc.duration_s
    names = list(sc.arms) if arms_opt is None else [a.strip() for a in arms_opt.split(",") if a]
    for a in names:
        if a not in sc.arms:
            raise ConfigError(f"--arms: unknown arm {a!r} (arms: {', '.join(sc.arms)})")
    skipped = [a for a in names if sc.arms[a].routing == CENTRAL_QUEUE]
    live_arms = [a for a in names if a not in skipped]
    if not live_arms:
        raise ConfigError(
            "--arms: no arm with a live counterpart (central-queue is simulator-only)"
        )
    if not repo.is_dir():
        raise ConfigError(f"--repo: not a directory: {repo} (run from the project root?)")
    base_seed = sc.seed if seed is None else seed
    label = sc.name if level is None else f"{sc.name}-{level}"
    folder = out or Path("out") / f"bench-{label}-{time.strftime('%Y%m%d-%H%M%S')}"
    folder.mkdir(parents=True, exist_ok=True)
    workroot = Path(tempfile.mkdtemp(prefix="evenserve-bench-"))
    scaled = scale_scenario(loaded, k, dur, wu, workroot)
    profile_dirs = write_profile_sets(scaled, workroot)
    wl = scaled.scenario.workload
    console.print(
        f"bench {scenario}"
        + (f" at level {level}" if level is not None else "")
        + f": {len(live_arms)} arm(s) x {repeats} repeat(s), {dur:g} s each "
        f"(warm-up {wu:g} s), time scale K = {k:g}: every batch and think/inter-arrival time "
        f"x{k:g}, policies unchanged"
        + (f"; simulator-only arms skipped live: {', '.join(skipped)}" if skipped else ""),
        highlight=False,
        soft_wrap=True,
    )
    live: dict[str, list[dict[str, Any]]] = {}
    lags: dict[str, Any] = {}
    conns: dict[str, dict[str, int]] = {}
    cpu: dict[str, Any] = {}
    for arm in live_arms:
        for rep in range(repeats):
            rseed = base_seed + rep
            work = workroot / f"{arm}-{rep}"
            work.mkdir(parents=True)
            cluster_path = write_arm_cluster(scaled, arm, repo, work, profile_dirs, rseed)
            spec = _scenario_spec(scaled, wl, rseed, max_requests, timeout_s)
            title = f"{arm} #{rep + 1}"
            with arm_cluster(cluster_path, folder / "logs" / f"{arm}-{rep + 1}") as la:
                spec.target = la.gateway.url if la.gateway else ""
                spec.scrape = {p.name: p.url for p in la.workers}
                pids = {p.name: p.pid for p in la.workers}
                if la.gateway is not None:
                    pids["gateway"] = la.gateway.pid
                before = {n: _cpu_s(p) for n, p in pids.items()}
                cpu0, wall0 = time.process_time(), time.perf_counter()
                with live_progress(err_console, title, enabled=progress) as show:
                    result = run_load(spec, show, realtime=realtime)
                wall = time.perf_counter() - wall0
                after = {n: _cpu_s(p) for n, p in pids.items()}
                load_avg = os.getloadavg()[0]
            use = {
                n: round((after[n] - b) / wall, 4)  # type: ignore[operator]
                for n, b in before.items()
                if b is not None and after.get(n) is not None
            }
            use["loadgen"] = round((time.process_time() - cpu0) / wall, 4)
            cpu[f"{arm}#{rep + 1}"] = {"cores": use, "load_average_1m": load_avg}
            spec_arm = scaled.scenario.arms[arm]
            labels = RunLabels(
                scenario=sc.name,
                arm=arm,
                routing=spec_label(spec_arm.routing),
                batching=_batching_label(spec_arm),
                seed=rseed,
                slo_ms={m: v.slo_ms for m, v in scaled.scenario.models.items()},
                timeseries_interval_s=sc.timeseries_interval_s,
            )
            write_run(
                folder / "runs" / arm / f"rep{rep + 1}",
                result,
                labels,
                {"time_scale": k, "cpu": cpu[f"{arm}#{rep + 1}"]},
            )
            _print_errors(result)
            s = summarize(result_records(result, labels))
            live.setdefault(arm, []).append(s)
            lags[f"{arm}#{rep + 1}"] = result.lag_ms
            conns[f"{arm}#{rep + 1}"] = result.connections
            total_cpu = sum(use.values())
            console.print(
                f"  {title}: P50 {_f(s['latency_ms']['p50'], 1)} ms, P99 "
                f"{_f(s['latency_ms']['p99'], 1)} ms, {s['throughput_rps']:.1f} req/s, spread "
                f"{s['utilization_spread_pts']:.1f} pts; lag P99 {_f(result.lag_ms['p99'], 3)} "
                f"ms ({result.priority}); CPU {total_cpu:.2f} cores of {os.cpu_count()} "
                f"(load avg {load_avg:.2f})",
                highlight=False,
            )
    sim_stats: dict[str, Any] = {}
    sim_summaries: dict[str, Any] = {}
    if fidelity_check:
        with console.status("simulating the same scenario at the same time scale ..."):
            for arm in live_arms + skipped:
                runs = [
                    summarize(simulate(scaled, arm, base_seed + rep), timeseries=False)
                    for rep in range(repeats)
                ]
                sim_stats[arm] = repeat_stats(runs)
                sim_summaries[arm] = headline(runs)
    repeat_block = {a: repeat_stats(v) for a, v in live.items()}
    summary = run_summary(sc.name, base_seed, {a: headline(v) for a, v in live.items()})
    summary["comparison"] = compare_rows(summary)
    summary["time_scale"] = k
    if level is not None:
        summary["level"] = level
    summary["repeats"] = repeat_block
    summary["scheduling_lag_ms"] = lags
    summary["connections"] = conns
    summary["cpu"] = cpu
    if fidelity_check:
        summary["fidelity"] = fidelity(repeat_block, sim_stats)
        summary["simulated"] = {"arms": sim_summaries, "repeats": sim_stats}
    (folder / BENCH_META).write_text(
        json.dumps(
            {
                "scenario": str(scenario),
                "overrides": overrides,
                "level": level,
                "time_scale": k,
                "duration_s": dur,
                "warmup_s": wu,
                "repeats": repeats,
                "arms": live_arms,
                "skipped_arms": skipped,
                "seed": base_seed,
            },
            indent=2,
        )
        + "\n"
    )
    worst_lag = max((v["p99"] for v in lags.values() if v.get("p99") is not None), default=None)
    notes = [
        f"Live: {len(live_arms)} arm(s) on a local emulated cluster (gateway + "
        f"{len(sc.expanded_devices())} workers), {dur:g} s per run, warm-up {wu:g} s, "
        f"{repeats} repeat(s); time scale K = {k:g} (batch, think and inter-arrival times x{k:g}; "
        "batching windows and the signal period unscaled).",
        f"Table: the repeat with the median P99 per arm. Worst scheduling-lag P99 of the load "
        f"generator over all runs: {_f(worst_lag, 3)} ms.",
    ]
    if skipped:
        notes.append(f"Simulator-only arms (no live run): {', '.join(skipped)}.")
    finish_report(
        folder,
        summary,
        title=f"{sc.name}"
        + (f" at level {level}" if level is not None else "")
        + f": live bench (K = {k:g})",
        notes=notes,
        plots=plots,
    )


def _batching_label(arm: Any) -> str:
    label = spec_label(arm.batching)
    if arm.batching_per_model:
        label += "; " + "; ".join(
            f"{m}: {spec_label(s)}" for m, s in sorted(arm.batching_per_model.items())
        )
    return label


def _scenario_spec(
    scaled: LoadedScenario, wl: Any, seed: int, max_requests: int, timeout_s: float
) -> LoadSpec:
    sc = scaled.scenario
    prio = {m: v.priority for m, v in sc.models.items()}
    common: dict[str, Any] = {
        "target": "",
        "duration_s": sc.duration_s,
        "warmup_s": sc.warmup_s,
        "seed": seed,
        "max_requests": max_requests,
        "timeout_s": timeout_s,
        "scrape_interval_s": sc.signals.interval_ms / 1000.0,
        "model_priority": prio,
        # A static batch that never fills holds its requests forever: do not wait long.
        "drain_s": 5.0,
    }
    if isinstance(wl, ClosedLoop):
        return LoadSpec(mix=dict(wl.mix), users=wl.users, think_s=wl.think_ms / 1000.0, **common)
    if isinstance(wl, OpenLoop):
        return LoadSpec(mix={}, trace=open_loop_arrivals(scaled, seed), **common)
    assert isinstance(wl, TraceWorkload)
    entries = read_trace(scaled.resolve(wl.path), list(sc.models))
    arrivals = [
        Arrival(
            e.t_s,
            e.model,
            e.priority,
            e.deadline_ms if e.deadline_ms is not None else sc.models[e.model].deadline_ms,
        )
        for e in entries
    ]
    return LoadSpec(mix={}, trace=arrivals, **common)


def report(
    runs: Annotated[list[Path], typer.Argument(help="Bench folders (or single run folders).")],
    out: Annotated[
        Path | None, typer.Option(help="Where to write (default: RUN/report of the first).")
    ] = None,
    plots: Annotated[bool, typer.Option(help="Write PNG plots.")] = True,
) -> None:
    """Tables, plots and an HTML report from saved bench runs (figures recomputed from raw)."""
    try:
        arms: dict[str, list[dict[str, Any]]] = {}
        fid_sim: dict[str, Any] = {}
        scales: set[float] = set()
        name = ""
        for folder in runs:
            if not folder.is_dir():
                raise ConfigError(f"{folder}: not a folder")
            run_dirs = sorted(p.parent for p in folder.glob("runs/*/*/run.json"))
            run_dirs += sorted(p.parent for p in folder.glob("runs/*/run.json"))
            if (folder / "run.json").is_file():
                run_dirs = [folder]
            if not run_dirs:
                raise ConfigError(f"{folder}: no runs found (expected runs/ARM/repN/run.json)")
            for rd in run_dirs:
                rec, meta = read_run(rd)
                key = rec.arm if len(runs) == 1 else f"{folder.name}:{rec.arm}"
                arms.setdefault(key, []).append(summarize(rec))
                name = name or rec.scenario
                if meta.get("time_scale") is not None:
                    scales.add(float(meta["time_scale"]))
            prev = folder / SUMMARY
            if prev.is_file():
                with contextlib.suppress(json.JSONDecodeError, KeyError, TypeError):
                    sim = json.loads(prev.read_text()).get("simulated") or {}
                    for a, st in (sim.get("repeats") or {}).items():
                        fid_sim[a if len(runs) == 1 else f"{folder.name}:{a}"] = st
        summary = run_summary(name, 0, {a: headline(v) for a, v in arms.items()})
        summary["comparison"] = compare_rows(summary)
        summary["repeats"] = {a: repeat_stats(v) for a, v in arms.items()}
        k = next(iter(scales)) if len(scales) == 1 else None
        if k is not None:
            summary["time_scale"] = k
        if fid_sim:
            summary["fidelity"] = fidelity(summary["repeats"], fid_sim)
        dest = out or runs[0] / "report"
        notes = [
            f"Recomputed from the raw samples of {sum(len(v) for v in arms.values())} run(s) "
            f"in {', '.join(str(r) for r in runs)}.",
            "Table: the repeat with the median P99 per arm.",
        ]
        finish_report(dest, summary, title=f"{name}: report", notes=notes, plots=plots)
    except EvenserveError as exc:
        fail(str(exc))
