"""Router signals the gateway relies on: done() nets out completions; refusal on evidence."""

from __future__ import annotations

import random

from evenserve.core.profile import LatencyProfile
from evenserve.core.types import LoadSample
from evenserve.policy.routing import ROUTING, Router
from evenserve.policy.routing.refusal import refusal


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


def _plain_refusal(r: Router, model: str, now_s: float) -> str | None:
    """The refusal rule applied anew to the router's current state (no kept verdict)."""
    hosts = r.candidates(model)
    return refusal(model, hosts, now_s, [r._backends[b.name].sampled_queued for b in hosts])


def test_refusal_kept_verdicts_are_the_rule_applied_anew_on_random_states() -> None:
    """``Router.refusal`` keeps the host that could take a request while its evidence holds;
    after every kind of change (reports, staleness, sends and answers, health, models and
    profiles, batch caps, the clock forward and back) it says what the rule says anew."""
    fast = LatencyProfile.from_points("m", {1: 10.0, 8: 40.0})
    slow = LatencyProfile.from_points("m", {1: 30.0, 8: 120.0})
    other = LatencyProfile.from_points("n", {1: 5.0, 4: 12.0})
    rng = random.Random(7)
    names = ["a", "b", "c"]
    compared = refused = kept = 0
    for trial in range(60):
        r = Router(ROUTING.build("queue-aware", random.Random(trial)), window=2, stale_after_s=0.5)
        for name in names:
            r.add_backend(name, ["m", "n"], profiles={"m": fast, "n": other})
        now = 0.0
        for _ in range(120):
            op = rng.random()
            name = rng.choice(names)
            if op < 0.3:
                q = rng.choice([0.0, 3.0, 9.0, 20.0, 40.0, 70.0])
                r.observe(
                    name,
                    LoadSample(
                        timestamp_s=now - rng.choice([0.0, 0.01, 0.05]),
                        queue_depth=q,
                        queued_by_model={"m": q, "n": rng.choice([0.0, 2.0, 6.0])},
                        busy_remaining_s=rng.choice([0.0, 0.02, 0.08, 0.3]),
                        max_batch_size={"m": rng.choice([4, 8]), "n": 4},
                        slo_s=rng.choice([{"m": 0.1}, {"m": 0.2, "n": 0.05}, {}]),
                        max_queue=rng.choice([{"m": 64}, {"m": 16}, {}]),
                    ),
                )
            elif op < 0.45:
                r.sent(name, "m", now)
            elif op < 0.55:
                r.done(name, "m", now_s=now)
            elif op < 0.6:
                r.expire(now)
            elif op < 0.64:
                r.set_healthy(name, rng.random() < 0.7)
            elif op < 0.67:
                r.set_models(name, rng.choice([["m", "n"], ["m"], ["n"]]))
            elif op < 0.7:
                r.set_models(name, ["m", "n"], profiles={"m": rng.choice([fast, slow]), "n": other})
            elif op < 0.72:
                r.update_max_batch_size(name, {"m": rng.choice([1, 4, 8])})
            elif op < 0.95:
                now += rng.choice([0.0, 0.001, 0.01, 0.03, 0.2])
            else:
                now -= 0.02  # the clock may go back: nothing kept may be taken then
            for model in ("m", "n"):
                for t in (now, now + 0.005):
                    before = model in r._takers
                    got = r.refusal(model, t)
                    assert got == _plain_refusal(r, model, t), (trial, model, t)
                    compared += 1
                    refused += got is not None
                    kept += before and got is None
    # Both kinds of verdict were met, and kept ones were used.
    assert refused > 500 and kept > 5000 and compared == 60 * 120 * 4, (refused, kept, compared)
