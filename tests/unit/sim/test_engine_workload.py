from __future__ import annotations

import random
from pathlib import Path

import pytest

from evenserve.core.errors import ConfigError
from evenserve.core.scenario import Phase
from evenserve.sim.engine import EventLoop
from evenserve.sim.workload import PoissonProcess, TraceEntry, read_trace, write_trace


def test_events_run_in_time_order_with_fifo_ties() -> None:
    loop = EventLoop()
    seen: list[str] = []
    for t, tag in [(2.0, "c"), (1.0, "a"), (1.0, "b"), (3.0, "late")]:
        loop.at(t, seen.append, tag)
    loop.run(2.5)
    assert seen == ["a", "b", "c"]
    assert loop.now == 2.5
    assert len(loop) == 1


def test_poisson_rate_and_phases() -> None:
    proc = PoissonProcess(
        100.0, [Phase(start_s=10.0, end_s=20.0, multiplier=3.0)], random.Random(1)
    )
    t, before, during = 0.0, 0, 0
    while True:
        t = proc.next_after(t)
        if t >= 20.0:
            break
        if t < 10.0:
            before += 1
        else:
            during += 1
    assert 900 < before < 1100
    assert 2700 < during < 3300


def test_zero_rate_phase_pauses_arrivals() -> None:
    proc = PoissonProcess(50.0, [Phase(start_s=0.0, end_s=5.0, multiplier=0.0)], random.Random(2))
    assert proc.next_after(0.0) >= 5.0


def test_trace_roundtrip_and_errors(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    write_trace(p, [TraceEntry(0.5, "b", 0, 100.0), TraceEntry(0.1, "a")])
    entries = read_trace(p, ["a", "b"])
    assert [e.model for e in entries] == ["a", "b"]
    assert entries[1].priority == 0 and entries[1].deadline_ms == 100.0
    bad = tmp_path / "bad.jsonl"
    for line, needle in [
        ('{"t_s": -1, "model": "a"}', "t_s"),
        ('{"t_s": 1}', "model"),
        ('{"t_s": 1, "model": "zzz"}', "not in the scenario"),
        ('{"t_s": 1, "model": "a", "priority": "vip"}', "priority"),
        ("{nope", "not valid JSON"),
    ]:
        bad.write_text('{"t_s": 0, "model": "a", "priority": "online"}\n' + line + "\n")
        with pytest.raises(ConfigError) as err:
            read_trace(bad, ["a"])
        assert needle in str(err.value) and ":2:" in str(err.value)


def test_vanishing_rate_terminates() -> None:
    """A subnormal rate once looped forever (found by hypothesis): the next arrival is just far."""
    proc = PoissonProcess(5e-324, [], random.Random(0))
    assert proc.next_after(0.0) > 1e300
