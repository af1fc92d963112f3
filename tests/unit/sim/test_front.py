"""The simulator's front door runs the gateway's rules: a device that refuses at once (queue
full, draining) has the request tried once more elsewhere, as the gateway retries a 429
``queue-full`` or a 503; a 504-like refusal is the answer; no device left, the refusal
stands."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import yaml

from evenserve.core.wire import DEADLINE_INFEASIBLE, NO_BACKEND, QUEUE_FULL
from evenserve.policy.routing import ROUTING, Router
from evenserve.sched import DRAINING, QUEUED
from evenserve.sim.cluster import Simulation
from evenserve.sim.device import SimRequest
from evenserve.sim.front import SimFront
from evenserve.sim.loader import load_scenario

from .scenarios import toy_scenario


def front(
    refusing: dict[str, str], retries: int = 1, names: tuple[str, ...] = ("a", "b", "c")
) -> tuple[SimFront, Router, list[tuple[str, str | None]], list[tuple[str, str | None]]]:
    router = Router(ROUTING.build("round-robin", random.Random(0)))
    for n in names:
        router.add_backend(n, ["m"])
    offers: list[tuple[str, str | None]] = []
    drops: list[tuple[str, str | None]] = []

    def offer(name: str, r: SimRequest, now: float) -> str | None:
        reason = refusing.get(name)
        offers.append((name, reason))
        return reason

    def drop(r: SimRequest, reason: str, device: str | None) -> None:
        drops.append((reason, device))
        if device is not None:
            router.done(device, r.model)

    f = SimFront([router], retries=retries, refusals=False, models=["m"], offer=offer, drop=drop)
    return f, router, offers, drops


def request() -> SimRequest:
    return SimRequest(1, "m", 0.0, 10, None, 1, QUEUED, 0, -1)


@pytest.mark.parametrize("reason", [QUEUE_FULL, DRAINING])
def test_a_refusal_at_the_door_is_tried_once_more_elsewhere(reason: str) -> None:
    f, router, offers, drops = front({"a": reason})
    f.route(request(), 0, 0.0)  # round robin: a first
    (first, why), (second, taken) = offers
    assert (first, why, taken) == ("a", reason, None) and second != "a" and drops == []
    assert {n: router.view(n).in_flight for n in "abc"} == {"a": 0, "b": 0, "c": 0, second: 1}


def test_retries_once_then_the_last_refusal_stands() -> None:
    f, router, offers, drops = front({"a": QUEUE_FULL, "b": QUEUE_FULL, "c": QUEUE_FULL})
    f.route(request(), 0, 0.0)
    assert len(offers) == 2 and len({n for n, _ in offers}) == 2  # the third is never tried
    assert drops == [(QUEUE_FULL, None)]
    assert all(router.view(n).in_flight == 0 for n in "abc")


def test_no_retry_without_retries_or_for_an_answer() -> None:
    f, router, offers, drops = front({"a": QUEUE_FULL}, retries=0)
    f.route(request(), 0, 0.0)
    assert offers == [("a", QUEUE_FULL)] and drops == [(QUEUE_FULL, None)]
    assert router.view("a").in_flight == 0
    f, _, offers, drops = front({"a": DEADLINE_INFEASIBLE})  # a 504: the answer
    f.route(request(), 0, 0.0)
    assert offers == [("a", DEADLINE_INFEASIBLE)] and drops == [(DEADLINE_INFEASIBLE, "a")]


def test_a_single_host_refusal_stands_and_no_host_is_no_backend() -> None:
    f, router, offers, drops = front({"a": QUEUE_FULL}, names=("a",))
    f.route(request(), 0, 0.0)
    assert offers == [("a", QUEUE_FULL)] and drops == [(QUEUE_FULL, None)]
    assert router.view("a").in_flight == 0
    f, _, offers, drops = front({}, names=())
    f.route(request(), 0, 0.0)
    assert offers == [] and drops == [(NO_BACKEND, None)]


def test_the_simulation_retries_a_full_queue_where_the_gateway_does(tmp_path: Path) -> None:
    """Bounded queues under a burst: with the gateway's retry (``retries: 1``, the default)
    fewer requests are refused queue-full than without (``retries: 0``), and every router
    count is settled at the end."""
    sc = toy_scenario(tmp_path)
    sc["duration_s"] = 3
    sc["warmup_s"] = 0
    sc["workload"] = {"type": "open-loop", "rates_rps": {"fast": 900, "slow": 0.5}}
    arm = {
        "routing": "power-of-two",
        "batching": {"policy": "fixed-window", "max_batch_size": 4, "max_batch_delay_ms": 2},
        "max_queue_per_model": 2,
    }
    sc["arms"] = {"retry": arm, "once": {**arm, "retries": 0}}
    (tmp_path / "sc.yaml").write_text(yaml.safe_dump(sc))
    loaded = load_scenario(tmp_path / "sc.yaml")
    full = {}
    for name in ("retry", "once"):
        sim = Simulation(loaded, name)
        assert sim.front is not None and sim.front.doors[0].retries == (name == "retry")
        log = sim.run().requests
        full[name] = sum(1 for r in log.drop_reason if r == QUEUE_FULL)
        answered = sum(1 for d in log.device if d)
        dropped = sum(1 for r in log.drop_reason if r is not None)
        out = sum(sim.router.view(d.name).in_flight for d in sim.devices)  # type: ignore[union-attr]
        assert answered + dropped + out == len(log.model)
    assert 0 < full["retry"] < full["once"]
