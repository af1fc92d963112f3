"""A model loading onto a device (``begin_load`` ... ``loaded``): its requests queue and never
run until it is loaded, wait at most ``load_wait_s``, and its weights are held throughout."""

from __future__ import annotations

import pytest

from evenserve.core.wire import LOAD_TIMEOUT, REFUSAL_REASONS, REFUSAL_STATUS
from evenserve.sched import scheduler_for

from .test_model_control import PROF_A, PROF_B, model, req
from .test_scheduler import Actions

MIB = 1024**2


def test_load_timeout_is_a_refusal_answered_503() -> None:
    assert LOAD_TIMEOUT in REFUSAL_REASONS
    assert REFUSAL_STATUS[LOAD_TIMEOUT] == 503


def test_requests_for_a_loading_model_queue_and_run_once_it_is_loaded() -> None:
    act = Actions()
    s = scheduler_for([model("b", PROF_B)], act, memory_total_bytes=1e9)
    s.begin_load(model("a", PROF_A), now=1.0)
    assert s.loading == {"a"}
    assert s.memory.weights_bytes == pytest.approx(150 * MIB)  # held from the load's start
    assert s.offer(req(1, "a", 1.0), 1.0) is None
    assert s.offer(req(2, "a", 1.1), 1.1) is None
    assert act.started == []  # never batched while loading
    assert s.queued_by_model() == {"a": 2, "b": 0}
    assert s.offer(req(3, "b", 1.2), 1.2) is None  # the other model runs meanwhile
    assert [b.model for b in act.started] == ["b"]
    s.finished(act.started[0], 1.205)
    assert len(act.started) == 1
    waited = s.loaded("a", 1.5)
    assert [r.request_id for r in waited] == [1, 2]
    assert s.loading == frozenset()
    assert [b.model for b in act.started] == ["b", "a"]
    assert [r.request_id for r in act.started[1].requests] == [1, 2]
    assert act.dropped == []


def test_a_request_waiting_past_the_bound_is_dropped_as_load_timeout() -> None:
    act = Actions()
    s = scheduler_for([], act)
    s.begin_load(model("a", PROF_A), now=0.0, load_wait_s=2.0)
    assert s.offer(req(1, "a", 0.0), 0.0) is None
    assert s.offer(req(2, "a", 1.5), 1.5) is None
    assert act.wakes == [2.0]  # the first one's bound
    s.wake(2.0, 2.0)
    assert act.dropped == [(1, LOAD_TIMEOUT)]
    assert act.wakes[-1] == 3.5  # the next one's
    waited = s.loaded("a", 3.0)  # loaded before the second one's bound
    assert [r.request_id for r in waited] == [2]
    s.wake(3.5, 3.5)  # nothing due: the request already runs
    assert act.dropped == [(1, LOAD_TIMEOUT)]
    assert [r.request_id for b in act.started for r in b.requests] == [2]


def test_loading_without_a_bound_waits_for_ever_and_asks_no_wake_up() -> None:
    act = Actions()
    s = scheduler_for([], act)
    s.begin_load(model("a", PROF_A), now=0.0)
    assert s.offer(req(1, "a", 0.0), 0.0) is None
    assert act.wakes == []
    s.loaded("a", 100.0)
    assert len(act.started) == 1


def test_loaded_needs_a_loading_model_and_a_loading_model_can_be_removed() -> None:
    s = scheduler_for([model("b", PROF_B)], Actions())
    with pytest.raises(ValueError, match="not loading"):
        s.loaded("b", 0.0)
    s.begin_load(model("a", PROF_A), now=0.0)
    s.remove_model("a", 0.5)  # an unload before the load finished: nothing was queued
    assert s.loading == frozenset()
    assert s.memory.weights_bytes == pytest.approx(50 * MIB)


def test_a_drained_device_takes_requests_again_after_end_drain() -> None:
    act = Actions()
    s = scheduler_for([], act)
    s.begin_drain(0.0)
    s.end_drain(1.0)
    s.add_model(model("a", PROF_A), now=1.0)
    assert s.offer(req(1, "a", 1.0), 1.0) is None
    assert len(act.started) == 1
