"""How a summary writes a figure: rounded for stable, readable JSON, and a set of latencies
as its percentiles, max and mean (``report.summary``'s module docstring defines them)."""

from __future__ import annotations

import numpy as np

PERCENTILES = {"p50": 50.0, "p95": 95.0, "p99": 99.0}


def rounded(x: float, nd: int = 6) -> float:
    """Round for stable, readable JSON (NaN becomes None upstream)."""
    return float(round(x, nd))


def latency_figures(lat_ms: np.ndarray) -> dict[str, float | None]:
    if lat_ms.size == 0:
        return {"p50": None, "p95": None, "p99": None, "max": None, "mean": None}
    # One partition for every percentile: the same figures as one call each.
    values = np.percentile(lat_ms, list(PERCENTILES.values()))
    out: dict[str, float | None] = {
        k: rounded(float(v)) for k, v in zip(PERCENTILES, values, strict=True)
    }
    out["max"] = rounded(float(lat_ms.max()))
    out["mean"] = rounded(float(lat_ms.mean()))
    return out
