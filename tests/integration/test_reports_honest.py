"""Reports that do not mislead: SLOs come from the flag or the target's model config (none:
no attainment figure, never 100 %), a run that scraped nothing has no utilization figure
(null, a note saying how to get it, a "not measured" panel), and the ``device`` label names
the worker's device, not the profile set that emulated workers share."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console

from evenserve.core.wire import LOAD_PATH, METRICS_PATH
from evenserve.experiment.target_bench import TargetBench, resolve_slos, run_target_bench
from evenserve.loadgen.spec import LoadSpec
from evenserve.report.plots import plot_utilization
from evenserve.runtime.device import parse_device
from evenserve.worker.app import Worker
from evenserve.worker.options import WorkerOptions
from evenserve.worker.repository import load_repository
from evenserve.worker.server import BackgroundWorker

from .worker_repo import MODELS, write_repo


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundWorker]:
    # "em" states an SLO in its model.yaml, "pair" none.
    repo = write_repo(
        tmp_path_factory.mktemp("honest"),
        {"em": {**MODELS["em"], "slo_ms": 40}, "pair": MODELS["pair"]},
    )
    service = Worker(load_repository(repo), WorkerOptions(device=parse_device("cpu")))
    with BackgroundWorker(service) as w:
        yield w


def _bench(worker: BackgroundWorker, tmp_path: Path, **kw: Any) -> tuple[dict[str, Any], str]:
    spec = LoadSpec(
        target=worker.url,
        mix={"em": 1.0, "pair": 1.0},
        duration_s=60.0,
        users=2,
        seed=1,
        var_dim=4,
        max_requests=20,
    )
    console = Console(record=True, width=200)
    run_target_bench(
        TargetBench(spec, out=tmp_path, progress=False, realtime=False, **kw),
        console,
        Console(file=io.StringIO()),
    )
    return json.loads((tmp_path / "summary.json").read_text()), console.export_text()


def test_slos_from_the_flag_then_the_model_config_then_none(worker: BackgroundWorker) -> None:
    slos, source = resolve_slos(worker.url, ["em", "pair"], {})
    assert slos["em"] == 40.0 and source["em"] == "model config"
    assert slos["pair"] == float("inf") and source["pair"] == "none"
    slos, source = resolve_slos(worker.url, ["em", "pair"], {"em": 7.0})
    assert slos["em"] == 7.0 and source["em"] == "flag"


def test_a_model_without_an_slo_gets_no_attainment(
    worker: BackgroundWorker, tmp_path: Path
) -> None:
    summary, text = _bench(worker, tmp_path, scrape={"w": worker.url})
    models = summary["arms"]["live"]["models"]
    assert models["em"]["slo_ms"] == 40.0 and models["em"]["slo_source"] == "model config"
    assert models["em"]["slo_attainment"] is not None
    assert models["pair"]["slo_ms"] is None and models["pair"]["slo_source"] == "none"
    assert models["pair"]["slo_attainment"] is None and models["pair"]["goodput_rps"] is None
    row = next(line for line in text.splitlines() if "SLO met pair" in line)
    assert "-" in row and "%" not in row
    assert "em 40 ms (model config)" in text and "pair none" in text
    # Scraped: utilization measured, no "not measured" note.
    assert summary["arms"]["live"]["utilization_mean"] is not None
    assert "utilization not measured" not in text


def test_a_run_that_scraped_nothing_has_no_utilization(
    worker: BackgroundWorker, tmp_path: Path
) -> None:
    # A scrape that never answers (nothing listens on port 9 of loopback).
    summary, text = _bench(worker, tmp_path, scrape={"gone": "http://127.0.0.1:9"}, plots=False)
    arm = summary["arms"]["live"]
    assert arm["utilization_mean"] is None and arm["utilization_spread_pts"] is None
    assert arm["devices"] == {}
    assert "utilization not measured" in text and "--admin-token" in text
    assert "--scrape NAME=URL" in text
    assert "utilization not measured" in (tmp_path / "report.html").read_text()
    # The plot of such a run says so instead of drawing a flat 0 % line.
    png = plot_utilization(summary, tmp_path)
    assert png.is_file()


def test_two_emulated_workers_on_one_profile_set_name_their_devices(tmp_path: Path) -> None:
    repo = write_repo(tmp_path, {"em": MODELS["em"]})
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "em.yaml").write_text((repo / "em" / "profile.yaml").read_text())
    labels = []
    for name in ("gpu0", "gpu1"):
        service = Worker(
            load_repository(repo),
            WorkerOptions(device=parse_device(f"emulated:{profiles}"), name=name),
        )
        with BackgroundWorker(service) as w:
            assert httpx.get(w.url + LOAD_PATH).json()["device"] == name
            text = httpx.get(w.url + METRICS_PATH).text
        labels.append({line for line in text.splitlines() if 'device="' in line})
        assert all(f'device="{name}"' in line for line in labels[-1])
    assert labels[0] and labels[1]
    assert not any('device="emulated:' in line for line in labels[0] | labels[1])
    # Unnamed, the label stays the device string.
    plain = Worker(load_repository(repo), WorkerOptions(device=parse_device("cpu")))
    assert plain.device.name == "cpu"
