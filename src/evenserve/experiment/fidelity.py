"""Fidelity: live figures against the simulator's on the same scenario, time scale and seeds."""

from __future__ import annotations

from typing import Any

from evenserve.experiment.stats import FigureStats

#: Fidelity target: live vs simulated relative error, per checked figure.
FIDELITY_TOLERANCE = 0.15
#: Figures compared (beside every device's utilization, ``util DEVICE``).
FIDELITY_FIGURES = ("p50_ms", "p99_ms", "throughput_rps")
#: Figures the fidelity target applies to, with every ``util DEVICE`` (throughput is shown).
FIDELITY_CHECKED = ("p50_ms", "p99_ms")


def fidelity(
    live: dict[str, dict[str, FigureStats]], sim: dict[str, dict[str, FigureStats]]
) -> dict[str, Any]:
    """Per arm and figure: live mean, simulated mean, relative error (live/sim - 1), whether
    the figure is checked and, if both are known, whether it is within the tolerance."""
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
            checked = key in FIDELITY_CHECKED or key.startswith("util ")
            rows[key] = {
                "live": lm,
                "simulated": sm,
                "rel_error": err,
                "checked": checked,
                "within": None if err is None else abs(err) <= FIDELITY_TOLERANCE,
            }
        out[arm] = rows
    return out
