"""Profiles that learn in the device scheduler (``learn_profiles``): the measured batch times
``finished`` hears move its estimates and its load snapshot carries the learned figures;
without it nothing changes."""

from __future__ import annotations

import pytest

from evenserve.core.profile_learning import learned_profile
from evenserve.policy.routing import ROUTING, Router
from evenserve.sched import scheduler_for

from .test_model_control import PROF_A, model, req
from .test_scheduler import Actions


def _run(learn: bool, factor: float, batches: int = 80) -> tuple[object, Actions]:
    act = Actions()
    s = scheduler_for([model("a", PROF_A)], act, learn_profiles=learn)
    t = 0.0
    for i in range(batches):
        assert s.offer(req(i, "a", t), t) is None
        (b,) = act.started[-1:]
        took = PROF_A.latency_s(1) * factor
        t += took
        s.finished(b, t, took)
    return s, act


def test_learning_follows_a_slow_device() -> None:
    s, _ = _run(True, 2.0)
    assert s.estimate_batch_s("a", 1) == pytest.approx(2 * PROF_A.latency_s(1), rel=0.03)
    assert s.estimate_batch_s("a", 4) == pytest.approx(2 * PROF_A.latency_s(4), rel=0.03)
    snap = s.snapshot(10.0)
    assert snap.profile_scale["a"] == pytest.approx(2.0, rel=0.03)
    assert set(snap.observed_ms["a"]) == {1}


def test_without_learning_estimates_read_the_profile() -> None:
    s, _ = _run(False, 2.0)
    assert s.estimate_batch_s("a", 1) == PROF_A.latency_s(1)
    snap = s.snapshot(10.0)
    assert snap.profile_scale == {} and snap.observed_ms == {}


def test_the_router_rebuilds_the_devices_learned_profile_from_its_sample() -> None:
    s, _ = _run(True, 2.0)
    router = Router(ROUTING.build("least-expected-work"))
    router.add_backend("d", ["a"], profiles={"a": PROF_A})
    assert router.view("d").profiles["a"] is PROF_A
    snap = s.snapshot(10.0)
    router.observe("d", snap)
    learned = router.view("d").profiles["a"]
    mine = learned_profile(PROF_A, snap.profile_scale["a"], snap.observed_ms["a"])
    assert learned.latency_ms == mine.latency_ms
    # The scheduler rebuilds its own profile when its figures moved by over 1 % (TOLERANCE);
    # the snapshot carries the current ones.
    assert learned.latency_s(4) == pytest.approx(s.estimate_batch_s("a", 4), rel=0.02)
    router.observe("d", snap)  # the same figures again: the same profile object
    assert router.view("d").profiles["a"] is learned


def test_a_batchs_real_time_stays_the_profiles_times_the_slowdown() -> None:
    """The simulator's slowdown stretches the profile as given, not the learned estimate
    (else a learned 2x would run 4x)."""
    s, act = _run(True, 2.0)
    s.slots.slowdown = 2.0
    act.ends.clear()
    s.offer(req(999, "a", 100.0), 100.0)
    ((end, _),) = act.ends
    assert end == pytest.approx(100.0 + 2 * PROF_A.latency_s(1))


def test_learning_turned_off_live_goes_back_to_the_base_profile() -> None:
    s, _ = _run(True, 2.0)
    assert s.estimate_batch_s("a", 1) > 1.9 * PROF_A.latency_s(1)
    s.set_learn_profiles(False, 10.0)
    assert s.learn_profiles is False
    assert s.estimate_batch_s("a", 1) == PROF_A.latency_s(1)
    assert s.learned() == ({}, {})
    snap = s.snapshot(10.0)
    assert snap.profile_scale == {} and snap.observed_ms == {}


def test_learning_turned_on_live_starts_a_fresh_learner_from_the_base() -> None:
    s, act = _run(False, 2.0)
    assert s.learned() == ({}, {})
    s.set_learn_profiles(True, 10.0)
    scale, _ = s.learned()
    assert scale == {"a": 1.0}  # fresh: nothing learned yet
    t = 10.0
    for i in range(80):
        assert s.offer(req(1000 + i, "a", t), t) is None
        (b,) = act.started[-1:]
        took = PROF_A.latency_s(1) * 2.0
        t += took
        s.finished(b, t, took)
    assert s.estimate_batch_s("a", 1) == pytest.approx(2 * PROF_A.latency_s(1), rel=0.03)
    # Off and on again: the learner starts afresh, from the base profile.
    s.set_learn_profiles(False, t)
    s.set_learn_profiles(True, t)
    assert s.learned()[0] == {"a": 1.0}
    assert s.estimate_batch_s("a", 1) == PROF_A.latency_s(1)


def test_the_router_goes_back_to_the_base_profile_when_learning_stops() -> None:
    s, _ = _run(True, 2.0)
    router = Router(ROUTING.build("least-expected-work"))
    router.add_backend("d", ["a"], profiles={"a": PROF_A})
    router.observe("d", s.snapshot(10.0))
    assert router.view("d").profiles["a"] is not PROF_A
    s.set_learn_profiles(False, 10.0)
    router.observe("d", s.snapshot(11.0))  # the report no longer carries learned figures
    assert router.view("d").profiles["a"] is PROF_A
    s.set_learn_profiles(True, 11.0)
    router.observe("d", s.snapshot(12.0))  # learning again, from scale 1: the base again
    assert router.view("d").profiles["a"].latency_ms == PROF_A.latency_ms
