"""The front door's refusal rule: every host full or predicted late, on the hosts' evidence."""

from __future__ import annotations

import pytest

from evenserve.core.profile import LatencyProfile
from evenserve.core.types import BackendView
from evenserve.policy.routing.refusal import host_verdict, refusal
from evenserve.policy.routing.work import predicted_wait_s
from tests.unit.policy.helpers import view

#: t(b) = 12 + 3.5 b ms (a BERT-like device): a full batch of 8 takes 40 ms.
BERT = LatencyProfile.from_points("m", {1: 15.5, 8: 40.0})
SLO = 0.1


def host(
    name: str,
    queued: float,
    *,
    slo: float | None = SLO,
    profile: LatencyProfile | None = BERT,
    busy_s: float = 0.0,
    sampled_at: float = 0.0,
    fresh: bool = True,
    bound: int | None = None,
) -> BackendView:
    v = view(
        name,
        q=queued,
        queued={"m": queued},
        fresh=fresh,
        busy_remaining_s=busy_s,
        profiles={} if profile is None else {"m": profile},
        max_batch={"m": 8},
    )
    v.slo_s = {} if slo is None else {"m": slo}
    v.max_queue = {} if bound is None else {"m": bound}
    v.sampled_at_s = sampled_at
    return v


def test_a_queue_of_five_on_a_device_that_runs_eight_at_once_is_not_overload() -> None:
    # The old soft-overload rule (queue > 5 on every host) refused this.
    assert refusal("m", [host("a", 6), host("b", 6)], 0.0) is None


def test_every_host_predicted_past_the_slo_is_refused_naming_each() -> None:
    why = refusal("m", [host("a", 24), host("b", 32)], 0.0)
    assert why is not None
    assert "a: predicted wait 120 ms > SLO 100 ms" in why
    assert "b: predicted wait 160 ms > SLO 100 ms" in why


def test_one_host_in_time_is_enough_to_route() -> None:
    assert refusal("m", [host("a", 24), host("b", 8)], 0.0) is None


@pytest.mark.parametrize(
    ("kw", "why"),
    [
        ({"slo": None}, "no SLO reported"),
        ({"profile": None}, "no profile for the model"),
        ({"fresh": False}, "stale signals"),
    ],
)
def test_no_evidence_no_refusal(kw: dict[str, object], why: str) -> None:
    hosts = [host("a", 400, **kw), host("b", 400)]  # type: ignore[arg-type]
    assert host_verdict("m", hosts[0], 0.0) is None, why
    assert refusal("m", hosts, 0.0) is None, why


def test_a_queued_model_without_a_profile_is_no_evidence() -> None:
    b = host("a", 24)
    b.queued_by_model = {"m": 24, "other": 3}
    assert predicted_wait_s("m", b, 0.0) is None
    assert host_verdict("m", b, 0.0) is None


def test_the_wait_counts_the_work_ahead_not_the_batch_it_joins() -> None:
    # 12 queued: one full batch ahead (40 ms); the 4 of the next batch run with it.
    assert predicted_wait_s("m", host("a", 12), 0.0) == pytest.approx(0.040)
    other = host("a", 12)
    other.profiles = {"m": BERT, "x": BERT}
    other.max_batch_size = {"m": 8, "x": 8}
    other.queued_by_model = {"m": 12, "x": 4}  # another model's queue is all ahead of it
    assert predicted_wait_s("m", other, 0.0) == pytest.approx(0.040 + 0.026)


def test_busy_time_is_aged_by_the_sample_age() -> None:
    b = host("a", 0, busy_s=0.150, sampled_at=10.0)
    assert predicted_wait_s("m", b, 10.0) == pytest.approx(0.150)
    assert predicted_wait_s("m", b, 10.1) == pytest.approx(0.050)
    assert predicted_wait_s("m", b, 11.0) == 0.0
    assert host_verdict("m", b, 10.0) is not None
    assert host_verdict("m", b, 10.1) is None


def test_full_queues_everywhere_are_refused_without_an_slo() -> None:
    hosts = [host("a", 64, slo=None, bound=64), host("b", 70, slo=None, bound=64)]
    why = refusal("m", hosts, 0.0)
    assert why is not None and "a: queue full 64/64" in why
    hosts[1] = host("b", 63, slo=None, bound=64)
    assert refusal("m", hosts, 0.0) is None


def test_no_hosts_is_not_a_refusal() -> None:
    assert refusal("m", [], 0.0) is None  # the dispatcher's 503, not a 429
