"""The device scheduler on its own: events in, actions out, no clock and no loop."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest

from evenserve.core.options import DeviceOptions
from evenserve.core.profile import LatencyProfile
from evenserve.policy.batching import BATCHING
from evenserve.sched import (
    DRAINING,
    GONE,
    Batch,
    DeviceScheduler,
    ModelSetup,
    QueuedRequest,
    QueueSet,
    scheduler_for,
)

PROF = LatencyProfile.from_points("a", {1: 10.0, 4: 16.0, 8: 20.0})


@dataclass
class Actions:
    """Records what the scheduler asks its driver to do."""

    started: list[Batch[QueuedRequest]] = field(default_factory=list)
    dropped: list[tuple[int, str]] = field(default_factory=list)
    wakes: list[float] = field(default_factory=list)
    ends: list[tuple[float, int]] = field(default_factory=list)

    def start_batch(self, batch: Batch[QueuedRequest]) -> None:
        self.started.append(batch)

    def drop(self, request: QueuedRequest, reason: str) -> None:
        self.dropped.append((request.request_id, reason))

    def wake_at(self, t_s: float) -> None:
        self.wakes.append(t_s)

    def end_at(self, t_s: float, token: int) -> None:
        self.ends.append((t_s, token))


def setup(policy: object, **kw: object) -> ModelSetup:
    return ModelSetup(name="a", policy=BATCHING.build(policy), profile=PROF, **kw)  # type: ignore[arg-type]


def req(i: int, t: float, deadline_s: float | None = None, priority: int = 10) -> QueuedRequest:
    return QueuedRequest(i, "a", t, priority, deadline_s)


def test_a_window_asks_for_one_wake_up_and_a_stale_one_does_nothing() -> None:
    act = Actions()
    s = scheduler_for(
        [setup({"policy": "fixed-window", "max_batch_size": 4, "max_batch_delay_ms": 5})], act
    )
    assert s.offer(req(1, 0.0), 0.0) is None
    assert act.wakes == [pytest.approx(0.005)] and not act.started
    s.offer(req(2, 0.001), 0.001)  # the same window: no second wake-up asked for
    assert len(act.wakes) == 1
    s.wake(act.wakes[0], 0.005)
    assert [b.items for b in act.started] == [2]
    assert act.ends == [(pytest.approx(0.005 + PROF.latency_s(2)), 1)]
    # A wake-up that comes with nothing due (never asked for again) changes nothing.
    s.wake(0.006, 0.006)
    assert len(act.started) == 1


def test_batch_ends_are_announced_and_superseded_with_several_instances() -> None:
    act = Actions()
    s = scheduler_for([setup("none")], act, DeviceOptions(instances=2))
    s.offer(req(1, 0.0), 0.0)
    first_end, token1 = act.ends[-1]
    assert first_end == pytest.approx(0.010)  # alone
    s.offer(req(2, 0.001), 0.001)  # a second batch slows both: announced again
    _, token2 = act.ends[-1]
    assert token2 != token1 and act.ends[-1][0] > first_end
    assert s.announced(token1) is None  # superseded
    due = s.announced(token2)
    assert due is act.started[0]
    s.finished(due, act.ends[-1][0])
    assert s.running() == [act.started[1]]


def test_the_deadline_watch_drops_at_the_hopeless_instant_without_planning() -> None:
    act = Actions()
    s = scheduler_for([setup("none")], act)
    s.offer(req(1, 0.0), 0.0)  # runs 0 .. 10 ms
    # Deadline 19 ms: even alone after the running batch it would end at 20 ms: refused.
    assert s.offer(req(2, 0.0, deadline_s=0.019), 0.0) == "deadline-infeasible"
    late = req(3, 0.0, deadline_s=0.025)  # feasible: would end at 20 ms
    assert s.offer(late, 0.0) is None
    hopeless = math.nextafter(0.025 - PROF.latency_s(1), math.inf)
    assert act.wakes == [hopeless]
    s.wake(hopeless, hopeless)  # the device is still busy: only the watch acts
    assert act.dropped == [(3, "deadline-expired")] and late.state == GONE
    assert len(act.started) == 1 and s.waiting == 0


def test_a_queue_set_shared_by_two_devices_is_served_by_the_free_one() -> None:
    act_a, act_b = Actions(), Actions()
    dropped: list[str] = []
    queues: QueueSet[QueuedRequest] = QueueSet(
        [setup("none")], lambda r, reason: dropped.append(reason), watch_deadlines=False
    )
    a = DeviceScheduler(queues, act_a)
    b = DeviceScheduler(queues, act_b)
    for i, dev in ((1, a), (2, b), (3, a)):
        assert queues.offer(req(i, 0.0), 0.0) is None
        dev.queues_changed(0.0)
    assert [len(x.started) for x in (act_a, act_b)] == [1, 1]
    assert queues.waiting == 1
    b.finished(act_b.started[0], 0.010)  # b frees first and takes the next request
    assert [r.request_id for r in act_b.started[1].requests] == [3]


def test_drain_refuses_and_flushes_a_waiting_batch() -> None:
    act = Actions()
    s = scheduler_for([setup({"policy": "static", "batch_size": 4})], act)
    for i in range(3):
        s.offer(req(i, 0.0), 0.0)
    assert not act.started
    s.begin_drain(0.0)
    assert [b.items for b in act.started] == [3]
    assert s.offer(req(9, 0.0), 0.0) == DRAINING


def test_the_snapshot_carries_how_the_device_batches() -> None:
    act = Actions()
    spec = {"policy": "fixed-window", "max_batch_size": 8, "max_batch_delay_ms": 0}
    s = scheduler_for([setup(spec)], act)
    s.offer(req(1, 0.0), 0.0)
    snap = s.snapshot(0.005)
    assert snap.max_batch_size == {"a": 8}
    assert snap.in_flight == 1 and snap.queue_depth == 0
    assert snap.utilization == pytest.approx(1.0)
    assert snap.busy_remaining_s == pytest.approx(0.005)
    assert snap.slo_s == {} and snap.max_queue == {}  # none given: none reported


def test_the_snapshot_carries_each_models_slo_and_queue_bound() -> None:
    spec = {"policy": "fixed-window", "max_batch_size": 8, "max_batch_delay_ms": 0}
    s = scheduler_for([setup(spec, slo_s=0.05, max_queue=64)], Actions())
    snap = s.snapshot(0.0)
    assert snap.slo_s == {"a": 0.05} and snap.max_queue == {"a": 64}
