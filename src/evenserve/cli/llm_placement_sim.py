"""``evenserve simulate`` / ``compare`` of an LLM-pools scenario (``kind: llm-placement``,
``sim.llm_placement``): every arm (or ``--arm``), a table of each arm's device-seconds, SLO
attainment, loads and switches, and the figures as JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from evenserve.cli.app import console, counted_progress, fail, write_json
from evenserve.core.errors import ConfigError, EvenserveError
from evenserve.core.validation import read_yaml
from evenserve.sim.llm_placement import run_placement_arm, summarize_placement
from evenserve.sim.llm_placement_scenario import load_llm_placement_scenario


def is_llm_placement_scenario(path: Path) -> bool:
    """Whether ``path`` holds an LLM-pools scenario (``kind: llm-placement``)."""
    try:
        raw = read_yaml(path, f"scenario file not found: {path}")
    except ConfigError:
        return False
    return isinstance(raw, dict) and raw.get("kind") == "llm-placement"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


def simulate_llm_placement(
    path: Path, arm: str | None, seed: int | None, json_path: Path | None
) -> None:
    """Run ``arm`` (None: every arm) of the scenario at ``path`` and print the figures."""
    try:
        sc = load_llm_placement_scenario(path)
        names = list(sc.doc.arms) if arm is None else [arm]
        for n in names:
            if n not in sc.doc.arms:
                fail(f"--arm: unknown arm {n!r} (arms: {', '.join(sc.doc.arms)})")
        s = sc.doc.seed if seed is None else seed
        quiet = json_path is not None and str(json_path) == "-"
        arms: dict[str, Any] = {}
        with counted_progress("arms", quiet) as progress:
            task = progress.add_task(f"simulating {sc.doc.name}", total=len(names))
            for n in names:
                progress.update(task, description=f"simulating {sc.doc.name} / {n}")
                arms[n] = summarize_placement(sc, run_placement_arm(sc, n, s))
                progress.advance(task)
    except EvenserveError as exc:
        fail(str(exc))
        return
    out = {"scenario": sc.doc.name, "seed": s, "arms": arms}
    if json_path is not None:
        write_json(json_path, out)
    if quiet:
        return
    t = Table(title=f"{sc.doc.name}: LLMs in the pools (simulated, seed {s})")
    for col in (
        "arm", "device-s", "LLM SLO", "classic SLO", "loads (warm/cold)", "evictions",
        "switches", "shortest switch gap s", "refused (no device)",
    ):  # fmt: skip
        t.add_column(col)
    for n, a in arms.items():
        gap = a["shortest_switch_gap_s"]
        t.add_row(
            n, f"{a['device_seconds']:.0f}", _pct(a["llm_attainment"]),
            _pct(a["classic_attainment"]), f"{a['loads']} ({a['warm_loads']}/{a['cold_loads']})",
            str(a["evictions"]), str(a["switches"]), "-" if gap is None else f"{gap:.1f}",
            str(a["unplaced"]),
        )  # fmt: skip
    console.print(t)
