"""Router signals the gateway relies on: done() nets out completions; refusal on evidence."""

from __future__ import annotations

import random

from evenserve.core.profile import LatencyProfile
from evenserve.core.types import LoadSample
from evenserve.policy.routing import ROUTING, Router


def test_done_settles_sends_and_then_the_reported_queue() -> None:
    r = Router(ROUTING.build("queue-aware", random.Random(0)), window=3)
    r.add_backend("a", ["m", "n"])
    for _ in range(2):  # waiting there when it reports
        r.sent("a", "m")
    r.observe("a", LoadSample(timestamp_s=0.0, queue_depth=2.0, queued_by_model={"m": 2.0}))
    for _ in range(3):
        r.sent("a", "m")
    assert r.view("a").queue_depth == 5.0
    r.done("a", "m")
    v = r.view("a")
    assert v.queue_depth == 4.0 and v.in_flight == 4 and v.queued_by_model["m"] == 4.0
    for _ in range(3):  # more answers than sends since the report: it drained below it
        r.done("a", "m")
    v = r.view("a")
    assert v.queue_depth == 1.0 and v.in_flight == 1 and v.queued_by_model["m"] == 1.0
    for _ in range(3):  # never more than were sent, never below zero
        r.done("a", "m")
    v = r.view("a")
    assert v.queue_depth == 0.0 and v.in_flight == 0 and v.queued_by_model["m"] == 0.0
    r.done("a", "n")  # nothing of n was sent: nothing to settle
    assert r.view("a").queued_by_model == {"m": 0.0}


def test_done_on_stale_backend_counts_down() -> None:
    r = Router(ROUTING.build("queue-aware", random.Random(0)), window=3, stale_after_s=0.5)
    r.add_backend("a", ["m"])
    r.observe("a", LoadSample(timestamp_s=0.0, queue_depth=0.0))
    r.expire(1.0)
    r.sent("a", "m")
    r.sent("a", "m")
    r.done("a", "m")
    assert r.view("a").queue_depth == 1.0 and r.view("a").in_flight == 1
    r.done("nope", "m")  # unknown backend: ignored


def test_refusal_judges_the_sampled_queues_not_own_sends_and_never_stale_hosts() -> None:
    r = Router(ROUTING.build("queue-aware", random.Random(0)), window=3, stale_after_s=0.5)
    r.add_backend("a", ["m"], profiles={"m": LatencyProfile.from_points("m", {1: 10.0, 8: 40.0})})

    def report(t: float, q: float) -> None:
        r.observe(
            "a",
            LoadSample(
                timestamp_s=t,
                queue_depth=q,
                queued_by_model={"m": q},
                max_batch_size={"m": 8},
                slo_s={"m": 0.1},
            ),
        )

    report(0.0, 1.0)
    for _ in range(40):
        r.sent("a", "m")  # the router's own sends: running or queued, it cannot tell
    assert r.view("a").queued_by_model["m"] == 41.0
    assert r.refusal("m", 0.0) is None
    report(0.1, 40.0)
    report(0.2, 40.0)
    assert r.refusal("m", 0.2) is not None  # mean (1 + 40 + 40) / 3 = 27: 3 batches ahead
    r.expire(1.0)
    assert r.refusal("m", 1.0) is None  # stale: no evidence, no refusal
