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

from evenserve.core.results import RunRecords
from evenserve.core.wire import PRIORITY_CLASSES
from evenserve.report.device_figures import (
    busy_in_window,
    device_diagnostics,
    queue_series,
    utilization_series,
)
from evenserve.report.figures import latency_figures, rounded

CDF_POINTS = 101


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
        "mean_ms": rounded(float(ms.mean())),
        "p99_ms": rounded(float(np.percentile(ms, 99.0))),
        "max_ms": rounded(float(ms.max())),
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
        "evictions_per_load": rounded(rec.evictions / rec.loads) if rec.loads else None,
        "resident": {"slo_attainment": rounded(met / n_dec) if n_dec else None},
        "cold": {
            "requests": int((cold & measured).sum()),
            "p99_ms": rounded(float(np.percentile(cold_lat, 99.0))) if cold_lat.size else None,
            "p99_of_bound": rounded(float(np.percentile(ratio, 99.0)))
            if ratio.size and not np.isnan(ratio).any()
            else None,
        },
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
            rounded(float((g & fin_in_window).sum()) / window),
            latency_figures(lat_ms[g & measured & done]),
            rounded(attained / n_decided) if n_decided else None,
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
            "goodput_rps": rounded(float((is_m & fin_in_window & in_slo).sum()) / window)
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
            "utilization": rounded(min(1.0, max(0.0, u))),
            "mean_queue_depth": rounded(mean_q),
            "max_queue_depth": rounded(max_q),
            "exact_mean_queue_depth": None
            if tr.exact_mean_queue_depth is None
            else rounded(tr.exact_mean_queue_depth),
            "exact_max_queue_depth": tr.exact_max_queue_depth,
            "mean_batch_size": rounded(sum(bs) / len(bs)) if bs else None,
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
        "utilization_mean": rounded(float(np.mean(utils))) if utils else None,
        "utilization_spread_pts": rounded((max(utils) - min(utils)) * 100.0) if utils else None,
        "max_queue_depth": rounded(max_q_all),
        "requests": counts(everyone),
        "device_seconds": None if rec.device_seconds is None else rounded(rec.device_seconds),
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
            "max_queue_depth": rounded(rec.central_max_queue_depth),
            "mean_queue_depth": rounded(rec.central_mean_queue_depth or 0.0),
        }
    if timeseries:
        dt = rec.timeseries_interval_s
        out["timeseries"] = {
            "interval_s": dt,
            "t_s": [rounded(float(x)) for x in np.arange(t0, t1 - 1e-9, dt)],
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
            [rounded(float(x)) for x in np.percentile(all_lat, np.linspace(0, 100, CDF_POINTS))]
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
