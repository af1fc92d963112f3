"""Turn RunRecords into the run summary (the JSON shape shared by simulate, compare and bench).

Definitions (all over the measured window ``[warmup_s, end_s]``):
- throughput: requests completed in the window / window length.
- latency percentiles: over requests that arrived in the window and completed.
- SLO attainment (per model, and ``slo_attainment`` over all requests): completed within
  the SLO / requests that arrived in the window and were
  decided (completed, dropped, or still unfinished at the end but already older than the SLO).
- a model without an SLO (``slo_ms`` inf, None in the JSON) has no attainment and no
  goodput (None), and its requests count in no attainment over several models: never 100 %.
- goodput: completions in the window that met their SLO / window length.
- device utilization: busy time inside the window / window length (busy-time, not "a kernel
  was running"); the spread is busiest minus idlest, in percentage points; both None when
  no device was measured (a live run that scraped no backend). Busy time comes
  from busy intervals (the simulator) or, when those are absent, from samples of a
  cumulative busy-seconds counter (a live scrape), linear between samples.
- queue depth: mean and max of the queue-depth samples taken every signal interval
  (100 ms by default): what the router and a Prometheus scrape see, and what a live run can
  measure too. The simulator also reports the exact time-weighted mean and the exact
  instantaneous max (``exact_*``), which under a batching window include the requests a
  window deliberately holds back.
- requests: over the whole run; arrived = completed + dropped + in_flight.
- device_seconds (the simulator; None live): each device's time on, summed over the whole
  run (the cost a user pays): devices x duration unless placement turns devices on and off.
- loads, warm_loads, evictions: placement's model loads started (warm: from host memory) and
  unloads (to make room or by rebalance), over the whole run; 0 without placement.
- load_wait: requests that arrived in the window and waited for their model to load (until
  it was loaded, or until they timed out as ``load-timeout``): how many, and the mean, P99
  and max of that wait in ms (part of their latency).
- placement (only with loads or evictions): ``evictions_per_load`` = evictions / loads;
  ``resident``: the requests that did not wait for a load (``load_wait_s`` absent or 0):
  their SLO attainment, the same definition as above; ``cold``: those that waited: how
  many, their latency P99 in ms, and ``p99_of_bound``: the P99 over them of latency / bound,
  the bound of a request being its model's ``cold_load_s + 2 * batch_s`` (its load time
  plus two batch times, ``RunRecords.load_bound_s``): at most 1 when P99 keeps the bound.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections import Counter
from typing import Any

import numpy as np

from evenserve.core.results import DeviceTrace, RunRecords
from evenserve.core.wire import PRIORITY_CLASSES

PERCENTILES = {"p50": 50.0, "p95": 95.0, "p99": 99.0}
CDF_POINTS = 101


def _r(x: float, nd: int = 6) -> float:
    """Round for stable, readable JSON (NaN becomes None upstream)."""
    return float(round(x, nd))


def latency_figures(lat_ms: np.ndarray) -> dict[str, float | None]:
    if lat_ms.size == 0:
        return {"p50": None, "p95": None, "p99": None, "max": None, "mean": None}
    # One partition for every percentile: the same figures as one call each.
    values = np.percentile(lat_ms, list(PERCENTILES.values()))
    out: dict[str, float | None] = {
        k: _r(float(v)) for k, v in zip(PERCENTILES, values, strict=True)
    }
    out["max"] = _r(float(lat_ms.max()))
    out["mean"] = _r(float(lat_ms.mean()))
    return out


def load_wait_figures(rec: RunRecords) -> dict[str, Any]:
    """Waits for a load of the requests that arrived in the measured window (ms)."""
    arr = rec.requests.arrival_s
    t0, t1 = rec.warmup_s, rec.end_s
    w = np.asarray(
        [s for i, s in rec.requests.load_wait_s.items() if t0 <= arr[i] < t1], dtype=float
    )
    if w.size == 0:
        return {"requests": 0, "mean_ms": None, "p99_ms": None, "max_ms": None}
    ms = w * 1000.0
    return {
        "requests": int(w.size),
        "mean_ms": _r(float(ms.mean())),
        "p99_ms": _r(float(np.percentile(ms, 99.0))),
        "max_ms": _r(float(ms.max())),
    }


def placement_figures(
    rec: RunRecords,
    log: Any,
    lat_ms: np.ndarray,
    measured: np.ndarray,
    done: np.ndarray,
    in_slo: np.ndarray,
    decided: np.ndarray,
) -> dict[str, Any]:
    """Resident against cold requests (module docstring); {} for a run without placement."""
    if not rec.loads and not rec.evictions:
        return {}
    cold = np.zeros(len(log), dtype=bool)
    for i, w in log.load_wait_s.items():
        cold[i] = w > 0
    resident = ~cold
    n_dec = int((resident & decided).sum())
    met = int((resident & measured & done & in_slo).sum())
    cold_lat = lat_ms[cold & measured & done]
    sel = np.flatnonzero(cold & measured & done)
    bound = np.asarray([rec.load_bound_s.get(log.model[i], math.nan) for i in sel], dtype=float)
    ratio = lat_ms[sel] / (bound * 1000.0)
    return {
        "evictions_per_load": _r(rec.evictions / rec.loads) if rec.loads else None,
        "resident": {"slo_attainment": _r(met / n_dec) if n_dec else None},
        "cold": {
            "requests": int((cold & measured).sum()),
            "p99_ms": _r(float(np.percentile(cold_lat, 99.0))) if cold_lat.size else None,
            "p99_of_bound": _r(float(np.percentile(ratio, 99.0)))
            if ratio.size and not np.isnan(ratio).any()
            else None,
        },
    }


def _busy_counter_at(tr: DeviceTrace, t: np.ndarray) -> np.ndarray:
    """The sampled cumulative busy seconds at times ``t`` (linear between samples)."""
    out: np.ndarray = np.interp(t, np.asarray(tr.busy_t_s), np.asarray(tr.busy_total_s))
    return out


def _sampled_busy(tr: DeviceTrace) -> bool:
    return not tr.busy_start_s and len(tr.busy_t_s) >= 2


def busy_in_window(tr: DeviceTrace, t0: float, t1: float) -> float:
    if _sampled_busy(tr):
        a, b = _busy_counter_at(tr, np.asarray([t0, t1]))
        return float(max(0.0, b - a))
    if not tr.busy_start_s:
        return 0.0
    s = np.asarray(tr.busy_start_s)
    e = np.asarray(tr.busy_end_s)
    busy = float(np.clip(np.minimum(e, t1) - np.maximum(s, t0), 0.0, None).sum())
    return busy / max(1, tr.instances)


def utilization_series(tr: DeviceTrace, t0: float, t1: float, dt: float) -> list[float]:
    edges = np.arange(t0, t1 + 1e-9, dt)
    if edges.size < 2:
        return []
    if _sampled_busy(tr):
        cum = _busy_counter_at(tr, edges)
        widths = np.diff(edges)
        return [_r(float(max(0.0, c) / w)) for c, w in zip(np.diff(cum), widths, strict=True)]
    if not tr.busy_start_s:
        return [0.0] * (edges.size - 1)
    s = np.asarray(tr.busy_start_s)
    e = np.asarray(tr.busy_end_s)
    n = max(1, tr.instances)
    return [
        _r(float(np.clip(np.minimum(e, b) - np.maximum(s, a), 0.0, None).sum() / ((b - a) * n)))
        for a, b in itertools.pairwise(edges)
    ]


def queue_series(tr: DeviceTrace, t0: float, t1: float, dt: float) -> list[float]:
    edges = np.arange(t0, t1 + 1e-9, dt)
    if edges.size < 2:
        return []
    t = np.asarray(tr.queue_t_s)
    q = np.asarray(tr.queue_depth)
    in_bins = (q[(t >= a) & (t < b)] for a, b in itertools.pairwise(edges))
    return [_r(float(sel.mean())) if sel.size else 0.0 for sel in in_bins]


#: Bins of the fine utilization reading (``burst``): short enough to see single batches.
BURST_BIN_S = 0.05


def _interval_busy_at(tr: DeviceTrace, t: np.ndarray) -> np.ndarray:
    """Cumulative busy seconds (summed over instances) at times ``t``, from busy intervals:
    piecewise linear, its slope the number of batches running."""
    s = np.asarray(tr.busy_start_s, dtype=float)
    e = np.asarray(tr.busy_end_s, dtype=float)
    times = np.concatenate([s, e])
    steps = np.concatenate([np.ones(s.size), -np.ones(e.size)])
    order = np.argsort(times, kind="stable")
    times, steps = times[order], steps[order]
    running = np.cumsum(steps)
    cum = np.concatenate([[0.0], np.cumsum(running[:-1] * np.diff(times))])
    out: np.ndarray = np.interp(t, times, cum, left=0.0, right=float(cum[-1]))
    return out


def burst_figures(tr: DeviceTrace, t0: float, t1: float) -> dict[str, float] | None:
    """The device's busy fraction in 50 ms bins: how many bins were idle (≤ 10 % busy) and
    how many full (≥ 90 %). Peaks and valleys both common is the saw-tooth a batching
    problem draws. None without busy intervals (a live scrape samples too coarsely)."""
    if not tr.busy_start_s or t1 - t0 < 2 * BURST_BIN_S:
        return None
    edges = np.arange(t0, t1 + 1e-9, BURST_BIN_S)
    u = np.diff(_interval_busy_at(tr, edges)) / (BURST_BIN_S * max(1, tr.instances))
    return {
        "bin_ms": BURST_BIN_S * 1000.0,
        "idle_bins": _r(float((u <= 0.1).mean())),
        "full_bins": _r(float((u >= 0.9).mean())),
    }


def device_diagnostics(tr: DeviceTrace, t0: float, t1: float) -> dict[str, Any]:
    """What diagnosis reads of one device beyond its utilization and queue (the batches that
    started in the window; ``DeviceTrace``'s per-batch records):
    - held_idle_fraction: seconds an instance sat idle while a request waited for a batch to
      form (``sched.Batch.held_s``, summed) / (window x instances);
    - observed_vs_profile: the batches' measured seconds / their profile's expected seconds
      (> 1: slower than its profile; input staging excluded);
    - staging_fraction: input staging seconds / busy seconds;
    - memory_peak_fraction: the most device memory in use when a batch started / the total;
    - per_model: batches, mean size, the policy's cap, fill (mean of size / cap), mean held
      ms per batch, and the model's profile here;
    - burst: ``burst_figures``.
    Figures a run did not record are None. A live device's figures come measured (from the
    worker's counters: ``DeviceTrace.measured_diagnostics``), with the same keys."""
    if tr.measured_diagnostics is not None:
        return dict(tr.measured_diagnostics)
    window = max(t1 - t0, 1e-9)
    n = len(tr.batch_models)
    # The batches that started in the window, selected with numpy; every sum and max below
    # is Python's own over the selected values, in start order (the figures of a loop).
    start = np.asarray(tr.busy_start_s[:n], dtype=float)
    sel = (start >= t0) & (start < t1)
    any_sel = bool(sel.any())
    models = np.asarray(tr.batch_models, dtype=object)
    sizes_all = np.asarray(tr.batch_sizes[:n], dtype=np.int64)
    caps_all = np.maximum(np.asarray(tr.batch_cap[:n], dtype=np.int64), 1)
    held_all = np.asarray(tr.batch_held_s[:n], dtype=float)
    inst = max(1, tr.instances)
    per_model: dict[str, Any] = {}
    in_window = set(models[sel].tolist()) if any_sel else set()
    for m in sorted(set(tr.models) | in_window):
        mine = sel & (models == m) if m in in_window else None
        sizes = sizes_all[mine].tolist() if mine is not None else []
        caps = caps_all[mine].tolist() if mine is not None else []
        held = held_all[mine].tolist() if mine is not None else []
        prof = tr.profiles.get(m)
        per_model[m] = {
            "batches": len(sizes),
            "mean_batch_size": _r(sum(sizes) / len(sizes)) if sizes else None,
            "cap": max(caps) if caps else None,
            "fill": _r(sum(b / c for b, c in zip(sizes, caps, strict=True)) / len(sizes))
            if sizes
            else None,
            "held_ms_mean": _r(1000.0 * sum(held) / len(held)) if held else None,
            "held_fraction": _r(sum(held) / (window * inst)),
            "profile": None if prof is None else {"batches": prof[0], "latency_ms": prof[1]},
        }
    if not any_sel:
        return {
            "models": list(tr.models),
            "held_idle_fraction": None,
            "observed_vs_profile": None,
            "staging_fraction": None,
            "memory_peak_fraction": None,
            "per_model": per_model,
            "burst": burst_figures(tr, t0, t1),
        }
    end = np.asarray(tr.busy_end_s[:n], dtype=float)
    took = sum((end[sel] - start[sel]).tolist())
    staging = sum(np.asarray(tr.batch_staging_s[:n], dtype=float)[sel].tolist())
    expected = sum(np.asarray(tr.batch_expected_s[:n], dtype=float)[sel].tolist())
    fractions = np.asarray(tr.batch_memory_fraction[:n], dtype=float)[sel]
    mem = fractions[~np.isnan(fractions)].tolist()
    return {
        "models": list(tr.models),
        "held_idle_fraction": _r(sum(held_all[sel].tolist()) / (window * inst)),
        "observed_vs_profile": _r((took - staging) / expected) if expected > 0 else None,
        "staging_fraction": _r(staging / took) if took > 0 else None,
        "memory_peak_fraction": _r(max(mem)) if mem else None,
        "per_model": per_model,
        "burst": burst_figures(tr, t0, t1),
    }


def summarize(rec: RunRecords, *, timeseries: bool = True) -> dict[str, Any]:
    t0, t1 = rec.warmup_s, rec.end_s
    window = t1 - t0
    log = rec.requests
    n = len(log)
    model = np.asarray(log.model, dtype=object)
    arr = np.asarray(log.arrival_s, dtype=float)
    fin = np.asarray(log.finish_s, dtype=float)
    reasons_all = log.drop_reason
    dropped = (
        np.zeros(n, dtype=bool)
        if reasons_all.count(None) == len(reasons_all)
        else np.fromiter(map(operator.is_not, reasons_all, itertools.repeat(None)), bool, n)
    )
    done = ~np.isnan(fin)
    lat_ms = (fin - arr) * 1000.0
    measured = arr >= t0
    fin_in_window = done & (fin >= t0) & (fin <= t1)
    is_model = {m: model == m for m in rec.slo_ms}
    slo_ms = np.full(n, math.inf)  # a model without an SLO: inf
    for m, slo in rec.slo_ms.items():
        slo_ms[is_model[m]] = slo
    in_slo = lat_ms <= slo_ms
    # Decided: completed, dropped, or unfinished at the end but already older than the SLO.
    # A request of a model without an SLO (inf) is never decided: it has no attainment.
    decided = measured & np.isfinite(slo_ms) & (done | dropped | ((t1 - arr) * 1000.0 > slo_ms))

    def served(g: np.ndarray) -> tuple[float, dict[str, float | None], float | None]:
        """Throughput, latency figures and SLO attainment of the requests ``g`` selects."""
        n_decided = int((g & decided).sum())
        attained = int((g & measured & done & in_slo).sum())
        return (
            _r(float((g & fin_in_window).sum()) / window),
            latency_figures(lat_ms[g & measured & done]),
            _r(attained / n_decided) if n_decided else None,
        )

    def counts(g: np.ndarray) -> dict[str, Any]:
        reasons = Counter(reasons_all[i] for i in np.flatnonzero(g & dropped).tolist())
        return {
            "arrived": int(g.sum()),
            "completed": int((g & done).sum()),
            "dropped": int((g & dropped).sum()),
            "in_flight": int((g & ~done & ~dropped).sum()),
            "dropped_by_reason": dict(sorted(reasons.items())),
        }

    models_out: dict[str, Any] = {}
    for m in sorted(rec.slo_ms):
        is_m = is_model[m]
        throughput, latency, attainment = served(is_m)
        has_slo = math.isfinite(rec.slo_ms[m])
        models_out[m] = {
            "throughput_rps": throughput,
            "latency_ms": latency,
            "slo_ms": rec.slo_ms[m],
            "slo_attainment": attainment,
            "goodput_rps": _r(float((is_m & fin_in_window & in_slo).sum()) / window)
            if has_slo
            else None,
            "completed": int((is_m & done).sum()),
            "dropped": int((is_m & dropped).sum()),
        }

    devices_out: dict[str, Any] = {}
    utils = []
    for tr in rec.devices:
        u = busy_in_window(tr, t0, t1) / window
        utils.append(u)
        qt = np.asarray(tr.queue_t_s)
        qd = np.asarray(tr.queue_depth)
        sel = qd[(qt >= t0) & (qt <= t1)]
        mean_q = float(sel.mean()) if sel.size else 0.0
        max_q = float(sel.max()) if sel.size else 0.0
        nb = min(len(tr.batch_sizes), len(tr.busy_start_s))
        bs = np.asarray(tr.batch_sizes[:nb], dtype=np.int64)[
            np.asarray(tr.busy_start_s[:nb], dtype=float) >= t0
        ].tolist()
        devices_out[tr.name] = {
            "utilization": _r(min(1.0, max(0.0, u))),
            "mean_queue_depth": _r(mean_q),
            "max_queue_depth": _r(max_q),
            "exact_mean_queue_depth": None
            if tr.exact_mean_queue_depth is None
            else _r(tr.exact_mean_queue_depth),
            "exact_max_queue_depth": tr.exact_max_queue_depth,
            "mean_batch_size": _r(sum(bs) / len(bs)) if bs else None,
            "batches": len(bs),
            **device_diagnostics(tr, t0, t1),
        }
    max_q_all = max((d["max_queue_depth"] for d in devices_out.values()), default=0.0)
    if rec.central_max_queue_depth is not None:
        max_q_all = max(max_q_all, rec.central_max_queue_depth)

    everyone = np.ones(len(log), dtype=bool)
    all_lat = lat_ms[measured & done]
    throughput, latency, overall_attainment = served(everyone)
    out: dict[str, Any] = {
        "routing": rec.routing,
        "batching": rec.batching,
        "routing_spec": rec.routing_spec,
        "batching_spec": rec.batching_spec,
        "throughput_rps": throughput,
        "latency_ms": latency,
        "slo_attainment": overall_attainment,
        "models": models_out,
        "devices": devices_out,
        # No device measured (a live run that scraped nothing): None, not 0 % busy.
        "utilization_mean": _r(float(np.mean(utils))) if utils else None,
        "utilization_spread_pts": _r((max(utils) - min(utils)) * 100.0) if utils else None,
        "max_queue_depth": _r(max_q_all),
        "requests": counts(everyone),
        "device_seconds": None if rec.device_seconds is None else _r(rec.device_seconds),
        "loads": rec.loads,
        "warm_loads": rec.warm_loads,
        "evictions": rec.evictions,
        "load_wait": load_wait_figures(rec),
        **placement_figures(rec, log, lat_ms, measured, done, in_slo, decided),
        "window_s": {"start": t0, "end": t1},
    }
    prio = np.asarray(log.priority, dtype=int) if len(log.priority) == len(log) else None
    classes = sorted(set(log.priority), reverse=True) if prio is not None else []
    if len(classes) > 1 and prio is not None:
        out["classes"] = {}
        for c in classes:
            is_c = prio == c
            throughput, latency, attainment = served(is_c)
            out["classes"][class_name(c)] = {
                "priority": c,
                **counts(is_c),
                "throughput_rps": throughput,
                "latency_ms": latency,
                "slo_attainment": attainment,
            }
    if rec.central_max_queue_depth is not None:
        out["central_queue"] = {
            "max_queue_depth": _r(rec.central_max_queue_depth),
            "mean_queue_depth": _r(rec.central_mean_queue_depth or 0.0),
        }
    if timeseries:
        dt = rec.timeseries_interval_s
        out["timeseries"] = {
            "interval_s": dt,
            "t_s": [_r(float(x)) for x in np.arange(t0, t1 - 1e-9, dt)],
            "utilization": {tr.name: utilization_series(tr, t0, t1, dt) for tr in rec.devices},
            "queue_depth": {tr.name: queue_series(tr, t0, t1, dt) for tr in rec.devices},
        }
        if len(classes) > 1 and prio is not None:
            edges = np.arange(t0, t1 + 1e-9, dt)
            out["timeseries"]["completions_by_class"] = {
                class_name(c): [
                    int(x) for x in np.histogram(fin[done & (prio == c)], bins=edges)[0]
                ]
                for c in classes
            }
        out["latency_cdf_ms"] = (
            [_r(float(x)) for x in np.percentile(all_lat, np.linspace(0, 100, CDF_POINTS))]
            if all_lat.size
            else []
        )
    return out


def class_name(priority: int) -> str:
    named = (name for name, value in PRIORITY_CLASSES.items() if value == priority)
    return next(named, f"priority-{priority}")


def clean_json(obj: Any) -> Any:
    """Replace NaN/inf by None so the JSON is strict."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: clean_json(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [clean_json(v) for v in obj]
    return obj


def run_summary(scenario: str, seed: int, arms: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = clean_json({"scenario": scenario, "seed": seed, "arms": arms})
    return out
