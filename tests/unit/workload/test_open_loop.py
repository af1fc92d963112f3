"""Open-loop streams: names and seeds as the simulator's, the merged list, caps, mixes."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from evenserve.core.errors import ConfigError
from evenserve.core.scenario import OpenLoop, Phase
from evenserve.workload import (
    Arrival,
    OpenStream,
    iter_arrivals,
    mix_streams,
    open_loop_arrivals,
    open_loop_streams,
    with_default_deadlines,
)

from .reference import open_loop_reference

PHASED: dict[str, Any] = {
    "type": "open-loop",
    "rates_rps": {"slow": 30, "fast": 300},
    "phases": [{"start_s": 5, "end_s": 10, "multiplier": 3.0}],
    "streams": [
        {
            "model": "fast",
            "rate_rps": 50,
            "priority": "offline",
            "deadline_ms": 40,
            "phases": [{"start_s": 2, "end_s": 4, "multiplier": 0.0}],
        },
        {"model": "slow", "rate_rps": 0},
        {"model": "slow", "rate_rps": 10, "priority": 5},
    ],
}
STREAMS_ONLY: dict[str, Any] = {
    "type": "open-loop",
    "streams": [
        {
            "model": "a",
            "rate_rps": 80,
            "deadline_ms": 25,
            "phases": [{"start_s": 1, "end_s": 2, "multiplier": 2.0}],
        },
        {"model": "b", "rate_rps": 40, "priority": "online"},
    ],
}
RATES_ONLY: dict[str, Any] = {"type": "open-loop", "rates_rps": {"x": 120, "idle": 0, "a": 7}}


@pytest.mark.parametrize("raw", [PHASED, STREAMS_ONLY, RATES_ONLY])
@pytest.mark.parametrize("seed", [0, 3, 1234])
def test_same_arrivals_as_before_the_module(raw: dict[str, Any], seed: int) -> None:
    wl = OpenLoop.model_validate(raw)
    got = open_loop_arrivals(wl, seed, 12.0)
    want = open_loop_reference(wl, seed, 12.0)
    assert len(got) > 50
    assert [(a.t_s, a.model, a.priority, a.deadline_ms) for a in got] == want


def test_stream_names_keep_their_index_when_a_rate_is_zero() -> None:
    streams = open_loop_streams(OpenLoop.model_validate(PHASED))
    assert [s.name for s in streams] == ["fast", "slow", "fast:2", "slow:4"]
    assert streams[2].priority == 0 and streams[2].deadline_ms == 40.0
    assert streams[2].phases == (Phase(start_s=2, end_s=4, multiplier=0.0),)
    assert streams[3].priority == 5 and streams[3].deadline_ms is None
    # A stream without phases of its own takes the workload's.
    assert streams[0].phases == streams[3].phases == (Phase(start_s=5, end_s=10, multiplier=3),)
    assert [s.name for s in open_loop_streams(OpenLoop.model_validate(RATES_ONLY))] == ["a", "x"]


def test_a_stream_pulled_one_arrival_at_a_time_is_the_merged_list() -> None:
    wl = OpenLoop.model_validate(PHASED)
    streams = open_loop_streams(wl)
    merged = open_loop_arrivals(streams, 9, 20.0)
    for s in streams:
        proc = s.process(9)
        times, t = [], proc.next_after(0.0)
        while t < 20.0:
            times.append(t)
            t = proc.next_after(t)
        mine = [a.t_s for a in merged if (a.model, a.priority) == (s.model, s.priority)]
        assert mine == times
    assert [a.t_s for a in merged] == sorted(a.t_s for a in merged)


def test_the_cap_keeps_the_earliest_and_nothing_is_made_ahead() -> None:
    wl = OpenLoop.model_validate(PHASED)
    full = open_loop_arrivals(wl, 1, 20.0)
    assert open_loop_arrivals(wl, 1, 20.0, max_requests=17) == full[:17]
    # Lazy: a run of a million years yields its first arrivals at once.
    first = list(itertools.islice(iter_arrivals(open_loop_streams(wl), 1, 3.15e13), 5))
    assert first == full[:5]


def test_mix_streams_are_a_scenarios_rates() -> None:
    streams = mix_streams(200.0, {"b": 1.0, "a": 3.0, "never": 0.0})
    assert streams == [OpenStream("a", "a", 150.0), OpenStream("b", "b", 50.0)]
    rates = OpenLoop(type="open-loop", rates_rps={"a": 150.0, "b": 50.0})
    assert open_loop_arrivals(streams, 5, 30.0) == open_loop_arrivals(rates, 5, 30.0)
    arrivals = open_loop_arrivals(streams, 5, 30.0)
    assert len(arrivals) / 30.0 == pytest.approx(200.0, rel=0.05)
    assert sum(a.model == "a" for a in arrivals) / len(arrivals) == pytest.approx(0.75, abs=0.03)
    for rate in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ConfigError, match="rate_rps"):
            mix_streams(rate, {"a": 1.0})
    with pytest.raises(ConfigError, match="mix: weights must not all be zero"):
        mix_streams(10.0, {"a": 0.0})
    with pytest.raises(ConfigError, match=r"mix\.a: weight"):
        mix_streams(10.0, {"a": -1.0})


def test_default_deadlines_fill_only_what_is_missing() -> None:
    arrivals = [Arrival(0.1, "a"), Arrival(0.2, "a", 0, 5.0), Arrival(0.3, "b")]
    out = with_default_deadlines(arrivals, {"a": 100.0, "b": None})
    assert out == [Arrival(0.1, "a", None, 100.0), Arrival(0.2, "a", 0, 5.0), Arrival(0.3, "b")]
