from __future__ import annotations

import pytest

from evenserve.core.clock import FakeClock, RealClock


def test_fake_clock_moves_only_when_told() -> None:
    c = FakeClock(5.0)
    assert c.now() == 5.0
    c.advance(0.25)
    assert c.now() == 5.25
    c.set(7.0)
    assert c.now() == 7.0
    with pytest.raises(ValueError):
        c.advance(-1)
    with pytest.raises(ValueError):
        c.set(6.0)


def test_real_clock_is_monotonic() -> None:
    c = RealClock()
    a = c.now()
    b = c.now()
    assert b >= a
