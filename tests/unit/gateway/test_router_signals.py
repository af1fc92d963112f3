"""Router signals the gateway relies on: done() nets out completions; sampled-only overload."""

from __future__ import annotations

import random

from evenserve.core.types import LoadSample
from evenserve.policy.routing import ROUTING, Router


def test_done_settles_sends_but_never_goes_below_the_sample() -> None:
    r = Router(ROUTING.build("queue-aware", random.Random(0)), window=3)
    r.add_backend("a", ["m", "n"])
    r.observe("a", LoadSample(timestamp_s=0.0, queue_depth=2.0, queued_by_model={"m": 2.0}))
    for _ in range(3):
        r.sent("a", "m")
    assert r.view("a").queue_depth == 5.0
    r.done("a", "m")
    v = r.view("a")
    assert v.queue_depth == 4.0 and v.in_flight == 2 and v.queued_by_model["m"] == 4.0
    for _ in range(4):  # more completions than sends since the sample
        r.done("a", "m")
    v = r.view("a")
    assert v.queue_depth == 2.0 and v.in_flight == 0 and v.queued_by_model["m"] == 2.0


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


def test_all_overloaded_sampled_only_ignores_own_sends_and_stale_hosts() -> None:
    r = Router(ROUTING.build("queue-aware", random.Random(0)), window=3, stale_after_s=0.5)
    r.add_backend("a", ["m"])
    r.observe("a", LoadSample(timestamp_s=0.0, queue_depth=1.0))
    for _ in range(10):
        r.sent("a", "m")  # the router's own sends: running or queued, it cannot tell
    assert r.all_overloaded("m")
    assert not r.all_overloaded("m", sampled_only=True)
    r.observe("a", LoadSample(timestamp_s=0.1, queue_depth=20.0))
    r.observe("a", LoadSample(timestamp_s=0.2, queue_depth=20.0))
    assert r.all_overloaded("m", sampled_only=True)  # mean (1 + 20 + 20) / 3 > 5
    r.expire(1.0)
    assert not r.all_overloaded("m", sampled_only=True)  # stale: no evidence, no refusal
