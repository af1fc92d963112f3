"""A driver on a FakeClock: virtual device, fake timer, a recording observer."""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from evenserve.core.clock import FakeClock
from evenserve.core.options import DeviceOptions, QueueOptions
from evenserve.core.profile import LatencyProfile
from evenserve.policy.batching import BATCHING
from evenserve.sched import ModelSetup
from evenserve.worker.batch import BatchResult, DriverObserver, RunningBatch
from evenserve.worker.driver import BatchDriver
from evenserve.worker.executor import VirtualExecutor
from evenserve.worker.timer import TimerHandle


class _FakeHandle:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeTimer:
    """A timer heap on a FakeClock; ``advance_to`` fires due callbacks in (time, order) order."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self._heap: list[tuple[float, int, _FakeHandle, Callable[[], None]]] = []
        self._seq = itertools.count()

    def call_at(self, t_s: float, callback: Callable[[], None]) -> TimerHandle:
        h = _FakeHandle()
        heapq.heappush(self._heap, (max(t_s, self.clock.now()), next(self._seq), h, callback))
        return h

    def next_time(self) -> float:
        while self._heap and self._heap[0][2].cancelled:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else math.inf

    def advance_to(self, t_s: float) -> None:
        """Move the clock to ``t_s``, firing every callback due on the way, in time order."""
        while True:
            nxt = self.next_time()
            if nxt > t_s:
                break
            when, _, _handle, cb = heapq.heappop(self._heap)
            self.clock.set(max(when, self.clock.now()))
            cb()
        self.clock.set(max(t_s, self.clock.now()))

    def run_until_idle(self, limit_s: float = math.inf) -> None:
        """Fire callbacks until none is left (or the next one is after ``limit_s``)."""
        while True:
            nxt = self.next_time()
            if nxt == math.inf or nxt > limit_s:
                return
            self.advance_to(nxt)


@dataclass
class Recorder(DriverObserver):
    started: list[tuple[float, str, int]] = field(default_factory=list)
    finished: list[tuple[float, str, int]] = field(default_factory=list)
    dropped: list[tuple[str, str]] = field(default_factory=list)

    def batch_started(self, batch: RunningBatch, now_s: float) -> None:
        self.started.append((now_s, batch.model, batch.items))

    def batch_finished(self, batch: RunningBatch, result: BatchResult, now_s: float) -> None:
        self.finished.append((now_s, batch.model, batch.items))

    def request_dropped(self, model: str, reason: str, waited_s: float) -> None:
        self.dropped.append((model, reason))


def profile(model: str, points: Mapping[int, float]) -> LatencyProfile:
    return LatencyProfile.from_points(model, points)


@dataclass
class Harness:
    clock: FakeClock
    timer: FakeTimer
    driver: BatchDriver
    rec: Recorder


def make_driver(
    specs: Mapping[str, Any],
    profiles: Mapping[str, LatencyProfile],
    *,
    instances: int = 1,
    max_queue: int = 1000,
    max_batch_size: int = 64,
    priorities: Mapping[str, int] | None = None,
    deadlines_s: Mapping[str, float] | None = None,
    slos_s: Mapping[str, float] | None = None,
    starvation_s: float | None = None,
    class_headroom: float | None = None,
) -> Harness:
    clock = FakeClock()
    timer = FakeTimer(clock)
    rec = Recorder()
    models = [
        ModelSetup(
            name=m,
            policy=BATCHING.build(spec),
            profile=profiles[m],
            max_batch_size=max_batch_size,
            max_queue=max_queue,
            priority=(priorities or {}).get(m, 10),
            deadline_s=(deadlines_s or {}).get(m),
            slo_s=(slos_s or {}).get(m),
        )
        for m, spec in specs.items()
    ]
    driver = BatchDriver(
        models,
        VirtualExecutor(),
        clock=clock,
        timer=timer,
        device=DeviceOptions(instances=instances),
        queue=QueueOptions(
            starvation_ms=None if starvation_s is None else starvation_s * 1000.0,
            class_headroom=class_headroom,
        ),
        observer=rec,
    )
    return Harness(clock, timer, driver, rec)


#: A synthetic profile YAML document for emulated test models (``model`` to be set).
PROFILE = {
    "model": "m",
    "device": "test device (synthetic)",
    "runtime": "emulated",
    "precision": "fp32",
    "source": "Synthetic figures for tests (not a measurement).",
    "points": [{"batch": 1, "latency_ms": 1.0}, {"batch": 4, "latency_ms": 2.0}],
}
