"""PNG plots of run summaries: per-device utilization over time, latency CDFs, queue depth."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def plot_utilization(summary: dict[str, Any], out: Path) -> Path:
    arms = summary["arms"]
    n = len(arms)
    fig, axes = plt.subplots(n, 1, figsize=(10, 2.6 * n), sharex=True, squeeze=False)
    for ax, (name, a) in zip(axes[:, 0], arms.items(), strict=True):
        ts = a.get("timeseries") or {}
        t = ts.get("t_s", [])
        for dev, series in ts.get("utilization", {}).items():
            ax.plot(t[: len(series)], [100 * x for x in series], label=dev, linewidth=1)
        ax.set_ylim(0, 105)
        ax.set_ylabel("busy %")
        ax.set_title(
            f"{name}: {a['routing']} + {a['batching']}  "
            f"(spread {a['utilization_spread_pts']:.1f} pts)",
            fontsize=9,
        )
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=4, loc="lower right")
    axes[-1, 0].set_xlabel("time (s)")
    fig.suptitle(f"{summary['scenario']}: device utilization over time", fontsize=11)
    fig.tight_layout()
    path = out / "utilization.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


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
    fig.tight_layout()
    path = out / "latency_cdf.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_queue_depth(summary: dict[str, Any], out: Path) -> Path:
    arms = summary["arms"]
    n = len(arms)
    fig, axes = plt.subplots(n, 1, figsize=(10, 2.4 * n), sharex=True, squeeze=False)
    for ax, (name, a) in zip(axes[:, 0], arms.items(), strict=True):
        ts = a.get("timeseries") or {}
        t = ts.get("t_s", [])
        for dev, series in ts.get("queue_depth", {}).items():
            ax.plot(t[: len(series)], series, label=dev, linewidth=1)
        ax.set_ylabel("queued")
        ax.set_title(f"{name}: queue depth per device (max {a['max_queue_depth']:.0f})", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=4, loc="upper right")
    axes[-1, 0].set_xlabel("time (s)")
    fig.tight_layout()
    path = out / "queue_depth.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(summary: dict[str, Any], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    return [
        plot_utilization(summary, out),
        plot_latency_cdf(summary, out),
        plot_queue_depth(summary, out),
    ]
