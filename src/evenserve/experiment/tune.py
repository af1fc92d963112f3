"""``evenserve tune``: search an arm's routing, batching, class headroom and profiles that learn
in the simulator.

Theory of operation. A scenario (or a recorded trace replayed on a scenario's placement,
``replay_trace``) is simulated once with the arm as it is ("current"), then ``budget - 1``
times with parameters proposed by optuna's TPE sampler, seeded, so one seed gives one search. Each
evaluation copies a params object onto the arm (``apply``) and runs ``simulate``; nothing
inside the simulator changes. When the current arm can be written as a params object
(queue-aware routing, fixed-window batching) it is the search's first trial (told from its
known run, not simulated again), so the search starts from what the user has. ``budget``
counts every simulator run of the search, the current arm's included.

Params (the shape the live parameter API takes)::

    {"routing": {"policy": "queue-aware", "queue_weight", "utilization_weight",
                 "memory_weight", "overload_utilization", "overload_free_gb"},
     "batching_per_model": {MODEL: {"policy": "fixed-window", "max_batch_size",
                                    "max_batch_delay_ms"}},
     "class_headroom": null | float,
     "learn_profiles": bool}

Search space: the three queue-aware weights as shares of a sum of 1 (two dimensions: the
queue's share in [0, 1], and how the rest splits between utilization and memory; a score
only ranks hosts, so only the weights' ratios matter); ``overload_utilization`` in
[0.5, 1]; ``overload_free_gb`` in [0, the largest device's memory]; per model a cap in
{1, 2, 4, 8, 16, 32} and a window in [0.1, min(50, SLO / 4)] ms, log-scaled;
``class_headroom`` (off, or in [0.3, 1]) only when the workload has more than one priority
class; ``learn_profiles`` in {false, true} (profiles that learn, ``core.profile_learning``).
The routing policy stays queue-aware (the params shape is queue-aware's).

Objective ("goodput within SLO first, then P99"): minimise the P99 latency over all
requests subject to ``goodput >= current goodput x (1 - GOODPUT_TOLERANCE)`` (0.5 %: the
run-to-run noise of one simulated minute, not a trade). Optuna sees it as a constraint
(``Trial.set_constraint``: feasible when the shortfall is <= 0); ``Score.key`` orders any two
evaluations the same way: every feasible one before every infeasible one, feasible ones by
P99, infeasible ones by goodput. The best is never worse than the current arm: when no
trial is feasible and better, the current parameters are returned.

Regret: an exhaustive sweep over a small grid (``sweep_grid``: 3 x 3 x 3 x 2 over the
utilization weight, the memory weight, one window for every model and ``learn_profiles``,
the other parameters at the current arm's values) scored the same way;
``regret = (tuned P99 - sweep best P99) / sweep best P99`` (negative: the search found
better than any grid point), None when no grid point is feasible.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evenserve.core.errors import ConfigError
from evenserve.core.scenario import ArmSpec, ClosedLoop, OpenLoop, Scenario, TraceWorkload
from evenserve.policy.batching import BATCHING
from evenserve.policy.params import Params as LiveParams
from evenserve.policy.params import apply_to_arm, parse_update
from evenserve.policy.routing import ROUTING
from evenserve.report.summary import run_summary, summarize
from evenserve.sim.cluster import simulate
from evenserve.sim.loader import LoadedScenario
from evenserve.workload import read_trace

if TYPE_CHECKING:
    import optuna

GOODPUT_TOLERANCE = 0.005
DEFAULT_BUDGET = 30
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
ROUTING_KEYS = (
    "queue_weight",
    "utilization_weight",
    "memory_weight",
    "overload_utilization",
    "overload_free_gb",
)

Params = dict[str, Any]
#: Called after each simulator run: (phase "search" | "sweep" | "held-out", done, total).
Progress = Callable[[str, int, int], None]


# -- params -----------------------------------------------------------------------------------
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


# -- the objective ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Score:
    """One evaluation's figures and its place in the objective's order."""

    p99_ms: float
    goodput_rps: float
    goodput_floor_rps: float

    @property
    def shortfall_rps(self) -> float:
        """How far goodput is under the floor (<= 0: feasible)."""
        return self.goodput_floor_rps - self.goodput_rps

    @property
    def feasible(self) -> bool:
        return self.shortfall_rps <= 0

    @property
    def key(self) -> tuple[int, float]:
        """Sort key, lower is better: feasible by P99, then infeasible by goodput."""
        return (0, self.p99_ms) if self.feasible else (1, -self.goodput_rps)


def goodput_rps(arm_summary: Mapping[str, Any]) -> float:
    return float(sum(m["goodput_rps"] or 0.0 for m in arm_summary["models"].values()))


def score(arm_summary: Mapping[str, Any], goodput_floor_rps: float) -> Score:
    p99 = arm_summary["latency_ms"]["p99"]
    return Score(
        math.inf if p99 is None else float(p99), goodput_rps(arm_summary), goodput_floor_rps
    )


def figures(arm_summary: Mapping[str, Any]) -> dict[str, Any]:
    """The figures the tune table shows."""
    lat = arm_summary["latency_ms"]
    return {
        "goodput_rps": round(goodput_rps(arm_summary), 3),
        "slo_attainment": arm_summary["slo_attainment"],
        "p50_ms": lat["p50"],
        "p99_ms": lat["p99"],
    }


# -- evaluations ------------------------------------------------------------------------------
def evaluate(loaded: LoadedScenario, arm: str, seed: int, params: Params | None) -> dict[str, Any]:
    """One simulated run of the arm (with ``params`` applied): its arm summary."""
    run = loaded if params is None else apply(loaded, arm, params)
    return summarize(simulate(run, arm, seed), timeseries=False)


def _suggest(trial: optuna.Trial, sc: Scenario, classes: bool) -> Params:
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


def _as_trial(params: Params, sc: Scenario, classes: bool) -> dict[str, Any]:
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
        p = _copy_params(base)
        p["learn_profiles"] = bool(learn)
        p["routing"]["utilization_weight"] = uw
        p["routing"]["memory_weight"] = mw
        for m in p["batching_per_model"]:
            p["batching_per_model"][m]["max_batch_delay_ms"] = min(
                window, window_limit_ms(sc.models[m].slo_ms)
            )
        out.append(p)
    return out


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


def _copy_params(p: Params) -> Params:
    return {
        "routing": dict(p["routing"]),
        "batching_per_model": {m: dict(b) for m, b in p["batching_per_model"].items()},
        "class_headroom": p["class_headroom"],
        "learn_profiles": p.get("learn_profiles", False),
    }


# -- the search -------------------------------------------------------------------------------
@dataclass
class Evaluation:
    params: Params | None
    summary: dict[str, Any]
    score: Score


@dataclass
class TuneResult:
    scenario: str
    arm: str
    seed: int
    budget: int
    current: Evaluation
    best: Evaluation
    evaluations: int
    sweep: list[Evaluation] = field(default_factory=list)
    held_out: list[dict[str, Any]] = field(default_factory=list)

    @property
    def sweep_best(self) -> Evaluation | None:
        return min(self.sweep, key=lambda e: e.score.key) if self.sweep else None

    @property
    def regret(self) -> float | None:
        sb = self.sweep_best
        if sb is None or not sb.score.feasible or sb.score.p99_ms <= 0:
            return None
        return (self.best.score.p99_ms - sb.score.p99_ms) / sb.score.p99_ms

    def to_json(self) -> dict[str, Any]:
        """``{"current", "best", "params", "evaluations", "regret", ...}``; current and best
        are run summaries (the format of ``evenserve simulate --json``)."""
        sb = self.sweep_best
        return {
            "current": run_summary(self.scenario, self.seed, {self.arm: self.current.summary}),
            "best": run_summary(self.scenario, self.seed, {self.arm: self.best.summary}),
            "params": self.best.params,
            "current_params": self.current.params,
            "evaluations": self.evaluations,
            "regret": None if self.regret is None else round(self.regret, 6),
            "objective": {
                "minimise": "latency_ms.p99 (all requests)",
                "subject_to": f"goodput_rps >= current goodput x (1 - {GOODPUT_TOLERANCE})",
                "goodput_floor_rps": round(self.current.score.goodput_floor_rps, 6),
                "current": _score_json(self.current.score),
                "best": _score_json(self.best.score),
            },
            "sweep": None
            if sb is None
            else {
                "grid": {k: list(v) for k, v in GRID.items()},
                "evaluations": len(self.sweep),
                "best_params": sb.params,
                "best": _score_json(sb.score),
            },
            "held_out": self.held_out,
            "seed": self.seed,
            "budget": self.budget,
            "arm": self.arm,
        }


def _score_json(s: Score) -> dict[str, Any]:
    return {"p99_ms": s.p99_ms, "goodput_rps": round(s.goodput_rps, 6), "feasible": s.feasible}


def _import_optuna() -> Any:
    try:
        import optuna
    except ImportError as exc:  # pragma: no cover - the extra is in dev
        raise ConfigError(
            f"evenserve tune needs optuna (the tune extra): pip install 'evenserve[tune]' ({exc})"
        ) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("optuna").setLevel(logging.WARNING)
    return optuna


def sampler(optuna: Any, seed: int, budget: int) -> Any:
    """The search's sampler: TPE, seeded, its random start a third of the budget (at most
    10), multivariate (the weights act together: only their ratios matter)."""
    return optuna.samplers.TPESampler(
        seed=seed, n_startup_trials=max(1, min(10, budget // 3)), multivariate=True
    )


def tune(
    loaded: LoadedScenario,
    arm: str,
    *,
    seed: int | None = None,
    budget: int = DEFAULT_BUDGET,
    sweep: bool = True,
    held_out_seeds: int = 0,
    progress: Progress | None = None,
    candidates: Sequence[Params] = (),
) -> TuneResult:
    """Search arm ``arm`` of ``loaded`` (module docstring): ``budget`` simulator evaluations
    in all, the current arm's first (also the search's first trial when it is expressible as
    params), then the sweep's grid when ``sweep``, and then the current and the
    best parameters on ``held_out_seeds`` more seeds (seed + 1, seed + 2, ...).
    ``candidates``: parameter sets the search tries right after the current arm (within the
    budget), e.g. the watch loop's best of earlier windows."""
    if budget < 1:
        raise ConfigError(f"--budget: must be at least 1 (got {budget})")
    if held_out_seeds < 0:
        raise ConfigError(f"--seeds: must be at least 0 (got {held_out_seeds})")
    sc = loaded.scenario
    if arm not in sc.arms:
        raise ConfigError(f"--arm: unknown arm {arm!r} (arms: {', '.join(sc.arms)})")
    s = sc.seed if seed is None else seed
    report = progress or (lambda phase, done, total: None)
    optuna = _import_optuna()

    cur_summary = evaluate(loaded, arm, s, None)
    floor = goodput_rps(cur_summary) * (1.0 - GOODPUT_TOLERANCE)
    cur_params = current_params(sc, arm)
    current = Evaluation(cur_params, cur_summary, score(cur_summary, floor))
    report("search", 1, budget)

    classes = has_classes(loaded)
    study = optuna.create_study(direction="minimize", sampler=sampler(optuna, s, budget))
    if cur_params is not None:
        study.enqueue_trial(_as_trial(cur_params, sc, classes))
    for p in candidates:  # e.g. the watch loop's best of earlier windows: tried first
        study.enqueue_trial(_as_trial(p, sc, classes))
    best = current
    runs = 1  # the current arm's
    while runs < budget:
        trial = study.ask()
        params = _suggest(trial, sc, classes)
        if trial.number == 0 and cur_params is not None:
            # The enqueued current arm (its trial values clipped into the space): its run
            # is known.
            params, summ = cur_params, cur_summary
        else:
            summ = evaluate(loaded, arm, s, params)
            runs += 1
            report("search", runs, budget)
        sc_i = score(summ, floor)
        trial.set_constraint("goodput_shortfall_rps", sc_i.shortfall_rps)
        study.tell(trial, sc_i.p99_ms if math.isfinite(sc_i.p99_ms) else 1e12)
        if sc_i.key < best.score.key:
            best = Evaluation(params, summ, sc_i)

    result = TuneResult(sc.name, arm, s, budget, current, best, runs)
    if sweep:
        grid = sweep_grid(sc, cur_params or default_params(sc, sc.arms[arm].learn_profiles))
        for i, p in enumerate(grid):
            summ = evaluate(loaded, arm, s, p)
            result.sweep.append(Evaluation(p, summ, score(summ, floor)))
            report("sweep", i + 1, len(grid))
    for k in range(held_out_seeds):
        hs = s + 1 + k
        cur_h = evaluate(loaded, arm, hs, None)
        best_h = evaluate(loaded, arm, hs, best.params)
        result.held_out.append({"seed": hs, "current": figures(cur_h), "best": figures(best_h)})
        report("held-out", k + 1, held_out_seeds)
    return result


# -- a trace on a scenario's placement --------------------------------------------------------
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
