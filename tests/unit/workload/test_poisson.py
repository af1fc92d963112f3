from __future__ import annotations

import random

from evenserve.core.scenario import Phase
from evenserve.workload import PoissonProcess


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


def test_zero_rate_for_good_never_arrives() -> None:
    proc = PoissonProcess(0.0, [], random.Random(2))
    assert proc.next_after(0.0) == float("inf")
    late = PoissonProcess(5.0, [Phase(start_s=3.0, end_s=1e9, multiplier=0.0)], random.Random(2))
    t = 0.0
    while (t := late.next_after(t)) < 3.0:
        pass
    assert t >= 1e9


def test_vanishing_rate_terminates() -> None:
    """A subnormal rate once looped forever (found by hypothesis): the next arrival is just far."""
    proc = PoissonProcess(5e-324, [], random.Random(0))
    assert proc.next_after(0.0) > 1e300
