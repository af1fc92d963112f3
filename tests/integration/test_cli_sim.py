"""The simulate/compare/policies commands end to end (in process, via typer's runner)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from evenserve.cli.main import app
from tests.unit.sim.scenarios import toy_scenario, write_scenario

runner = CliRunner()


def scenario(tmp_path: Path) -> Path:
    return write_scenario(tmp_path, toy_scenario(tmp_path, duration_s=6, warmup_s=1))


def test_simulate_prints_figures_and_json(tmp_path: Path) -> None:
    sc = scenario(tmp_path)
    out = tmp_path / "s.json"
    res = runner.invoke(app, ["simulate", str(sc), "--arm", "optimized", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "arrived" in res.output
    data = json.loads(out.read_text())
    arm = data["arms"]["optimized"]
    for key in (
        "throughput_rps",
        "latency_ms",
        "models",
        "devices",
        "utilization_spread_pts",
        "max_queue_depth",
        "requests",
        "routing",
        "batching",
    ):
        assert key in arm
    assert set(arm["latency_ms"]) >= {"p50", "p95", "p99", "max"}
    m = arm["models"]["fast"]
    assert set(m) >= {"throughput_rps", "latency_ms", "slo_ms", "slo_attainment", "goodput_rps"}
    d = arm["devices"]["d0"]
    assert set(d) >= {"utilization", "mean_queue_depth", "max_queue_depth"}


def test_compare_is_byte_for_byte_deterministic_and_plots(tmp_path: Path) -> None:
    sc = scenario(tmp_path)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    res = runner.invoke(app, ["compare", str(sc), "--json", str(a), "--plots", str(tmp_path / "p")])
    assert res.exit_code == 0, res.output
    assert "P99 / central-queue" in res.output
    res = runner.invoke(app, ["compare", str(sc), "--json", str(b)])
    assert res.exit_code == 0, res.output
    assert a.read_bytes() == b.read_bytes()
    for name in ("utilization.png", "latency_cdf.png", "queue_depth.png"):
        png = tmp_path / "p" / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = {r["arm"]: r for r in json.loads(a.read_text())["comparison"]}
    assert rows["baseline"]["throughput_vs_baseline"] == 1.0
    assert "p99_vs_central_queue" in rows["optimized"]


def test_seed_option_changes_result(tmp_path: Path) -> None:
    sc = scenario(tmp_path)
    outs = []
    for seed in ("1", "2"):
        p = tmp_path / f"{seed}.json"
        assert (
            runner.invoke(app, ["simulate", str(sc), "--seed", seed, "--json", str(p)]).exit_code
            == 0
        )
        outs.append(json.loads(p.read_text()))
    assert outs[0]["seed"] == 1 and outs[1]["seed"] == 2
    assert outs[0]["arms"] != outs[1]["arms"]


def test_json_to_stdout_is_pure_json(tmp_path: Path) -> None:
    res = runner.invoke(app, ["simulate", str(scenario(tmp_path)), "--json", "-"])
    assert res.exit_code == 0
    assert json.loads(res.stdout)["scenario"] == "toy"


def test_bad_inputs_give_one_clear_error(tmp_path: Path) -> None:
    sc = scenario(tmp_path)
    cases = [
        (["simulate", str(tmp_path / "missing.yaml")], "scenario file not found"),
        (["simulate", str(sc), "--arm", "nope"], "--arm: unknown arm 'nope'"),
        (["simulate", str(sc), "--set", "arms.baseline.routing=warp"], "unknown routing policy"),
        (["compare", str(sc), "--set", "workload.rates_rps.fast=-1"], "rates_rps.fast"),
    ]
    for args, needle in cases:
        res = runner.invoke(app, args)
        assert res.exit_code == 2, (args, res.output)
        assert needle in res.output.replace("\n", ""), (args, res.output)
        assert "Traceback" not in res.output


def test_policies_lists_everything() -> None:
    res = runner.invoke(app, ["policies", "--json"])
    assert res.exit_code == 0
    data = json.loads(res.stdout)
    assert "queue-aware" in data["routing"] and "central-queue" in data["routing"]
    assert data["routing"]["queue-aware"]["params"]["queue_weight"] == 0.5
    assert "fixed-window" in data["batching"]
