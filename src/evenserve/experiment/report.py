"""A bench's report: printed tables, ``summary.json``, plots and ``report.html`` in one folder;
and ``evenserve report``: the same, recomputed from saved runs' raw samples."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from rich.console import Console

from evenserve.core.errors import ConfigError
from evenserve.experiment.fidelity import FIDELITY_TOLERANCE, fidelity
from evenserve.experiment.stats import headline, repeat_stats
from evenserve.experiment.tables import (
    fidelity_rows,
    fidelity_table,
    repeats_rows,
    repeats_table,
)
from evenserve.loadgen.records import read_run
from evenserve.report.html import Section, write_html
from evenserve.report.plots import write_plots
from evenserve.report.summary import clean_json, run_summary, summarize
from evenserve.report.table import compare_rows, compare_table, compare_table_rows

SUMMARY = "summary.json"


def finish_report(
    out: Path,
    summary: dict[str, Any],
    *,
    title: str,
    notes: list[str],
    plots: bool,
    console: Console,
) -> None:
    """Print the tables on ``console``, write summary.json, plots and report.html into ``out``.

    ``summary`` is a ``run_summary`` with ``comparison`` and optionally ``repeats``,
    ``fidelity`` and ``time_scale``; the first two notes open the HTML report's first section.
    """
    console.print(compare_table(summary, title=title))
    repeats = summary.get("repeats")
    if repeats and any(v["p99_ms"]["n"] > 1 for v in repeats.values()):
        console.print(repeats_table(repeats))
    fid = summary.get("fidelity")
    if fid:
        console.print(fidelity_table(fid, summary.get("time_scale")))
    for line in notes:
        console.print(line, highlight=False, soft_wrap=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / SUMMARY).write_text(json.dumps(clean_json(summary), indent=2) + "\n")
    images: list[Path] = []
    if plots:
        images = write_plots(summary, out / "plots")
    header, rows = compare_table_rows(summary)
    sections = [
        Section("Arms side by side", text=" ".join(notes[:2]), header=header, rows=rows),
    ]
    if repeats:
        rh, rr = repeats_rows(repeats)
        sections.append(Section("Spread across repeats (mean ± sd [min-max])", header=rh, rows=rr))
    if fid:
        fh, fr, fm = fidelity_rows(fid)
        sections.append(
            Section(
                "Fidelity: live vs simulated",
                text=f"Same scenario, time scale and seeds; target: within "
                f"{FIDELITY_TOLERANCE:.0%} on P50, P99 and per-device utilization.",
                header=fh,
                rows=fr,
                marks=fm,
            )
        )
    sections.append(Section("Notes", preformatted="\n".join(notes)))
    if images:
        sections.append(Section("Plots", images=images))
    html_path = write_html(out / "report.html", title, sections)
    console.print(
        f"wrote {out / SUMMARY}, {html_path}" + (f", plots in {out / 'plots'}" if images else "")
    )


def rebuild_report(runs: list[Path], out: Path | None, plots: bool, console: Console) -> Path:
    """``evenserve report``: every run's figures recomputed from its raw samples, repeats and
    (from a bench folder's summary.json) the simulated side of fidelity; returns the folder.

    ``runs`` are bench folders (``runs/ARM/repN/run.json``) or single run folders; with
    several, arms are named ``FOLDER:ARM``. Writes into ``out`` (default: first/report).
    """
    arms: dict[str, list[dict[str, Any]]] = {}
    fid_sim: dict[str, Any] = {}
    scales: set[float] = set()
    name = ""
    for folder in runs:
        if not folder.is_dir():
            raise ConfigError(f"{folder}: not a folder")
        run_dirs = sorted(p.parent for p in folder.glob("runs/*/*/run.json"))
        run_dirs += sorted(p.parent for p in folder.glob("runs/*/run.json"))
        if (folder / "run.json").is_file():
            run_dirs = [folder]
        if not run_dirs:
            raise ConfigError(f"{folder}: no runs found (expected runs/ARM/repN/run.json)")
        for rd in run_dirs:
            rec, meta = read_run(rd)
            key = rec.arm if len(runs) == 1 else f"{folder.name}:{rec.arm}"
            arms.setdefault(key, []).append(summarize(rec))
            name = name or rec.scenario
            if meta.get("time_scale") is not None:
                scales.add(float(meta["time_scale"]))
        prev = folder / SUMMARY
        if prev.is_file():
            with contextlib.suppress(json.JSONDecodeError, KeyError, TypeError):
                sim = json.loads(prev.read_text()).get("simulated") or {}
                for a, st in (sim.get("repeats") or {}).items():
                    fid_sim[a if len(runs) == 1 else f"{folder.name}:{a}"] = st
    summary = run_summary(name, 0, {a: headline(v) for a, v in arms.items()})
    summary["comparison"] = compare_rows(summary)
    summary["repeats"] = {a: repeat_stats(v) for a, v in arms.items()}
    k = next(iter(scales)) if len(scales) == 1 else None
    if k is not None:
        summary["time_scale"] = k
    if fid_sim:
        summary["fidelity"] = fidelity(summary["repeats"], fid_sim)
    dest = out or runs[0] / "report"
    notes = [
        f"Recomputed from the raw samples of {sum(len(v) for v in arms.values())} run(s) "
        f"in {', '.join(str(r) for r in runs)}.",
        "Table: the repeat with the median P99 per arm.",
    ]
    finish_report(dest, summary, title=f"{name}: report", notes=notes, plots=plots, console=console)
    return dest
