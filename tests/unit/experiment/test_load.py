"""The load generator's spec for a scaled scenario: closed loop, open loop, trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evenserve.core.errors import ConfigError
from evenserve.experiment.load import scenario_arrivals, scenario_load_spec
from evenserve.sim.loader import load_scenario
from evenserve.workload import Arrival

from .scenarios import scenario, write


def test_closed_loop_spec(tmp_path: Path) -> None:
    closed = {
        "type": "closed-loop",
        "users": 5,
        "think_ms": 8,
        "mix": {"resnet50": 3, "bert-base": 1},
    }
    loaded = load_scenario(write(tmp_path, scenario(workload=closed)))
    spec = scenario_load_spec(loaded, 7, 500, 2.5)
    assert spec.mode() == "closed-loop" and spec.users == 5 and spec.think_s == 0.008
    assert spec.mix == {"resnet50": 3.0, "bert-base": 1.0}
    assert (spec.duration_s, spec.warmup_s, spec.seed) == (10.0, 2.0, 7)
    assert (spec.max_requests, spec.timeout_s, spec.scrape_interval_s) == (500, 2.5, 0.05)
    assert spec.model_priority == {"resnet50": 10, "bert-base": 0}
    spec.validate()
    with pytest.raises(ConfigError, match="closed loop"):
        scenario_arrivals(loaded, 7)


def test_open_loop_spec_sends_the_simulators_arrivals(tmp_path: Path) -> None:
    loaded = load_scenario(write(tmp_path, scenario()))
    spec = scenario_load_spec(loaded, 4, 1_000_000, 30.0)
    assert spec.mode() == "trace" and spec.trace == scenario_arrivals(loaded, 4)
    assert spec.trace is not None and len(spec.trace) > 1000
    # Deadlines: the stream's own (50), else the model's (resnet50: 30, bert-base: none).
    assert {(a.model, a.priority, a.deadline_ms) for a in spec.trace} == {
        ("resnet50", None, 30.0),
        ("bert-base", None, None),
        ("bert-base", 10, 50.0),
    }
    assert scenario_load_spec(loaded, 5, 10, 30.0).trace != spec.trace  # the seed matters


def test_trace_spec(tmp_path: Path) -> None:
    lines = [
        {"t_s": 0.3, "model": "resnet50"},
        {"t_s": 0.1, "model": "bert-base", "deadline_ms": 7},
    ]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    loaded = load_scenario(write(tmp_path, scenario(workload={"type": "trace", "path": "t.jsonl"})))
    spec = scenario_load_spec(loaded, 1, 10, 30.0)
    assert spec.trace == [
        Arrival(0.1, "bert-base", None, 7.0),
        Arrival(0.3, "resnet50", None, 30.0),
    ]
