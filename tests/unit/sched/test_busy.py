"""The busy clock: its windowed fraction is exact whenever its old marks were let go."""

from __future__ import annotations

import random

import pytest

from evenserve.sched.busy import _LET_GO, BusyClock


def _reference(marks: list[tuple[float, float, int]], now: float, window: float) -> float:
    """The fraction from every mark ever made (none let go), by the clock's own formula."""
    lo = max(now - window, 0.0)
    span = now - lo
    t_last, acc_last, run_last = marks[-1]
    total = acc_last + run_last * (now - t_last)
    h = 0
    while h < len(marks) - 1 and marks[h + 1][0] <= lo:
        h += 1
    t0, acc0, running0 = marks[h]
    at_lo = acc0 + running0 * (lo - t0) if lo > t0 else acc0
    busy = (total - at_lo) / span
    return 0.0 if busy < 0.0 else (1.0 if busy > 1.0 else busy)


@pytest.mark.parametrize("seed", range(6))
def test_fraction_matches_every_mark_kept_and_old_marks_go(seed: int) -> None:
    rng = random.Random(seed)
    window = rng.choice([0.01, 0.1, 1.0])
    clock = BusyClock(instances=1, window_s=window)
    marks = [(0.0, 0.0, 0)]
    now = acc = 0.0
    running = 0
    most_in_window = 0
    for _ in range(6000):
        # About 400 changes a window, and now and then an idle gap of up to two windows.
        idle = rng.random() < 0.002
        now += rng.uniform(0.0, 2 * window) if idle else rng.expovariate(400 / window)
        if running == 0 or (running == 1 and rng.random() < 0.5):
            delta = 1 if running == 0 else -1
        else:
            delta = -1
        acc += running * (now - marks[-1][0])
        running += delta
        if delta > 0:
            clock.start(now)
        else:
            clock.stop(now)
        marks.append((now, acc, running))
        in_window = sum(1 for m in marks if m[0] > now - window)
        most_in_window = max(most_in_window, in_window)
        # Marks kept: those in the window, the one it starts in, at most _LET_GO more.
        assert len(clock._t) - clock._head <= in_window + 2 + _LET_GO
        if rng.random() < 0.05:
            assert clock.fraction(now) == _reference(marks, now, window)
    assert clock.fraction(now + window / 3) == _reference(marks, now + window / 3, window)
    assert most_in_window > 4 * _LET_GO
    assert len(clock._t) < len(marks) / 2  # old marks were let go (and the arrays compacted)
