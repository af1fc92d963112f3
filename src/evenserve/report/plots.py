"""PNG plots of run summaries: per-device utilization over time, latency CDFs, queue depth."""

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
        for dev, values in ts.get(series, {}).items():
            ax.plot(t[: len(values)], [scale * x for x in values], label=dev, linewidth=1)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=4, loc=legend)
    axes[-1, 0].set_xlabel("time (s)")
    return fig, list(axes[:, 0])


def plot_utilization(summary: dict[str, Any], out: Path) -> Path:
    fig, axes = _per_arm(summary, "utilization", 2.6, 100.0, "busy %", "lower right")
    for ax, (name, a) in zip(axes, summary["arms"].items(), strict=True):
        ax.set_ylim(0, 105)
        ax.set_title(
            f"{name}: {a['routing']} + {a['batching']}  "
            f"(spread {a['utilization_spread_pts']:.1f} pts)",
            fontsize=9,
        )
    fig.suptitle(f"{summary['scenario']}: device utilization over time", fontsize=11)
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
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"{summary['scenario']}: latency CDF per arm")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return _save(fig, out / "latency_cdf.png")


def plot_queue_depth(summary: dict[str, Any], out: Path) -> Path:
    fig, axes = _per_arm(summary, "queue_depth", 2.4, 1.0, "queued", "upper right")
    for ax, (name, a) in zip(axes, summary["arms"].items(), strict=True):
        ax.set_title(f"{name}: queue depth per device (max {a['max_queue_depth']:.0f})", fontsize=9)
    return _save(fig, out / "queue_depth.png")


def write_plots(summary: dict[str, Any], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    return [
        plot_utilization(summary, out),
        plot_latency_cdf(summary, out),
        plot_queue_depth(summary, out),
    ]
