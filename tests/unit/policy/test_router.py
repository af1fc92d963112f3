from __future__ import annotations

import pytest

from evenserve.core.profile import LatencyProfile
from evenserve.core.types import LoadSample, RequestInfo
from evenserve.policy.routing import ROUTING, Router
from evenserve.policy.routing.router import LEARN_MIN_ANSWERS
from tests.unit.policy.helpers import req

GB = 1024.0**3


def sample(t: float, q: float, util: float = 0.5, free_gb: float = 10.0) -> LoadSample:
    return LoadSample(
        timestamp_s=t,
        queue_depth=q,
        utilization=util,
        memory_used_bytes=(24 - free_gb) * GB,
        memory_total_bytes=24 * GB,
        queued_by_model={"m": q},
    )


def make_router(policy: str = "queue-aware", **kw: object) -> Router:
    r = Router(ROUTING.build(policy), **kw)  # type: ignore[arg-type]
    r.add_backend("a", ["m", "x"])
    r.add_backend("b", ["m"])
    return r


def test_only_hosts_of_the_model_are_candidates() -> None:
    r = make_router()
    assert [v.name for v in r.candidates("m")] == ["a", "b"]
    assert [v.name for v in r.candidates("x")] == ["a"]
    assert r.choose(req("unknown"), 0.0) is None


def test_window_average_of_last_three_samples() -> None:
    r = make_router(window=3)
    for t, q in [(0.0, 30.0), (0.1, 3.0), (0.2, 6.0), (0.3, 9.0)]:
        r.observe("a", sample(t, q))
    v = r.view("a")
    assert v.queue_depth == pytest.approx(6.0)  # (3 + 6 + 9) / 3, the 30 fell out
    assert v.utilization == pytest.approx(0.5)
    assert v.memory_free_bytes == pytest.approx(10 * GB)
    assert v.signals_fresh


def test_sends_between_polls_count_until_next_sample() -> None:
    r = make_router()
    r.observe("a", sample(0.0, 0.0))
    r.observe("b", sample(0.0, 0.0))
    for _ in range(3):
        r.sent("a", "m")
    assert r.view("a").queue_depth == pytest.approx(3.0)
    assert r.view("a").in_flight == 3
    assert r.view("a").queued_by_model["m"] == pytest.approx(3.0)
    r.observe("a", sample(0.1, 2.0))
    # new sample: own-send counter resets, mean of (0, 2) is 1
    assert r.view("a").queue_depth == pytest.approx(1.0)
    assert r.view("a").in_flight == 3
    r.done("a", "m")
    assert r.view("a").in_flight == 2
    # an answer after the sample: one fewer waits there than the sampled mean says
    assert r.view("a").queue_depth == pytest.approx(0.0)
    assert r.view("a").queued_by_model == {"m": pytest.approx(0.0)}


def test_completions_net_out_sends_between_polls() -> None:
    r = make_router()
    r.observe("a", sample(0.0, 2.0))
    for _ in range(50):
        r.sent("a", "m")
        r.done("a", "m")
    # 50 requests came and went between two polls: the backend is not 50 deep
    assert r.view("a").queue_depth == pytest.approx(2.0)
    assert r.view("a").queued_by_model["m"] == pytest.approx(2.0)
    assert r.view("a").in_flight == 0


def test_burst_between_polls_spreads_out() -> None:
    r = make_router("queue-aware")
    r.observe("a", sample(0.0, 0.0, util=0.1))
    r.observe("b", sample(0.0, 0.0, util=0.1))
    picks = []
    for i in range(10):
        v = r.choose(req("m", rid=i), 0.0)
        assert v is not None
        r.sent(v.name, "m")
        picks.append(v.name)
    assert picks.count("a") == 5 and picks.count("b") == 5


def test_stale_backend_becomes_unknown_not_idle() -> None:
    r = make_router(stale_after_s=0.5)
    r.observe("a", sample(0.0, 0.0, util=0.0))
    r.observe("b", sample(0.0, 4.0, util=0.9))
    assert r.expire(0.4) == []
    r.observe("b", sample(0.6, 4.0, util=0.9))
    assert r.expire(0.7) == ["a"]
    v = r.view("a")
    assert not v.signals_fresh
    assert v.utilization is None and v.memory_free_bytes is None
    assert v.queue_depth == 0.0
    assert r.signal_age_s("a", 0.7) == pytest.approx(0.7)


def test_unhealthy_backends_are_skipped_and_readmitted() -> None:
    r = make_router("round-robin")
    r.set_healthy("a", False)
    assert [r.choose(req("m"), 0.0).name for _ in range(3)] == ["b", "b", "b"]  # type: ignore[union-attr]
    assert r.choose(req("x"), 0.0) is None
    r.set_healthy("a", True)
    assert {r.choose(req("m"), 0.0).name for _ in range(2)} == {"a", "b"}  # type: ignore[union-attr]


def test_exclude_for_retries() -> None:
    r = make_router("round-robin")
    v = r.choose(req("m"), 0.0, exclude=["a"])
    assert v is not None and v.name == "b"
    assert r.choose(req("m"), 0.0, exclude=["a", "b"]) is None


def test_refusal_takes_the_reported_slo_and_the_profiles() -> None:
    prof = LatencyProfile.from_points("m", {1: 10.0, 8: 40.0})
    r = Router(ROUTING.build("round-robin"))
    for n in ("a", "b"):
        r.add_backend(n, ["m"], profiles={"m": prof})

    def report(name: str, t: float, q: float, slo: dict[str, float] | None) -> None:
        r.observe(
            name,
            LoadSample(
                timestamp_s=t,
                queue_depth=q,
                queued_by_model={"m": q},
                max_batch_size={"m": 8},
                slo_s=slo or {},
            ),
        )

    for n in ("a", "b"):
        report(n, 0.0, 24.0, None)
    assert r.refusal("m", 0.0) is None  # no SLO reported: no evidence, no refusal
    for n in ("a", "b"):
        report(n, 0.0, 24.0, {"m": 0.1})
    why = r.refusal("m", 0.0)
    assert why is not None and "predicted wait 120 ms > SLO 100 ms" in why
    r.set_healthy("b", False)
    assert r.refusal("m", 0.0) is not None  # the healthy hosts only
    r.set_healthy("b", True)
    for t in (0.1, 0.2, 0.3):
        report("b", t, 0.0, {"m": 0.1})
    assert r.refusal("m", 0.3) is None


def test_router_counts_its_own_in_flight_per_model() -> None:
    r = make_router()
    for m in ("m", "m", "x"):
        r.sent("a", m)
    assert r.view("a").in_flight_by_model == {"m": 2, "x": 1}
    r.done("a", "m", 5)  # more than were sent: never below zero
    r.done("a", "x")
    assert r.view("a").in_flight_by_model == {"m": 0, "x": 0}
    assert r.view("a").in_flight == 0


def test_router_learns_each_backends_seconds_per_request_from_its_answers() -> None:
    r = make_router()
    for k in range(LEARN_MIN_ANSWERS):
        r.sent("a", "m", float(k))  # nothing in flight before it: 30 ms per request
        if k < LEARN_MIN_ANSWERS - 1:
            r.done("a", "m", now_s=k + 0.030)
            # Not used before LEARN_MIN_ANSWERS answers: one cold answer brands no backend.
            assert r.view("a").latency_per_request_s == {}
    r.done("a", "m", now_s=LEARN_MIN_ANSWERS - 1 + 0.030)
    assert r.view("a").latency_per_request_s == {"m": pytest.approx(0.030)}
    for _ in range(LEARN_MIN_ANSWERS):
        r.sent("b", "m", 10.0)  # 0, 1, 2 and 3 in flight before each
    r.done("b", "m", LEARN_MIN_ANSWERS, now_s=10.060)  # 60, 30, 20, 15 ms per request
    x = r.view("b").latency_per_request_s["m"]
    assert 0.015 < x < 0.060
    r.sent("a", "m", 20.0)
    r.done("a", "m")  # a failure or a refusal: no time, nothing learned
    assert r.view("a").latency_per_request_s == {"m": pytest.approx(0.030)}
    r.sent("a", "m", 30.0)
    r.done("a", "m", now_s=30.130)  # answered: a running mean over the first 1/alpha
    n = LEARN_MIN_ANSWERS + 1
    assert r.view("a").latency_per_request_s["m"] == pytest.approx(0.030 + (0.1 / n))


def test_a_cold_first_answer_does_not_starve_a_backend() -> None:
    """One slow first answer (a model warming up) must not keep a backend from traffic."""
    r = make_router("least-expected-work")
    r.sent("a", "m", 0.0)
    r.done("a", "m", now_s=0.5)  # 500 ms: cold
    for k in range(LEARN_MIN_ANSWERS):
        r.sent("b", "m", 1.0 + k)
        r.done("b", "m", now_s=1.0 + k + 0.003)
    req = RequestInfo(request_id=1, model="m", arrival_s=10.0)
    # Four in flight on b (3 ms each): a, untrusted at one answer, costs the fallback (10 ms).
    for _ in range(4):
        r.sent("b", "m", 10.0)
    view = r.choose(req, 10.0)
    assert view is not None and view.name == "a"


def test_policy_swap_takes_effect_on_next_decision() -> None:
    r = make_router("round-robin")
    r.observe("a", sample(0.0, 9.0))
    r.observe("b", sample(0.0, 0.0))
    assert r.choose(req("m"), 0.0).name == "a"  # type: ignore[union-attr]
    r.set_policy(ROUTING.build("queue-aware"))
    assert r.choose(req("m"), 0.0).name == "b"  # type: ignore[union-attr]


def test_how_a_backend_batches_comes_from_its_own_reports() -> None:
    """The worker says how it batches each model; the router passes it to the policies (so a
    cluster file cannot disagree with the worker: the least-expected-work gap of issue 10)."""
    r = Router(ROUTING.build("least-expected-work"))
    r.add_backend("a", ["m"], max_batch_size={"m": 1})
    r.observe("a", LoadSample(timestamp_s=0.0, queue_depth=0.0, max_batch_size={"m": 8}))
    assert r.view("a").max_batch_size == {"m": 8}
    r.observe("a", LoadSample(timestamp_s=0.1, queue_depth=0.0))  # a report without it
    assert r.view("a").max_batch_size == {"m": 8}


def test_done_settles_several_requests_as_one_call_each() -> None:
    one, many = make_router(), make_router()
    for r in (one, many):
        r.observe("a", sample(0.0, 2.0))
        for _ in range(5):
            r.sent("a", "m")
    for _ in range(3):
        one.done("a", "m")
    many.done("a", "m", 3)
    for field in ("in_flight", "queue_depth", "queued_by_model"):
        assert getattr(one.view("a"), field) == getattr(many.view("a"), field)


@pytest.mark.parametrize("policy", ["least-expected-work", "queue-aware"])
def test_a_backend_not_yet_measured_is_assumed_as_fast_as_the_fastest(policy: str) -> None:
    """Optimism: with a pessimistic default, one measured fast backend would take every
    request and the others would never be measured (64 backends: 1,875 of 2,064 on one)."""
    r = Router(ROUTING.build(policy))
    for n in ("a", "b", "c"):
        r.add_backend(n, ["m"])
    for k in range(LEARN_MIN_ANSWERS):
        r.sent("a", "m", float(k))
        r.done("a", "m", now_s=k + 0.001)  # a: 1 ms per request, measured
    r.sent("a", "m", 10.0)  # one in flight on a: 2 ms there, 1 ms (assumed) on b or c
    view = r.choose(RequestInfo(request_id=1, model="m", arrival_s=10.0), 10.0)
    assert view is not None and view.name in ("b", "c")


# -- set_models: a backend's model set changes at run time (the gateway learns it) ---------------
def test_set_models_changes_candidates_and_keeps_the_backends_signals() -> None:
    r = make_router()
    r.observe("a", sample(0.0, 4.0))
    r.sent("a", "m", 0.0)
    r.set_models("a", ["x", "y"])
    assert [v.name for v in r.candidates("m")] == ["b"]
    assert [v.name for v in r.candidates("y")] == ["a"]
    assert r.models_of("a") == frozenset({"x", "y"})
    v = r.view("a")
    # The window and the in-flight request of the removed model are kept...
    assert v.signals_fresh and v.queue_depth == pytest.approx(5.0) and v.in_flight == 1
    assert v.in_flight_by_model == {"m": 1}
    # ...and its answer settles the count (no leak).
    r.done("a", "m", now_s=0.1)
    assert v.in_flight == 0 and v.in_flight_by_model.get("m", 0) == 0
    assert "m" not in v.latency_per_request_s


def test_set_models_drops_a_removed_models_learned_speed_and_profile() -> None:
    r = make_router()
    prof = LatencyProfile.from_points("m", {1: 0.01})
    r.set_models("a", ["m", "x"], profiles={"m": prof, "other": prof})
    assert dict(r.view("a").profiles) == {"m": prof}  # only models it hosts
    for i in range(LEARN_MIN_ANSWERS):
        r.sent("a", "m", float(i))
        r.done("a", "m", now_s=float(i) + 0.5)
    assert r.view("a").latency_per_request_s["m"] == pytest.approx(0.5)
    r.set_models("a", ["x"])
    v = r.view("a")
    assert "m" not in v.latency_per_request_s and "m" not in v.profiles
    assert "m" not in v.in_flight_by_model  # nothing out: its count is dropped too
    # Learned again from scratch when it comes back.
    r.set_models("a", ["m", "x"])
    assert "m" not in v.latency_per_request_s
    assert [b.name for b in r.candidates("m")] == ["a", "b"]


def test_set_models_keeps_health_and_the_view_object() -> None:
    r = make_router()
    view = r.view("b")
    r.set_healthy("b", False)
    r.set_models("b", ["m", "z"])
    assert r.candidates("z") == ()
    r.set_healthy("b", True)
    assert r.candidates("z") == [view]
    assert r.choose(req("z"), 0.0) is view
    with pytest.raises(KeyError):
        r.set_models("nope", ["m"])
