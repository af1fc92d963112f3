"""bench/routing_decisions.py replays the simulator's own router calls on a copy of the router
as it was before the run: every replayed decision is the recorded one, a decision that
differs is counted, and the recording is back in the collector's sight after a replay."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from tests.unit.bench.bench_module import BENCH, load


@pytest.fixture(autouse=True)
def nothing_frozen() -> Iterator[None]:
    """Start with nothing frozen, whatever ran before in this process (an in-process
    server's ``tune_gc`` freezes what it allocated), and leave it as it was found."""
    was_frozen = gc.get_freeze_count() > 0
    gc.unfreeze()
    yield
    if was_frozen:
        gc.freeze()


@pytest.mark.parametrize("routing", ["least-expected-work", "power-of-two"])
def test_a_replay_makes_the_recorded_decisions(
    routing: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(BENCH))  # it imports bench/sim_speed.py's scenario
    mod = load("routing_decisions")
    start, calls = mod.record(1500, 16, routing)
    chosen = [i for i, c in enumerate(calls) if c[0] == "choose"]
    assert len(chosen) > 1000 and any(c[0] == "sent" for c in calls)
    for timed in (False, True):
        seconds, wrong = mod.replay(start, calls, timed)
        assert wrong == 0 and seconds > 0.0
        assert gc.get_freeze_count() == 0
    name, a, k, _ = calls[chosen[-1]]
    changed = list(calls)
    changed[chosen[-1]] = (name, a, k, "no such backend")
    assert mod.replay(start, changed, False)[1] == 1
    assert mod.replay(None, calls, False)[1] == 0  # the loop alone decides nothing
