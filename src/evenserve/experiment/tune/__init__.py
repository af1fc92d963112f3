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

The package: ``params`` (an arm as a params object and back, a trace replayed on a
scenario's placement), ``space`` (the search space as optuna sees it, and the sweep's grid)
and ``search`` (the objective, the evaluations, the search itself and its result).
"""

from evenserve.experiment.tune.params import (
    Params,
    apply,
    current_params,
    default_params,
    has_classes,
    replay_trace,
)
from evenserve.experiment.tune.search import (
    DEFAULT_BUDGET,
    GOODPUT_TOLERANCE,
    Evaluation,
    Progress,
    Score,
    TuneResult,
    evaluate,
    figures,
    goodput_rps,
    score,
    tune,
)
from evenserve.experiment.tune.space import GRID, sweep_grid

__all__ = [
    "DEFAULT_BUDGET",
    "GOODPUT_TOLERANCE",
    "GRID",
    "Evaluation",
    "Params",
    "Progress",
    "Score",
    "TuneResult",
    "apply",
    "current_params",
    "default_params",
    "evaluate",
    "figures",
    "goodput_rps",
    "has_classes",
    "replay_trace",
    "score",
    "sweep_grid",
    "tune",
]
