"""``evenserve bench URL``: load-test a live KServe v2 target (a gateway or a worker).

The load generator runs the spec against the target while it scrapes the backends it finds
(given ones, the gateway's admin listing, or the target's own load endpoint); the raw run is
saved under ``runs/live`` and reported like a scenario bench's single arm.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from evenserve.core.wire import LOAD_PATH
from evenserve.experiment.notes import lag_line, print_errors
from evenserve.experiment.report import finish_report
from evenserve.loadgen.display import live_progress
from evenserve.loadgen.records import RunLabels, result_records, write_run
from evenserve.loadgen.runner import run_load
from evenserve.loadgen.spec import LoadResult, LoadSpec
from evenserve.loadgen.target import check_url
from evenserve.report.summary import run_summary, summarize
from evenserve.report.table import compare_rows


@dataclass
class TargetBench:
    """What to bench: the load (``spec.target`` a checked URL), SLOs per model (``--slo``,
    ms; a model without one takes its model config's, else gets none), the backends to scrape
    (NAME -> URL; none given: discovered)."""

    spec: LoadSpec
    slo_ms: dict[str, float] = field(default_factory=dict)
    scrape: dict[str, str] = field(default_factory=dict)
    admin_token: str | None = None
    allow_remote: bool = False
    out: Path | None = None
    plots: bool = True
    progress: bool = True
    realtime: bool = True
    #: The trace file the spec replays, for the header line.
    trace_path: Path | None = None


@dataclass
class TargetBenchResult:
    folder: Path
    summary: dict[str, Any]
    result: LoadResult

    @property
    def ok(self) -> int:
        """Requests answered 200."""
        return sum(1 for s in self.result.samples if s.outcome == "ok")


def discover_scrapes(
    target: str, scrape: dict[str, str], admin_token: str | None, allow_remote: bool
) -> dict[str, str]:
    """The backends to scrape: the given ones (checked), else those the gateway's admin API
    lists (with a token), else the target itself if it has a load endpoint, else none."""
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
                if client.get(target + LOAD_PATH).status_code == 200:
                    found["target"] = target
    return found


#: Where a model's SLO came from (``slo_source`` in the summary).
SLO_FLAG, SLO_MODEL_CONFIG, SLO_NONE = "flag", "model config", "none"
#: The model config parameter that carries a model's SLO (the worker's ``model.yaml``
#: ``slo_ms``), a KServe v2 / Triton string parameter.
SLO_PARAMETER = "evenserve_slo_ms"


def config_slo_ms(client: httpx.Client, target: str, model: str) -> float | None:
    """The SLO (ms) the target's model config states (``parameters.evenserve_slo_ms``), or
    None: no config endpoint, no such parameter, or not a positive number."""
    with contextlib.suppress(httpx.HTTPError, ValueError, TypeError, AttributeError):
        r = client.get(f"{target}/v2/models/{model}/config")
        if r.status_code != 200:
            return None
        body = r.json()
        cfg = body.get("config", body) if isinstance(body, dict) else {}
        param: Any = (cfg.get("parameters") or {}).get(SLO_PARAMETER)
        if param is None:
            return None
        value = float(param["string_value"] if isinstance(param, dict) else param)
        return value if math.isfinite(value) and value > 0 else None
    return None


def resolve_slos(
    target: str, models: list[str], given: dict[str, float]
) -> tuple[dict[str, float], dict[str, str]]:
    """Each model's SLO (ms; inf: none) and where it came from: ``--slo``, else the model
    config the target answers, else none (the model then gets no attainment figure)."""
    slos: dict[str, float] = {}
    source: dict[str, str] = {}
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        for m in sorted({*models, *given}):
            if m in given:
                slos[m], source[m] = given[m], SLO_FLAG
                continue
            found = config_slo_ms(client, target, m)
            slos[m] = math.inf if found is None else found
            source[m] = SLO_NONE if found is None else SLO_MODEL_CONFIG
    return slos, source


def scraped_nothing_line(spec: LoadSpec, result: LoadResult, admin_token: str | None) -> str | None:
    """The note for a run whose scrapes got nothing (utilization not measured), else None."""
    if any(b.queue_t_s or b.busy_t_s for b in result.scrapes.values()):
        return None
    if not spec.scrape:
        why = (
            "the gateway's admin API listed no backend"
            if admin_token
            else "no backend to scrape (a gateway lists its backends only with --admin-token)"
        )
    else:
        why = f"no scrape of {', '.join(sorted(spec.scrape))} answered"
    return (
        f"utilization not measured: {why}; give --admin-token (a gateway) or "
        "--scrape NAME=URL (a worker's base URL) to measure it"
    )


def run_target_bench(
    bench: TargetBench, console: Console, err_console: Console
) -> TargetBenchResult:
    spec = bench.spec
    spec.validate()
    url = spec.target
    spec.scrape = discover_scrapes(url, bench.scrape, bench.admin_token, bench.allow_remote)
    slos, slo_source = resolve_slos(url, spec.models(), bench.slo_ms)
    folder = bench.out or Path("out") / f"bench-{time.strftime('%Y%m%d-%H%M%S')}"
    dur, wu = spec.duration_s, spec.warmup_s
    console.print(
        f"bench {url}: {spec.mode()}"
        + (
            f", {spec.users} users, think {spec.think_s * 1000.0:g} ms"
            if spec.users is not None
            else ""
        )
        + (f", {spec.rate_rps:g} req/s Poisson" if spec.rate_rps is not None else "")
        + (f", trace {bench.trace_path}" if bench.trace_path is not None else "")
        + f", {dur:g} s (warm-up {wu:g} s); scraping: {', '.join(spec.scrape) or 'nothing'}",
        highlight=False,
    )
    slo_line = "SLOs: " + ", ".join(
        f"{m} {slos[m]:g} ms ({slo_source[m]})" if slo_source[m] != SLO_NONE else f"{m} none"
        for m in sorted(slos)
    )
    console.print(slo_line, highlight=False)
    cpu0 = time.process_time()
    with live_progress(err_console, "load", enabled=bench.progress) as show:
        result = run_load(spec, show, realtime=bench.realtime)
    cpu_s = time.process_time() - cpu0
    labels = RunLabels(
        scenario=f"bench {url}",
        arm="live",
        routing="(target's)",
        batching="(target's)",
        seed=spec.seed,
        slo_ms=slos,
    )
    write_run(
        folder / "runs" / "live",
        result,
        labels,
        {"loadgen_cpu_s": round(cpu_s, 3), "slo_source": slo_source},
    )
    print_errors(result, err_console)
    arm_summary = summarize(result_records(result, labels))
    for m, v in arm_summary["models"].items():
        v["slo_source"] = slo_source.get(m, SLO_NONE)
    summary = run_summary(labels.scenario, spec.seed, {"live": arm_summary})
    summary["comparison"] = compare_rows(summary)
    summary["scheduling_lag_ms"] = result.lag_ms
    summary["connections"] = result.connections
    notes = [
        lag_line(result),
        f"load generator CPU: {cpu_s / max(1e-9, dur):.1%} of one core",
        slo_line + " (a model without an SLO gets no attainment figure)",
    ]
    unmeasured = scraped_nothing_line(spec, result, bench.admin_token)
    if unmeasured is not None:
        notes.insert(0, unmeasured)
    if result.aborted:
        notes.insert(0, result.aborted)
    finish_report(
        folder, summary, title=f"bench {url}", notes=notes, plots=bench.plots, console=console
    )
    return TargetBenchResult(folder, summary, result)
