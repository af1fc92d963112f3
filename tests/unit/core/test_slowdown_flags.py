"""``core.slowdown``: a slowdown over time, and the worker's ``--slowdown-phases`` text."""

from __future__ import annotations

import pytest

from evenserve.core.errors import ConfigError
from evenserve.core.slowdown import SlowdownSchedule, parse_slowdown_phases, phases_flag


def test_phases_multiply_the_base_inside_them_only() -> None:
    s = SlowdownSchedule(1.5, parse_slowdown_phases("20:40:2, 50:55:0.5"))
    assert [s.at(t) for t in (0, 19.99, 20, 39.99, 40, 52, 55)] == [1.5, 1.5, 3, 3, 1.5, 0.75, 1.5]
    assert SlowdownSchedule().constant and not s.constant


def test_the_flag_text_reads_back() -> None:
    phases = ((0.5, 1.25, 2.0), (3.0, 4.0, 0.5))
    assert parse_slowdown_phases(phases_flag(phases)) == phases


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("20:40", "phase 1 ('20:40'): expected START_S:END_S:MULT"),
        ("1:2:x", "expected START_S:END_S:MULT"),
        ("-1:2:2", "START_S must be >= 0"),
        ("5:5:2", "END_S must be greater than START_S"),
        ("1:2:0", "MULT must be > 0"),
        ("1:5:2,4:6:2", "phases overlap"),
        ("1:inf:2", "finite"),
    ],
)
def test_bad_phases_are_named(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match="--slowdown-phases: ") as exc:
        parse_slowdown_phases(text)
    assert message in str(exc.value)
