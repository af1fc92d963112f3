"""The search: the objective (``Score``: goodput within SLO first, then P99), one simulated
evaluation, optuna's seeded TPE search within the budget, the sweep and the held-out seeds,
and the result (``TuneResult``) with its JSON (the package's docstring)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from evenserve.core.errors import ConfigError
from evenserve.experiment.tune.params import (
    Params,
    apply,
    current_params,
    default_params,
    has_classes,
)
from evenserve.experiment.tune.space import GRID, as_trial, suggest, sweep_grid
from evenserve.report.summary import run_summary, summarize
from evenserve.sim.cluster import simulate
from evenserve.sim.loader import LoadedScenario

GOODPUT_TOLERANCE = 0.005
DEFAULT_BUDGET = 30
#: Called after each simulator run: (phase "search" | "sweep" | "held-out", done, total).
Progress = Callable[[str, int, int], None]


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
    """Search arm ``arm`` of ``loaded`` (the package's docstring): ``budget`` simulator evaluations
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
        study.enqueue_trial(as_trial(cur_params, sc, classes))
    for p in candidates:  # e.g. the watch loop's best of earlier windows: tried first
        study.enqueue_trial(as_trial(p, sc, classes))
    best = current
    runs = 1  # the current arm's
    while runs < budget:
        trial = study.ask()
        params = suggest(trial, sc, classes)
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
