"""One device 2.5x slower than the other three (scenarios/slow-device.yaml, shortened): the
front door's refusal rule refuses nothing at this load and bounds the queues when the load
is past capacity."""

from __future__ import annotations

from pathlib import Path

from evenserve.core.wire import OVERLOADED
from evenserve.report.summary import summarize
from evenserve.sim.cluster import Simulation
from evenserve.sim.loader import load_scenario

SHORT = ["duration_s=20", "warmup_s=4"]


def test_the_refusal_rule_refuses_nothing_at_this_load(repo_root: Path) -> None:
    ld = load_scenario(
        repo_root / "scenarios" / "slow-device.yaml",
        [*SHORT, "arms.queue-aware.overload_refusals=true"],
    )
    rec = Simulation(ld, "queue-aware").run()
    assert OVERLOADED not in rec.requests.drop_reason


def test_past_capacity_the_refusal_rule_bounds_what_waits(repo_root: Path) -> None:
    over = [*SHORT, "workload.rates_rps.bert-base=800"]
    path = repo_root / "scenarios" / "slow-device.yaml"
    served = {}
    for refusals in (False, True):
        ld = load_scenario(path, [*over, f"arms.least-expected-work.overload_refusals={refusals}"])
        rec = Simulation(ld, "least-expected-work").run()
        reasons = set(rec.requests.drop_reason) - {None}
        assert reasons == ({OVERLOADED} if refusals else set())
        served[refusals] = summarize(rec, timeseries=False)
    # Without refusals the queues grow for the whole run; with them what is served starts
    # within about an SLO (200 ms for BERT): P99 stays within a few SLOs.
    assert served[False]["latency_ms"]["p99"] > 2000.0
    assert served[True]["latency_ms"]["p99"] < 1000.0
    assert served[True]["requests"]["in_flight"] < served[False]["requests"]["in_flight"] / 10
