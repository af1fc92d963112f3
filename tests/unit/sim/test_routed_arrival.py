"""The routed open-loop arrival (``Simulation._open_arrival_routed``) makes its requests
without ``SimRequest.__init__``: each must carry every field, as the constructor sets them."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from evenserve.sched import QUEUED
from evenserve.sim.cluster import Simulation
from evenserve.sim.device import SimRequest
from evenserve.sim.loader import load_scenario

from .scenarios import toy_scenario, write_scenario

FIELDS = [f.name for f in dataclasses.fields(SimRequest)]


def test_routed_arrivals_set_every_field_as_the_constructor_would(tmp_path: Path) -> None:
    ld = load_scenario(write_scenario(tmp_path, toy_scenario(tmp_path)))
    sim = Simulation(ld, "optimized")
    assert sim._open_arrival_cb == sim._open_arrival_routed
    seen: list[dict[str, Any]] = []
    for name, offer in list(sim._offers.items()):

        def spy(r: SimRequest, now: float, offer: Any = offer) -> str | None:
            # Every field as it is when offered (an unset slot raises AttributeError).
            seen.append({f: getattr(r, f) for f in FIELDS})
            return offer(r, now)  # type: ignore[no-any-return]

        sim._offers[name] = spy
    log = sim.run().requests
    assert len(seen) == len(log) > 5000
    for got in seen:
        i = got["idx"]
        rel = sim._deadline_s[got["model"]]
        at = log.arrival_s[i]
        made = SimRequest(
            i + 1, log.model[i], at, log.priority[i], None if rel is None else at + rel,
            1, QUEUED, i, -1,
        )  # fmt: skip
        assert got == {f: getattr(made, f) for f in FIELDS}
