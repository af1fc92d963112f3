"""step-down, adaptive, deadline, the request queue (order, admission, expiry, starvation) and
the class guard of the device choice."""

from __future__ import annotations

import math

import pytest

from evenserve.core.profile import LatencyProfile
from evenserve.core.types import Dispatch, QueueView, RequestInfo, WaitUntil
from evenserve.policy.batching import BATCHING
from evenserve.policy.batching.base import BatchingPolicy
from evenserve.policy.batching.device import NextBatch, next_batch
from evenserve.policy.batching.rate import RateEstimator
from evenserve.sched.queue import RequestQueue

MB = 1024.0 * 1024.0
PROF = LatencyProfile.from_points(
    "m", {1: 10.0, 4: 16.0, 8: 24.0, 32: 80.0}, memory_mb={1: 100, 4: 400, 8: 800, 32: 3200}
)


def reqs(
    arrivals: list[float], priority: int = 10, deadline: float | None = None
) -> list[RequestInfo]:
    return [
        RequestInfo(request_id=i, model="m", arrival_s=t, priority=priority, deadline_s=deadline)
        for i, t in enumerate(arrivals)
    ]


def view(
    rs: list[RequestInfo], free_mb: float | None = None, slo_s: float | None = None
) -> QueueView:
    return QueueView("m", rs, PROF, None if free_mb is None else free_mb * MB, slo_s)


def test_rate_estimator_tracks_and_decays() -> None:
    est = RateEstimator(0.2)
    for i in range(400):
        est.observe(i * 0.01)  # 100 per second
    assert est.rate_at(3.99) == pytest.approx(100.0, rel=0.05)
    assert est.rate_at(5.0) < 1.0


def test_step_down_steps_down_and_back_up() -> None:
    p = BATCHING.build({"policy": "step-down", "max_batch_size": 10, "window_batches": 2})
    assert p.decide(view(reqs([0.0])), 0.05) == WaitUntil(0.1)
    for _ in range(2):
        p.on_dispatch(3, 0.0)  # 30 % full
    assert p.decide(view(reqs([0.0])), 0.05) == Dispatch(1)  # now a 50 ms window
    for _ in range(2):
        p.on_dispatch(2, 0.0)
    assert p.delay_s == pytest.approx(0.030)  # type: ignore[attr-defined]
    for _ in range(2):
        p.on_dispatch(2, 0.0)
    assert p.delay_s == pytest.approx(0.030)  # type: ignore[attr-defined]  # floor
    for _ in range(2):
        p.on_dispatch(10, 0.0)  # full again
    assert p.delay_s == pytest.approx(0.050)  # type: ignore[attr-defined]


def test_adaptive_cap_rises_with_queue_and_respects_memory() -> None:
    p = BATCHING.build({"policy": "adaptive", "max_batch_size": 8, "max_batch_cap": 32})
    assert p.decide(view(reqs([0.0] * 3)), 0.0) == Dispatch(3)  # greedy
    assert p.decide(view(reqs([0.0] * 20)), 0.0) == Dispatch(20)  # cap followed the queue
    assert p.decide(view(reqs([0.0] * 50)), 0.0) == Dispatch(32)
    # 85 % of 1000 MB free: batches of 8 need 800 MB, 9 need ~900 MB
    assert p.decide(view(reqs([0.0] * 20), free_mb=1000), 0.0) == Dispatch(8)
    assert p.decide(view(reqs([0.0] * 20), free_mb=50), 0.0) == Dispatch(1)


def test_adaptive_waits_only_when_enabled_and_batches_cannot_keep_up() -> None:
    p = BATCHING.build({"policy": "adaptive", "max_delay_ms": 20})
    for i in range(100):
        p.on_arrival(i * 0.002)  # 500 per second; batches of 1 cannot keep up (10 ms each)
    dec = p.decide(view(reqs([0.198])), 0.198)
    assert isinstance(dec, WaitUntil) and 0.198 < dec.t_s <= 0.218
    slow = BATCHING.build({"policy": "adaptive", "max_delay_ms": 20})
    slow.on_arrival(0.0)
    slow.on_arrival(1.0)  # about one per second: batches of 1 keep up
    assert slow.decide(view(reqs([1.0])), 1.0) == Dispatch(1)


def test_deadline_sizes_batch_to_earliest_deadline() -> None:
    p = BATCHING.build({"policy": "deadline", "max_batch_size": 8, "margin_ms": 0})
    rs = reqs([0.0] * 8)
    rs[2].deadline_s = 0.017  # a batch of 4 takes 16 ms, of 8 takes 24 ms
    assert p.decide(view(rs), 0.0) == Dispatch(4)
    # defaults to arrival + SLO when a request carries no deadline
    assert p.decide(view(reqs([0.0] * 8), slo_s=0.020), 0.0) == Dispatch(6)
    # hopeless: nobody can make it, serve the lot
    assert p.decide(view(reqs([0.0] * 3, deadline=0.001)), 0.0) == Dispatch(3)


@pytest.mark.parametrize("name", ["step-down", "adaptive", "deadline"])
def test_new_policies_registered_and_validated(name: str) -> None:
    assert name in BATCHING.names()
    with pytest.raises(Exception, match="max_batch_size"):
        BATCHING.build({"policy": name, "max_batch_size": 0})


def test_queue_orders_by_class_then_deadline_then_arrival() -> None:
    q: RequestQueue[RequestInfo] = RequestQueue(slo_s=1.0)
    a = RequestInfo(1, "m", 0.0, priority=0)
    b = RequestInfo(2, "m", 0.1, priority=10)
    c = RequestInfo(3, "m", 0.2, priority=10, deadline_s=0.5)
    d = RequestInfo(4, "m", 0.3, priority=10)
    for r in (a, b, c, d):
        assert q.offer(r, 0.3).admitted
    assert [r.request_id for r in q.items] == [3, 2, 4, 1]
    assert [r.request_id for r in q.pop(2)] == [3, 2]
    assert len(q) == 2


def test_queue_admission_sheds_lowest_class_first() -> None:
    q: RequestQueue[RequestInfo] = RequestQueue(max_len=2)
    assert q.offer(RequestInfo(1, "m", 0.0, priority=0), 0.0).admitted
    assert q.offer(RequestInfo(2, "m", 0.0, priority=10), 0.0).admitted
    full = q.offer(RequestInfo(3, "m", 0.1, priority=0), 0.1)
    assert not full.admitted and full.reason == "queue-full"
    shed = q.offer(RequestInfo(4, "m", 0.1, priority=10), 0.1)
    assert shed.admitted and shed.evicted is not None and shed.evicted.request_id == 1
    assert q.offer(RequestInfo(5, "m", 0.1, priority=10), 0.1).reason == "queue-full"


def test_queue_refuses_infeasible_deadline_and_expires() -> None:
    q: RequestQueue[RequestInfo] = RequestQueue()
    r = RequestInfo(1, "m", 0.0, deadline_s=0.005)
    o = q.offer(r, 0.0, profile=PROF)  # a batch of one takes 10 ms
    assert not o.admitted and o.reason == "deadline-infeasible"
    ok = RequestInfo(2, "m", 0.0, deadline_s=0.05)
    assert q.offer(ok, 0.0, profile=PROF, busy_remaining_s=0.02).admitted
    late = q.offer(
        RequestInfo(3, "m", 0.0, deadline_s=0.05), 0.0, profile=PROF, busy_remaining_s=0.045
    )
    assert late.reason == "deadline-infeasible"
    assert q.expire(0.04) == []
    assert [x.request_id for x in q.expire(0.06)] == [2]
    assert len(q) == 0


def test_full_queue_first_lets_go_of_hopeless_requests() -> None:
    q: RequestQueue[RequestInfo] = RequestQueue(max_len=2)
    hopeless = RequestInfo(1, "m", 0.0, priority=10, deadline_s=0.05)
    q.offer(hopeless, 0.0, profile=PROF)
    q.offer(RequestInfo(2, "m", 0.0, priority=10), 0.0, profile=PROF)
    # At 45 ms a batch of one (10 ms) cannot end by 50 ms: it leaves rather than hold a place.
    o = q.offer(RequestInfo(3, "m", 0.045, priority=0), 0.045, profile=PROF)
    assert o.admitted and o.evicted is None and o.expired == (hopeless,)
    assert [r.request_id for r in q.items] == [2, 3]
    full = q.offer(RequestInfo(4, "m", 0.05, priority=0), 0.05, profile=PROF)
    assert full.reason == "queue-full" and full.expired == ()


def test_queue_starvation_bound_promotes() -> None:
    q: RequestQueue[RequestInfo] = RequestQueue(starvation_s=1.0)
    old = RequestInfo(1, "m", 0.0, priority=0)
    q.offer(old, 0.0)
    for i in range(5):
        q.offer(RequestInfo(10 + i, "m", 0.5 + i * 0.1, priority=10), 0.9)
    assert q.items[0].priority == 10
    assert q.promote_starved(0.9) == 0
    assert q.promote_starved(1.5) == 1
    assert q.items[0] is old


def fw(delay_ms: float) -> object:
    return BATCHING.build(
        {"policy": "fixed-window", "max_batch_size": 8, "max_batch_delay_ms": delay_ms}
    )


def test_lower_class_batch_may_not_delay_a_waiting_higher_class() -> None:
    online = QueueView("web", reqs([0.0], priority=10), PROF)
    offline = QueueView("batch", reqs([0.0, 0.0], priority=0), PROF)
    # online waits for its 5 ms window; an offline batch of 2 (~12 ms) would end after it
    nb = next_batch([(online, fw(5)), (offline, fw(0))], 0.001)  # type: ignore[list-item]
    assert nb.model is None and nb.wake_s == pytest.approx(0.005)
    # with a 50 ms window the offline batch fits in the valley
    nb = next_batch([(online, fw(50)), (offline, fw(0))], 0.001)  # type: ignore[list-item]
    assert (nb.model, nb.n) == ("batch", 2)


def test_starvation_bound_lets_offline_go_first() -> None:
    online = QueueView("web", reqs([5.0], priority=10), PROF)
    offline = QueueView("batch", reqs([0.0], priority=0), PROF)
    pol = fw(0)
    assert next_batch([(online, pol), (offline, pol)], 5.0).model == "web"  # type: ignore[list-item]
    nb = next_batch([(online, pol), (offline, pol)], 5.0, starvation_s=2.0)  # type: ignore[list-item]
    assert nb.model == "batch"
    assert math.isinf(next_batch([], 0.0).wake_s)


def test_work_held_back_by_the_headroom_wakes_when_the_demand_has_decayed() -> None:
    policy = BATCHING.build({"policy": "fixed-window", "max_batch_delay_ms": 0})
    per_item = PROF.per_item_s(8)
    rate = 2.0 * 0.5 / per_item  # online demand: twice the headroom of 0.5
    off = [RequestInfo(1, "off", 0.0, priority=0)]

    def choose(now: float, rate_rps: float, tau: float | None) -> NextBatch:
        views: list[tuple[QueueView, BatchingPolicy]] = [
            (QueueView("off", off, PROF, None, 1.0, 0.0, 0), policy),
            (QueueView("on", [], PROF, None, 0.1, rate_rps, 10), policy),
        ]
        return next_batch(views, now, class_headroom=0.5, rate_tau_s=tau)

    held = choose(1.0, rate, None)
    assert held.model is None and held.wake_s == math.inf
    held = choose(1.0, rate, 0.2)
    # Rates decay as exp(-dt / tau): the demand halves to the headroom after tau * ln 2.
    assert held.model is None
    assert held.wake_s == pytest.approx(1.0 + 0.2 * math.log(2.0), abs=1e-5)
    decayed = rate * math.exp(-(held.wake_s - 1.0) / 0.2)
    assert choose(held.wake_s, decayed, 0.2).model == "off"


def test_every_starved_request_is_promoted_however_the_promoted_sort() -> None:
    """Regression: promoting one request moved it ahead of the others still to promote, and
    the next removal by position took the wrong request (the oldest stayed unpromoted)."""
    q: RequestQueue[RequestInfo] = RequestQueue(slo_s=1.0, starvation_s=0.5)
    low1, low2, top = (
        RequestInfo(1, "m", 0.0, 0),
        RequestInfo(2, "m", 0.1, 0),
        RequestInfo(3, "m", 0.2, 10),
    )
    for r in (low1, low2, top):
        q.offer(r, r.arrival_s)
    assert q.promote_starved(1.0) == 2
    assert [(r.request_id, r.priority) for r in q.items] == [(1, 10), (2, 10), (3, 10)]
