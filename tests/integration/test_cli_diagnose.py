"""``evenserve diagnose`` end to end on a short simulated run: findings, recommendations
verified by replaying the run in the simulator, ``--json``; bad input named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evenserve.cli.main import app
from evenserve.core.errors import ConfigError
from evenserve.experiment.diagnose import Replay, combine, verify, with_candidate

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "scenarios" / "diagnose.yaml"
STATIC = [
    "--set",
    "duration_s=6",
    "--set",
    "warmup_s=1",
    "--set",
    "arms.healthy.batching={policy: static, batch_size: 4}",
    "--set",
    "workload.rates_rps.vision=600",
    "--set",
    "workload.rates_rps.text=300",
]


def _simulate(tmp_path: Path) -> Path:
    out = tmp_path / "run.json"
    r = runner.invoke(app, ["simulate", str(SCENARIO), *STATIC, "--json", str(out)])
    assert r.exit_code == 0, r.output
    return out


def test_static_batches_found_and_a_verified_fix(tmp_path: Path) -> None:
    run = _simulate(tmp_path)
    source = json.loads(run.read_text())["source"]
    assert source["scenario"] == str(SCENARIO) and source["arm"] == "healthy"
    out = tmp_path / "findings.json"
    r = runner.invoke(app, ["diagnose", str(run), "--json", str(out), "--jobs", "1"])
    assert r.exit_code == 0, r.output
    report = json.loads(out.read_text())
    arm = report["runs"][0]["arms"]["healthy"]
    assert arm["verified"] and arm["simulator_runs"] >= 3
    kinds = {(f["kind"], f["device"], f["model"]) for f in arm["findings"]}
    assert ("static-batch-wait", "gpu0", "vision") in kinds
    f = next(f for f in arm["findings"] if f["kind"] == "static-batch-wait")
    rec = f["recommendation"]
    assert rec is not None and rec["pushable"]
    p99 = rec["predicted"]["p99_ms"]
    assert p99["after"] < p99["before"]
    # The replay of the run as it was reproduces the run (same scenario, seed, arrivals).
    summary = json.loads(run.read_text())["arms"]["healthy"]
    assert arm["replayed"]["p99_ms"] == summary["latency_ms"]["p99"]
    assert arm["combined"]["better"]
    assert "static-batch-wait" in r.output and "P99 ms" in r.output


def test_no_verify_and_stdout_json(tmp_path: Path) -> None:
    run = _simulate(tmp_path)
    plots = tmp_path / "plots"
    r = runner.invoke(
        app, ["diagnose", str(run), "--no-verify", "--json", "-", "--plots", str(plots)]
    )
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)
    arm = report["runs"][0]["arms"]["healthy"]
    assert not arm["verified"] and arm["findings"]
    assert Path(arm["plot"]).read_bytes()[:4] == b"\x89PNG"
    assert all("recommendation" not in f for f in arm["findings"])


def test_a_live_summary_without_a_scenario_is_diagnosed_not_verified(tmp_path: Path) -> None:
    run = _simulate(tmp_path)
    data = json.loads(run.read_text())
    del data["source"]
    run.write_text(json.dumps(data))
    r = runner.invoke(app, ["diagnose", str(run), "--json", "-"])
    assert r.exit_code == 0, r.output
    arm = json.loads(r.output)["runs"][0]["arms"]["healthy"]
    assert arm["findings"] and "give --scenario" in arm["not_verified"]


def test_bad_input_is_named(tmp_path: Path) -> None:
    r = runner.invoke(app, ["diagnose", str(tmp_path / "nope.json")])
    assert r.exit_code == 2 and "file not found" in r.output
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    r = runner.invoke(app, ["diagnose", str(bad)])
    assert r.exit_code == 2 and "not JSON" in r.output
    bad.write_text('{"arms": {"a": {"x": 1}}}')
    r = runner.invoke(app, ["diagnose", str(bad)])
    assert r.exit_code == 2 and "arms.a: not an arm summary" in r.output
    run = _simulate(tmp_path)
    r = runner.invoke(app, ["diagnose", str(run), "--arm", "other"])
    assert r.exit_code == 2 and "--arm" in r.output
    r = runner.invoke(app, ["diagnose", str(run), "--trace", str(run)])
    assert r.exit_code == 2 and "--trace: needs --scenario" in r.output
    r = runner.invoke(app, ["diagnose", str(run), "--verify-s", "0"])
    assert r.exit_code == 2 and "--verify-s" in r.output
    r = runner.invoke(
        app,
        ["diagnose", str(run), "--apply", "http://127.0.0.1:9"],
        env={"EVENSERVE_ADMIN_TOKEN": ""},
    )
    assert r.exit_code == 2 and "admin token" in r.output


def test_candidates_change_the_scenario_as_asked() -> None:
    loaded = Replay(SCENARIO, "healthy", overrides=tuple(STATIC[1::2])).load()
    new = with_candidate(
        loaded,
        "healthy",
        {
            "params": {"routing": {"policy": "round-robin"}},
            "placement": None,
            "devices": {"gpu1": {"staging_ms_per_item": 0.5}},
        },
    )
    assert new.scenario.arms["healthy"].routing["policy"] == "round-robin"
    assert new.scenario.devices[1].staging_ms_per_item == 0.5
    assert loaded.scenario.devices[1].staging_ms_per_item == 0.0  # the original is kept
    with pytest.raises(ConfigError, match=r"placement\.gpu9"):
        with_candidate(loaded, "healthy", {"placement": {"gpu9": ["text"]}})


def test_combine_merges_pushable_changes_best_first() -> None:
    a = {"change": "a", "pushable": True, "params": {"routing": {"policy": "x"}}}
    b = {
        "change": "b",
        "pushable": True,
        "params": {"routing": {"policy": "y"}, "batching_per_model": {"m": {"policy": "none"}}},
    }
    c = {"change": "c", "pushable": False, "params": None, "placement": {"gpu0": ["m"]}}
    together = combine([a, b, c])
    assert together is not None
    assert together["params"] == {
        "routing": {"policy": "x"},
        "batching_per_model": {"m": {"policy": "none"}},
    }
    assert combine([a, c]) is None


def test_verify_keeps_no_recommendation_when_nothing_is_better() -> None:
    replay = Replay(SCENARIO, "healthy", overrides=tuple(STATIC[1::2]))
    worse: dict[str, object] = {
        "kind": "x",
        "candidates": [
            {
                "change": "batches of one",
                "params": {"batching_per_model": {"text": {"policy": "static", "batch_size": 32}}},
                "placement": None,
                "devices": None,
                "pushable": True,
            }
        ],
    }
    v = verify([worse], replay, "healthy", jobs=1)
    assert worse["recommendation"] is None
    assert worse["tried"][0]["better"] is False and v.runs == 2
