"""The bench's tables: repeats' spread and fidelity (console and HTML), arms side by side."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from evenserve.experiment.fidelity import FIDELITY_TOLERANCE
from evenserve.experiment.stats import FigureStats

#: An HTML table's cell marks: (row, column) -> "good" or "bad".
Marks = dict[tuple[int, int], str]


def fmt(x: Any, nd: int = 1) -> str:
    """A number with ``nd`` decimals, ``-`` when unknown."""
    return "-" if x is None else f"{float(x):.{nd}f}"


def repeats_table(repeats: dict[str, dict[str, FigureStats]]) -> Table:
    t = Table(title="spread across repeats: mean ± sd [min-max]")
    t.add_column("figure", style="bold")
    arms = list(repeats)
    for a in arms:
        t.add_column(a, justify="right")
    keys = ["p50_ms", "p99_ms", "throughput_rps", "utilization_spread_pts", "utilization_mean"]
    for k in keys:
        cells = []
        for a in arms:
            s = repeats[a].get(k)
            if not s or s["mean"] is None:
                cells.append("-")
                continue
            scale, nd = (100.0, 1) if k == "utilization_mean" else (1.0, 2)
            cells.append(
                f"{s['mean'] * scale:.{nd}f} ± {(s['sd'] or 0) * scale:.{nd}f} "
                f"[{s['min'] * scale:.{nd}f}-{s['max'] * scale:.{nd}f}]"  # type: ignore[operator]
            )
        t.add_row(k, *cells)
    t.add_row("repeats", *[str(repeats[a]["p99_ms"]["n"]) for a in arms])
    return t


def repeats_rows(repeats: dict[str, dict[str, FigureStats]]) -> tuple[list[str], list[list[str]]]:
    """The HTML report's spread table: header and rows."""
    header = ["figure", *repeats]
    rows = []
    for k in ("p50_ms", "p99_ms", "throughput_rps", "utilization_spread_pts"):
        rows.append(
            [
                k,
                *[
                    "-"
                    if (s := repeats[a][k])["mean"] is None
                    else f"{s['mean']:.2f} ± {s['sd']:.2f} [{s['min']:.2f}-{s['max']:.2f}]"
                    for a in repeats
                ],
            ]
        )
    return header, rows


def fidelity_rows(fid: dict[str, Any]) -> tuple[list[str], list[list[str]], Marks]:
    """Fidelity as a table: header, rows and the within-tolerance column's marks."""
    header = [
        "arm",
        "figure",
        "live",
        "simulated",
        "rel. error",
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
            ok = "" if not v["checked"] else ("yes" if v["within"] else "NO")
            unit = " %" if pct else ""
            rows.append([arm, key, fmt(live, 2) + unit, fmt(sim, 2) + unit, err, ok])
            if v["checked"] and v["within"] is not None:
                marks[(len(rows) - 1, 5)] = "good" if v["within"] else "bad"
    return header, rows, marks


def fidelity_table(fid: dict[str, Any], k: float | None) -> Table:
    title = "fidelity: live vs simulated (same scenario, same time scale, same seeds)"
    if k is not None:
        title += f", K = {k:g}"
    header, rows, marks = fidelity_rows(fid)
    t = Table(title=title)
    for i, h in enumerate(header):
        t.add_column(h, justify="left" if i < 2 else "right")
    for i, r in enumerate(rows):
        cells = list(r)
        if marks.get((i, 5)) == "bad":
            cells[5] = "[bold red]NO[/]"
        t.add_row(*cells)
    return t


def arms_rows(table_rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """The HTML report's arms side by side (``summary["comparison"]``): header and rows."""
    arms = [r["arm"] for r in table_rows]
    header = ["figure", *arms]
    rows = []
    keys = [
        ("routing", "routing", None),
        ("batching", "batching", None),
        ("util mean %", "utilization_mean", 100.0),
        ("spread (pts)", "utilization_spread_pts", 1.0),
        ("P50 ms", "p50_ms", 1.0),
        ("P99 ms", "p99_ms", 1.0),
        ("throughput rps", "throughput_rps", 1.0),
        ("max queue depth", "max_queue_depth", 1.0),
        ("throughput / baseline", "throughput_vs_baseline", 1.0),
        ("P99 / baseline", "p99_vs_baseline", 1.0),
    ]
    devices = list(table_rows[0]["devices"]) if table_rows else []
    for label, key, _ in keys[:2]:
        rows.append([label, *[str(r.get(key, "")) for r in table_rows]])
    for d in devices:
        rows.append(
            [f"util {d} %", *[fmt(100.0 * (r["devices"].get(d) or 0.0)) for r in table_rows]]
        )
    for label, key, scale in keys[2:]:
        rows.append(
            [
                label,
                *[
                    fmt(None if r.get(key) is None else r[key] * (scale or 1.0), 2)
                    for r in table_rows
                ],
            ]
        )
    models = list(table_rows[0]["slo_attainment"]) if table_rows else []
    for m in models:
        rows.append(
            [
                f"SLO met {m} %",
                *[
                    fmt(None if (v := r["slo_attainment"].get(m)) is None else 100 * v, 2)
                    for r in table_rows
                ],
            ]
        )
    return header, rows
