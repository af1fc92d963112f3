"""Schedules, the mix, the send clock's order and the lag accounting (no wall-clock asserts)."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from evenserve.core.errors import ConfigError
from evenserve.loadgen.schedule import (
    Arrival,
    LagStats,
    MixSampler,
    SendClock,
    parse_mix,
    poisson_schedule,
    think_s,
    trace_schedule,
)


def test_parse_mix() -> None:
    assert parse_mix("resnet50=0.85, bert-base=0.15") == {"resnet50": 0.85, "bert-base": 0.15}
    assert parse_mix("a") == {"a": 1.0}


@pytest.mark.parametrize(
    ("text", "needle"),
    [("a=x", "not a number"), ("a=-1", ">= 0"), ("=1", "MODEL=WEIGHT"), ("a=0", "zero"), ("", "")],
)
def test_parse_mix_errors(text: str, needle: str) -> None:
    with pytest.raises(ConfigError, match="--mix") as e:
        parse_mix(text)
    assert needle in str(e.value)


def test_mix_sampler_follows_weights() -> None:
    s = MixSampler({"a": 3.0, "b": 1.0, "never": 0.0}, random.Random(1))
    draws = [s.draw() for _ in range(20_000)]
    assert "never" not in draws
    assert draws.count("a") / len(draws) == pytest.approx(0.75, abs=0.02)


def test_poisson_schedule_rate_order_and_cap() -> None:
    sched = poisson_schedule(200.0, {"a": 1, "b": 1}, 50.0, random.Random(3), 1_000_000)
    times = [a.t_s for a in sched]
    assert times == sorted(times) and times[-1] < 50.0
    assert len(sched) / 50.0 == pytest.approx(200.0, rel=0.05)
    assert len(poisson_schedule(200.0, {"a": 1}, 50.0, random.Random(3), 17)) == 17
    with pytest.raises(ConfigError, match="--rate"):
        poisson_schedule(0.0, {"a": 1}, 1.0, random.Random(0), 10)


def test_trace_schedule_scales_cuts_and_caps() -> None:
    entries = [Arrival(0.3, "b", priority=0), Arrival(0.1, "a"), Arrival(2.0, "a")]
    out = trace_schedule(entries, duration_s=5.0, max_requests=10, time_scale=2.0)
    assert [(a.t_s, a.model) for a in out] == [(0.2, "a"), (0.6, "b"), (4.0, "a")]
    assert out[1].priority == 0
    assert len(trace_schedule(entries, duration_s=1.0, max_requests=10, time_scale=2.0)) == 2
    assert len(trace_schedule(entries, duration_s=9.0, max_requests=1)) == 1


def test_think_time_is_exponential_with_the_mean() -> None:
    rng = random.Random(5)
    xs = [think_s(rng, 0.4) for _ in range(20_000)]
    assert sum(xs) / len(xs) == pytest.approx(0.4, rel=0.03)
    assert think_s(rng, 0.0) == 0.0


def test_lag_stats() -> None:
    lag = LagStats()
    assert lag.summary_ms()["count"] == 0
    for i in range(100):
        lag.record(10.0, 10.0 + i / 1e6)  # 0 .. 99 microseconds late
    s = lag.summary_ms()
    assert s["count"] == 100
    assert s["max"] == pytest.approx(0.099)
    assert s["p50"] == pytest.approx(0.0495)
    assert s["p99"] is not None and s["p50"] < s["p99"] <= s["max"]  # type: ignore[operator]


async def test_send_clock_releases_in_time_order_not_arrival_order() -> None:
    clock = SendClock()
    clock.start()
    released: list[int] = []
    base = time.perf_counter() + 0.02

    async def sender(i: int, t: float) -> None:
        await clock.wait_until(t)
        released.append(i)

    # Registered latest first, all within a few hundred microseconds: the clock must still
    # release them by intended time (one timer for all, an exact heap).
    offsets = [0.0009, 0.0007, 0.0005, 0.0003, 0.0001]
    tasks = [asyncio.create_task(sender(i, base + off)) for i, off in enumerate(offsets)]
    await asyncio.gather(*tasks)
    await clock.stop()
    assert released == [4, 3, 2, 1, 0]


async def test_send_clock_wakes_for_an_earlier_sender() -> None:
    clock = SendClock()
    clock.start()
    released: list[str] = []

    async def sender(name: str, t: float) -> None:
        await clock.wait_until(t)
        released.append(name)

    late = asyncio.create_task(sender("late", time.perf_counter() + 0.2))
    await asyncio.sleep(0.01)  # the clock now sleeps for "late"
    early = asyncio.create_task(sender("early", time.perf_counter() + 0.01))
    await asyncio.gather(early, late)
    await clock.stop()
    assert released == ["early", "late"]
