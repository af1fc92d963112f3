"""A batch's held time (``Batch.held_s``): how long its instance sat idle while its oldest
request waited, the figure diagnosis reads to tell a batching hold from a busy device."""

from __future__ import annotations

import pytest

from evenserve.sched import scheduler_for

from .test_scheduler import Actions, req, setup


def test_a_window_holds_its_first_request_on_an_idle_device() -> None:
    act = Actions()
    spec = {"policy": "fixed-window", "max_batch_size": 4, "max_batch_delay_ms": 5}
    s = scheduler_for([setup(spec)], act)
    s.offer(req(1, 1.0), 1.0)
    s.wake(1.005, 1.005)
    (b,) = act.started
    assert b.held_s == pytest.approx(0.005)
    assert b.cap == 4


def test_a_static_batch_holds_from_its_first_arrival_until_it_fills() -> None:
    act = Actions()
    s = scheduler_for([setup({"policy": "static", "batch_size": 3})], act)
    for i, t in enumerate((2.0, 2.01, 2.03)):
        s.offer(req(i, t), t)
    (b,) = act.started
    assert b.items == 3 and b.held_s == pytest.approx(0.03)


def test_a_busy_device_holds_nothing_and_counts_from_its_last_batch_end() -> None:
    act = Actions()
    spec = {"policy": "fixed-window", "max_batch_size": 4, "max_batch_delay_ms": 0}
    s = scheduler_for([setup(spec)], act)
    s.offer(req(1, 0.0), 0.0)
    s.offer(req(2, 0.001), 0.001)  # waits behind the running batch
    first = act.started[0]
    assert first.held_s == 0.0
    s.finished(first, 0.010)
    second = act.started[1]
    # It waited 9 ms, all of it while the device was busy: nothing held.
    assert second.started_s == pytest.approx(0.010) and second.held_s == 0.0
