from __future__ import annotations

from evenserve.sim.engine import EventLoop


def test_events_run_in_time_order_with_fifo_ties() -> None:
    loop = EventLoop()
    seen: list[str] = []
    for t, tag in [(2.0, "c"), (1.0, "a"), (1.0, "b"), (3.0, "late")]:
        loop.at(t, seen.append, tag)
    loop.run(2.5)
    assert seen == ["a", "b", "c"]
    assert loop.now == 2.5
    assert len(loop) == 1
