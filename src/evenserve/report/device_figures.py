"""One device's figures over a run's measured window, from its ``DeviceTrace``: busy time and
utilization (from busy intervals, or from samples of a cumulative busy-seconds counter),
the utilization and queue-depth series, the 50 ms burst reading, and what diagnosis reads
(``device_diagnostics``). ``report.summary``'s module docstring defines them."""

from __future__ import annotations

import itertools
from operator import truediv
from typing import Any

import numpy as np

from evenserve.core.results import DeviceTrace
from evenserve.report.figures import rounded


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
        return [rounded(float(max(0.0, c) / w)) for c, w in zip(np.diff(cum), widths, strict=True)]
    if not tr.busy_start_s:
        return [0.0] * (edges.size - 1)
    s = np.asarray(tr.busy_start_s)
    e = np.asarray(tr.busy_end_s)
    n = max(1, tr.instances)
    return [
        rounded(
            float(np.clip(np.minimum(e, b) - np.maximum(s, a), 0.0, None).sum() / ((b - a) * n))
        )
        for a, b in itertools.pairwise(edges)
    ]


def queue_series(tr: DeviceTrace, t0: float, t1: float, dt: float) -> list[float]:
    edges = np.arange(t0, t1 + 1e-9, dt)
    if edges.size < 2:
        return []
    t = np.asarray(tr.queue_t_s)
    q = np.asarray(tr.queue_depth)
    in_bins = (q[(t >= a) & (t < b)] for a, b in itertools.pairwise(edges))
    return [rounded(float(sel.mean())) if sel.size else 0.0 for sel in in_bins]


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
        "idle_bins": rounded(float((u <= 0.1).mean())),
        "full_bins": rounded(float((u >= 0.9).mean())),
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
            "mean_batch_size": rounded(sum(sizes) / len(sizes)) if sizes else None,
            "cap": max(caps) if caps else None,
            "fill": rounded(sum(map(truediv, sizes, caps)) / len(sizes)) if sizes else None,
            "held_ms_mean": rounded(1000.0 * sum(held) / len(held)) if held else None,
            "held_fraction": rounded(sum(held) / (window * inst)),
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
        "held_idle_fraction": rounded(sum(held_all[sel].tolist()) / (window * inst)),
        "observed_vs_profile": rounded((took - staging) / expected) if expected > 0 else None,
        "staging_fraction": rounded(staging / took) if took > 0 else None,
        "memory_peak_fraction": rounded(max(mem)) if mem else None,
        "per_model": per_model,
        "burst": burst_figures(tr, t0, t1),
    }
