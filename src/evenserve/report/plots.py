"""PNG plots of run summaries: per-device utilization over time, latency CDFs, queue depth.

Titles say what is drawn (which figure, its unit, which percentile); legends sit outside the
axes, right of the data, so they cover none of it. An arm whose devices were not measured
(a live run that scraped no backend) gets a panel saying so, not a flat 0 % line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _per_arm(
    summary: dict[str, Any], series: str, height: float, scale: float, ylabel: str, legend: str
) -> tuple[Figure, list[Any]]:
    """One panel per arm (in order), one line per device: ``timeseries[series]`` over time."""
    arms = summary["arms"]
    n = len(arms)
    fig, axes = plt.subplots(n, 1, figsize=(10, height * n), sharex=True, squeeze=False)
    for ax, a in zip(axes[:, 0], arms.values(), strict=True):
        ts = a.get("timeseries") or {}
        t = ts.get("t_s", [])
        lines = ts.get(series, {})
        for dev, values in lines.items():
            ax.plot(t[: len(values)], [scale * x for x in values], label=dev, linewidth=1)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if lines:
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), title=legend)
        else:
            ax.text(
                0.5,
                0.5,
                "not measured: no backend scraped",
                transform=ax.transAxes,
                ha="center",
                va="center",
                color="gray",
            )
    axes[-1, 0].set_xlabel("time since the start of the run (s)")
    return fig, list(axes[:, 0])


def plot_utilization(summary: dict[str, Any], out: Path) -> Path:
    fig, axes = _per_arm(summary, "utilization", 2.6, 100.0, "busy %", "device")
    for ax, (name, a) in zip(axes, summary["arms"].items(), strict=True):
        ax.set_ylim(0, 105)
        spread = a.get("utilization_spread_pts")
        ax.set_title(
            f"{name}: {a['routing']} + {a['batching']}  "
            + (
                f"(busiest - idlest: {spread:.1f} pts)"
                if spread is not None
                else "(utilization not measured)"
            ),
            fontsize=9,
        )
    fig.suptitle(
        f"{summary['scenario']}: busy % per device over time (per-interval mean)", fontsize=11
    )
    return _save(fig, out / "utilization.png")


def plot_latency_cdf(summary: dict[str, Any], out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, a in summary["arms"].items():
        q = a.get("latency_cdf_ms") or []
        if not q:
            continue
        frac = [i / (len(q) - 1) for i in range(len(q))]
        ax.plot(q, frac, label=f"{name} (P99 {a['latency_ms']['p99']:.1f} ms)")
    ax.set_xscale("log")
    ax.set_xlabel("latency (ms, log scale)")
    ax.set_ylabel("fraction of requests at or below")
    ax.set_title(f"{summary['scenario']}: latency CDF per arm (completed, after warm-up)")
    ax.grid(alpha=0.3, which="both")
    if ax.get_lines():
        ax.legend(fontsize=8, loc="lower right")
    return _save(fig, out / "latency_cdf.png")


def plot_queue_depth(summary: dict[str, Any], out: Path) -> Path:
    fig, axes = _per_arm(summary, "queue_depth", 2.4, 1.0, "requests queued", "device")
    for ax, (name, a) in zip(axes, summary["arms"].items(), strict=True):
        ax.set_title(
            f"{name}: requests queued per device, per-interval mean of samples "
            f"(max sample {a['max_queue_depth']:.0f})",
            fontsize=9,
        )
    return _save(fig, out / "queue_depth.png")


def write_plots(summary: dict[str, Any], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    return [
        plot_utilization(summary, out),
        plot_latency_cdf(summary, out),
        plot_queue_depth(summary, out),
    ]


def plot_diagnosis(
    name: str, arm: dict[str, Any], findings: list[dict[str, Any]], out: Path
) -> Path:
    """One arm's diagnosis: queue depth and busy % per device over time (a device named by a
    finding drawn thick), and per device the share of the window it sat idle while requests
    waited for a batch (held) next to its busy share; the findings listed under the plot."""
    ts = arm.get("timeseries") or {}
    t = ts.get("t_s", [])
    named = {f["device"] for f in findings if f.get("device")}
    fig, (q_ax, u_ax, h_ax) = plt.subplots(
        3, 1, figsize=(10, 8.5), gridspec_kw={"height_ratios": [2, 2, 1.6]}
    )
    for ax, series, scale, label in (
        (q_ax, "queue_depth", 1.0, "requests queued"),
        (u_ax, "utilization", 100.0, "busy %"),
    ):
        lines = ts.get(series) or {}
        for dev, values in lines.items():
            ax.plot(
                t[: len(values)],
                [scale * x for x in values],
                label=dev + (" (finding)" if dev in named else ""),
                linewidth=2.2 if dev in named else 0.9,
            )
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if lines:
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="device")
        else:
            ax.text(0.5, 0.5, "not measured", transform=ax.transAxes, ha="center", color="gray")
    q_ax.set_title(f"{name}: requests queued per device (per-interval mean)", fontsize=9)
    u_ax.set_title(f"{name}: busy % per device (per-interval mean)", fontsize=9)
    u_ax.set_xlabel("time since the start of the run (s)")
    devices = arm.get("devices") or {}
    names = list(devices)
    held = [100.0 * (devices[d].get("held_idle_fraction") or 0.0) for d in names]
    busy = [100.0 * (devices[d].get("utilization") or 0.0) for d in names]
    x = range(len(names))
    h_ax.bar([i - 0.2 for i in x], busy, width=0.4, label="busy")
    h_ax.bar([i + 0.2 for i in x], held, width=0.4, label="idle while a batch was held")
    h_ax.set_xticks(list(x), names, fontsize=8)
    h_ax.set_ylabel("% of the window")
    h_ax.set_ylim(0, 105)
    h_ax.set_title(f"{name}: busy vs held idle per device (over the window)", fontsize=9)
    h_ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    lines = [f"{f['severity']}: {f['kind']} - {f['summary']}" for f in findings[:8]]
    if len(findings) > 8:
        lines.append(f"... and {len(findings) - 8} more (see the JSON)")
    fig.text(0.01, 0.005, "\n".join(lines) or "no findings", fontsize=7, va="bottom")
    fig.tight_layout(rect=(0, 0.03 + 0.018 * len(lines), 1, 1))
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    path = out / f"diagnosis-{safe}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_variants(report: dict[str, Any], out: Path) -> Path:
    """``evenserve optimize --plot``: per-item latency by batch size of each profiled variant
    (the chosen one drawn thick, rejected ones dashed)."""
    fig, ax = plt.subplots(figsize=(9, 4))
    for name, v in report["variants"].items():
        prof = v.get("profile")
        if not prof:
            continue
        points = sorted((int(b), ms) for b, ms in prof["latency_ms"].items())
        xs = [b for b, _ in points]
        ys = [ms / b for b, ms in points]
        chosen = name == report.get("chosen")
        usable = v["status"] in ("passed", "chosen")
        ax.plot(
            xs,
            ys,
            marker="o",
            linewidth=3 if chosen else 1.2,
            linestyle="-" if usable else "--",
            label=f"{name} ({v['status']})",
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("ms per item")
    ax.set_title(f"{report['model']} on {report['device']}: variants")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    out.parent.mkdir(parents=True, exist_ok=True)
    return _save(fig, out)
