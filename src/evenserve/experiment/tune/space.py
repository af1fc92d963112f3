"""The search space as optuna's trials see it (``suggest``; a params object as a trial's
values, ``as_trial``, to enqueue a known arm), and the sweep's grid (``GRID``,
``sweep_grid``) the regret is measured against (the package's docstring)."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from evenserve.core.scenario import Scenario
from evenserve.experiment.tune.params import Params, copy_params

if TYPE_CHECKING:
    import optuna


BATCH_CAPS = (1, 2, 4, 8, 16, 32)
MIN_WINDOW_MS = 0.1
MAX_WINDOW_MS = 50.0
#: The sweep's grid (``sweep_grid``): the dimensions and their values, stated in the output.
GRID: dict[str, tuple[float, ...]] = {
    "routing.utilization_weight": (0.0, 0.3, 0.9),
    "routing.memory_weight": (0.0, 0.2, 0.6),
    "batching.max_batch_delay_ms": (1.0, 5.0, 10.0),
    "learn_profiles": (False, True),
}


def suggest(trial: optuna.Trial, sc: Scenario, classes: bool) -> Params:
    max_gb = max(d.memory_gb for d in sc.expanded_devices())
    # Scores rank hosts, so only the weights' ratios matter: two shares of a sum of 1.
    wq = trial.suggest_float("routing.queue_weight", 0.0, 1.0)
    split = trial.suggest_float("routing.utilization_split", 0.0, 1.0)
    routing: dict[str, Any] = {
        "policy": "queue-aware",
        "queue_weight": wq,
        "utilization_weight": (1.0 - wq) * split,
        "memory_weight": (1.0 - wq) * (1.0 - split),
        "overload_utilization": trial.suggest_float("routing.overload_utilization", 0.5, 1.0),
        "overload_free_gb": trial.suggest_float("routing.overload_free_gb", 0.0, max_gb),
    }
    per_model: dict[str, Any] = {}
    for m, spec in sc.models.items():
        per_model[m] = {
            "policy": "fixed-window",
            "max_batch_size": trial.suggest_categorical(f"batching.{m}.max_batch_size", BATCH_CAPS),
            "max_batch_delay_ms": trial.suggest_float(
                f"batching.{m}.max_batch_delay_ms",
                MIN_WINDOW_MS,
                window_limit_ms(spec.slo_ms),
                log=True,
            ),
        }
    headroom: float | None = None
    if classes and trial.suggest_categorical("class_headroom.on", (False, True)):
        headroom = trial.suggest_float("class_headroom", 0.3, 1.0)
    learn = bool(trial.suggest_categorical("learn_profiles", (False, True)))
    return {
        "routing": routing,
        "batching_per_model": per_model,
        "class_headroom": headroom,
        "learn_profiles": learn,
    }


def window_limit_ms(slo_ms: float) -> float:
    return min(MAX_WINDOW_MS, slo_ms / 4.0)


def as_trial(params: Params, sc: Scenario, classes: bool) -> dict[str, Any]:
    """A params object as optuna's trial values (to enqueue the current arm), clipped into
    the search space."""
    max_gb = max(d.memory_gb for d in sc.expanded_devices())
    r = params["routing"]
    total = r["queue_weight"] + r["utilization_weight"] + r["memory_weight"]
    wq, wu = (r["queue_weight"] / total, r["utilization_weight"] / total) if total else (1.0, 0.0)
    out: dict[str, Any] = {
        "routing.queue_weight": wq,
        "routing.utilization_split": wu / (1.0 - wq) if wq < 1.0 else 0.5,
        "routing.overload_utilization": max(0.5, r["overload_utilization"]),
        "routing.overload_free_gb": min(max_gb, r["overload_free_gb"]),
    }
    for m, b in params["batching_per_model"].items():
        cap = b["max_batch_size"]
        out[f"batching.{m}.max_batch_size"] = min(BATCH_CAPS, key=lambda c: abs(c - cap))
        window = b["max_batch_delay_ms"]
        out[f"batching.{m}.max_batch_delay_ms"] = min(
            max(MIN_WINDOW_MS, window), window_limit_ms(sc.models[m].slo_ms)
        )
    if classes:
        h = params["class_headroom"]
        out["class_headroom.on"] = h is not None
        if h is not None:
            out["class_headroom"] = max(0.3, h)
    out["learn_profiles"] = bool(params.get("learn_profiles"))
    return out


def sweep_grid(sc: Scenario, base: Params) -> list[Params]:
    """The grid's params (``GRID``), every other parameter as in ``base``."""
    out = []
    for uw, mw, window, learn in itertools.product(*GRID.values()):
        p = copy_params(base)
        p["learn_profiles"] = bool(learn)
        p["routing"]["utilization_weight"] = uw
        p["routing"]["memory_weight"] = mw
        for m in p["batching_per_model"]:
            p["batching_per_model"][m]["max_batch_delay_ms"] = min(
                window, window_limit_ms(sc.models[m].slo_ms)
            )
        out.append(p)
    return out
