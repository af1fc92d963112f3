"""A driver on a FakeClock: virtual device, fake timer, a recording observer."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from evenserve.core.clock import FakeClock
from evenserve.core.options import DeviceOptions, QueueOptions
from evenserve.core.profile import LatencyProfile
from evenserve.policy.batching import BATCHING
from evenserve.sched import ModelSetup
from evenserve.worker.driver import BatchDriver, BatchResult, DriverObserver, RunningBatch
from evenserve.worker.executor import VirtualExecutor
from evenserve.worker.timer import FakeTimer


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
