"""LLMs in the pools, simulated (``sim.llm_placement``): virtual time, deterministic, small."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from evenserve.core.errors import ConfigError
from evenserve.sched import scheduler_for
from evenserve.sched.engine import EngineSetup, GenSpec
from evenserve.sim.llm import LlmSimRequest
from evenserve.sim.llm_placement import (
    engine_utilization,
    run_placement_arm,
    summarize_placement,
)
from evenserve.sim.llm_placement_scenario import load_llm_placement_scenario

GIB = 1024.0**3
LLM = "llama-3.1-8b"


def doc(**over: Any) -> dict[str, Any]:
    """A small day and night: the LLM at 2 req/s, idle from 40 to 150 s (it goes to sleep,
    60 s after its last request), back at 150 s; BERT all along; a 2-device pool."""
    d: dict[str, Any] = {
        "kind": "llm-placement",
        "name": "tiny",
        "seed": 3,
        "duration_s": 200,
        "warmup_s": 5,
        "drain_s": 60,
        "profiles": "h100-llm",
        "llm": {
            "model": LLM,
            "kv_tokens": 32768,
            "cold_load_ms": 20000,
            "warm_load_ms": 1500,
            "capacity": {"prompt_tokens": 300, "output_tokens": 40},
            "engine": {
                "max_num_seqs": 32,
                "mode": "continuous-chunked",
                "max_num_batched_tokens": 2048,
            },
            "workloads": [
                {
                    "rate_rps": 2,
                    "phases": [{"start_s": 40, "end_s": 150, "multiplier": 0}],
                    "prompt_tokens": {"dist": "fixed", "value": 300},
                    "output_tokens": {"dist": "fixed", "value": 40},
                    "ttft_ms": 1000,
                    "tpot_ms": 50,
                }
            ],
        },
        "classic": [{"model": "bert-base", "rate_rps": 50, "slo_ms": 50}],
        "arms": {
            "static": {
                "devices": [{"name": "s0", "models": [LLM, "bert-base"]}],
            },
            "pool": {
                "placement": {"policy": "cost-aware", "hold_s": 30, "idle_unload_s": 60},
                "autoscaling": {"policy": "demand", "quiet_s": 10},
                "min_switch_s": 30,
                "host_memory_gib": 64,
                "devices": [
                    {"name": "g0", "models": [LLM, "bert-base"]},
                    {"name": "g1", "active": False},
                ],
            },
        },
    }
    d.update(over)
    return d


def write(tmp_path: Path, d: dict[str, Any]) -> Path:
    p = tmp_path / "sc.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


def test_a_sleeping_engine_wakes_behind_the_morning_burst_within_wake_plus_one_step(
    tmp_path: Path,
) -> None:
    sc = load_llm_placement_scenario(write(tmp_path, doc()))
    run = run_placement_arm(sc, "pool")
    s = summarize_placement(sc, run)
    # It went to sleep at night (an unload of the LLM) and a miss woke it: warm, 1.5 s.
    assert any(m == LLM and k == "unload" for _, m, _, k in run.counts.switch_log)
    [b] = s["bursts"]
    assert b["warm"] and b["load_s"] == pytest.approx(1.5)
    assert 150.0 <= b["at_s"] < 152.0
    # The first request waited the wake and one step: its first token came from the first
    # step after the wake; every later request met 1 s.
    assert b["first_step_after_load_s"] == 0.0
    assert b["first_ttft_s"] <= b["bound_s"] + 1e-9
    assert b["first_ttft_s"] <= b["load_s"] + b["one_step_s"]
    assert b["first_ttft_s"] >= 1.5
    assert b["recovered_s"] <= b["load_s"] + b["one_step_s"]
    assert b["after_ttft_met"] == 1.0
    # No (model, device) changed twice within 30 s.
    assert s["switches_within_30s"] == 0
    assert s["shortest_switch_gap_s"] is None or s["shortest_switch_gap_s"] >= 30.0
    # Deterministic: the same run twice gives the same figures.
    again = summarize_placement(sc, run_placement_arm(sc, "pool"))
    assert again == s


def test_with_no_host_memory_the_engine_loads_from_disk(tmp_path: Path) -> None:
    d = doc()
    d["arms"]["pool"]["host_memory_gib"] = 0
    sc = load_llm_placement_scenario(write(tmp_path, d))
    s = summarize_placement(sc, run_placement_arm(sc, "pool"))
    [b] = s["bursts"]
    assert not b["warm"] and b["load_s"] == pytest.approx(20.0)
    assert b["first_ttft_s"] >= 20.0
    assert b["first_ttft_s"] <= b["bound_s"]
    assert s["cold_loads"] >= 1


def test_device_seconds_count_what_was_on(tmp_path: Path) -> None:
    sc = load_llm_placement_scenario(write(tmp_path, doc()))
    st = summarize_placement(sc, run_placement_arm(sc, "static"))
    assert st["device_seconds"] == pytest.approx(200.0)
    assert st["loads"] == 0 and st["bursts"] == []
    pool = run_placement_arm(sc, "pool")
    expect = 0.0
    for spans in pool.on.values():
        for a, b in spans:
            assert a is not None
            expect += min(200.0, 200.0 if b is None else b) - a
    assert pool.device_seconds() == pytest.approx(expect)
    assert 200.0 <= expect <= 400.0  # g0 stays on (min_devices 1), g1 may come and go


def test_an_engine_in_a_pool_holds_its_weights_and_kv_blocks(tmp_path: Path) -> None:
    from evenserve.sim.llm_placement import _Pool

    sc = load_llm_placement_scenario(write(tmp_path, doc()))
    pool = _Pool(sc, "pool", 1)
    info = pool.infos[LLM]
    assert info.kv_bytes == 32768 * 128 * 1024  # 32768 tokens of 128 KiB: 4 GiB
    host = pool.devs["g0"].sched.engines[LLM]
    assert host.engine.kv.num_blocks == 32768 // 16
    bert = pool.infos["bert-base"].weights_bytes
    used = pool.devs["g0"].sched.memory.weights_bytes
    assert used == pytest.approx(info.device_bytes + bert)


def test_scenario_errors_name_the_field(tmp_path: Path) -> None:
    d = doc()
    d["llm"]["kv_tokens"] = 4096
    with pytest.raises(ConfigError, match="llm: kv_tokens: 4096 is fewer than one sequence"):
        run_placement_arm(load_llm_placement_scenario(write(tmp_path, d)), "pool")
    d = doc()
    d["arms"]["pool"]["devices"][0]["models"] = ["gpt-9"]
    with pytest.raises(ConfigError, match=r"arms\.pool\.devices\.0\.models: unknown model"):
        load_llm_placement_scenario(write(tmp_path, d))
    d = doc()
    d["llm"]["warm_load_ms"] = 30000
    with pytest.raises(ConfigError, match="warm_load_ms"):
        load_llm_placement_scenario(write(tmp_path, d))
    sc = load_llm_placement_scenario(write(tmp_path, doc()))
    with pytest.raises(ConfigError, match="no arm 'nope'"):
        run_placement_arm(sc, "nope")


def test_an_engines_load_is_its_step_time_over_the_tpot_target_not_its_busy_time() -> None:
    # Steps back to back of 10 ms against a 50 ms target: 20 % loaded, not 100 %.
    assert engine_utilization(0.0, 1.0, 100, 0.05, 0.0) == pytest.approx(0.2)
    # KV use counts when higher; classic batches take their share first.
    assert engine_utilization(0.0, 1.0, 100, 0.05, 0.6) == pytest.approx(0.6)
    assert engine_utilization(0.5, 1.0, 100, 0.05, 0.0) == pytest.approx(0.6)
    assert engine_utilization(0.3, 0.0, 0, 0.05, 0.0) == pytest.approx(0.3)
    assert engine_utilization(0.9, 10.0, 10, 0.05, 0.0) == 1.0


def test_remove_engine_frees_its_memory_and_refuses_while_it_has_work() -> None:
    from evenserve.core.llm import load_step_profiles
    from evenserve.core.profile import bundled_profile_set

    pdir = bundled_profile_set("h100-llm")
    assert pdir is not None
    prof = load_step_profiles(pdir)[LLM]

    class Acts:
        def start_batch(self, batch: object) -> None: ...
        def drop(self, request: object, reason: str) -> None: ...
        def wake_at(self, t_s: float) -> None: ...
        def end_at(self, t_s: float, token: int) -> None: ...

    s = scheduler_for([], Acts(), memory_total_bytes=prof.device_memory_bytes)
    s.add_engine(LLM, EngineSetup(prof), 0.0, 1024)
    assert s.memory.weights_bytes == pytest.approx(prof.weights_bytes + 1024 * prof.block_bytes)
    r = LlmSimRequest(1, LLM, 0.0)
    assert s.offer_generation(r, GenSpec(list(range(100)), 4, True), 0.0) is None
    with pytest.raises(ValueError, match="an engine leaves only when it has none"):
        s.remove_engine(LLM, 0.0)
    s.engines[LLM].engine.cancel(r)
    s.engines[LLM].in_flight = False
    s.remove_engine(LLM, 0.0)
    assert s.memory.weights_bytes == 0.0 and LLM not in s.engines
    with pytest.raises(ValueError, match="has no engine here"):
        s.remove_engine(LLM, 0.0)


def test_evenserve_simulate_runs_an_llm_placement_scenario(tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from evenserve.cli.main import app

    d = doc(duration_s=60)
    p = write(tmp_path, d)
    out = tmp_path / "out.json"
    res = CliRunner().invoke(app, ["simulate", str(p), "--arm", "static", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "LLMs in the pools" in res.output
    data = json.loads(out.read_text())
    assert list(data["arms"]) == ["static"] and data["arms"]["static"]["device_seconds"] == 60
    res = CliRunner().invoke(app, ["simulate", str(p), "--arm", "nope"])
    assert res.exit_code != 0 and "unknown arm 'nope'" in res.output
    res = CliRunner().invoke(app, ["compare", str(p), "--set", "seed=2"])
    assert res.exit_code != 0 and "kind: llm-placement" in res.output
