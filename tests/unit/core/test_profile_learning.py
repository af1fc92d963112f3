"""Profiles that learn (``core.profile_learning``): a device's observed batch times move a
base profile, smoothed, monotone in batch size, and back when the device speeds up."""

from __future__ import annotations

import itertools
import math
import random

from hypothesis import given
from hypothesis import strategies as st

from evenserve.core.profile import LatencyProfile
from evenserve.core.profile_learning import MIN_SIZE_OBS, ProfileLearner, learned_profile

BASE = LatencyProfile.from_points("m", {1: 2.0, 4: 4.0, 8: 6.0, 16: 10.0})


def _feed(learner: ProfileLearner, factor: float, n: int, rng: random.Random) -> None:
    for _ in range(n):
        b = rng.randint(1, 16)
        learner.observe(b, BASE.latency_s(b) * factor)


def test_nothing_observed_is_the_base() -> None:
    learner = ProfileLearner(BASE)
    assert learner.profile() is BASE
    assert learned_profile(BASE, 1.0, {}) is BASE


def test_uniform_slowdown_learned_from_a_mix_of_sizes() -> None:
    learner = ProfileLearner(BASE)
    _feed(learner, 2.0, 600, random.Random(1))
    p = learner.profile()
    assert math.isclose(learner.scale, 2.0, rel_tol=0.01)
    # Sizes never observed too (above 16: extrapolated). Each size's shape still holds a
    # few % of the step it absorbed while the scale caught up (it decays as it is observed).
    for b in range(1, 40):
        assert math.isclose(p.latency_s(b), 2.0 * BASE.latency_s(b), rel_tol=0.03), b


def test_a_step_is_tracked_within_tens_of_batches() -> None:
    learner = ProfileLearner(BASE)
    for _ in range(45):
        learner.observe(8, BASE.latency_s(8) * 2.0)
    assert learner.profile().latency_s(8) >= 0.9 * 2.0 * BASE.latency_s(8)


def test_one_outlier_barely_moves_it() -> None:
    learner = ProfileLearner(BASE)
    _feed(learner, 1.0, 100, random.Random(2))
    learner.observe(4, BASE.latency_s(4) * 10.0)
    assert learner.scale < 1.04
    assert learner.profile().latency_s(4) < 1.1 * BASE.latency_s(4)


def test_recovers_when_the_device_speeds_back_up() -> None:
    learner = ProfileLearner(BASE)
    rng = random.Random(3)
    _feed(learner, 2.0, 600, rng)
    _feed(learner, 1.0, 600, rng)
    p = learner.profile()
    assert math.isclose(learner.scale, 1.0, rel_tol=0.01)
    for b in (1, 3, 8, 16):
        assert math.isclose(p.latency_s(b), BASE.latency_s(b), rel_tol=0.03)


def test_a_shape_of_its_own_where_observed() -> None:
    learner = ProfileLearner(BASE)
    for _ in range(400):  # size 16 is 3x the profile, size 1 as the profile
        learner.observe(16, BASE.latency_s(16) * 3.0)
        learner.observe(1, BASE.latency_s(1))
    obs = learner.observed_ms()
    assert set(obs) == {1, 16}
    assert math.isclose(obs[16], 30.0, rel_tol=0.05)
    assert math.isclose(obs[1], 2.0, rel_tol=0.05)


def test_the_gateway_rebuilds_the_workers_profile_from_its_report() -> None:
    learner = ProfileLearner(BASE)
    _feed(learner, 1.7, 300, random.Random(4))
    mine = learner.profile()
    theirs = learned_profile(BASE, learner.scale, learner.observed_ms())
    assert mine.batches == theirs.batches and mine.latency_ms == theirs.latency_ms


@given(st.lists(st.tuples(st.integers(1, 32), st.floats(0.05, 20.0)), min_size=1, max_size=300))
def test_learned_profile_is_monotone_in_batch_size(obs: list[tuple[int, float]]) -> None:
    learner = ProfileLearner(BASE)
    for b, factor in obs:
        learner.observe(b, BASE.latency_s(b) * factor)
    p = learner.profile()
    times = [p.latency_s(b) for b in range(1, 48)]
    assert all(t > 0 for t in times)
    assert all(a <= b + 1e-12 for a, b in itertools.pairwise(times))
    assert all(learner.observations(b) >= MIN_SIZE_OBS for b in learner.observed_ms())


@given(st.floats(0.25, 4.0), st.integers(0, 10_000))
def test_converges_to_the_scaled_profile(factor: float, seed: int) -> None:
    learner = ProfileLearner(BASE)
    _feed(learner, factor, 800, random.Random(seed))
    p = learner.profile()
    for b in (1, 2, 5, 8, 13, 16, 24):
        assert math.isclose(p.latency_s(b), factor * BASE.latency_s(b), rel_tol=0.05)
