"""Placement figures of a live run, from the gateway's metrics, and the simulator's match.

Live: the gateway's ``/metrics`` is scraped when the load starts and when it ends, and the
difference is the run's: device-seconds (``evenserve_gateway_device_active_seconds_total``
summed over backends), model loads and evictions (``..._model_loads_total``,
``..._evictions_total``), scale decisions; the scale-up decision time is the gateway's gauge
at the end (seconds from the first request of the last burst to its ScaleUp; None: none).
The simulator counts device-seconds from the start of the run, as this difference does.

Scale-up decision time, simulated: the same burst clock (``policy.placement.burst``) run by
the simulator's placement driver, the last ScaleUp's (as the gauge keeps the last one).
That clock starts at the first request of the interval whose demand estimate first exceeds
the devices, so it leaves out the estimate's rise: it is kept as ``scale_up_decision_s``
(shown, not the figure to judge by).

**The scale-up time after a burst** (``scale_up_after_burst_s``), the honest figure: from the
burst's start (``burst_starts_s``: a phase edge of the scenario's open-loop workload where
the offered rate, all streams together, goes up) to the first ScaleUp decided at or after it
and before the next burst; the worst over the run's bursts (None: no burst, or no ScaleUp
after one). Simulated: the ScaleUp times (``RunRecords.scale_ups_s``) against the
scenario's times. Live: the gateway's ScaleUp wall times (``/admin/placement``
``scale_ups_unix_s``) less the wall time of the load's t = 0 (``LoadResult.t0_unix_s``),
against the same scenario times (the load generator schedules the arrivals from that t = 0).

**The decisions side by side** (``compare_decisions``): the placement controller logs every
decision it takes (``Decision``: time, what asked — a miss, the rebalance, the autoscaler —,
load / unload / up / down, model, device, the model's demand estimate and the device's
utilization then). Live, the
gateway's ``/admin/placement`` gives them with wall times (``scrape_placement_view``), less
the load's t = 0; simulated, ``RunRecords.placement_decisions``. Walked in order, the two
logs agree while each side's next decision is the same (what asked, kind, model, device;
two adjacent decisions taken in the other order count as agreeing, ``reordered``); the first
pair that differs is where the two runs parted, shown with its time and demand estimates on
both sides and the decisions around it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from evenserve.core.results import RunRecords
from evenserve.core.scenario import OpenLoop
from evenserve.sim.placement import PlacementClock
from evenserve.workload.open_loop import open_loop_streams

LOADS = "evenserve_gateway_model_loads"
EVICTIONS = "evenserve_gateway_evictions"
ACTIVE_SECONDS = "evenserve_gateway_device_active_seconds"
SCALE_DECISIONS = "evenserve_gateway_scale_decisions"
SCALE_UP_SECONDS = "evenserve_gateway_scale_up_decision_seconds"


def parse_placement_metrics(text: str) -> dict[str, Any]:
    """The gateway's placement counters in a Prometheus text (zeros where absent)."""
    out: dict[str, Any] = {
        "device_seconds": 0.0,
        "loads": 0.0,
        "evictions": 0.0,
        "scale_up": 0.0,
        "scale_down": 0.0,
        "scale_up_decision_s": None,
    }
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            base = s.name.removesuffix("_total")
            if base == ACTIVE_SECONDS:
                out["device_seconds"] += s.value
            elif base == LOADS:
                out["loads"] += s.value
            elif base == EVICTIONS:
                out["evictions"] += s.value
            elif base == SCALE_DECISIONS:
                out[f"scale_{s.labels.get('direction', '')}"] = (
                    out.get(f"scale_{s.labels.get('direction', '')}", 0.0) + s.value
                )
            elif base == SCALE_UP_SECONDS and not math.isnan(s.value):
                out["scale_up_decision_s"] = s.value
    return out


def scrape_placement(gateway_url: str, timeout_s: float = 5.0) -> dict[str, Any] | None:
    """:func:`parse_placement_metrics` of the gateway's ``/metrics`` (None: unreachable)."""
    try:
        with httpx.Client(timeout=timeout_s, trust_env=False) as client:
            r = client.get(f"{gateway_url}/metrics")
            r.raise_for_status()
    except httpx.HTTPError:
        return None
    return parse_placement_metrics(r.text)


def run_placement_figures(
    before: dict[str, Any] | None, after: dict[str, Any] | None
) -> dict[str, Any]:
    """The run's figures: ``after`` less ``before`` (counters); the gauge as at the end."""
    if before is None or after is None:
        return {"device_seconds": None, "loads": None, "evictions": None}
    return {
        "device_seconds": round(after["device_seconds"] - before["device_seconds"], 4),
        "loads": round(after["loads"] - before["loads"]),
        "evictions": round(after["evictions"] - before["evictions"]),
        "scale_ups": round(after["scale_up"] - before["scale_up"]),
        "scale_downs": round(after["scale_down"] - before["scale_down"]),
        "scale_up_decision_s": after["scale_up_decision_s"],
    }


def sim_scale_up_decision_s(rec: RunRecords) -> float | None:
    """The simulator's counterpart of the gateway's gauge: the last ScaleUp's burst-clock
    time (``RunRecords.scale_up_decisions_s``; None: no ScaleUp in a burst)."""
    return round(rec.scale_up_decisions_s[-1], 4) if rec.scale_up_decisions_s else None


def burst_starts_s(workload: object, end_s: float = math.inf) -> list[float]:
    """The times before ``end_s`` where the offered load rises: phase edges of an open-loop
    workload where the sum of every stream's rate after the edge exceeds the sum just before
    ([] for other workloads)."""
    if not isinstance(workload, OpenLoop):
        return []
    streams = open_loop_streams(workload)

    def total(t: float) -> float:
        out = 0.0
        for st in streams:
            mult = 1.0
            for p in st.phases:
                if p.start_s <= t < p.end_s:
                    mult = p.multiplier
            out += st.rate_rps * mult
        return out

    edges = sorted({e for st in streams for p in st.phases for e in (p.start_s, p.end_s)})
    out: list[float] = []
    for e in edges:
        before = total(e - 1e-9) if e > 0 else 0.0
        if 0 < e < end_s and total(e) > before * (1 + 1e-9):
            out.append(e)
    return out


def scale_up_after_burst_s(bursts: Sequence[float], scale_ups: Sequence[float]) -> float | None:
    """The worst over ``bursts`` of the time from a burst's start to the first of
    ``scale_ups`` at or after it and before the next burst (None: none)."""
    worst: float | None = None
    for i, b in enumerate(bursts):
        nxt = bursts[i + 1] if i + 1 < len(bursts) else math.inf
        ups = [t for t in scale_ups if b <= t < nxt]
        if ups:
            took = round(min(ups) - b, 4)
            worst = took if worst is None else max(worst, took)
    return worst


def scrape_placement_view(
    gateway_url: str, token: str, timeout_s: float = 5.0
) -> dict[str, Any] | None:
    """The gateway's ``/admin/placement`` (None: unreachable or not a JSON object)."""
    try:
        with httpx.Client(timeout=timeout_s, trust_env=False) as client:
            r = client.get(
                f"{gateway_url}/admin/placement", headers={"authorization": f"Bearer {token}"}
            )
            r.raise_for_status()
            view = r.json()
    except (httpx.HTTPError, ValueError):
        return None
    return view if isinstance(view, dict) else None


def scale_ups_unix_s(view: dict[str, Any] | None) -> list[float] | None:
    """The gateway's ScaleUp wall times in its placement view (None: not there)."""
    ups = None if view is None else view.get("scale_ups_unix_s")
    return [float(t) for t in ups] if isinstance(ups, list) else None


def live_placement_clock(
    view: dict[str, Any] | None, t0_unix_s: float | None
) -> PlacementClock | None:
    """Where the gateway's controller stood at the load's t = 0, from its placement view
    (``clock``; read at any time, the end of the run too: its schedule is fixed): when its
    demand estimates started (None when that was after t = 0: then, as in the simulator, at
    its first event), and its first rebalance and autoscaler check at or after t = 0 (the
    schedule's due times moved by whole periods). None when the view or t = 0 is missing or
    the controller never ticked (the simulator then keeps its own schedule)."""
    c = None if view is None else view.get("clock")
    if not isinstance(c, dict) or t0_unix_s is None:
        return None
    started, rebalance = c.get("started_unix_s"), c.get("next_rebalance_unix_s")
    if started is None or rebalance is None:
        return None
    scale = c.get("next_scale_unix_s")
    start_s = float(started) - t0_unix_s
    start = start_s if start_s < 0 else None

    def first(due: float, every: float) -> float:
        return (due - t0_unix_s) % every

    reb = first(float(rebalance), float(c["interval_s"]))
    if scale is None:
        return PlacementClock(start, reb, reb)
    every = float(c["scale_interval_s"])
    sc = first(float(scale), every)
    # Both fall on the gateway's tick grid: the rebalance is put on the checks' grid exactly
    # (a microsecond off it, a replay's tick would find it not due and wait a whole tick).
    reb = sc + max(0, round((reb - sc) / every)) * every
    return PlacementClock(start, reb, sc)


def live_decisions(
    view: dict[str, Any] | None, t0_unix_s: float | None, log: str = "decisions"
) -> list[list[Any]] | None:
    """A log of the gateway's placement view (``decisions``, or ``switches``) with times
    from the load's t = 0 (None: no view, no such log or no t = 0). Rows before t = 0 (the
    gateway's start) keep negative times."""
    rows = None if view is None else view.get(log)
    if not isinstance(rows, list) or t0_unix_s is None:
        return None
    return [[round(float(r[0]) - t0_unix_s, 6), *r[1:]] for r in rows]


def _key(d: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(d[1:5])


def _row(d: Sequence[Any] | None) -> dict[str, Any] | None:
    if d is None:
        return None
    return {
        "t_s": round(float(d[0]), 4),
        "source": d[1],
        "kind": d[2],
        "model": d[3],
        "device": d[4],
        "rate_rps": round(float(d[5]), 4),
        "utilization": round(float(d[6]), 4) if len(d) > 6 else None,
    }


def compare_decisions(
    live: Sequence[Sequence[Any]], sim: Sequence[Sequence[Any]], context: int = 4
) -> dict[str, Any]:
    """Where a live run's placement decisions and the simulator's part (the module
    docstring): ``agreed`` (decisions in the same order on both sides), ``reordered`` (of
    those, adjacent pairs taken in the other order), the time by which live lagged the
    simulator over the agreed ones (``lag_s``: median and the largest either way), the
    first differing decision on each side (``live`` / ``sim``; None: that side had no more)
    with the ``context`` decisions before and after it, and the count of decisions by what
    asked and kind on each side (``counts``)."""
    i = j = agreed = reordered = 0
    lags: list[float] = []
    while i < len(live) and j < len(sim):
        if _key(live[i]) == _key(sim[j]):
            lags.append(float(live[i][0]) - float(sim[j][0]))
            i, j, agreed = i + 1, j + 1, agreed + 1
            continue
        if (
            i + 1 < len(live)
            and j + 1 < len(sim)
            and _key(live[i]) == _key(sim[j + 1])
            and _key(live[i + 1]) == _key(sim[j])
        ):
            lags += [
                float(live[i][0]) - float(sim[j + 1][0]),
                float(live[i + 1][0]) - float(sim[j][0]),
            ]
            i, j, agreed, reordered = i + 2, j + 2, agreed + 2, reordered + 1
            continue
        break

    def counts(log: Sequence[Sequence[Any]]) -> dict[str, int]:
        out: dict[str, int] = {}
        for d in log:
            k = f"{d[1]} {d[2]}"
            out[k] = out.get(k, 0) + 1
        return dict(sorted(out.items()))

    lags.sort()
    return {
        "decisions": {"live": len(live), "sim": len(sim)},
        "agreed": agreed,
        "reordered": reordered,
        "lag_s": None
        if not lags
        else {
            "median": round(lags[len(lags) // 2], 4),
            "min": round(lags[0], 4),
            "max": round(lags[-1], 4),
        },
        "parted": i < len(live) or j < len(sim),
        "live": _row(live[i] if i < len(live) else None),
        "sim": _row(sim[j] if j < len(sim) else None),
        "before": [_row(d) for d in live[max(0, i - context) : i]],
        "live_next": [_row(d) for d in live[i + 1 : i + 1 + context]],
        "sim_next": [_row(d) for d in sim[j + 1 : j + 1 + context]],
        "counts": {"live": counts(live), "sim": counts(sim)},
    }
