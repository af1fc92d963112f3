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
