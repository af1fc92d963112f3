"""The send clock's order and the lag accounting (no wall-clock asserts)."""

from __future__ import annotations

import asyncio
import time

import pytest

from evenserve.loadgen.schedule import LagStats, SendClock


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

    # "late" is far out (never reached: the clock is stopped first), so however slowly this
    # machine runs the steps below, the clock is still sleeping for "late" when "early"
    # registers, and only a wake-up for the earlier time can release "early" at all.
    late = asyncio.create_task(sender("late", time.perf_counter() + 3600.0))
    await asyncio.sleep(0.01)  # the clock now sleeps for "late"
    early = asyncio.create_task(sender("early", time.perf_counter() + 0.01))
    await asyncio.wait_for(early, 60)
    assert released == ["early"]
    assert not late.done()
    await clock.stop()  # cancels what is still waiting
    with pytest.raises(asyncio.CancelledError):
        await late
    assert released == ["early"]
