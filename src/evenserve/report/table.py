"""Side-by-side comparison tables (rich) of arms in a run summary."""

from __future__ import annotations

from typing import Any

from rich.table import Table

REFERENCE_ARM = "central-queue"


def _fmt(x: Any, nd: int = 1, pct: bool = False) -> str:
    if x is None:
        return "-"
    if pct:
        return f"{100.0 * float(x):.{nd}f}%"
    return f"{float(x):.{nd}f}"


def compare_rows(summary: dict[str, Any], baseline: str = "baseline") -> list[dict[str, Any]]:
    """One row per arm with the figures of the articles' before/after table and ratios."""
    arms = summary["arms"]
    base = arms.get(baseline)
    ref = arms.get(REFERENCE_ARM)
    rows = []
    for name, a in arms.items():
        p99 = a["latency_ms"]["p99"]
        row: dict[str, Any] = {
            "arm": name,
            "routing": a["routing"],
            "batching": a["batching"],
            "throughput_rps": a["throughput_rps"],
            "p50_ms": a["latency_ms"]["p50"],
            "p99_ms": p99,
            "utilization_mean": a.get("utilization_mean"),
            "utilization_spread_pts": a["utilization_spread_pts"],
            "max_queue_depth": a["max_queue_depth"],
            "slo_attainment": {m: v["slo_attainment"] for m, v in a["models"].items()},
            "devices": {d: v["utilization"] for d, v in a["devices"].items()},
            "device_seconds": a.get("device_seconds"),
            "loads": a.get("loads", 0),
            "evictions": a.get("evictions", 0),
            "load_wait_p99_ms": (a.get("load_wait") or {}).get("p99_ms"),
            "slo_all": a.get("slo_attainment"),
            "evictions_per_load": a.get("evictions_per_load"),
            "resident_slo": (a.get("resident") or {}).get("slo_attainment"),
            "cold_p99_ms": (a.get("cold") or {}).get("p99_ms"),
            "cold_p99_of_bound": (a.get("cold") or {}).get("p99_of_bound"),
        }
        if base is not None and base["throughput_rps"]:
            row["throughput_vs_baseline"] = round(a["throughput_rps"] / base["throughput_rps"], 3)
        if base is not None and p99 is not None and base["latency_ms"]["p99"]:
            row["p99_vs_baseline"] = round(p99 / base["latency_ms"]["p99"], 3)
        if ref is not None and p99 is not None and ref["latency_ms"]["p99"]:
            row["p99_vs_central_queue"] = round(p99 / ref["latency_ms"]["p99"], 3)
        rows.append(row)
    return rows


def rich_table(
    title: str,
    header: list[str],
    rows: list[list[str]],
    marks: dict[tuple[int, int], str] | None = None,
    left: int = 1,
) -> Table:
    """A printed table of ``rows`` (the first ``left`` columns left-aligned, a cell marked
    ``bad`` in red): the same rows the HTML report shows."""
    t = Table(title=title)
    for i, h in enumerate(header):
        first = i == 0
        t.add_column(
            h, justify="left" if i < left else "right", style="bold" if first else "", no_wrap=first
        )
    for i, row in enumerate(rows):
        t.add_row(
            *[
                f"[bold red]{c}[/]" if marks and marks.get((i, j)) == "bad" else c
                for j, c in enumerate(row)
            ]
        )
    return t


def compare_table_rows(summary: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The arms side by side, a figure per row: header and rows (printed and in HTML)."""
    rows = compare_rows(summary)
    arms = summary["arms"]
    out: list[list[str]] = []

    def add(label: str, values: list[str]) -> None:
        out.append([label, *values])

    add("routing", [r["routing"] for r in rows])
    add("batching", [r["batching"] for r in rows])
    # Every arm's devices (arms may run on different devices: placement scenarios).
    devices = list(dict.fromkeys(d for a in arms.values() for d in a["devices"]))
    for d in devices:
        add(f"util {d}", [_fmt(r["devices"].get(d), 1, pct=True) for r in rows])
    add("util mean", [_fmt(r["utilization_mean"], 1, pct=True) for r in rows])
    add("spread (pts)", [_fmt(r["utilization_spread_pts"]) for r in rows])
    add("P50 ms", [_fmt(r["p50_ms"], 2) for r in rows])
    add("P99 ms", [_fmt(r["p99_ms"], 2) for r in rows])
    add("throughput rps", [_fmt(r["throughput_rps"]) for r in rows])
    add("max queue depth", [_fmt(r["max_queue_depth"], 0) for r in rows])
    # Placement figures, where they tell arms apart (an arm that loads, evicts, or pays for
    # other device time): cost in device-seconds, and what misses cost.
    secs = {r["device_seconds"] for r in rows}
    if any(r["loads"] or r["evictions"] for r in rows) or len(secs) > 1:
        add("device-seconds", [_fmt(r["device_seconds"], 0) for r in rows])
        add("loads", [str(r["loads"]) for r in rows])
        add("evictions", [str(r["evictions"]) for r in rows])
        add("load wait P99 ms", [_fmt(r["load_wait_p99_ms"], 1) for r in rows])
        add("evictions/load", [_fmt(r["evictions_per_load"], 2) for r in rows])
        add("SLO met resident", [_fmt(r["resident_slo"], 2, pct=True) for r in rows])
        add("cold P99 ms", [_fmt(r["cold_p99_ms"], 1) for r in rows])
        add("cold P99/bound", [_fmt(r["cold_p99_of_bound"], 2) for r in rows])
        add("SLO met (all)", [_fmt(r["slo_all"], 2, pct=True) for r in rows])
    models = list(next(iter(arms.values()))["models"])
    for m in models:
        add(f"SLO met {m}", [_fmt(r["slo_attainment"].get(m), 2, pct=True) for r in rows])
    for c in dict.fromkeys(c for a in arms.values() for c in a.get("classes", {})):
        cls = [arms[r["arm"]].get("classes", {}).get(c) for r in rows]
        add(f"SLO met {c}", [_fmt(x["slo_attainment"], 2, pct=True) if x else "-" for x in cls])
        add(f"completed {c}", [str(x["completed"]) if x else "-" for x in cls])
        add(
            f"dropped {c}",
            [
                ", ".join(f"{k} {v}" for k, v in x["dropped_by_reason"].items()) or "0"
                if x
                else "-"
                for x in cls
            ],
        )
    if any("throughput_vs_baseline" in r for r in rows):
        add("throughput / baseline", [_fmt(r.get("throughput_vs_baseline"), 3) for r in rows])
        add("P99 / baseline", [_fmt(r.get("p99_vs_baseline"), 3) for r in rows])
    if any("p99_vs_central_queue" in r for r in rows):
        add("P99 / central-queue", [_fmt(r.get("p99_vs_central_queue"), 3) for r in rows])
    return ["figure", *[r["arm"] for r in rows]], out


def compare_table(summary: dict[str, Any], title: str | None = None) -> Table:
    return rich_table(
        title or f"{summary['scenario']} (seed {summary['seed']})", *compare_table_rows(summary)
    )


def arm_table(name: str, arm: dict[str, Any]) -> Table:
    """Per-model and per-device detail of one arm."""
    t = Table(title=f"arm {name}: {arm['routing']} + {arm['batching']}")
    t.add_column("model")
    for col in ("rps", "P50 ms", "P95 ms", "P99 ms", "max ms", "SLO ms", "SLO met", "goodput"):
        t.add_column(col, justify="right")

    def latencies(lat: dict[str, Any]) -> list[str]:
        return [_fmt(lat[k], 2) for k in ("p50", "p95", "p99", "max")]

    for m, v in arm["models"].items():
        t.add_row(
            m,
            _fmt(v["throughput_rps"]),
            *latencies(v["latency_ms"]),
            _fmt(v["slo_ms"], 0),
            _fmt(v["slo_attainment"], 2, pct=True),
            _fmt(v["goodput_rps"]),
        )
    t.add_row(
        "all", _fmt(arm["throughput_rps"]), *latencies(arm["latency_ms"]), "", "", "", style="bold"
    )
    return t


def device_table(arm: dict[str, Any]) -> Table:
    t = Table(title="devices")
    for col in ("device", "utilization", "mean queue", "max queue", "mean batch"):
        t.add_column(col, justify="right")
    for d, v in arm["devices"].items():
        t.add_row(
            d,
            _fmt(v["utilization"], 1, pct=True),
            _fmt(v["mean_queue_depth"], 2),
            _fmt(v["max_queue_depth"], 0),
            _fmt(v.get("mean_batch_size"), 2),
        )
    return t
