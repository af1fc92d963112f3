"""Several gateways in the simulator (design 0013): N routers, each with its own sends and
reports; one gateway is the plain simulation."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from evenserve.core.scenario import ArmSpec
from evenserve.experiment.herding import model_hosts, run_herding, with_gateways
from evenserve.report.summary import summarize
from evenserve.sim.cluster import Simulation, simulate
from evenserve.sim.loader import load_scenario

BURST = Path(__file__).resolve().parents[3] / "scenarios" / "gateways-burst.yaml"
ARM = "least-expected-work"


@pytest.fixture(scope="module")
def loaded():  # type: ignore[no-untyped-def]
    return load_scenario(BURST, ["duration_s=12", "warmup_s=2"])


def p99(rec) -> float:  # type: ignore[no-untyped-def]
    return float(summarize(rec, timeseries=False)["latency_ms"]["p99"])


def test_one_gateway_is_the_plain_simulation(loaded) -> None:  # type: ignore[no-untyped-def]
    plain = simulate(loaded, ARM)
    one = simulate(with_gateways(loaded, ARM, 1), ARM)
    # As text: a typed column's NaN (unfinished) is not equal to itself.
    assert repr(list(one.requests.finish_s)) == repr(list(plain.requests.finish_s))
    assert one.requests.device == plain.requests.device


def test_two_gateways_split_the_arrivals_and_hear_reports_at_their_phase(loaded) -> None:  # type: ignore[no-untyped-def]
    sim = Simulation(with_gateways(loaded, ARM, 2), ARM)
    assert len(sim.routers) == 2 and sim.gateway_offsets_s() == [0.0, 0.05]
    assert all(r.replicas == 2 for r in sim.routers)
    rec = sim.run()
    log = rec.requests
    open_ = {i for i, d in enumerate(log.device) if not d and log.drop_reason[i] is None}
    # What is still out at the end is what the routers still count, each its own.
    assert set(sim.front.gateway_of) == open_
    assert sum(r.view(d.name).in_flight for r in sim.routers for d in sim.devices) == len(open_)
    assert {sim.front.gateway_of[i] for i in open_} <= {0, 1}


def test_aware_gateways_keep_the_p99_and_do_not_herd(loaded) -> None:  # type: ignore[no-untyped-def]
    hosts = model_hosts(loaded, ARM)
    one = simulate(loaded, ARM)
    naive = simulate(with_gateways(loaded, ARM, 2, replicas=1, offsets_ms=[0, 0]), ARM)
    aware = simulate(with_gateways(loaded, ARM, 2, offsets_ms=[0, 0]), ARM)
    assert p99(aware) <= 1.1 * p99(one)
    # Both hear each report at once and count only their own sends: they herd (less since a
    # lone router's answers take its estimate below the report: design 0016, *Saturation*).
    assert p99(naive) > 1.03 * p99(aware)
    h1, hn, ha = (run_herding(r, hosts) for r in (one, naive, aware))
    assert hn.p99 > 1.15 * h1.p99
    assert ha.p99 < hn.p99
    # 1.10x here: the lone router's share fell (1.59 to 1.39) when its answers began to take
    # its estimate below the report; the aware pair's did not move (1.52).
    assert ha.p99 <= 1.15 * h1.p99


def test_gateway_fields_are_checked() -> None:
    base = {"routing": "least-expected-work", "batching": "greedy"}
    with pytest.raises(ValidationError, match="one offset per gateway"):
        ArmSpec.model_validate({**base, "gateways": 2, "gateway_offsets_ms": [0]})
    with pytest.raises(ValidationError, match="central queue"):
        ArmSpec.model_validate({**base, "routing": "central-queue", "gateways": 2})
    with pytest.raises(ValidationError, match="placement"):
        ArmSpec.model_validate({**base, "gateways": 2, "placement": {"policy": "static"}})
