"""The batcher driver on a FakeClock: policies honoured, deadlines, limits, drain, cancel."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import pytest

from evenserve.policy.batching import BATCHING
from evenserve.sched import ModelSetup
from evenserve.worker.refusals import DrainingError, RefusedError, UnknownModelError
from evenserve.worker.timer import TimerHandle

from .fakes import make_driver, profile

FAST = profile("a", {1: 10.0, 4: 16.0, 8: 20.0})


async def test_fixed_window_waits_for_the_delay_then_dispatches() -> None:
    h = make_driver(
        {"a": {"policy": "fixed-window", "max_batch_size": 4, "max_batch_delay_ms": 5}}, {"a": FAST}
    )
    r1 = h.driver.submit("a", "x1")
    h.timer.advance_to(0.002)
    h.driver.submit("a", "x2")
    assert h.rec.started == []
    h.timer.advance_to(0.0049)
    assert h.rec.started == []
    h.timer.advance_to(0.005)
    assert h.rec.started == [(0.005, "a", 2)]
    assert not r1.future.done()  # type: ignore[union-attr]
    h.timer.run_until_idle()
    assert r1.future.result() == "x1"  # type: ignore[union-attr]
    # The batch of 2 took the profile's latency for 2 (interpolated: 12 ms).
    assert h.rec.finished == [(pytest.approx(0.005 + 0.012), "a", 2)]


async def test_full_batch_goes_at_once_and_the_next_waits_for_the_device() -> None:
    h = make_driver(
        {"a": {"policy": "fixed-window", "max_batch_size": 4, "max_batch_delay_ms": 50}},
        {"a": FAST},
    )
    for i in range(6):
        h.driver.submit("a", i)
    assert h.rec.started == [(0.0, "a", 4)]
    assert h.driver.sched.queued_by_model() == {"a": 2}
    assert h.driver.sched.in_flight_by_model() == {"a": 4}
    h.timer.run_until_idle()
    # The remaining 2 wait for the device (16 ms), then for their window (50 ms from arrival).
    assert [s[2] for s in h.rec.started] == [4, 2]
    assert h.rec.started[1][0] == pytest.approx(0.05)


async def test_static_waits_forever_but_drain_flushes() -> None:
    h = make_driver({"a": {"policy": "static", "batch_size": 4}}, {"a": FAST})
    reqs = [h.driver.submit("a", i) for i in range(3)]
    h.timer.run_until_idle()
    assert h.rec.started == []
    h.driver.begin_drain()
    with pytest.raises(DrainingError):
        h.driver.submit("a", 99)
    assert h.rec.started == [(0.0, "a", 3)]
    h.timer.run_until_idle()
    assert [r.future.result() for r in reqs] == [0, 1, 2]  # type: ignore[union-attr]
    assert h.driver.idle


async def test_drain_waits_for_queued_work() -> None:
    h = make_driver({"a": {"policy": "static", "batch_size": 8}}, {"a": FAST})
    reqs = [h.driver.submit("a", i) for i in range(3)]
    task = asyncio.ensure_future(h.driver.drain(timeout_s=10))
    await asyncio.sleep(0)
    assert not task.done()
    h.timer.run_until_idle()
    await asyncio.wait_for(task, 1)
    assert all(r.future.done() for r in reqs)  # type: ignore[union-attr]


async def test_deadline_expires_while_the_device_is_busy() -> None:
    h = make_driver({"a": {"policy": "none"}}, {"a": FAST})
    first = h.driver.submit("a", "first")  # runs 0 .. 10 ms
    urgent = h.driver.submit("a", "urgent", priority=20)  # runs 10 .. 20 ms
    # Deadline 25 ms: feasible at arrival (alone after `first`: ends at 20 ms), but once
    # `urgent` takes the device at 10 ms it could start at 20 ms at best and end at 30 ms.
    late = h.driver.submit("a", "late", deadline_in_s=0.025)
    ok = h.driver.submit("a", "ok", deadline_in_s=1.0)
    h.timer.advance_to(0.0149)
    assert not late.future.done()  # type: ignore[union-attr]
    # Answered when it can no longer finish in time (deadline - one batch of one = 15 ms),
    # while the device is still busy, not when it next looks.
    h.timer.advance_to(0.0151)
    assert late.future.done()  # type: ignore[union-attr]
    with pytest.raises(RefusedError, match=r"^deadline-expired: "):
        late.future.result()  # type: ignore[union-attr]
    assert h.rec.dropped == [("a", "deadline-expired")]
    assert h.driver.sched.queued_by_model() == {"a": 1}
    h.timer.run_until_idle()
    assert first.future.result() == "first"  # type: ignore[union-attr]
    assert urgent.future.result() == "urgent"  # type: ignore[union-attr]
    assert ok.future.result() == "ok"  # type: ignore[union-attr]
    assert [s[2] for s in h.rec.started] == [1, 1, 1]
    assert h.driver.idle and h.driver.sched.waiting == 0


async def test_infeasible_deadline_is_refused_at_once() -> None:
    h = make_driver({"a": {"policy": "none"}}, {"a": FAST})
    h.driver.submit("a", "first")  # the device is busy until 10 ms
    with pytest.raises(RefusedError, match=r"^deadline-infeasible: .* 15.0 ms away, .* 20.0 ms"):
        h.driver.submit("a", "late", deadline_in_s=0.015)  # alone after it: ends at 20 ms
    assert h.rec.dropped == [("a", "deadline-infeasible")]
    assert h.driver.sched.queued_by_model() == {"a": 0}
    h.driver.submit("a", "fits", deadline_in_s=0.020)
    h.timer.run_until_idle()
    assert [s[2] for s in h.rec.started] == [1, 1]


async def test_default_deadline_from_model_config() -> None:
    h = make_driver(
        {"a": {"policy": "static", "batch_size": 4}}, {"a": FAST}, deadlines_s={"a": 0.1}
    )
    r = h.driver.submit("a", "x")
    h.timer.run_until_idle()
    exc = r.future.exception()  # type: ignore[union-attr]
    assert isinstance(exc, RefusedError) and exc.reason == "deadline-expired"
    # Answered as soon as it could no longer finish: deadline 100 ms - a batch of one (10 ms).
    assert h.clock.now() == pytest.approx(0.09)
    assert h.driver.idle


async def test_queue_bound_refuses_with_a_retry_estimate() -> None:
    h = make_driver({"a": {"policy": "static", "batch_size": 4}}, {"a": FAST}, max_queue=3)
    for i in range(3):
        h.driver.submit("a", i)
    with pytest.raises(RefusedError, match=r"^queue-full: ") as err:
        h.driver.submit("a", 3)
    assert err.value.reason == "queue-full"
    assert err.value.retry_after_s is not None and err.value.retry_after_s > 0
    with pytest.raises(UnknownModelError):
        h.driver.submit("nope", 0)


async def test_priority_between_models_on_one_device() -> None:
    profiles = {"hi": profile("hi", {1: 10.0}), "lo": profile("lo", {1: 10.0})}
    h = make_driver({"hi": "none", "lo": "none"}, profiles, priorities={"hi": 10, "lo": 0})
    h.driver.submit("lo", "l1")  # starts at once: the device is idle
    h.driver.submit("lo", "l2")
    h.timer.advance_to(0.001)
    h.driver.submit("hi", "h1")  # arrives later but outranks l2
    h.timer.run_until_idle()
    assert [s[1] for s in h.rec.started] == ["lo", "hi", "lo"]


async def test_cancelled_request_leaves_the_queue_and_never_runs() -> None:
    h = make_driver({"a": {"policy": "static", "batch_size": 2}}, {"a": FAST})
    r1 = h.driver.submit("a", "gone")
    r1.future.cancel()  # type: ignore[union-attr]
    await asyncio.sleep(0)  # done-callbacks run on the loop
    assert h.driver.sched.queued_by_model() == {"a": 0}
    h.driver.submit("a", "x")
    h.driver.submit("a", "y")
    assert h.rec.started == [(0.0, "a", 2)]
    assert h.rec.dropped == [("a", "cancelled")]


async def test_two_instances_run_two_batches_at_once() -> None:
    h = make_driver({"a": "none"}, {"a": FAST}, instances=2)
    for i in range(3):
        h.driver.submit("a", i)
    assert [s[0] for s in h.rec.started] == [0.0, 0.0]
    # Two batches of 1 (occupancy 2.5 / 10 = 0.25 each) share the device: each runs at 0.75
    # of its solo speed (core.contention), so both end at 10 / 0.75 ms.
    shared = 0.010 / 0.75
    assert h.driver.sched.busy_remaining_s(0.0) == pytest.approx(shared)
    h.timer.advance_to(0.020)
    assert [s[0] for s in h.rec.started] == [0.0, 0.0, pytest.approx(shared)]
    # busy instance-time over the first 20 ms: 2 x 13.3 ms + 1 x 6.7 ms, of 2 x 20 ms
    assert h.driver.sched.busy.fraction(0.020) == pytest.approx(
        (2 * shared + 0.020 - shared) / 0.040
    )
    h.timer.run_until_idle()
    assert h.driver.idle


async def test_requests_carrying_several_items_respect_max_batch_size() -> None:
    h = make_driver(
        {"a": {"policy": "fixed-window", "max_batch_size": 8, "max_batch_delay_ms": 0}},
        {"a": FAST},
        max_batch_size=8,
    )
    h.driver.submit("a", "first", items=1)  # runs alone at once
    h.driver.submit("a", "b5", items=5)
    h.driver.submit("a", "c4", items=4)
    h.timer.run_until_idle()
    # 5 + 4 would exceed 8 items: they go in two batches.
    assert [s[2] for s in h.rec.started] == [1, 5, 4]


async def test_busy_fraction_over_the_window() -> None:
    h = make_driver({"a": "none"}, {"a": FAST})
    h.driver.submit("a", 0)
    h.timer.run_until_idle()  # busy 0 .. 10 ms
    h.timer.advance_to(0.02)
    assert h.driver.sched.busy.fraction(0.02) == pytest.approx(0.5)
    h.timer.advance_to(0.5)
    assert h.driver.sched.busy.fraction(0.5) == pytest.approx(0.02)
    assert h.driver.sched.busy.total_s(0.5) == pytest.approx(0.01)
    h.timer.advance_to(2.0)
    assert h.driver.sched.busy.fraction(2.0) == 0.0


async def test_every_request_gets_exactly_one_outcome() -> None:
    rng = random.Random(7)
    specs = {
        "a": {"policy": "fixed-window", "max_batch_size": 8, "max_batch_delay_ms": 3},
        "b": {"policy": "static", "batch_size": 4, "max_wait_ms": 20},
    }
    profiles = {"a": FAST, "b": profile("b", {1: 5.0, 4: 9.0, 8: 15.0})}
    h = make_driver(specs, profiles, max_queue=30)
    futures = []
    refused = 0
    t = 0.0
    for i in range(600):
        t += rng.expovariate(400.0)
        h.timer.advance_to(t)
        try:
            r = h.driver.submit(rng.choice("ab"), i, deadline_in_s=rng.choice([None, 0.01, 0.05]))
        except RefusedError:
            refused += 1
            continue
        futures.append(r.future)
        if rng.random() < 0.02:
            r.future.cancel()  # type: ignore[union-attr]
        await asyncio.sleep(0)
    h.timer.run_until_idle()
    await asyncio.sleep(0)
    assert all(f.done() for f in futures)  # type: ignore[union-attr]
    ok = sum(1 for f in futures if not f.cancelled() and f.exception() is None)  # type: ignore[union-attr]
    expired = sum(
        1
        for f in futures
        if not f.cancelled() and isinstance(f.exception(), RefusedError)  # type: ignore[union-attr]
    )
    cancelled = sum(1 for f in futures if f.cancelled())  # type: ignore[union-attr]
    assert ok + expired + cancelled == len(futures)
    assert ok == sum(s[2] for s in h.rec.started)
    assert expired == sum(1 for d in h.rec.dropped if d[1] == "deadline-expired")
    assert h.driver.idle


async def test_a_timer_that_fires_a_hair_early_does_not_stall_the_queue() -> None:
    # asyncio may run a call_later callback slightly before its time; the driver must then
    # re-arm rather than believe a wake-up is still pending.
    from evenserve.worker.driver import BatchDriver

    h = make_driver(
        {"a": {"policy": "fixed-window", "max_batch_size": 4, "max_batch_delay_ms": 5}}, {"a": FAST}
    )

    class EarlyTimer:
        """Fires 0.1 us early, as asyncio may, unless that moment has passed (time moves)."""

        def call_at(self, t_s: float, callback: Callable[[], None]) -> TimerHandle:
            early = t_s - 1e-7
            return h.timer.call_at(early if early > h.clock.now() else t_s, callback)

    driver: BatchDriver = h.driver
    driver._timer_service = EarlyTimer()
    for i in range(3):
        r = driver.submit("a", i)
        h.timer.run_until_idle()
        assert r.future.done()  # type: ignore[union-attr]
    assert [s[2] for s in h.rec.started] == [1, 1, 1]


async def test_a_request_waiting_past_the_load_bound_is_refused_load_timeout() -> None:
    h = make_driver({"a": {"policy": "none"}}, {"a": FAST})
    setup = ModelSetup("b", BATCHING.build({"policy": "none"}), FAST)
    h.driver.sched.begin_load(setup, h.clock.now(), load_wait_s=0.5)
    r = h.driver.submit("b", "x")
    h.timer.advance_to(0.4999)
    assert not r.future.done()  # type: ignore[union-attr]
    h.timer.advance_to(0.5)
    exc = r.future.exception()  # type: ignore[union-attr]
    assert isinstance(exc, RefusedError) and exc.reason == "load-timeout"
    assert exc.retry_after_s is not None and "waited 500.0 ms" in str(exc)
    assert h.rec.dropped == [("b", "load-timeout")]
