"""Near saturation a router must see a drained device as drained (design 0016, *Saturation*):
between two load reports its queue estimate is the reported queue plus the sends since, less
the answers since. When answers stopped at the reported queue, a device that drained kept its
reported queue for up to a report interval and sat idle while the others queued:
least-expected-work and queue-aware had 2.5x least-connections' P99 at 97 % of capacity."""

from __future__ import annotations

from pathlib import Path

import pytest

from evenserve.report.summary import summarize
from evenserve.sim.cluster import simulate
from evenserve.sim.loader import load_scenario

SATURATION = Path(__file__).resolve().parents[3] / "scenarios" / "saturation.yaml"


@pytest.fixture(scope="module")
def loaded():  # type: ignore[no-untyped-def]
    return load_scenario(SATURATION, ["duration_s=15", "warmup_s=3"])


def p99(loaded, arm: str) -> float:  # type: ignore[no-untyped-def]
    return float(summarize(simulate(loaded, arm), timeseries=False)["latency_ms"]["p99"])


@pytest.mark.parametrize("arm", ["least-expected-work", "queue-aware"])
def test_signal_reading_routers_keep_up_with_least_connections(loaded, arm: str) -> None:  # type: ignore[no-untyped-def]
    assert p99(loaded, arm) <= 1.25 * p99(loaded, "least-connections")
