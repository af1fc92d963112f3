"""Traces: round trip, errors naming file, line and field, replay."""

from __future__ import annotations

from pathlib import Path

import pytest

from evenserve.core.errors import ConfigError
from evenserve.workload import Arrival, read_trace, replay, write_trace


def test_trace_roundtrip(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    write_trace(p, [Arrival(0.5, "b", 0, 100.0), Arrival(0.1, "a"), Arrival(0.25, "a", 12)])
    entries = read_trace(p, ["a", "b"])
    assert entries == [Arrival(0.1, "a"), Arrival(0.25, "a", 12), Arrival(0.5, "b", 0, 100.0)]


def test_classes_and_deadlines_are_read_as_the_wire_reads_them(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text(
        '{"t_s": 0, "model": "a", "priority": "online"}\n'
        "\n"
        '{"t_s": 1, "model": "a", "priority": "offline", "deadline_ms": 20}\n'
        '{"t_s": 2, "model": "a", "priority": "7", "deadline_ms": "12.5"}\n'
    )
    assert read_trace(p) == [
        Arrival(0.0, "a", 10),
        Arrival(1.0, "a", 0, 20.0),
        Arrival(2.0, "a", 7, 12.5),
    ]


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ('{"t_s": -1, "model": "a"}', "t_s"),
        ('{"t_s": true, "model": "a"}', "t_s"),
        ('{"t_s": 1}', "model"),
        ('{"t_s": 1, "model": "zzz"}', "not in the scenario"),
        ('{"t_s": 1, "model": "a", "priority": "vip"}', "priority: must be an integer"),
        ('{"t_s": 1, "model": "a", "priority": 1.5}', "priority"),
        ('{"t_s": 1, "model": "a", "priority": true}', "priority"),
        ('{"t_s": 1, "model": "a", "deadline_ms": 0}', "deadline_ms: must be a number"),
        ('{"t_s": 1, "model": "a", "deadline_ms": false}', "deadline_ms"),
        ("{nope", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_bad_lines_name_the_file_line_and_field(tmp_path: Path, line: str, needle: str) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"t_s": 0, "model": "a", "priority": "online"}\n' + line + "\n")
    with pytest.raises(ConfigError) as err:
        read_trace(bad, ["a"])
    assert needle in str(err.value) and f"{bad}:2:" in str(err.value)


def test_missing_trace_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="trace file not found"):
        read_trace(tmp_path / "none.jsonl")


def test_replay_scales_cuts_and_caps() -> None:
    entries = [Arrival(0.3, "b", priority=0), Arrival(0.1, "a"), Arrival(2.0, "a")]
    out = replay(entries, duration_s=5.0, max_requests=10, time_scale=2.0)
    assert [(a.t_s, a.model) for a in out] == [(0.2, "a"), (0.6, "b"), (4.0, "a")]
    assert out[1].priority == 0
    assert len(replay(entries, duration_s=1.0, max_requests=10, time_scale=2.0)) == 2
    assert len(replay(entries, duration_s=9.0, max_requests=1)) == 1
