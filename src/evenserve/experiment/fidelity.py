"""Fidelity: live figures against the simulator's on the same scenario, time scale and seeds.

Checked figures: P50 and P99 and every device's utilization; on a placement arm also
``device_seconds`` and ``evictions``. The error is relative (live / simulated - 1, within
15 %) except for a count where both sides are below ``SMALL_COUNT`` (10): then it is the
absolute difference (live - simulated), within if at most ``SMALL_COUNT_SLACK`` (1), since
one eviction more or less is not a 15 % question.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from evenserve.experiment.stats import FigureStats

#: Fidelity target: live vs simulated relative error, per checked figure.
FIDELITY_TOLERANCE = 0.15
#: Figures compared (beside every device's utilization, ``util DEVICE``).
FIDELITY_FIGURES = (
    "p50_ms",
    "p99_ms",
    "throughput_rps",
    "device_seconds",
    "loads",
    "evictions",
    "scale_up_after_burst_s",
    "scale_up_decision_s",
)
#: Figures the fidelity target applies to, with every ``util DEVICE`` (throughput is shown).
FIDELITY_CHECKED = ("p50_ms", "p99_ms")
#: Also checked on a placement arm.
PLACEMENT_CHECKED = ("device_seconds", "evictions")
#: Counts: below this on both sides the error is the absolute difference ...
COUNT_FIGURES = ("loads", "evictions")
SMALL_COUNT = 10
#: ... and within if at most this.
SMALL_COUNT_SLACK = 1


def figure_error(key: str, live: float, sim: float) -> tuple[float | None, str, bool | None]:
    """(error, how it is computed: "relative" | "absolute", within the target)."""
    if key in COUNT_FIGURES and max(abs(live), abs(sim)) < SMALL_COUNT:
        diff = round(live - sim, 4)
        return diff, "absolute", abs(diff) <= SMALL_COUNT_SLACK
    if sim == 0:
        return None, "relative", None
    err = round(live / sim - 1.0, 4)
    return err, "relative", abs(err) <= FIDELITY_TOLERANCE


def fidelity(
    live: dict[str, dict[str, FigureStats]],
    sim: dict[str, dict[str, FigureStats]],
    placement_arms: Collection[str] = (),
) -> dict[str, Any]:
    """Per arm and figure: live mean, simulated mean, error (``figure_error``: relative,
    live/sim - 1, or for small counts absolute), whether the figure is checked and, if both
    are known, whether it is within the target."""
    out: dict[str, Any] = {}
    for arm, lstats in live.items():
        if arm not in sim:
            continue
        checked_keys = set(FIDELITY_CHECKED)
        if arm in placement_arms:
            checked_keys.update(PLACEMENT_CHECKED)
        rows = {}
        for key, lv in lstats.items():
            if key not in FIDELITY_FIGURES and not key.startswith("util "):
                continue
            sv = sim[arm].get(key, {})
            lm, sm = lv.get("mean"), sv.get("mean")
            err, kind, within = None, "relative", None
            if lm is not None and sm is not None:
                err, kind, within = figure_error(key, lm, sm)
            checked = key in checked_keys or key.startswith("util ")
            rows[key] = {
                "live": lm,
                "simulated": sm,
                "rel_error": err if kind == "relative" else None,
                "abs_error": err if kind == "absolute" else None,
                "error": kind,
                "checked": checked,
                "within": within,
            }
        out[arm] = rows
    return out
