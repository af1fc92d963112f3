"""The load of one live run of a (scaled) scenario: its arrivals and the generator's spec."""

from __future__ import annotations

from typing import Any

from evenserve.core.errors import ConfigError
from evenserve.core.scenario import ClosedLoop, OpenLoop, TraceWorkload
from evenserve.loadgen.spec import LoadSpec
from evenserve.sim.loader import LoadedScenario
from evenserve.workload import Arrival, open_loop_arrivals, read_trace, with_default_deadlines


def scenario_arrivals(loaded: LoadedScenario, seed: int) -> list[Arrival]:
    """An open-loop or trace scenario's arrivals over its duration, the simulator's own (same
    streams, same seeds), each without a deadline of its own given its model's."""
    sc = loaded.scenario
    wl = sc.workload
    if isinstance(wl, OpenLoop):
        arrivals = open_loop_arrivals(wl, seed, sc.duration_s)
    elif isinstance(wl, TraceWorkload):
        arrivals = read_trace(loaded.resolve(wl.path), list(sc.models))
    else:
        raise ConfigError("workload: a closed loop has no arrivals fixed in advance")
    return with_default_deadlines(arrivals, {m: v.deadline_ms for m, v in sc.models.items()})


def scenario_load_spec(
    scaled: LoadedScenario, seed: int, max_requests: int, timeout_s: float
) -> LoadSpec:
    """The load generator's spec for one run of the scaled scenario (target and scrapes are
    filled in once the arm's cluster is up)."""
    sc = scaled.scenario
    wl = sc.workload
    common: dict[str, Any] = {
        "target": "",
        "duration_s": sc.duration_s,
        "warmup_s": sc.warmup_s,
        "seed": seed,
        "max_requests": max_requests,
        "timeout_s": timeout_s,
        "scrape_interval_s": sc.signals.interval_ms / 1000.0,
        "model_priority": {m: v.priority_value for m, v in sc.models.items()},
        # A static batch that never fills holds its requests forever: do not wait long.
        "drain_s": 5.0,
    }
    if isinstance(wl, ClosedLoop):
        return LoadSpec(mix=dict(wl.mix), users=wl.users, think_s=wl.think_ms / 1000.0, **common)
    return LoadSpec(mix={}, trace=scenario_arrivals(scaled, seed), **common)
