"""``evenserve simulate`` and ``compare`` on an LLM scenario (``kind: llm``): every arm (or
one), the LLM's figures side by side, each classic model's, the device's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evenserve.cli.app import console, counted_progress, fail, write_json
from evenserve.core.errors import EvenserveError
from evenserve.report.llm_summary import llm_table
from evenserve.report.table import rich_table
from evenserve.sim.llm import ArmFigures, run_arm, summarize_arm
from evenserve.sim.llm_scenario import load_llm_scenario


def simulate_llm(path: Path, arm: str | None, seed: int | None, json_path: Path | None) -> None:
    """Run ``arm`` (None: every arm) of the LLM scenario at ``path`` and print the figures."""
    try:
        sc = load_llm_scenario(path)
        names = list(sc.doc.arms) if arm is None else [arm]
        for n in names:
            if n not in sc.doc.arms:
                fail(f"--arm: unknown arm {n!r} (arms: {', '.join(sc.doc.arms)})")
        s = sc.doc.seed if seed is None else seed
        quiet = json_path is not None and str(json_path) == "-"
        figures: list[ArmFigures] = []
        with counted_progress("arms", quiet) as progress:
            task = progress.add_task(f"simulating {sc.doc.name}", total=len(names))
            for n in names:
                progress.update(task, description=f"simulating {sc.doc.name} / {n}")
                figures.append(summarize_arm(sc, run_arm(sc, n, s)))
                progress.advance(task)
    except (EvenserveError, KeyError) as exc:
        fail(str(exc))
        return
    out: dict[str, Any] = {
        "scenario": sc.doc.name,
        "seed": s,
        "window_s": [sc.doc.warmup_s, sc.doc.duration_s],
        "arms": {f.arm: f.to_dict() for f in figures},
    }
    if json_path is not None:
        write_json(json_path, out)
    if quiet:
        return
    llms = [f.llm for f in figures if f.llm is not None]
    if llms:
        console.print(llm_table(llms, f"{sc.doc.name}: LLM generation (simulated)"))
    rows = []
    for f in figures:
        for model, c in f.classic.items():
            rows.append([
                f.arm, model, str(c["requests"]), str(c["completed"]),
                _ms(c["p50_ms"]), _ms(c["p99_ms"]), f"{c['slo_ms']:.0f}",
                f"{c['goodput_rps']:.1f}",
                "-" if c["goodput_fraction"] is None else f"{100 * c['goodput_fraction']:.1f}%",
            ])  # fmt: skip
    if rows:
        head = ["arm", "model", "requests", "completed", "P50 ms", "P99 ms", "SLO ms",
                "goodput rps", "within SLO"]  # fmt: skip
        console.print(rich_table(f"{sc.doc.name}: classic models (simulated)", head, rows))
    dev = [[f.arm, _pct(f.device["utilization"]), str(f.device["steps"]),
            str(f.device["batches"]), str(f.device["kv_blocks"]), str(f.device["preemptions"])]
           for f in figures]  # fmt: skip
    head = ["arm", "busy", "steps", "batches", "KV blocks", "preemptions"]
    console.print(rich_table(f"{sc.doc.name}: device", head, dev))


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def simulate_llm_pool(
    path: Path, arm: str | None, seed: int | None, json_path: Path | None
) -> None:
    """Run ``arm`` (None: every arm) of the LLM pool scenario at ``path``; print the arms side
    by side, each workload's figures, each device's and each classic model's."""
    from evenserve.sim.llm_pool import PoolFigures, run_pool_arm, summarize_pool_arm
    from evenserve.sim.llm_pool_scenario import load_llm_pool_scenario

    try:
        sc = load_llm_pool_scenario(path)
        names = list(sc.doc.arms) if arm is None else [arm]
        for n in names:
            if n not in sc.doc.arms:
                fail(f"--arm: unknown arm {n!r} (arms: {', '.join(sc.doc.arms)})")
        s = sc.doc.seed if seed is None else seed
        quiet = json_path is not None and str(json_path) == "-"
        figures: list[PoolFigures] = []
        with counted_progress("arms", quiet) as progress:
            task = progress.add_task(f"simulating {sc.doc.name}", total=len(names))
            for n in names:
                progress.update(task, description=f"simulating {sc.doc.name} / {n}")
                figures.append(summarize_pool_arm(sc, run_pool_arm(sc, n, s)))
                progress.advance(task)
    except (EvenserveError, KeyError) as exc:
        fail(str(exc))
        return
    out: dict[str, Any] = {
        "scenario": sc.doc.name,
        "seed": s,
        "window_s": [sc.doc.warmup_s, sc.doc.duration_s],
        "arms": {f.arm: f.to_dict() for f in figures},
    }
    if json_path is not None:
        write_json(json_path, out)
    if quiet:
        return
    console.print(llm_table([f.llm for f in figures], f"{sc.doc.name}: LLM generation (simulated)"))
    rows = []
    for f in figures:
        for wl, w in f.by_workload.items():
            rows.append([
                f.arm, wl, str(w.requests), str(w.completed), str(sum(w.refused.values())),
                _s(w.ttft_s.p50), _s(w.ttft_s.p90), _s(w.tpot_s.p90, 1e3),
                _num(w.goodput_rps), _pct(w.goodput_fraction),
            ])  # fmt: skip
    head = ["arm", "workload", "requests", "completed", "refused", "TTFT P50 s", "TTFT P90 s",
            "TPOT P90 ms", "goodput rps", "within targets"]  # fmt: skip
    console.print(rich_table(f"{sc.doc.name}: by workload", head, rows))
    rows = []
    for f in figures:
        for name, d in f.devices.items():
            rows.append([
                f.arm, name, str(d["routed"]), _pct(d["utilization"]), _pct(d["kv_usage"]),
                _pct(d["prefix_cache_hit_rate"]), str(d["preemptions"]),
            ])  # fmt: skip
    head = ["arm", "device", "routed", "busy", "KV use", "prefix hits", "preemptions"]
    console.print(rich_table(f"{sc.doc.name}: devices", head, rows))
    rows = []
    for f in figures:
        for model, c in f.classic.items():
            rows.append([
                f.arm, model, str(c["requests"]), _ms(c["p50_ms"]), _ms(c["p99_ms"]),
                f"{c['slo_ms']:.0f}", _num(c["goodput_rps"]), _pct(c["goodput_fraction"]),
            ])  # fmt: skip
    if rows:
        head = ["arm", "model", "requests", "P50 ms", "P99 ms", "SLO ms", "goodput rps",
                "within SLO"]  # fmt: skip
        console.print(rich_table(f"{sc.doc.name}: classic models", head, rows))


def _s(v: float | None, scale: float = 1.0) -> str:
    return "-" if v is None else f"{v * scale:.3f}" if scale == 1.0 else f"{v * scale:.1f}"


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"
