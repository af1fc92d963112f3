"""The LLM pool simulator (sim.llm_pool): a router in front of engines of two speeds, on
virtual time; the scenario file's errors; the CLI on a pool scenario."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from evenserve.core.errors import ConfigError
from evenserve.core.llm import UNFINISHED
from evenserve.sim.llm_pool import run_pool_arm, summarize_pool_arm
from evenserve.sim.llm_pool_scenario import load_llm_pool_scenario

SCENARIO: dict[str, Any] = {
    "kind": "llm-pool",
    "name": "tiny-pool",
    "seed": 2,
    "duration_s": 30,
    "warmup_s": 3,
    "drain_s": 60,
    "signals": {"scrape_s": 1.0},
    "llm": {
        "model": "llama-3.1-8b",
        "engine": {"mode": "continuous-chunked", "max_num_batched_tokens": 512,
                   "num_blocks": 600},
        "workloads": [
            {"name": "chat", "rate_rps": 2,
             "prompt_tokens": {"dist": "lognormal", "mean": 400, "sigma": 0.8, "max": 3000},
             "output_tokens": {"dist": "uniform", "min": 10, "max": 80},
             "classes": [{"weight": 3, "priority": "online", "ttft_ms": 1000},
                         {"weight": 1, "priority": "offline", "ttft_ms": 5000}],
             "tpot_ms": 60},
            {"name": "tenants", "rate_rps": 20,
             "prompt_tokens": {"dist": "uniform", "min": 2100, "max": 2300},
             "output_tokens": {"dist": "fixed", "value": 20},
             "prefix_groups": {"groups": 6, "tokens": 2048, "share": 1.0},
             "ttft_ms": 1000, "tpot_ms": 60},
        ],
    },
    "devices": [
        {"name": "fast", "profiles": "h100-llm", "classic": ["resnet50"]},
        {"name": "slow", "profiles": "a100-llm", "classic": ["resnet50"]},
    ],
    "classic": [{"model": "resnet50", "rate_rps": 40, "slo_ms": 25, "max_batch_size": 16}],
    "arms": {
        "round-robin": {"routing": "round-robin"},
        "kv-load": {"routing": {"policy": "kv-load", "staleness_s": 2.0}},
        "prefix-approx": {"routing": {"policy": "prefix-approx", "staleness_s": 2.0}},
        "ours": {"routing": "predicted-ttft"},
        "ours-stale": {"routing": "predicted-ttft", "signals": {"stale_s": 5}},
    },
}  # fmt: skip


def write(tmp_path: Path, doc: dict[str, Any]) -> Path:
    p = tmp_path / "pool.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    sc = load_llm_pool_scenario(write(tmp_path_factory.mktemp("pool"), SCENARIO))
    return {a: (sc, run_pool_arm(sc, a)) for a in sc.doc.arms}


def test_every_request_is_answered_once_and_the_router_ends_with_nothing_in_flight(
    runs: dict[str, Any],
) -> None:
    for arm, (_, run) in runs.items():
        ids = [r.request_id for r in run.records]
        assert len(ids) == len(set(ids)), arm
        for r in run.records:
            assert r.outcome, arm
            assert r.finished_s is not None, arm
            if r.outcome == "completed":
                assert r.output_tokens > 0
        routed = sum(run.routed.values())
        assert routed + run.refused == len(run.records), arm
        for dr in run.devices.values():
            assert all(c.outcome for c in dr.classic["resnet50"]), arm


def test_only_ours_refuses_and_for_the_reason_it_names(runs: dict[str, Any]) -> None:
    for arm, (_, run) in runs.items():
        reasons = {r.outcome for r in run.records} - {"completed"}
        if arm.startswith("ours"):
            assert reasons <= {"ttft-unreachable"}, arm
        else:
            assert run.refused == 0 and not reasons, arm


def test_ours_keeps_tenants_with_their_prefix_and_beats_round_robin(
    runs: dict[str, Any],
) -> None:
    sc, rr = runs["round-robin"]
    _, ours = runs["ours"]
    f_rr, f_ours = summarize_pool_arm(sc, rr), summarize_pool_arm(sc, ours)

    def hit_rate(run: Any) -> float:
        devs = run.devices.values()
        return sum(d.prefix_hit_tokens for d in devs) / sum(d.prefix_query_tokens for d in devs)

    assert hit_rate(ours) > hit_rate(rr) + 0.1
    assert (f_ours.llm.goodput_rps or 0) > (f_rr.llm.goodput_rps or 0)
    assert f_ours.by_workload["tenants"].ttft_s.p90 < f_rr.by_workload["tenants"].ttft_s.p90
    # the fast device takes more of the work
    assert ours.routed["fast"] > ours.routed["slow"]


def test_what_the_drain_leaves_unanswered_is_unfinished_not_completed(tmp_path: Path) -> None:
    doc = {**SCENARIO, "duration_s": 10, "warmup_s": 1, "drain_s": 0}
    sc = load_llm_pool_scenario(write(tmp_path, doc))
    run = run_pool_arm(sc, "round-robin")
    open_ = [r for r in run.records if r.outcome == UNFINISHED]
    assert open_, "the scenario should leave requests open at the end of arrivals"
    assert all(r.finished_s is None and not r.met_targets() for r in open_)
    assert all(r.finished_s is not None for r in run.records if r.outcome != UNFINISHED)
    f = summarize_pool_arm(sc, run)
    assert f.llm.refused.get(UNFINISHED, 0) == sum(
        1 for r in open_ if doc["warmup_s"] <= r.scheduled_s < doc["duration_s"]
    )
    assert f.llm.completed == sum(
        1
        for r in run.records
        if r.outcome == "completed" and doc["warmup_s"] <= r.scheduled_s < doc["duration_s"]
    )


def test_an_arrival_jitter_delays_offers_only_and_is_seeded(tmp_path: Path) -> None:
    doc = {**SCENARIO, "duration_s": 10, "warmup_s": 1}
    sc = load_llm_pool_scenario(write(tmp_path, doc))

    def key(run: Any) -> list[tuple[Any, ...]]:
        return [(r.request_id, r.scheduled_s, r.outcome, r.token_times_s) for r in run.records]

    plain = run_pool_arm(sc, "ours")
    assert key(run_pool_arm(sc, "ours", arrival_jitter_s=0.0, jitter_seed=7)) == key(plain)
    a = run_pool_arm(sc, "ours", arrival_jitter_s=0.002, jitter_seed=1)
    assert key(run_pool_arm(sc, "ours", arrival_jitter_s=0.002, jitter_seed=1)) == key(a)
    assert key(run_pool_arm(sc, "ours", arrival_jitter_s=0.002, jitter_seed=2)) != key(a)
    # the same requests, each still due when it was (TTFT counts from there), each first
    # token at least as late as the offer could be
    assert sorted(r.scheduled_s for r in a.records) == sorted(r.scheduled_s for r in plain.records)
    assert all(r.token_times_s[0] > r.scheduled_s for r in a.records if r.token_times_s)
    with pytest.raises(ValueError, match="arrival_jitter_s"):
        run_pool_arm(sc, "ours", arrival_jitter_s=-1.0)


def test_a_run_is_a_pure_function_of_scenario_and_seed(tmp_path: Path) -> None:
    doc = {**SCENARIO, "duration_s": 10, "warmup_s": 1}
    sc = load_llm_pool_scenario(write(tmp_path, doc))
    a, b = run_pool_arm(sc, "ours"), run_pool_arm(sc, "ours")
    assert [(r.request_id, r.outcome, r.token_times_s) for r in a.records] == [
        (r.request_id, r.outcome, r.token_times_s) for r in b.records
    ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"arms": {"x": {"routing": "fastest"}}}, "arms.x.routing"),
        ({"arms": {"x": {"routing": {"policy": "kv-load", "weight": 1}}}}, "weight"),
        ({"devices": [{"name": "a", "profiles": "h100-llm", "classic": ["bert"]}]},
         "devices.0.classic"),
        ({"devices": [{"name": "a", "profiles": "h100-llm"},
                      {"name": "a", "profiles": "a100-llm"}]}, "share a name"),
        ({"signals": {"scrape_s": 0}}, "signals.scrape_s"),
        ({"arms": {"x": {"rate_scale": 0}}}, "rate_scale"),
    ],
)  # fmt: skip
def test_scenario_errors_name_the_field(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_llm_pool_scenario(write(tmp_path, {**SCENARIO, **change}))


def test_a_workload_without_a_name_or_with_a_duplicate_one(tmp_path: Path) -> None:
    wl = SCENARIO["llm"]["workloads"]
    doc = {**SCENARIO, "llm": {**SCENARIO["llm"], "workloads": [wl[0], wl[0]]}}
    with pytest.raises(ConfigError, match="two workloads share a name"):
        load_llm_pool_scenario(write(tmp_path, doc))


def test_cli_simulates_a_pool_scenario_with_json(tmp_path: Path) -> None:
    from evenserve.cli.main import app

    doc = {**SCENARIO, "duration_s": 8, "warmup_s": 1}
    path = write(tmp_path, doc)
    res = CliRunner().invoke(app, ["simulate", str(path), "--arm", "ours", "--json", "-"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert set(out["arms"]) == {"ours"}
    assert out["arms"]["ours"]["routing"] == "predicted-ttft"
    assert set(out["arms"]["ours"]["by_workload"]) == {"chat", "tenants"}
    bad = CliRunner().invoke(app, ["simulate", str(path), "--arm", "nope"])
    assert bad.exit_code != 0 and "unknown arm 'nope'" in bad.output
