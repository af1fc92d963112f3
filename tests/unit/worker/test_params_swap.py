"""A batching policy swapped live (a parameter push): queued requests stay queued and each is
answered exactly once; the next decision is the new policy's."""

from __future__ import annotations

import random

from evenserve.policy.batching import BATCHING

from .fakes import make_driver, profile

FAST = profile("a", {1: 10.0, 4: 16.0, 8: 20.0})


async def test_queued_requests_are_answered_once_across_a_swap() -> None:
    h = make_driver({"a": {"policy": "static", "batch_size": 4}}, {"a": FAST})
    reqs = [h.driver.submit("a", i) for i in range(3)]
    h.timer.run_until_idle()
    assert h.rec.started == []  # static waits for 4 that never come
    swapped = BATCHING.build(
        {"policy": "fixed-window", "max_batch_size": 2, "max_batch_delay_ms": 0}
    )
    h.driver.sched.set_policy("a", swapped, h.clock.now())
    # The very next decision is the new policy's: a batch of 2 at once, then 1 after it.
    assert h.rec.started == [(0.0, "a", 2)]
    assert h.driver.sched.snapshot(h.clock.now()).max_batch_size == {"a": 2}
    h.timer.run_until_idle()
    assert [s[2] for s in h.rec.started] == [2, 1]
    assert [r.future.result() for r in reqs] == [0, 1, 2]  # type: ignore[union-attr]
    assert sum(s[2] for s in h.rec.finished) == 3 and h.rec.dropped == []


async def test_swaps_under_load_lose_and_duplicate_nothing() -> None:
    """Random arrivals with a swap between policies every few ms: every request answered
    once, each batch within the cap of the policy in force when it started."""
    specs = [
        {"policy": "fixed-window", "max_batch_size": 8, "max_batch_delay_ms": 5},
        {"policy": "static", "batch_size": 3},
        {"policy": "fixed-window", "max_batch_size": 2, "max_batch_delay_ms": 0},
        "none",
    ]
    h = make_driver({"a": specs[0]}, {"a": FAST})
    rng = random.Random(7)
    reqs = []
    t = 0.0
    for i in range(400):
        t += rng.expovariate(800.0)
        h.timer.advance_to(t)
        reqs.append(h.driver.submit("a", i))
        if i % 25 == 24:
            policy = BATCHING.build(specs[(i // 25) % len(specs)])
            h.driver.sched.set_policy("a", policy, h.clock.now())
    # The last is a policy that never waits, so everything left runs.
    h.driver.sched.set_policy("a", BATCHING.build("none"), h.clock.now())
    h.timer.run_until_idle()
    assert [r.future.result() for r in reqs] == list(range(400))  # type: ignore[union-attr]
    assert sum(s[2] for s in h.rec.started) == 400 and h.rec.dropped == []
    assert max(s[2] for s in h.rec.started) <= 8


async def test_a_draining_model_keeps_flushing_after_a_swap() -> None:
    h = make_driver(
        {"a": {"policy": "fixed-window", "max_batch_size": 8, "max_batch_delay_ms": 1000}},
        {"a": FAST},
    )
    reqs = [h.driver.submit("a", i) for i in range(5)]
    h.driver.begin_drain()
    assert h.rec.started == [(0.0, "a", 5)]
    h.driver.sched.set_policy("a", BATCHING.build({"policy": "static", "batch_size": 8}), 0.0)
    h.timer.run_until_idle()
    assert [r.future.result() for r in reqs] == list(range(5))  # type: ignore[union-attr]


async def test_class_headroom_is_set_live() -> None:
    h = make_driver({"a": "none", "b": "none"}, {"a": FAST, "b": FAST})
    assert h.driver.sched.queues.class_headroom is None
    h.driver.sched.set_class_headroom(0.5, 0.0)
    assert h.driver.sched.queues.class_headroom == 0.5
    reqs = [h.driver.submit(m, i) for i, m in enumerate("abab")]
    h.timer.run_until_idle()
    assert [r.future.result() for r in reqs] == [0, 1, 2, 3]  # type: ignore[union-attr]
    h.driver.sched.set_class_headroom(None, h.clock.now())
    assert h.driver.sched.queues.class_headroom is None


async def test_toggling_learning_while_requests_queue_answers_each_once() -> None:
    h = make_driver({"a": {"policy": "static", "batch_size": 4}}, {"a": FAST})
    sched = h.driver.sched
    reqs = [h.driver.submit("a", i) for i in range(3)]
    h.timer.run_until_idle()
    assert h.rec.started == []  # static waits for 4
    sched.set_learn_profiles(True, h.clock.now())
    assert sched.learned()[0] == {"a": 1.0} and sched.waiting == 3
    reqs.append(h.driver.submit("a", 3))
    h.timer.run_until_idle()
    assert [s[2] for s in h.rec.started] == [4]
    reqs += [h.driver.submit("a", i) for i in range(4, 7)]
    sched.set_learn_profiles(False, h.clock.now())
    assert sched.learned() == ({}, {}) and sched.waiting == 3
    sched.set_policy("a", BATCHING.build("none"), h.clock.now())
    h.timer.run_until_idle()
    assert [r.future.result() for r in reqs] == list(range(7))  # type: ignore[union-attr]
    assert sum(s[2] for s in h.rec.started) == 7 and h.rec.dropped == []
