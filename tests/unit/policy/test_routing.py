"""Table-driven tests of every routing policy: given these backend views, this pick."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from evenserve.core.profile import LatencyProfile
from evenserve.policy.registry import PolicySpecError
from evenserve.policy.routing import ROUTING
from evenserve.policy.routing.queue_aware import QueueAware, QueueAwareParams
from tests.unit.policy.helpers import req, view


def pick(spec: object, views: list, seed: int = 0, model: str = "m") -> str:
    policy = ROUTING.build(spec, random.Random(seed))
    return str(policy.choose(req(model), views, 0.0).name)


def test_registry_has_every_policy() -> None:
    assert set(ROUTING.names()) >= {
        "round-robin",
        "least-connections",
        "weighted-random",
        "queue-aware",
        "power-of-two",
        "least-expected-work",
    }


def test_round_robin_cycles_per_model() -> None:
    policy = ROUTING.build("round-robin")
    vs = [view("a"), view("b"), view("c")]
    picks = [policy.choose(req("m"), vs, 0.0).name for _ in range(6)]
    assert picks == ["a", "b", "c", "a", "b", "c"]
    # another model has its own cursor
    assert policy.choose(req("other"), vs[:2], 0.0).name == "a"


@pytest.mark.parametrize(
    ("views", "expected"),
    [
        ([view("a", inflight=3), view("b", inflight=1), view("c", inflight=2)], "b"),
        ([view("a", inflight=0), view("b", inflight=5)], "a"),
    ],
)
def test_least_connections(views: list, expected: str) -> None:
    assert pick("least-connections", views) == expected


def test_least_connections_ties_rotate() -> None:
    policy = ROUTING.build("least-connections")
    vs = [view("a"), view("b"), view("c")]
    picks = {policy.choose(req(), vs, 0.0).name for _ in range(3)}
    assert picks == {"a", "b", "c"}


def test_weighted_random_follows_weights() -> None:
    policy = ROUTING.build(
        {"policy": "weighted-random", "weights": {"a": 3.0, "b": 1.0, "c": 0.0}}, random.Random(7)
    )
    vs = [view("a"), view("b"), view("c")]
    counts = Counter(policy.choose(req(), vs, 0.0).name for _ in range(4000))
    assert counts["c"] == 0
    assert 2.5 < counts["a"] / counts["b"] < 3.5


def test_weighted_random_rejects_negative_weight() -> None:
    with pytest.raises(PolicySpecError, match="weights"):
        ROUTING.build({"policy": "weighted-random", "weights": {"a": -1}})


@pytest.mark.parametrize(
    ("views", "expected", "why"),
    [
        (
            [view("a", q=4, util=0.5), view("b", q=1, util=0.5)],
            "b",
            "shorter queue",
        ),
        (
            [view("a", q=2, util=0.9), view("b", q=2, util=0.2)],
            "b",
            "same queue, lower utilization",
        ),
        (
            [view("a", q=1, util=0.3, free_gb=1.0), view("b", q=1, util=0.3, free_gb=20.0)],
            "b",
            "same queue and utilization, more free memory",
        ),
        (
            [view("a", q=0, util=0.9, free_gb=1.0), view("b", q=3, util=0.5)],
            "b",
            "a is soft-overloaded: util > 85 % and free < 2 GB",
        ),
        (
            [view("a", q=1, util=None), view("b", q=1, util=0.6)],
            "b",
            "unknown utilization counts as busy, not idle",
        ),
    ],
)
def test_queue_aware(views: list, expected: str, why: str) -> None:
    assert pick("queue-aware", views) == expected, why


def test_queue_aware_all_overloaded_still_picks_best() -> None:
    vs = [view("a", q=9, util=0.9, free_gb=1.0), view("b", q=7, util=0.9, free_gb=1.0)]
    assert pick("queue-aware", vs) == "b"


def test_queue_aware_steers_away_from_a_host_past_the_slo_but_never_refuses() -> None:
    # a: 16 queued = 2 full batches (4 ms) + its own (1 ms); b has nothing queued but is
    # busy for 2.5 ms and hot. Past an SLO of 4.5 ms, a is soft-overloaded: b is picked
    # despite its score.
    fast = LatencyProfile.from_points("m", {1: 1.0, 8: 2.0})
    a = view("a", q=16, queued={"m": 16}, util=0.0, profiles={"m": fast}, max_batch={"m": 8})
    b = view("b", q=0, util=0.84, busy_remaining_s=0.0025, profiles={"m": fast})
    b.max_batch_size = {"m": 8}
    assert pick("queue-aware", [a, b]) == "a"  # no SLO known: the score decides
    a.slo_s = b.slo_s = {"m": 0.0045}
    assert pick("queue-aware", [a, b]) == "b"
    b.busy_remaining_s = 0.010  # both past the SLO: the best score, never no answer
    assert pick("queue-aware", [a, b]) == "a"


def test_queue_aware_measures_the_queue_in_seconds_of_work() -> None:
    # The same 8 queued on a device 2.5x slower is 2.5x the work: the articles' count could
    # not tell them apart.
    fast = LatencyProfile.from_points("m", {1: 4.6, 8: 8.8})
    slow = LatencyProfile.from_points("m", {1: 11.5, 8: 22.0})
    vs = [
        view("slow", q=8, queued={"m": 8}, util=0.5, profiles={"m": slow}, max_batch={"m": 8}),
        view("fast", q=9, queued={"m": 9}, util=0.5, profiles={"m": fast}, max_batch={"m": 8}),
    ]
    assert pick("queue-aware", vs) == "fast"


def test_queue_aware_scores_in_range_and_weights_are_parameters() -> None:
    p = QueueAware(QueueAwareParams(queue_weight=1.0, utilization_weight=0.0, memory_weight=0.0))
    vs = [view("a", q=2, util=1.0), view("b", q=4, util=0.0)]
    # no profiles, nothing learned: (queue + 1) x 10 ms, 30 and 50 ms
    assert p.scores(req(), vs, 0.0) == [pytest.approx(0.6), pytest.approx(1.0)]
    assert p.choose(req(), vs, 0.0).name == "a"
    default = QueueAware(QueueAwareParams())
    for s in default.scores(req(), vs, 0.0):
        assert 0.0 <= s <= 1.0


def test_queue_aware_ties_spread_a_burst() -> None:
    policy = ROUTING.build("queue-aware")
    vs = [view("a"), view("b"), view("c"), view("d")]
    picks = Counter(policy.choose(req(), vs, 0.0).name for _ in range(8))
    assert set(picks.values()) == {2}


def test_power_of_two_prefers_less_loaded_of_sample() -> None:
    vs = [view("a", q=10), view("b", q=0)]
    policy = ROUTING.build("power-of-two", random.Random(1))
    assert all(policy.choose(req(), vs, 0.0).name == "b" for _ in range(20))


def test_power_of_two_never_picks_the_worst_of_three() -> None:
    vs = [view("a", q=0), view("b", q=5), view("c", q=50)]
    policy = ROUTING.build("power-of-two", random.Random(3))
    picks = Counter(policy.choose(req(), vs, 0.0).name for _ in range(300))
    assert picks["c"] == 0
    assert picks["a"] > picks["b"]


def test_power_of_two_single_backend() -> None:
    assert pick("power-of-two", [view("only", q=100)]) == "only"


PROF_FAST = LatencyProfile.from_points("m", {1: 1.0, 8: 2.0})
PROF_SLOW = LatencyProfile.from_points("m", {1: 10.0, 8: 20.0})


@pytest.mark.parametrize(
    ("views", "expected", "why"),
    [
        (
            [
                view("a", queued={"m": 8}, profiles={"m": PROF_FAST}, max_batch={"m": 8}),
                view("b", queued={"m": 0}, profiles={"m": PROF_SLOW}, max_batch={"m": 8}),
            ],
            "a",
            "a: 2 ms backlog + its batch of 1 (1 ms) = 3 ms < b: 10 ms",
        ),
        (
            [
                view("a", busy_remaining_s=0.05, profiles={"m": PROF_FAST}, max_batch={"m": 8}),
                view("b", busy_remaining_s=0.0, profiles={"m": PROF_FAST}, max_batch={"m": 8}),
            ],
            "b",
            "a is busy for 50 ms more",
        ),
        (
            [
                view(
                    "a",
                    queued={"other": 16},
                    profiles={"m": PROF_FAST, "other": PROF_SLOW},
                    max_batch={"m": 8, "other": 8},
                ),
                view("b", queued={"m": 4}, profiles={"m": PROF_FAST}, max_batch={"m": 8}),
            ],
            "b",
            "work of other models queued on a device counts",
        ),
    ],
)
def test_least_expected_work(views: list, expected: str, why: str) -> None:
    assert pick("least-expected-work", views) == expected, why


def test_least_expected_work_ages_the_sampled_busy_time() -> None:
    a = view("a", busy_remaining_s=0.050, profiles={"m": PROF_FAST}, max_batch={"m": 8})
    b = view("b", queued={"m": 16}, profiles={"m": PROF_FAST}, max_batch={"m": 8})
    a.sampled_at_s = b.sampled_at_s = 0.0
    policy = ROUTING.build("least-expected-work")
    assert policy.choose(req(), [a, b], 0.0).name == "b"  # a: 51 ms, b: 4 + 1 ms
    assert policy.choose(req(), [a, b], 0.048).name == "a"  # a: 2 + 1 ms left


def test_least_expected_work_counts_its_own_in_flight_without_signals() -> None:
    # Stale signals say nothing; the router's own count does: a holds 16 of ours.
    a = view("a", fresh=False, profiles={"m": PROF_FAST}, max_batch={"m": 8})
    b = view("b", fresh=False, profiles={"m": PROF_FAST}, max_batch={"m": 8})
    a.in_flight_by_model, a.in_flight = {"m": 16}, 16
    b.in_flight_by_model, b.in_flight = {"m": 1}, 1
    assert pick("least-expected-work", [a, b]) == "b"


def test_least_expected_work_learns_speed_without_a_profile() -> None:
    # No profile anywhere: the router's learned seconds per request in flight tell a device
    # 2.5x slower apart; with 2 in flight on the fast one and 1 on the slow one, fast wins.
    fast = view("fast", inflight=2)
    slow = view("slow", inflight=1)
    fast.latency_per_request_s = {"m": 0.004}
    slow.latency_per_request_s = {"m": 0.010}
    assert pick("least-expected-work", [fast, slow]) == "fast"  # 12 ms < 20 ms
    slow.latency_per_request_s = {}
    fast.latency_per_request_s = {}
    assert pick("least-expected-work", [fast, slow]) == "slow"  # fallback: fewer in flight


def test_least_expected_work_penalises_stale() -> None:
    vs = [
        view("a", fresh=False, profiles={"m": PROF_FAST}, max_batch={"m": 8}),
        view("b", queued={"m": 3}, profiles={"m": PROF_FAST}, max_batch={"m": 8}),
    ]
    assert pick("least-expected-work", vs) == "b"


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("no-such-policy", "unknown routing policy 'no-such-policy'"),
        ({"policy": "queue-aware", "queue_weight": -1}, "queue_weight"),
        ({"policy": "queue-aware", "bogus": 1}, "bogus"),
        ({"queue_weight": 1}, "policy: required"),
        (42, "expected a policy name"),
    ],
)
def test_bad_specs_name_the_field(spec: object, needle: str) -> None:
    with pytest.raises(PolicySpecError) as err:
        ROUTING.build(spec)
    assert needle in str(err.value)


def test_power_of_two_draws_what_random_sample_draws() -> None:
    """The fast path of power-of-two takes the same two backends from the same stream as
    ``random.sample`` (so seeded runs did not change when it replaced it)."""
    import random

    from evenserve.policy.routing.power_of_two import two_distinct

    for n in (2, 3, 21, 22, 64):
        for seed in range(20):
            a, b = random.Random(seed), random.Random(seed)
            for _ in range(30):
                assert tuple(a.sample(range(n), 2)) == two_distinct(b, n)
