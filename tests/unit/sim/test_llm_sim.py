"""The LLM simulator (sim.llm): one device's scheduler with an engine next to classic models,
on virtual time; the scenario file's errors; the CLI on an LLM scenario."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from evenserve.core.errors import ConfigError
from evenserve.sim.llm import run_arm, summarize_arm
from evenserve.sim.llm_scenario import load_llm_scenario

SCENARIO = {
    "kind": "llm",
    "name": "tiny-mix",
    "seed": 3,
    "duration_s": 20,
    "warmup_s": 2,
    "device": {"profiles": "h100-llm"},
    "llm": {
        "model": "llama-3.1-8b",
        "engine": {"max_num_seqs": 64},
        "workloads": [
            {"rate_rps": 4, "prompt_tokens": {"dist": "fixed", "value": 300},
             "output_tokens": {"dist": "uniform", "min": 20, "max": 200},
             "prefix_groups": {"groups": 2, "tokens": 256, "share": 1.0},
             "ttft_ms": 1000, "tpot_ms": 30},
        ],
    },
    "classic": [{"model": "resnet50", "rate_rps": 100, "slo_ms": 30}],
    "arms": {
        "request-level": {"engine": {"mode": "request-level"}, "classic": False},
        "continuous": {"engine": {"mode": "continuous"}, "classic": False},
        "colocated": {"engine": {"mode": "continuous-chunked", "max_num_batched_tokens": 256}},
        "classic-solo": {"llm": False},
    },
}  # fmt: skip


def write(tmp_path: Path, doc: dict) -> Path:
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def test_every_request_answered_and_continuous_beats_request_level(tmp_path: Path) -> None:
    sc = load_llm_scenario(write(tmp_path, SCENARIO))
    figs = {a: summarize_arm(sc, run_arm(sc, a)) for a in sc.doc.arms}
    for a in ("request-level", "continuous", "colocated"):
        llm = figs[a].llm
        assert llm is not None and llm.requests > 40
        assert llm.completed == llm.requests  # nothing lost: each answered once
    cont, static = figs["continuous"].llm, figs["request-level"].llm
    assert cont is not None and static is not None
    assert cont.ttft_s.p50 is not None and static.ttft_s.p50 is not None
    assert cont.ttft_s.p50 < static.ttft_s.p50  # nothing waits for a whole batch to end
    assert cont.goodput_rps is not None and static.goodput_rps is not None
    assert cont.goodput_rps > static.goodput_rps
    # The shared prefixes hit the prefix cache.
    assert cont.extra["prefix_cache_hit_rate"] > 0.5
    co = figs["colocated"].classic["resnet50"]
    solo = figs["classic-solo"].classic["resnet50"]
    assert co["requests"] == solo["requests"] and co["completed"] == co["requests"]
    assert figs["colocated"].device["batches"] > 0 and figs["colocated"].device["steps"] > 0


def test_runs_are_a_function_of_the_seed(tmp_path: Path) -> None:
    sc = load_llm_scenario(write(tmp_path, SCENARIO))
    a = summarize_arm(sc, run_arm(sc, "colocated")).to_dict()
    b = summarize_arm(sc, run_arm(sc, "colocated")).to_dict()
    assert a == b


def test_scenario_errors_name_the_field(tmp_path: Path) -> None:
    bad = {**SCENARIO, "warmup_s": 30}
    with pytest.raises(ConfigError, match="warmup_s"):
        load_llm_scenario(write(tmp_path, bad))
    bad = {**SCENARIO, "llm": {**SCENARIO["llm"], "workloads": [{"rate_rps": 1}]}}
    with pytest.raises(ConfigError, match=r"llm\.workloads\.0.*prompt_tokens"):
        load_llm_scenario(write(tmp_path, bad))
    bad = {**SCENARIO, "arms": {"x": {"engine": {"mode": "fast"}}}}
    with pytest.raises(ConfigError, match=r"arms\.x\.engine\.mode"):
        load_llm_scenario(write(tmp_path, bad))


def test_cli_simulate_prints_every_arm_and_writes_json(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from evenserve.cli.main import app

    doc = {**SCENARIO, "duration_s": 6, "warmup_s": 1}
    path = write(tmp_path, doc)
    out = tmp_path / "o.json"
    res = CliRunner().invoke(app, ["simulate", str(path), "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "LLM generation" in res.output and "goodput" in res.output
    import json

    data = json.loads(out.read_text())
    assert set(data["arms"]) == set(doc["arms"])
    res = CliRunner().invoke(app, ["simulate", str(path), "--arm", "nope"])
    assert res.exit_code == 2 and "unknown arm" in res.output
