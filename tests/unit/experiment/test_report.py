"""The report folder: summary.json, report.html, the printed tables; and its errors."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from evenserve.core.errors import ConfigError
from evenserve.experiment.fidelity import fidelity
from evenserve.experiment.report import SUMMARY, finish_report, rebuild_report
from evenserve.experiment.stats import repeat_stats
from evenserve.report.summary import run_summary, summarize
from evenserve.report.table import compare_rows
from evenserve.sim.cluster import simulate
from evenserve.sim.loader import load_scenario

from .scenarios import scenario, write


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=200), buf


def test_finish_report_writes_the_folder(tmp_path: Path) -> None:
    loaded = load_scenario(write(tmp_path, scenario(duration_s=3, warmup_s=0.5)))
    runs = {
        a: [summarize(simulate(loaded, a, s), timeseries=False) for s in (1, 2)]
        for a in ("baseline", "classes")
    }
    summary = run_summary("small", 1, {a: v[0] for a, v in runs.items()})
    summary["comparison"] = compare_rows(summary)
    summary["repeats"] = {a: repeat_stats(v) for a, v in runs.items()}
    summary["fidelity"] = fidelity(summary["repeats"], summary["repeats"])
    summary["time_scale"] = 2.0
    console, buf = _console()
    out = tmp_path / "rep"
    finish_report(
        out, summary, title="small: test", notes=["first.", "second."], plots=False, console=console
    )
    text = buf.getvalue()
    assert "small: test" in text and "spread across repeats" in text
    assert "fidelity: live vs simulated" in text and "within 15 %" in text
    assert f"wrote {out / SUMMARY}" in text
    back = json.loads((out / SUMMARY).read_text())
    assert list(back["arms"]) == ["baseline", "classes"] and back["time_scale"] == 2.0
    html = (out / "report.html").read_text()
    assert html.startswith("<!doctype html>")
    for section in (
        "Arms side by side",
        "Spread across repeats",
        "Fidelity: live vs simulated",
        "first. second.",
    ):
        assert section in html
    assert not (out / "plots").exists()


def test_rebuild_report_errors(tmp_path: Path) -> None:
    console, _ = _console()
    with pytest.raises(ConfigError, match="not a folder"):
        rebuild_report([tmp_path / "none"], None, False, console)
    with pytest.raises(ConfigError, match="no runs found"):
        rebuild_report([tmp_path], None, False, console)
