"""Sending at the intended times: the send clock, and the lag of every send.

Theory of operation. Every send has an *intended* time on the generator's monotonic clock
(``time.perf_counter``, seconds from the run start); what to send when comes from
``evenserve.workload``. Open loop: the Poisson streams (or the trace) fix the intended times
in advance, independent of how the target answers, so a slow target cannot slow the offered
load down (no coordinated omission). Closed loop: a user's next intended time is its previous
answer's time plus an exponential think time.

Waiting for an intended time: an asyncio timer can fire up to a millisecond late (the event
loop's selector rounds its timeout up to whole milliseconds; libuv keeps millisecond time), so
:class:`SendClock` asks the loop to wake it ``EARLY_S`` early and covers the rest with a short
blocking ``time.sleep`` (the kernel's sub-millisecond sleep, no busy-waiting). The loop is
blocked for at most that remainder, so answers that arrive meanwhile are read a fraction of a
millisecond later; that is the price of sub-millisecond send accuracy, and it is measured:
the *scheduling lag* of every send (actual minus intended) is recorded and reported.
While the load runs, :func:`sender_priority` lifts the sending thread's scheduling priority
where the host permits, so it does not wait behind the system under test for a CPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import os
import time
from collections.abc import Iterator

import numpy as np

#: Wake this long before an intended send time, then sleep the rest precisely (seconds).
EARLY_S = 0.0012


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


@contextlib.contextmanager
def sender_priority(enabled: bool = True) -> Iterator[str]:
    """Run the calling thread at real-time round-robin priority 1 when permitted, else nice -10.

    On a host shared with the system under test, a woken generator can wait milliseconds for
    a CPU behind the gateway and the workers (the kernel's wake-up granularity), which is
    scheduling lag that has nothing to do with the generator. The lowest real-time priority
    removes that wait; the generator sleeps between sends (it never spins), so it takes only
    the CPU it needs. Only this thread is changed, and only while the load runs: the cluster's
    processes, started before, keep their normal priority. Yields what was obtained.
    """
    if not enabled or not hasattr(os, "sched_setscheduler"):
        yield "normal"
        return
    try:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
    except (OSError, AttributeError):
        pass
    else:
        try:
            yield "real-time (SCHED_RR 1)"
        finally:
            with contextlib.suppress(OSError):
                os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        return
    old = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, -10)
    except OSError:
        yield "normal"
        return
    try:
        yield "nice -10"
    finally:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, old)
