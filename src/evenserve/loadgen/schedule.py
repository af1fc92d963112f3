"""When to send what: open-loop Poisson schedules, closed-loop think times, trace replay, lag.

Theory of operation. Every send has an *intended* time on the generator's monotonic clock
(``time.perf_counter``, seconds from the run start). Open loop: the Poisson process (or the
trace) fixes the intended times in advance, independent of how the target answers, so a slow
target cannot slow the offered load down (no coordinated omission). Closed loop: a user's next
intended time is its previous answer's time plus an exponential think time.

Waiting for an intended time: an asyncio timer can fire up to a millisecond late (the event
loop's selector rounds its timeout up to whole milliseconds; libuv keeps millisecond time), so
:class:`SendClock` asks the loop to wake it ``EARLY_S`` early and covers the rest with a short
blocking ``time.sleep`` (the kernel's sub-millisecond sleep, no busy-waiting). The loop is
blocked for at most that remainder, so answers that arrive meanwhile are read a fraction of a
millisecond later; that is the price of sub-millisecond send accuracy, and it is measured:
the *scheduling lag* of every send (actual minus intended) is recorded and reported.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import heapq
import itertools
import math
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from evenserve.core.errors import ConfigError

#: Wake this long before an intended send time, then sleep the rest precisely (seconds).
EARLY_S = 0.0012


@dataclass(frozen=True, slots=True)
class Arrival:
    """One scheduled request: when (seconds from the start), which model, class, deadline."""

    t_s: float
    model: str
    priority: int | None = None
    deadline_ms: float | None = None


def parse_mix(text: str) -> dict[str, float]:
    """``resnet50=0.85,bert-base=0.15`` -> weights; errors name the item."""
    out: dict[str, float] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, weight = item.partition("=")
        name = name.strip()
        if not name:
            raise ConfigError(f"--mix {item!r}: expected MODEL=WEIGHT")
        if not sep:
            out[name] = 1.0
            continue
        try:
            w = float(weight)
        except ValueError:
            raise ConfigError(f"--mix {item!r}: weight {weight!r} is not a number") from None
        if not math.isfinite(w) or w < 0:
            raise ConfigError(f"--mix {item!r}: weight must be a number >= 0")
        out[name] = w
    if not out:
        raise ConfigError("--mix: give at least one model (MODEL=WEIGHT,...)")
    if sum(out.values()) <= 0:
        raise ConfigError("--mix: weights must not all be zero")
    return out


class MixSampler:
    """Draws a model name with probability proportional to its weight."""

    def __init__(self, mix: Mapping[str, float], rng: random.Random) -> None:
        items = [(m, w) for m, w in sorted(mix.items()) if w > 0]
        if not items:
            raise ConfigError("mix: weights must not all be zero")
        total = sum(w for _, w in items)
        self.models = [m for m, _ in items]
        self._cum: list[float] = []
        acc = 0.0
        for _, w in items:
            acc += w / total
            self._cum.append(acc)
        self._cum[-1] = 1.0
        self.rng = rng

    def draw(self) -> str:
        return self.models[bisect.bisect_left(self._cum, self.rng.random())]


def poisson_schedule(
    rate_rps: float,
    mix: Mapping[str, float],
    duration_s: float,
    rng: random.Random,
    max_requests: int,
) -> list[Arrival]:
    """Open loop: Poisson arrivals at ``rate_rps`` over ``[0, duration_s)``, models by mix."""
    if rate_rps <= 0 or not math.isfinite(rate_rps):
        raise ConfigError("--rate: must be a number > 0")
    sampler = MixSampler(mix, rng)
    out: list[Arrival] = []
    t = rng.expovariate(rate_rps)
    while t < duration_s and len(out) < max_requests:
        out.append(Arrival(t, sampler.draw()))
        t += rng.expovariate(rate_rps)
    return out


def trace_schedule(
    entries: Sequence[Arrival], duration_s: float, max_requests: int, time_scale: float = 1.0
) -> list[Arrival]:
    """Trace replay: entries' times stretched by ``time_scale``, cut at the duration and cap."""
    out: list[Arrival] = []
    for e in sorted(entries, key=lambda a: a.t_s):
        t = e.t_s * time_scale
        if t >= duration_s or len(out) >= max_requests:
            break
        out.append(Arrival(t, e.model, e.priority, e.deadline_ms))
    return out


def think_s(rng: random.Random, mean_s: float) -> float:
    """Closed loop: an exponential think time with mean ``mean_s`` (0: none)."""
    return rng.expovariate(1.0 / mean_s) if mean_s > 0 else 0.0


class SendClock:
    """Releases senders at their intended times, in exact time order, with one timer for all.

    Each sender awaits :meth:`wait_until`; a single coroutine keeps the intended times in a
    heap, sleeps on the event loop until ``EARLY_S`` before the earliest, finishes with a short
    blocking sleep, releases that sender and yields once so it sends before the next one is
    considered. One timer matters: event loops order their own timers only to the millisecond
    (libuv), so two senders each sleeping on their own timer can be released in the wrong
    order, and one would then wait out the other's blocking sleep.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._wake: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for _, _, fut in self._heap:
            fut.cancel()
        self._heap.clear()

    def _poke(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    async def wait_until(self, t_abs: float) -> None:
        """Return at ``t_abs`` (a ``time.perf_counter`` time), as precisely as the host allows."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._heap, (t_abs, next(self._seq), fut))
        if self._heap[0][2] is fut:
            self._poke()  # an earlier time than the one the clock sleeps for
        await fut

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        heap = self._heap
        while True:
            if not heap:
                self._wake = loop.create_future()
                await self._wake
                continue
            t, _, fut = heap[0]
            delay = t - time.perf_counter() - EARLY_S
            if delay > 0:
                self._wake = loop.create_future()
                timer = loop.call_later(delay, self._poke)
                await self._wake
                timer.cancel()
                continue
            heapq.heappop(heap)
            if fut.done():
                continue
            rest = t - time.perf_counter()
            if rest > 0:
                time.sleep(rest)
            fut.set_result(None)
            # Let the released sender reach its send before the next release.
            await asyncio.sleep(0)


class LagStats:
    """Scheduling lag of every send: actual minus intended send time (seconds)."""

    def __init__(self) -> None:
        self.lag_s: list[float] = []

    def record(self, intended_s: float, actual_s: float) -> None:
        self.lag_s.append(actual_s - intended_s)

    def summary_ms(self) -> dict[str, float | int | None]:
        if not self.lag_s:
            return {"count": 0, "p50": None, "p99": None, "max": None, "mean": None}
        a = np.asarray(self.lag_s) * 1000.0
        return {
            "count": int(a.size),
            "p50": round(float(np.percentile(a, 50)), 4),
            "p99": round(float(np.percentile(a, 99)), 4),
            "max": round(float(a.max()), 4),
            "mean": round(float(a.mean()), 4),
        }
