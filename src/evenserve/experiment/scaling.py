"""Time scale K: a scenario K times slower, for a live bench on a small host.

Every emulated batch takes K times its profile's time (the scaled profile set is written next
to the cluster), every think time and inter-arrival time is K times longer (rates K times
lower), trace times and rate phases K times later, SLOs, deadlines and each device's input
staging (``staging_ms_per_item``) K times longer.
Placement (an arm with ``placement``): every model's cold and warm load time (its own
``load_ms`` / ``warm_load_ms``, else the default from its profile's weights, made explicit)
is K times longer, and so are every device's ``start_ms``, each arm's
``placement_interval_ms``, ``load_wait_ms`` and ``unload_ms``; the live cluster takes the
scaled load times as each emulated model's ``load_ms``. Other policy parameters (batching
windows, batch sizes, the 100 ms signal period, queue thresholds) are left alone. The
simulator runs the very same scaled scenario, so live and simulated figures are compared
like for like; see docs/design/0004-loadgen-bench.md for what the unscaled parts
do to the comparison with the unscaled scenario.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from evenserve.core.errors import ConfigError
from evenserve.core.scenario import ClosedLoop, OpenLoop, Phase, TraceWorkload
from evenserve.sim.loader import LoadedScenario
from evenserve.workload import read_trace, write_trace

#: Default time scale of a scenario bench on a small host.
DEFAULT_TIME_SCALE = 40.0


def scaled_phases(phases: list[Phase], k: float) -> list[Phase]:
    return [
        Phase(start_s=p.start_s * k, end_s=p.end_s * k, multiplier=p.multiplier) for p in phases
    ]


def model_weights_bytes(loaded: LoadedScenario, model: str) -> float:
    """A model's weights as the simulator's placement takes them: its profile in the first
    device's profile set (else in any set that has it; 0 if none)."""
    sc = loaded.scenario
    prof_name = sc.models[model].profile or model
    first = sc.profile_set_of(sc.expanded_devices()[0])
    for name in [first, *loaded.profile_sets]:
        prof = loaded.profile_sets.get(name, {}).get(prof_name)
        if prof is not None:
            return prof.weights_bytes
    return 0.0


def scale_scenario(
    loaded: LoadedScenario, k: float, duration_s: float, warmup_s: float, workdir: Path
) -> LoadedScenario:
    """The scenario K times slower: profiles, think times, arrivals, SLOs; policies unchanged.

    ``duration_s`` and ``warmup_s`` are the scaled run's (live seconds). A trace workload is
    rewritten, K times later, as ``workdir/trace-scaled.jsonl``.
    """
    sc = loaded.scenario
    wl: Any = sc.workload
    if isinstance(wl, ClosedLoop):
        wl = wl.model_copy(update={"think_ms": wl.think_ms * k})
    elif isinstance(wl, OpenLoop):
        wl = wl.model_copy(
            update={
                "rates_rps": {m: r / k for m, r in wl.rates_rps.items()},
                "phases": scaled_phases(wl.phases, k),
                "streams": [
                    st.model_copy(
                        update={
                            "rate_rps": st.rate_rps / k,
                            "deadline_ms": None if st.deadline_ms is None else st.deadline_ms * k,
                            "phases": None if st.phases is None else scaled_phases(st.phases, k),
                        }
                    )
                    for st in wl.streams
                ],
            }
        )
    elif isinstance(wl, TraceWorkload):
        entries = read_trace(loaded.resolve(wl.path), list(sc.models))
        path = workdir / "trace-scaled.jsonl"
        write_trace(path, [dataclasses.replace(e, t_s=e.t_s * k) for e in entries])
        wl = wl.model_copy(update={"path": str(path.resolve())})
    models = {}
    for m, spec in sc.models.items():
        cold_s, warm_s = spec.load_times_s(model_weights_bytes(loaded, m))
        models[m] = spec.model_copy(
            update={
                "slo_ms": spec.slo_ms * k,
                "deadline_ms": None if spec.deadline_ms is None else spec.deadline_ms * k,
                "load_ms": cold_s * 1000.0 * k,
                "warm_load_ms": warm_s * 1000.0 * k,
            }
        )
    if not 0 <= warmup_s < duration_s:
        raise ConfigError("--warmup: must be >= 0 and less than --duration")
    devices = [
        d.model_copy(
            update={
                "start_ms": d.start_ms * k,
                "slowdown_phases": scaled_phases(d.slowdown_phases, k),
                # Staging is part of a batch's time: it scales with the batches.
                "staging_ms_per_item": d.staging_ms_per_item * k,
            }
        )
        for d in sc.devices
    ]
    arms = {
        a: spec.model_copy(
            update={
                "placement_interval_ms": spec.placement_interval_ms * k,
                "load_wait_ms": spec.load_wait_ms * k,
                "unload_ms": spec.unload_ms * k,
            }
        )
        for a, spec in sc.arms.items()
    }
    sc2 = sc.model_copy(
        update={
            "workload": wl,
            "models": models,
            "devices": devices,
            "arms": arms,
            "duration_s": duration_s,
            "warmup_s": warmup_s,
        }
    )
    sets = {
        name: {
            m: dataclasses.replace(
                p,
                latency_ms=tuple(x * k for x in p.latency_ms),
                source=f"{p.source.strip()} [time scale x{k:g} for a live bench]",
            )
            for m, p in profs.items()
        }
        for name, profs in loaded.profile_sets.items()
    }
    return LoadedScenario(scenario=sc2, base_dir=loaded.base_dir, profile_sets=sets)
