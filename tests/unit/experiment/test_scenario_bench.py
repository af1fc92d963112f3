"""A scenario bench's plan, summary, bench.json and notes (no live run: the simulator stands in)."""

from __future__ import annotations

from pathlib import Path

import pytest

from evenserve.core.errors import ConfigError
from evenserve.experiment.scenario_bench import (
    BenchPlan,
    RepeatRun,
    ScenarioBench,
    bench_meta,
    bench_notes,
    bench_source,
    bench_summary,
    plan_bench,
    simulate_arms,
)
from evenserve.report.summary import summarize
from evenserve.sim.cluster import simulate

from .scenarios import REPO, scenario, write


def _plan(tmp_path: Path, **over: object) -> BenchPlan:
    path = write(tmp_path, scenario())
    opts = {"repo": REPO, "out": tmp_path / "out", "time_scale": 4.0, **over}
    return plan_bench(ScenarioBench(path, **opts))


def test_plan_defaults_and_choices(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    assert plan.live_arms == ["baseline", "classes"] and plan.skipped_arms == ["central-queue"]
    assert (plan.duration_s, plan.warmup_s, plan.seed) == (10.0, 2.0, 4)
    assert plan.scaled.scenario.duration_s == 10.0
    assert plan.scaled.scenario.models["resnet50"].slo_ms == 40.0
    assert plan.folder == tmp_path / "out" and plan.folder.is_dir()
    assert (plan.profile_dirs["a10"] / "resnet50.yaml").is_file()
    # The scenario gives no model a batch cap: each gets its model.yaml's, as the workers
    # have it, and the summary's source carries it (a replay applies the same rule).
    caps = {m: plan.scaled.scenario.models[m].max_batch_size for m in ("resnet50", "bert-base")}
    assert caps == {"resnet50": 64, "bert-base": 64}
    assert plan.overrides == [f"models.{m}.max_batch_size=64" for m in ("resnet50", "bert-base")]
    assert bench_source(plan)["set"] == plan.overrides
    # A shorter run keeps the scenario's warm-up share unless told otherwise.
    plan = _plan(tmp_path, duration_s=5.0, seed=11, arms=["classes"])
    assert (plan.duration_s, plan.warmup_s, plan.seed) == (5.0, 1.0, 11)
    assert plan.live_arms == ["classes"] and plan.skipped_arms == []
    assert _plan(tmp_path, duration_s=5.0, warmup_s=0.0).warmup_s == 0.0
    level = write(tmp_path, scenario(levels={"hi": [{"start_s": 0, "end_s": 10, "multiplier": 3}]}))
    plan = plan_bench(ScenarioBench(level, level="hi", repo=REPO, out=tmp_path / "o2"))
    assert plan.scaled.scenario.workload.phases[0].multiplier == 3


@pytest.mark.parametrize(
    ("over", "needle"),
    [
        ({"repeats": 0}, "--repeats"),
        ({"time_scale": 0.0}, "--time-scale"),
        ({"time_scale": float("nan")}, "--time-scale"),
        ({"arms": ["nope"]}, "--arms: unknown arm 'nope' (arms: baseline, classes, central-queue)"),
        ({"arms": ["central-queue"]}, "no arm with a live counterpart"),
        ({"repo": Path("no/such/repo")}, "--repo: not a directory"),
        ({"duration_s": 5.0, "warmup_s": 5.0}, "--warmup"),
        ({"level": "peak"}, "--level"),
    ],
)
def test_bad_plans_name_the_option(tmp_path: Path, over: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        _plan(tmp_path, **over)
    assert needle in str(e.value)


def test_summary_meta_and_notes(tmp_path: Path) -> None:
    plan = _plan(tmp_path, repeats=2)
    # Stand-ins for the live repeats: the simulator's own runs, so fidelity must be exact.
    runs = [
        RepeatRun(
            arm,
            rep + 1,
            summarize(simulate(plan.scaled, arm, plan.seed + rep), timeseries=False),
            {"count": 10, "p99": 0.2 + rep},
            {"opened": 3},
            {"cores": {"loadgen": 0.1}, "load_average_1m": 1.0},
        )
        for arm in plan.live_arms
        for rep in range(2)
    ]
    simulated = simulate_arms(plan)
    assert list(simulated.stats) == ["baseline", "classes", "central-queue"]
    assert simulated.decisions == {}  # no placement arm
    s = bench_summary(plan, runs, simulated)
    assert list(s["arms"]) == ["baseline", "classes"]
    assert s["time_scale"] == 4.0 and "level" not in s
    assert s["repeats"]["classes"]["p99_ms"]["n"] == 2
    assert list(s["scheduling_lag_ms"]) == ["baseline#1", "baseline#2", "classes#1", "classes#2"]
    assert s["cpu"]["classes#2"]["load_average_1m"] == 1.0
    for rows in s["fidelity"].values():
        for fig in rows.values():
            assert fig["rel_error"] in (0.0, None)
    assert "central-queue" in s["simulated"]["arms"]
    assert "fidelity" not in bench_summary(plan, runs, None)

    meta = bench_meta(plan)
    assert meta["arms"] == ["baseline", "classes"] and meta["skipped_arms"] == ["central-queue"]
    assert (meta["duration_s"], meta["warmup_s"], meta["repeats"], meta["seed"]) == (
        10.0,
        2.0,
        2,
        4,
    )
    notes = bench_notes(plan, runs)
    assert "gateway + up to 3 workers per arm" in notes[0] and "time scale K = 4" in notes[0]
    assert notes[1].endswith("over all runs: 1.200 ms.")
    assert notes[2] == "Simulator-only arms (no live run): central-queue."
