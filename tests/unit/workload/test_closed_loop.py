"""Closed-loop users: the simulator's draws, in its order, and the live generator's per user."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from evenserve.core.errors import ConfigError
from evenserve.core.scenario import ClosedLoop
from evenserve.workload import ClosedLoopUsers, user_rng

from .reference import ClosedLoopReference


@pytest.mark.parametrize(
    "raw",
    [
        {"users": 100, "think_ms": 10, "mix": {"resnet50": 0.85, "bert-base": 0.15}},
        {"users": 7, "think_ms": 20, "mix": {"slow": 1.0, "fast": 3.0}},
        {"users": 3, "think_ms": 0, "mix": {"c": 0.1, "a": 0.2, "z": 0.0, "b": 0.7}},
        {"users": 1, "think_ms": 250, "mix": {"only": 2.5}},
    ],
)
@pytest.mark.parametrize("seed", [0, 1, 42])
def test_same_draws_as_the_simulator(raw: dict[str, Any], seed: int) -> None:
    wl = ClosedLoop.model_validate({"type": "closed-loop", **raw})
    ref = ClosedLoopReference(wl, seed)
    users = ClosedLoopUsers.for_workload(wl, seed)
    assert (users.models, users.cum_weights) == (ref._mix_models, ref._mix_cum)
    # The simulator interleaves think draws (a user starts thinking) and mix draws (a request
    # arrives) in event order: any interleaving must give the same values.
    pattern = random.Random(f"pattern:{seed}")
    for _ in range(3000):
        if pattern.random() < 0.5:
            assert users.think_s() == ref.think()
        else:
            assert users.draw_model() == ref.model()


def test_mix_weights_and_think_times() -> None:
    users = ClosedLoopUsers({"b": 1.0, "a": 3.0, "never": 0.0}, 0.4, random.Random(1))
    assert users.models == ["a", "b"] and users.cum_weights == [0.75, 1.0]
    draws = [users.draw_model() for _ in range(20_000)]
    assert "never" not in draws
    assert draws.count("a") / len(draws) == pytest.approx(0.75, abs=0.02)
    thinks = [users.think_s() for _ in range(20_000)]
    assert sum(thinks) / len(thinks) == pytest.approx(0.4, rel=0.03)
    assert ClosedLoopUsers({"a": 1.0}, 0.0, random.Random(1)).think_s() == 0.0


def test_live_users_have_seeds_of_their_own() -> None:
    def first_draws(seed: int, user: int) -> list[str]:
        u = ClosedLoopUsers({"a": 1.0, "b": 1.0}, 0.01, user_rng(seed, user))
        return [u.draw_model() for _ in range(30)]

    assert first_draws(3, 0) == first_draws(3, 0)
    assert first_draws(3, 0) != first_draws(3, 1)
    assert first_draws(3, 0) != first_draws(4, 0)


@pytest.mark.parametrize(
    ("mix", "think_s", "needle"),
    [
        ({"a": 0.0}, 0.1, "mix: weights must not all be zero"),
        ({"a": 1.0, "b": -1.0}, 0.1, "mix.b: weight"),
        ({"a": math.nan}, 0.1, "mix.a: weight"),
        ({"a": 1.0}, -0.5, "think time"),
        ({"a": 1.0}, math.nan, "think time"),
    ],
)
def test_bad_users_are_clear_errors(mix: dict[str, float], think_s: float, needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        ClosedLoopUsers(mix, think_s, random.Random(0))
    assert needle in str(e.value)
