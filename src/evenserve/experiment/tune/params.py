"""An arm as a params object (the shape the live parameter API takes; the package's
docstring) and back: a params object copied onto an arm, the arm read as one, the
defaults, whether the workload has classes; and a trace replayed on a scenario's placement."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from evenserve.core.errors import ConfigError
from evenserve.core.scenario import ArmSpec, ClosedLoop, OpenLoop, Scenario, TraceWorkload
from evenserve.policy.batching import BATCHING
from evenserve.policy.params import Params as LiveParams
from evenserve.policy.params import apply_to_arm, parse_update
from evenserve.policy.routing import ROUTING
from evenserve.sim.loader import LoadedScenario
from evenserve.workload import read_trace

ROUTING_KEYS = (
    "queue_weight",
    "utilization_weight",
    "memory_weight",
    "overload_utilization",
    "overload_free_gb",
)

Params = dict[str, Any]


def apply(loaded: LoadedScenario, arm: str, params: Mapping[str, Any]) -> LoadedScenario:
    """The loaded scenario with ``params`` copied onto arm ``arm``: validated as a partial
    parameter set (``policy.params.parse_update``: ConfigError naming the field, a model not
    in the scenario too) and put on the arm by ``policy.params.apply_to_arm``, as a push
    puts it live; keys absent keep the arm's values."""
    sc = loaded.scenario
    if arm not in sc.arms:
        raise ConfigError(f"--arm: unknown arm {arm!r} (arms: {', '.join(sc.arms)})")
    update = parse_update(params, "params")
    for m in update.get("batching_per_model", {}):
        if m not in sc.models:
            raise ConfigError(f"params.batching_per_model.{m}: unknown model")
    spec = sc.arms[arm]
    base = LiveParams(class_headroom=spec.class_headroom, learn_profiles=spec.learn_profiles)
    try:
        new_arm = ArmSpec.model_validate(apply_to_arm(spec, base.merged(update)).model_dump())
    except ValueError as exc:
        raise ConfigError(f"params: {exc}") from None
    new_sc = sc.model_copy(update={"arms": {**sc.arms, arm: new_arm}})
    return LoadedScenario(new_sc, loaded.base_dir, loaded.profile_sets)


def current_params(sc: Scenario, arm: str) -> Params | None:
    """The arm as a params object, or None when it is not queue-aware + fixed-window."""
    spec = sc.arms[arm]
    try:
        r_name, r_params = ROUTING.parse(spec.routing, f"arms.{arm}.routing")
    except ConfigError:
        return None  # central-queue
    if r_name != "queue-aware":
        return None
    per_model: dict[str, Any] = {}
    for m in sc.models:
        b_name, b_params = BATCHING.parse(
            spec.batching_per_model.get(m, spec.batching), f"arms.{arm}"
        )
        if b_name != "fixed-window":
            return None
        per_model[m] = {"policy": "fixed-window", **b_params.model_dump()}
    rp = r_params.model_dump()
    return {
        "routing": {"policy": "queue-aware", **{k: rp[k] for k in ROUTING_KEYS}},
        "batching_per_model": per_model,
        "class_headroom": spec.class_headroom,
        "learn_profiles": spec.learn_profiles,
    }


def has_classes(loaded: LoadedScenario) -> bool:
    """Whether the workload carries more than one priority class (class headroom matters)."""
    sc = loaded.scenario
    wl = sc.workload
    if isinstance(wl, ClosedLoop):
        classes = {sc.models[m].priority_value for m, w in wl.mix.items() if w > 0}
    elif isinstance(wl, OpenLoop):
        streams = [(st.model, st.priority_value()) for st in wl.streams if st.rate_rps > 0]
        classes = {sc.models[m].priority_value for m in wl.rates_rps if wl.rates_rps[m] > 0}
        classes |= {sc.models[m].priority_value if p is None else p for m, p in streams}
    else:
        arrivals = read_trace(loaded.resolve(wl.path), list(sc.models))
        classes = {
            sc.models[a.model].priority_value if a.priority is None else a.priority
            for a in arrivals
        }
    return len(classes) > 1


def default_params(sc: Scenario, learn_profiles: bool = False) -> Params:
    """queue-aware at its defaults (the articles') and fixed-window at its defaults for every
    model (and ``learn_profiles``, the arm's): the sweep's base when the arm is not
    expressible as params."""
    rp = ROUTING.parse("queue-aware", "routing")[1].model_dump()
    bp = BATCHING.parse("fixed-window", "batching")[1].model_dump()
    return {
        "routing": {"policy": "queue-aware", **{k: rp[k] for k in ROUTING_KEYS}},
        "batching_per_model": {m: {"policy": "fixed-window", **bp} for m in sc.models},
        "class_headroom": None,
        "learn_profiles": learn_profiles,
    }


def copy_params(p: Params) -> Params:
    return {
        "routing": dict(p["routing"]),
        "batching_per_model": {m: dict(b) for m, b in p["batching_per_model"].items()},
        "class_headroom": p["class_headroom"],
        "learn_profiles": p.get("learn_profiles", False),
    }


def replay_trace(loaded: LoadedScenario, trace: Path) -> LoadedScenario:
    """``loaded`` with its workload replaced by the JSONL trace ``trace`` (its devices,
    models, SLOs, profiles and arms kept). The run lasts the trace's span (its last arrival,
    rounded up, plus one second) and keeps the scenario's warm-up when that is under half
    of it (else none)."""
    sc = loaded.scenario
    arrivals = read_trace(trace, list(sc.models))
    if not arrivals:
        raise ConfigError(f"{trace}: the trace has no arrivals")
    duration = math.ceil(arrivals[-1].t_s) + 1.0
    warmup = sc.warmup_s if sc.warmup_s < duration / 2 else 0.0
    new_sc = sc.model_copy(
        update={
            "workload": TraceWorkload(type="trace", path=str(trace.resolve())),
            "duration_s": duration,
            "warmup_s": warmup,
            "levels": {},
        }
    )
    return LoadedScenario(new_sc, loaded.base_dir, loaded.profile_sets)
