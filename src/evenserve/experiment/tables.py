"""The bench's tables, printed and in HTML from the same rows: repeats' spread, fidelity."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from evenserve.experiment.fidelity import FIDELITY_TOLERANCE
from evenserve.experiment.stats import FigureStats
from evenserve.report.table import rich_table

#: An HTML table's cell marks: (row, column) -> "good" or "bad".
Marks = dict[tuple[int, int], str]


def fmt(x: Any, nd: int = 1) -> str:
    """A number with ``nd`` decimals, ``-`` when unknown."""
    return "-" if x is None else f"{float(x):.{nd}f}"


def repeats_rows(repeats: dict[str, dict[str, FigureStats]]) -> tuple[list[str], list[list[str]]]:
    """The spread of each figure across repeats (mean ± sd [min-max]): header and rows."""
    rows = []
    for k in ("p50_ms", "p99_ms", "throughput_rps", "utilization_spread_pts", "utilization_mean"):
        scale, nd = (100.0, 1) if k == "utilization_mean" else (1.0, 2)
        cells = []
        for a in repeats:
            s = repeats[a].get(k)
            if not s or s["mean"] is None:
                cells.append("-")
                continue
            mean, sd, lo, hi = (scale * (s[f] or 0.0) for f in ("mean", "sd", "min", "max"))
            cells.append(f"{mean:.{nd}f} ± {sd:.{nd}f} [{lo:.{nd}f}-{hi:.{nd}f}]")
        rows.append([k, *cells])
    rows.append(["repeats", *[str(repeats[a]["p99_ms"]["n"]) for a in repeats]])
    return ["figure", *repeats], rows


def repeats_table(repeats: dict[str, dict[str, FigureStats]]) -> Table:
    return rich_table("spread across repeats: mean ± sd [min-max]", *repeats_rows(repeats))


def fidelity_rows(fid: dict[str, Any]) -> tuple[list[str], list[list[str]], Marks]:
    """Fidelity as a table: header, rows and the within-tolerance column's marks."""
    header = [
        "arm",
        "figure",
        "live",
        "simulated",
        "error",
        f"within {100 * FIDELITY_TOLERANCE:g} %",
    ]
    rows: list[list[str]] = []
    marks: Marks = {}
    for arm, figs in fid.items():
        for key, v in figs.items():
            pct = key.startswith("util ")
            scale = 100.0 if pct else 1.0
            live = None if v["live"] is None else v["live"] * scale
            sim = None if v["simulated"] is None else v["simulated"] * scale
            err = "-" if v["rel_error"] is None else f"{100 * v['rel_error']:+.1f} %"
            if v.get("abs_error") is not None:  # a small count: the difference itself
                err = f"{v['abs_error']:+g} (abs.)"
            ok = (
                ""
                if not v["checked"]
                else ("-" if v["within"] is None else "yes" if v["within"] else "NO")
            )
            unit = " %" if pct else ""
            rows.append([arm, key, fmt(live, 2) + unit, fmt(sim, 2) + unit, err, ok])
            if v["checked"] and v["within"] is not None:
                marks[(len(rows) - 1, 5)] = "good" if v["within"] else "bad"
    return header, rows, marks


def fidelity_table(fid: dict[str, Any], k: float | None) -> Table:
    title = "fidelity: live vs simulated (same scenario, same time scale, same seeds)"
    if k is not None:
        title += f", K = {k:g}"
    return rich_table(title, *fidelity_rows(fid), left=2)
