"""experiment.tune: params onto an arm, the objective's order, a seeded search, the JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from evenserve.core.errors import ConfigError
from evenserve.experiment.tune import (
    GOODPUT_TOLERANCE,
    GRID,
    Score,
    apply,
    current_params,
    has_classes,
    replay_trace,
    score,
    sweep_grid,
    tune,
)
from evenserve.sim.loader import LoadedScenario, load_scenario
from evenserve.workload import Arrival, write_trace
from tests.unit.sim.scenarios import toy_scenario, write_scenario

FW = {"policy": "fixed-window", "max_batch_size": 8, "max_batch_delay_ms": 5}


def tiny(tmp_path: Path, **over: Any) -> LoadedScenario:
    sc = toy_scenario(
        tmp_path,
        duration_s=3,
        warmup_s=0.5,
        arms={
            "qa": {"routing": "queue-aware", "batching": FW},
            "lew": {"routing": "least-expected-work", "batching": FW},
        },
        **over,
    )
    return load_scenario(write_scenario(tmp_path, sc))


def params_of(loaded: LoadedScenario) -> dict[str, Any]:
    p = current_params(loaded.scenario, "qa")
    assert p is not None
    return p


def test_current_params_shape(tmp_path: Path) -> None:
    p = params_of(tiny(tmp_path))
    assert set(p) == {"routing", "batching_per_model", "class_headroom", "learn_profiles"}
    assert p["routing"] == {
        "policy": "queue-aware",
        "queue_weight": 0.5,
        "utilization_weight": 0.3,
        "memory_weight": 0.2,
        "overload_utilization": 0.85,
        "overload_free_gb": 2.0,
    }
    assert p["batching_per_model"]["fast"] == FW
    assert p["class_headroom"] is None
    assert p["learn_profiles"] is False


def test_current_params_none_when_not_queue_aware(tmp_path: Path) -> None:
    assert current_params(tiny(tmp_path).scenario, "lew") is None


def test_apply_copies_the_three_fields(tmp_path: Path) -> None:
    loaded = tiny(tmp_path)
    p = params_of(loaded)
    p["routing"]["queue_weight"] = 0.9
    p["batching_per_model"]["slow"]["max_batch_size"] = 4
    p["class_headroom"] = 0.7
    arm = apply(loaded, "qa", p).scenario.arms["qa"]
    assert arm.routing["queue_weight"] == 0.9
    assert arm.batching_per_model["slow"]["max_batch_size"] == 4
    assert arm.class_headroom == 0.7
    assert loaded.scenario.arms["qa"].class_headroom is None  # the original is untouched
    assert arm.learn_profiles is False
    on = apply(loaded, "qa", {"learn_profiles": True}).scenario.arms["qa"]
    assert on.learn_profiles is True
    assert on.batching_per_model == loaded.scenario.arms["qa"].batching_per_model


def test_apply_names_learn_profiles_when_it_is_not_a_bool(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"params.learn_profiles"):
        apply(tiny(tmp_path), "qa", {"learn_profiles": "yes"})


def test_apply_names_the_bad_field(tmp_path: Path) -> None:
    loaded = tiny(tmp_path)
    p = params_of(loaded)
    p["batching_per_model"]["nope"] = FW
    with pytest.raises(ConfigError, match=r"params.batching_per_model.nope"):
        apply(loaded, "qa", p)
    p = params_of(loaded)
    p["routing"]["queue_weight"] = -1
    with pytest.raises(ConfigError, match=r"params.routing"):
        apply(loaded, "qa", p)


def test_objective_never_trades_goodput_for_p99() -> None:
    floor = 100.0 * (1 - GOODPUT_TOLERANCE)
    fast_but_short = Score(p99_ms=10.0, goodput_rps=98.0, goodput_floor_rps=floor)
    slow_but_full = Score(p99_ms=80.0, goodput_rps=100.0, goodput_floor_rps=floor)
    within_tolerance = Score(p99_ms=50.0, goodput_rps=99.6, goodput_floor_rps=floor)
    assert not fast_but_short.feasible
    assert slow_but_full.feasible and within_tolerance.feasible
    ranked = sorted([fast_but_short, slow_but_full, within_tolerance], key=lambda s: s.key)
    assert ranked == [within_tolerance, slow_but_full, fast_but_short]
    # Among infeasible ones, more goodput first (whatever the P99).
    worse = Score(p99_ms=1.0, goodput_rps=90.0, goodput_floor_rps=floor)
    assert fast_but_short.key < worse.key


def test_score_reads_the_summary() -> None:
    summary = {
        "latency_ms": {"p99": 12.5},
        "models": {"a": {"goodput_rps": 10.0}, "b": {"goodput_rps": 5.0}},
    }
    s = score(summary, 14.0)
    assert (s.p99_ms, s.goodput_rps, s.feasible) == (12.5, 15.0, True)


def test_sweep_grid_is_the_stated_grid(tmp_path: Path) -> None:
    loaded = tiny(tmp_path)
    grid = sweep_grid(loaded.scenario, params_of(loaded))
    n = 1
    for v in GRID.values():
        n *= len(v)
    assert len(grid) == n
    assert {g["routing"]["utilization_weight"] for g in grid} == set(
        GRID["routing.utilization_weight"]
    )
    # The fast model's window is capped at a quarter of its 50 ms SLO.
    assert max(g["batching_per_model"]["fast"]["max_batch_delay_ms"] for g in grid) <= 12.5


def test_tiny_search_json_shape_and_best_not_worse(tmp_path: Path) -> None:
    r = tune(tiny(tmp_path), "qa", budget=4, sweep=True, held_out_seeds=1)
    j = json.loads(json.dumps(r.to_json()))  # strict JSON
    assert {"current", "best", "params", "evaluations", "regret"} <= set(j)
    assert j["evaluations"] == 4
    for k in ("current", "best"):
        assert set(j[k]) == {"scenario", "seed", "arms"}
        assert "latency_ms" in j[k]["arms"]["qa"]
    assert set(j["params"]) == {"routing", "batching_per_model", "class_headroom", "learn_profiles"}
    assert j["params"]["routing"]["policy"] == "queue-aware"
    assert r.best.score.key <= r.current.score.key
    assert j["sweep"]["evaluations"] == len(r.sweep)
    assert isinstance(j["regret"], float)
    assert [h["seed"] for h in j["held_out"]] == [r.seed + 1]
    # The best params, applied and run again, give the best figures (one deterministic run).
    again = tune(apply(tiny(tmp_path), "qa", j["params"]), "qa", budget=1, sweep=False)
    assert again.current.summary["latency_ms"] == r.best.summary["latency_ms"]


def test_same_seed_same_search(tmp_path: Path) -> None:
    a = tune(tiny(tmp_path), "qa", seed=5, budget=4, sweep=False).to_json()
    b = tune(tiny(tmp_path), "qa", seed=5, budget=4, sweep=False).to_json()
    assert a["params"] == b["params"] and a["best"] == b["best"]


def test_candidates_are_tried_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import evenserve.experiment.tune.search as tuning

    loaded = tiny(tmp_path)
    cur = params_of(loaded)
    slow = {
        **cur,
        "batching_per_model": {
            m: {**b, "max_batch_delay_ms": 12.0} for m, b in cur["batching_per_model"].items()
        },
    }
    seen: list[Any] = []
    real = tuning.evaluate

    def spy(ld: LoadedScenario, arm: str, seed: int, params: Any) -> dict[str, Any]:
        seen.append(params)
        return real(ld, arm, seed, params)

    monkeypatch.setattr(tuning, "evaluate", spy)
    r = tune(loaded, "qa", seed=5, budget=2, sweep=False, candidates=[slow])
    # Budget 2: the current arm (None: as it is), then the candidate, nothing sampled.
    assert r.evaluations == 2
    assert seen[0] is None
    assert seen[1]["batching_per_model"] == slow["batching_per_model"]


def test_a_non_expressible_arm_is_the_baseline(tmp_path: Path) -> None:
    r = tune(tiny(tmp_path), "lew", budget=3, sweep=False)
    assert r.current.params is None
    assert r.best.score.key <= r.current.score.key


def test_bad_budget_and_arm(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--budget"):
        tune(tiny(tmp_path), "qa", budget=0)
    with pytest.raises(ConfigError, match="--arm"):
        tune(tiny(tmp_path), "nope", budget=2)


def test_replay_trace_on_a_scenario(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    write_trace(trace, [Arrival(i * 0.01, "fast" if i % 3 else "slow") for i in range(250)])
    loaded = replay_trace(tiny(tmp_path), trace)
    assert loaded.scenario.duration_s == 4.0  # last arrival 2.49 s, rounded up, + 1
    r = tune(loaded, "qa", budget=2, sweep=False)
    assert r.current.summary["requests"]["arrived"] == 250


def test_replay_trace_unknown_model(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"t_s": 0.1, "model": "other"}\n')
    with pytest.raises(ConfigError, match="not in the scenario"):
        replay_trace(tiny(tmp_path), trace)


def test_class_headroom_searched_only_with_classes(tmp_path: Path) -> None:
    assert not has_classes(tiny(tmp_path))
    classed = tiny(
        tmp_path,
        workload={
            "type": "open-loop",
            "streams": [
                {"model": "fast", "rate_rps": 200, "priority": "online"},
                {"model": "fast", "rate_rps": 100, "priority": "offline"},
                {"model": "slow", "rate_rps": 20},
            ],
        },
    )
    assert has_classes(classed)
    r = tune(classed, "qa", budget=6, sweep=False)
    h = r.best.params["class_headroom"] if r.best.params else None
    assert h is None or 0.3 <= h <= 1.0
