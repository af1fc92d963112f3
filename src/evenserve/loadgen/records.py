"""A live run on disk (raw JSONL) and as :class:`~evenserve.core.results.RunRecords`.

A run folder holds ``samples.jsonl`` (one line per request: model, intended/actual send time,
answer time, status, outcome, backend, whether it was resent after a keep-alive race),
``scrapes.jsonl`` (one line per backend with its time series), and ``run.json`` (what was
run: target, mode, arm labels, window, SLOs, lag, errors, the send path's connections).
:func:`to_records` turns them into the RunRecords the simulator also produces, so
``report.summary.summarize`` computes live and simulated figures with one piece of code:
- a request's arrival is its *intended* send time, its finish the time its answer arrived;
  a failed request is a drop whose reason is its outcome (``overloaded``, ``http-500``,
  ``timeout`` ...); one never answered is unfinished;
- a backend's queue-depth samples are the load endpoint's ``queue_depth`` (requests waiting,
  as the simulator samples them every signal interval); its busy time comes from the sampled
  busy-seconds counter; a backend whose scrapes never answered is no device of the records
  (its utilization was not measured: no figure, rather than 0 %);
- a backend's diagnosis figures (``report.device_figures.device_diagnostics``'s keys) come from
  its counters' deltas over the window, each counter interpolated linearly at the window's
  edges (``measured_diagnostics``): held seconds / (window x instances), (compute seconds -
  input staging) / the profile's expected seconds, staging / compute seconds, the peak of
  memory used / total among the readings in the window; per model the batches, mean size,
  cap (the gauge's last reading in the window), fill (mean size / cap) and held ms per
  batch. The simulator's per-batch ``burst`` and the models' ``profile`` are None live.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from evenserve.core.errors import ConfigError
from evenserve.core.results import DeviceTrace, RequestLog, RunRecords
from evenserve.loadgen.scrape import BackendScrape
from evenserve.loadgen.spec import LoadResult, Sample

SAMPLES = "samples.jsonl"
SCRAPES = "scrapes.jsonl"
RUN_META = "run.json"
DEFAULT_PRIORITY = 10
T = TypeVar("T")


@dataclass
class RunLabels:
    """How a live run is named in reports."""

    scenario: str
    arm: str
    routing: str
    batching: str
    seed: int
    slo_ms: dict[str, float]
    timeseries_interval_s: float = 1.0
    #: The policies in force with every parameter (``Registry.resolved``), when known:
    #: routing, and batching per model.
    routing_spec: dict[str, object] = dataclasses.field(default_factory=dict)
    batching_spec: dict[str, dict[str, object]] = dataclasses.field(default_factory=dict)
    #: Per device and model, the profile the run gave it: (batch sizes, ms per batch); the
    #: summary's ``per_model.profile`` (what diagnosis reads memory- vs compute-bound from).
    profiles: dict[str, dict[str, tuple[list[int], list[float]]]] = dataclasses.field(
        default_factory=dict
    )


def _r(x: float) -> float:
    return round(x, 6)


def _at(ts: list[float], vs: list[float], t: float) -> float:
    """A counter's value at ``t``: linear between readings, the nearest one outside them."""
    if t <= ts[0]:
        return vs[0]
    if t >= ts[-1]:
        return vs[-1]
    i = bisect.bisect_right(ts, t)
    t_a, t_b = ts[i - 1], ts[i]
    f = (t - t_a) / (t_b - t_a) if t_b > t_a else 1.0
    return vs[i - 1] + f * (vs[i] - vs[i - 1])


def measured_diagnostics(
    readings_t_s: list[float], readings: list[dict[str, Any]], t0: float, t1: float
) -> dict[str, Any] | None:
    """``report.device_figures.device_diagnostics``'s figures from a worker's diagnosis readings
    (``loadgen.scrape.parse_diagnosis``) over ``[t0, t1]``; None with fewer than two."""
    if len(readings) < 2 or len(readings_t_s) != len(readings):
        return None
    window = max(t1 - t0, 1e-9)
    inst = max(1.0, max(float(r.get("instances", 1.0)) for r in readings))
    models = sorted({m for r in readings for m in r["models"]})

    def delta(m: str, key: str) -> float:
        ts = [
            t for t, r in zip(readings_t_s, readings, strict=True) if key in r["models"].get(m, {})
        ]
        vs = [r["models"][m][key] for r in readings if key in r["models"].get(m, {})]
        if not ts:
            return 0.0
        return max(0.0, _at(ts, vs, t1) - _at(ts, vs, t0))

    inside = [r for t, r in zip(readings_t_s, readings, strict=True) if t0 <= t <= t1]
    per_model: dict[str, Any] = {}
    held = expected = computed = staged = 0.0
    # Observed vs profile over the models with a profile only (the others expect nothing).
    profiled_compute = profiled_staged = 0.0
    for m in models:
        n = delta(m, "batches")
        items = delta(m, "items")
        h = delta(m, "held_s")
        held += h
        e, c, i = delta(m, "expected_s"), delta(m, "compute_s"), delta(m, "input_s")
        expected += e
        computed += c
        staged += i
        if e > 0:
            profiled_compute += c
            profiled_staged += i
        caps = [r["models"][m]["cap"] for r in inside if "cap" in r["models"].get(m, {})]
        cap = int(caps[-1]) if caps else None
        mean = items / n if n > 0 else None
        per_model[m] = {
            # Counter deltas at interpolated edges: whole batches, rounded.
            "batches": round(n),
            "mean_batch_size": None if mean is None else _r(mean),
            "cap": cap,
            "fill": _r(mean / cap) if mean is not None and cap else None,
            "held_ms_mean": _r(1000.0 * h / n) if n > 0 else None,
            "held_fraction": _r(h / (window * inst)),
            "profile": None,
        }
    mem = [
        r["memory_used_bytes"] / r["memory_total_bytes"]
        for r in inside
        if r.get("memory_total_bytes") and "memory_used_bytes" in r
    ]
    batched = any(p["batches"] for p in per_model.values())
    return {
        "models": models,
        "held_idle_fraction": _r(held / (window * inst)) if batched else None,
        "observed_vs_profile": _r((profiled_compute - profiled_staged) / expected)
        if expected > 0
        else None,
        "staging_fraction": _r(staged / computed) if computed > 0 else None,
        "memory_peak_fraction": _r(max(mem)) if mem else None,
        "per_model": per_model,
        "burst": None,
    }


def to_records(
    samples: list[Sample],
    scrapes: dict[str, BackendScrape],
    labels: RunLabels,
    warmup_s: float,
    end_s: float,
) -> RunRecords:
    log = RequestLog()
    slo = dict(labels.slo_ms)
    for s in samples:
        i = log.add(s.model, s.intended_s, DEFAULT_PRIORITY if s.priority is None else s.priority)
        if s.outcome == "ok":
            log.finish_s[i] = s.done_s
            log.device[i] = s.backend
        elif s.outcome != "unfinished":
            log.drop_reason[i] = s.outcome
        slo.setdefault(s.model, math.inf)
    devices = []
    for name, b in sorted(scrapes.items()):
        if not b.queue_t_s and not b.busy_t_s:
            continue  # never answered: not measured, rather than a device 0 % busy
        bt, bc = b.busy_series()
        diag = measured_diagnostics(b.metrics_t_s, b.metrics, warmup_s, end_s)
        for m, (batches, ms) in labels.profiles.get(name, {}).items():
            if diag is not None and m in diag["per_model"]:
                diag["per_model"][m]["profile"] = {"batches": batches, "latency_ms": ms}
        devices.append(
            DeviceTrace(
                name,
                queue_t_s=list(b.queue_t_s),
                queue_depth=list(b.queue_depth),
                busy_t_s=list(bt),
                busy_total_s=list(bc),
                models=[] if diag is None else list(diag["models"]),
                measured_diagnostics=diag,
            )
        )
    # The run's labels name the records; the SLOs cover every model that was sent.
    named = {**dataclasses.asdict(labels), "slo_ms": slo}
    named.pop("profiles")
    return RunRecords(**named, warmup_s=warmup_s, end_s=end_s, requests=log, devices=devices)


def measured_batch_figures(summary: dict[str, Any]) -> dict[str, Any]:
    """A live summary's per-device ``batches`` and ``mean_batch_size`` from its measured
    per-model figures (``summarize`` counts them from per-batch records, which a live run
    has not: 0 and None there would say nothing ran). Changes ``summary`` in place."""
    for d in summary.get("devices", {}).values():
        per_model = d.get("per_model") or {}
        if not per_model or d.get("batches"):
            continue  # counted from per-batch records (the simulator's) already
        n = sum(p["batches"] for p in per_model.values())
        items = sum(p["batches"] * (p["mean_batch_size"] or 0.0) for p in per_model.values())
        d["batches"] = n
        d["mean_batch_size"] = _r(items / n) if n else None
    return summary


def result_records(result: LoadResult, labels: RunLabels) -> RunRecords:
    return to_records(result.samples, result.scrapes, labels, result.spec.warmup_s, result.end_s)


def write_run(folder: Path, result: LoadResult, labels: RunLabels, extra: dict[str, Any]) -> None:
    """Raw samples, scrapes and the run's description into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / SAMPLES).open("w") as f:
        for s in result.samples:
            f.write(json.dumps(s.to_json()) + "\n")
    with (folder / SCRAPES).open("w") as f:
        for b in result.scrapes.values():
            f.write(json.dumps(dataclasses.asdict(b)) + "\n")
    spec = result.spec
    meta = {
        "labels": dataclasses.asdict(labels),
        "target": spec.target,
        "mode": spec.mode(),
        "users": spec.users,
        "think_ms": spec.think_s * 1000.0,
        "rate_rps": spec.rate_rps,
        "mix": spec.mix,
        "warmup_s": spec.warmup_s,
        "end_s": result.end_s,
        "started_unix_s": result.started_unix_s,
        "scheduling_lag_ms": result.lag_ms,
        "generator_priority": result.priority,
        "errors": result.errors,
        "aborted": result.aborted,
        "connections": result.connections,
        **extra,
    }
    (folder / RUN_META).write_text(json.dumps(meta, indent=2) + "\n")


def _num(x: Any) -> float:
    return math.nan if x is None else float(x)


def _sample(o: dict[str, Any]) -> Sample:
    return Sample(
        model=str(o["model"]),
        intended_s=float(o["intended_s"]),
        sent_s=_num(o.get("sent_s")),
        done_s=_num(o.get("done_s")),
        status=int(o.get("status", 0)),
        outcome=str(o["outcome"]),
        backend=str(o.get("backend", "")),
        user=int(o.get("user", -1)),
        priority=None if o.get("priority") is None else int(o["priority"]),
        resent=int(o.get("resent", 0)),
    )


def _scrape(o: dict[str, Any]) -> BackendScrape:
    b = BackendScrape(name=str(o["name"]), url=str(o.get("url", "")))
    b.queue_t_s = [float(x) for x in o["queue_t_s"]]
    b.queue_depth = [float(x) for x in o["queue_depth"]]
    b.in_flight = [float(x) for x in o.get("in_flight", [])]
    b.utilization = [float(x) for x in o.get("utilization", [])]
    b.busy_t_s = [float(x) for x in o.get("busy_t_s", [])]
    b.busy_total_s = [float(x) for x in o.get("busy_total_s", [])]
    b.metrics_t_s = [float(x) for x in o.get("metrics_t_s", [])]
    b.metrics = [dict(x) for x in o.get("metrics", [])]
    return b


def _read_jsonl(path: Path, what: str, parse: Callable[[Any], T]) -> list[T]:
    """Every non-blank line parsed; a bad one is a ConfigError naming the file and line."""
    out: list[T] = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append(parse(json.loads(line)))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{path}:{n}: bad {what} ({type(exc).__name__}: {exc})") from None
    return out


def read_run(folder: Path) -> tuple[RunRecords, dict[str, Any]]:
    """A run folder back into RunRecords (and its run.json); errors name the file and line."""
    meta_path = folder / RUN_META
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{folder}: not a run folder (no {RUN_META})") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{meta_path}: not valid JSON: {exc.msg}") from None
    try:
        lab = meta["labels"]
        labels = RunLabels(
            scenario=str(lab["scenario"]),
            arm=str(lab["arm"]),
            routing=str(lab["routing"]),
            batching=str(lab["batching"]),
            seed=int(lab["seed"]),
            slo_ms={str(k): float(v) for k, v in lab["slo_ms"].items()},
            timeseries_interval_s=float(lab.get("timeseries_interval_s", 1.0)),
            routing_spec=dict(lab.get("routing_spec") or {}),
            batching_spec={str(k): dict(v) for k, v in (lab.get("batching_spec") or {}).items()},
            profiles={
                str(d): {str(m): (list(p[0]), list(p[1])) for m, p in v.items()}
                for d, v in (lab.get("profiles") or {}).items()
            },
        )
        warmup_s, end_s = float(meta["warmup_s"]), float(meta["end_s"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(f"{meta_path}: missing or bad field {exc}") from None
    try:
        samples = _read_jsonl(folder / SAMPLES, "sample", _sample)
    except FileNotFoundError:
        raise ConfigError(f"{folder}: no {SAMPLES}") from None
    spath = folder / SCRAPES
    scrapes = {b.name: b for b in _read_jsonl(spath, "scrape", _scrape)} if spath.is_file() else {}
    return to_records(samples, scrapes, labels, warmup_s, end_s), meta
