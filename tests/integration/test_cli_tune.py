"""``evenserve tune`` end to end (in process, via typer's runner): a tiny search, errors."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from evenserve.cli.main import app
from evenserve.workload import Arrival, write_trace
from tests.unit.sim.scenarios import toy_scenario, write_scenario

runner = CliRunner()
FW = {"policy": "fixed-window", "max_batch_size": 8, "max_batch_delay_ms": 5}


def scenario(tmp_path: Path) -> Path:
    sc = toy_scenario(
        tmp_path,
        duration_s=3,
        warmup_s=0.5,
        arms={"qa": {"routing": "queue-aware", "batching": FW}},
    )
    return write_scenario(tmp_path, sc)


def test_tune_prints_the_table_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    res = runner.invoke(
        app, ["tune", str(scenario(tmp_path)), "--budget", "3", "--no-sweep", "--json", str(out)]
    )
    assert res.exit_code == 0, res.output
    assert "current" in res.output and "best params" in res.output
    data = json.loads(out.read_text())
    assert {"current", "best", "params", "evaluations", "regret"} <= set(data)
    assert data["evaluations"] == 3
    assert data["regret"] is None  # no sweep


def test_tune_a_trace_on_a_scenario(tmp_path: Path) -> None:
    trace = tmp_path / "rec.jsonl"
    write_trace(trace, [Arrival(i * 0.02, "fast") for i in range(100)])
    res = runner.invoke(
        app,
        ["tune", str(trace), "--scenario", str(scenario(tmp_path)), "--budget", "2", "--no-sweep"],
    )
    assert res.exit_code == 0, res.output


def test_tune_errors_name_the_option(tmp_path: Path) -> None:
    sc = str(scenario(tmp_path))
    res = runner.invoke(app, ["tune", str(tmp_path / "missing.yaml")])
    assert res.exit_code == 2 and "SCENARIO_OR_TRACE: file not found" in res.output
    res = runner.invoke(app, ["tune", sc, "--budget", "0"])
    assert res.exit_code == 2 and "--budget" in res.output
    res = runner.invoke(app, ["tune", sc, "--arm", "nope", "--budget", "1"])
    assert res.exit_code == 2 and "--arm: unknown arm" in res.output
    res = runner.invoke(app, ["tune", sc, "--seeds", "-1"])
    assert res.exit_code == 2 and "--seeds" in res.output
    trace = tmp_path / "rec.jsonl"
    write_trace(trace, [Arrival(0.1, "fast")])
    res = runner.invoke(app, ["tune", str(trace)])
    assert res.exit_code == 2 and "--scenario" in res.output
    res = runner.invoke(app, ["tune", str(trace), "--cluster", str(tmp_path / "c.yaml")])
    assert res.exit_code == 2 and "--cluster" in res.output


def test_tune_a_trace_on_a_cluster(tmp_path: Path) -> None:
    from evenserve.experiment.cluster import write_arm_cluster, write_profile_sets
    from evenserve.sim.loader import load_scenario
    from tests.unit.experiment.scenarios import REPO, write
    from tests.unit.experiment.scenarios import scenario as small

    loaded = load_scenario(write(tmp_path, small()))
    dirs = write_profile_sets(loaded, tmp_path / "w")
    cluster = write_arm_cluster(loaded, "classes", REPO, tmp_path / "w", dirs, seed=9)
    trace = tmp_path / "rec.jsonl"
    write_trace(trace, [Arrival(i * 0.01, "resnet50") for i in range(150)])
    args = ["tune", str(trace), "--cluster", str(cluster), "--budget", "3", "--no-sweep"]
    res = runner.invoke(app, [*args, "--json", "-"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["evaluations"] == 3 and data["arm"] == "bench-small-classes"
    res = runner.invoke(app, [*args, "--scenario", str(tmp_path / "sc.yaml")])
    assert res.exit_code == 2 and "--cluster, --scenario: give one" in res.output
    res = runner.invoke(app, ["tune", str(trace), "--budget", "1"])
    assert res.exit_code == 2 and "--cluster" in res.output
    res = runner.invoke(app, ["tune", str(trace), "--cluster", str(tmp_path / "no.yaml")])
    assert res.exit_code == 2 and "--cluster: file not found" in res.output


def test_watch_and_push_errors_name_the_option(tmp_path: Path) -> None:
    from evenserve.experiment.cluster import free_port

    sc = str(scenario(tmp_path))
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    env = {"EVENSERVE_ADMIN_TOKEN": "t0k3n-not-shown"}
    res = runner.invoke(app, ["tune", sc, "--watch", url, "--every", "1s"], env=env)
    assert res.exit_code == 2 and "--watch:" in res.output and "no answer" in res.output
    assert "t0k3n-not-shown" not in res.output
    res = runner.invoke(app, ["tune", sc, "--watch", url, "--every", "soon"], env=env)
    assert res.exit_code == 2 and "--every" in res.output
    res = runner.invoke(app, ["tune", sc, "--watch", url, "--budget", "1"], env=env)
    assert res.exit_code == 2 and "--budget" in res.output
    res = runner.invoke(app, ["tune", sc, "--watch", url], env={"EVENSERVE_ADMIN_TOKEN": ""})
    assert res.exit_code == 2 and "no admin token" in res.output
    res = runner.invoke(app, ["tune", sc, "--budget", "2", "--no-sweep", "--push", url], env=env)
    assert res.exit_code == 2 and "--push:" in res.output
