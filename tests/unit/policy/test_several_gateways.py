"""Several gateways in front of the same backends (design 0013): routers that count their
peers' share of the sends do not all pile onto the backend that looked idle at the last
report."""

from __future__ import annotations

import pytest

from evenserve.core.types import LoadSample
from evenserve.policy.routing import ROUTING, Router
from evenserve.policy.routing.router import PEER_WEIGHT
from tests.unit.policy.helpers import req

NAMES = ["a", "b", "c", "d"]
#: The report every gateway heard: a idle, the others 6 deep.
REPORTED = {"a": 0.0, "b": 6.0, "c": 6.0, "d": 6.0}


def router(replicas: int, policy: str = "least-expected-work", peer_weight: float = 1.0) -> Router:
    r = Router(ROUTING.build(policy), replicas=replicas, peer_weight=peer_weight)
    for n in NAMES:
        r.add_backend(n, ["m"])
        q = REPORTED[n]
        r.observe(n, LoadSample(timestamp_s=0.0, queue_depth=q, queued_by_model={"m": q}))
    return r


def burst(
    replicas: int,
    gateways: int = 2,
    each: int = 6,
    policy: str = "least-expected-work",
    peer_weight: float = 1.0,
) -> dict[str, float]:
    """Each of ``gateways`` routers routes ``each`` requests before the next report; the
    backends' true queues after (reported + every gateway's sends)."""
    routers = [router(replicas, policy, peer_weight) for _ in range(gateways)]
    truth = dict(REPORTED)
    for _ in range(each):
        for r in routers:
            v = r.choose(req("m"), 0.01)
            assert v is not None
            r.sent(v.name, "m", 0.01)
            truth[v.name] += 1
    return truth


@pytest.mark.parametrize("policy", ["least-expected-work", "queue-aware"])
def test_naive_routers_herd_onto_the_backend_idle_at_the_report(policy: str) -> None:
    truth = burst(replicas=1, policy=policy)
    assert truth["a"] == 12  # every send of both gateways: twice what either meant
    assert max(truth[n] for n in "bcd") == 6


@pytest.mark.parametrize("policy", ["least-expected-work", "queue-aware"])
def test_routers_that_count_their_peers_spread(policy: str) -> None:
    truth = burst(replicas=2, policy=policy)
    assert sum(truth.values()) == 18 + 12
    assert max(truth.values()) - min(truth.values()) <= 2
    assert truth["a"] <= 8


@pytest.mark.parametrize("policy", ["least-expected-work", "queue-aware"])
def test_the_default_peer_weight_herds_less_than_naive(policy: str) -> None:
    """Three quarters of the peers' share (the default): the idle backend takes less than
    the naive 12."""
    truth = burst(replicas=2, policy=policy, peer_weight=PEER_WEIGHT)
    assert sum(truth.values()) == 18 + 12
    assert truth["a"] < 12
    assert truth["a"] <= 10


def test_send_weight() -> None:
    assert Router(ROUTING.build("round-robin"), replicas=3).send_weight == 2.5  # 1 + 2 x 0.75
    assert Router(ROUTING.build("round-robin"), replicas=3, peer_weight=0.0).send_weight == 1.0
    with pytest.raises(ValueError, match="peer_weight"):
        Router(ROUTING.build("round-robin"), replicas=2, peer_weight=1.5)


def test_one_replica_is_the_plain_router() -> None:
    one, plain = router(1), Router(ROUTING.build("least-expected-work"))
    for n in NAMES:
        plain.add_backend(n, ["m"])
        plain.observe(n, LoadSample(timestamp_s=0.0, queue_depth=REPORTED[n]))
    for r in (one, plain):
        r.sent("a", "m", 0.0)
    assert one.view("a").queue_depth == plain.view("a").queue_depth == 1.0


def test_own_sends_count_replicas_times_and_answers_settle_as_many() -> None:
    r = router(3)
    v = r.view("a")
    r.sent("a", "m", 0.0)
    r.sent("a", "m", 0.0)
    assert v.queue_depth == 6.0 and v.queued_by_model["m"] == 6.0
    assert v.in_flight == 2  # its own, exact
    r.done("a", "m", 1, 0.005)
    assert v.queue_depth == 3.0 and v.queued_by_model["m"] == 3.0
    r.observe("a", LoadSample(timestamp_s=0.1, queue_depth=4.0, queued_by_model={"m": 4.0}))
    assert v.queued_by_model["m"] == pytest.approx(4.0 / 2)  # window mean of 0 and 4, fresh


def test_replicas_must_be_positive() -> None:
    with pytest.raises(ValueError, match="replicas"):
        Router(ROUTING.build("round-robin"), replicas=0)
