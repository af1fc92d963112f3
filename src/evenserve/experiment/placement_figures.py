"""Placement figures of a live run, from the gateway's metrics, and the simulator's match.

Live: the gateway's ``/metrics`` is scraped when the load starts and when it ends, and the
difference is the run's: device-seconds (``evenserve_gateway_device_active_seconds_total``
summed over backends), model loads and evictions (``..._model_loads_total``,
``..._evictions_total``), scale decisions; the scale-up decision time is the gateway's gauge
at the end (seconds from the first request of the last burst to its ScaleUp; None: none).
The simulator counts device-seconds from the start of the run, as this difference does.

Scale-up decision time, simulated: the same burst clock (``policy.placement.burst``) run by
the simulator's placement driver, the last ScaleUp's (as the gauge keeps the last one).
"""

from __future__ import annotations

import math
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from evenserve.core.results import RunRecords

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
