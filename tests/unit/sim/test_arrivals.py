"""The simulator's arrivals: pinned, and the workload module's.

The figures below were recorded from the simulator as it stood before the workload module
(seed 3, toy devices); they must not move when the simulator draws its arrivals through
``evenserve.workload``: same per-stream seeds, same closed-loop draw order, same trace
handling. Times are compared to 1e-9 s, so a last-bit difference in a platform's ``log``
cannot fail them; counts are exact.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from evenserve.core.scenario import OpenLoop
from evenserve.sim.cluster import simulate
from evenserve.sim.loader import load_scenario
from evenserve.workload import open_loop_arrivals, read_trace
from tests.unit.workload.test_open_loop import PHASED

from .scenarios import toy_scenario, write_scenario

OPEN_LOOP = PHASED  # the workload tests' phased streams, with classes and deadlines
CLOSED_LOOP = {"type": "closed-loop", "users": 7, "think_ms": 20, "mix": {"slow": 1, "fast": 3}}
TRACE = [
    {"t_s": 0.5, "model": "slow", "priority": "offline", "deadline_ms": 300},
    {"t_s": 0.1, "model": "fast"},
    {"t_s": 3.25, "model": "fast", "priority": 3},
    {"t_s": 19.5, "model": "slow"},
    {"t_s": 25.0, "model": "fast"},
]

# (workload, arm): arrivals, per model, the first six (model, t_s, class), sum of t_s.
PINNED: dict[tuple[str, str], dict[str, Any]] = {
    ("open", "optimized"): {
        "n": 10934,
        "per_model": {"fast": 9810, "slow": 1124},
        "head": [
            ("fast", 0.001348449, 10),
            ("fast", 0.00839432, 10),
            ("fast", 0.009884068, 10),
            ("fast", 0.011029819, 10),
            ("fast", 0.011055145, 0),
            ("fast", 0.016314282, 10),
        ],
        "sum_t": 101938.44553,
        "priority_sum": 99215,
    },
    # Re-recorded when least-expected-work's predicted finish changed (aged busy time, then
    # the same sums in another order): a closed loop's arrivals follow its completions, so
    # routing moves them, down to a tie broken the other way (the head does not move).
    # Re-recorded when every answer began to take away what its send added to the queue
    # estimate, below the reported queue too (``Router.done``): the head did not move.
    ("closed", "optimized"): {
        "n": 4775,
        "per_model": {"fast": 3564, "slow": 1211},
        "head": [
            ("fast", 0.002634991, 10),
            ("fast", 0.004179357, 10),
            ("fast", 0.006071314, 10),
            ("fast", 0.006945531, 10),
            ("fast", 0.010545213, 10),
            ("fast", 0.015861032, 10),
        ],
        "sum_t": 47697.466185,
        "priority_sum": 47750,
    },
    ("closed", "central-queue"): {
        "n": 4787,
        "per_model": {"fast": 3606, "slow": 1181},
        "head": [
            ("fast", 0.002634991, 10),
            ("fast", 0.004179357, 10),
            ("fast", 0.006071314, 10),
            ("fast", 0.006945531, 10),
            ("fast", 0.010545213, 10),
            ("fast", 0.015527345, 10),
        ],
        "sum_t": 47733.24241,
        "priority_sum": 47870,
    },
    ("trace", "optimized"): {
        "n": 4,
        "per_model": {"fast": 2, "slow": 2},
        "head": [("fast", 0.1, 10), ("slow", 0.5, 0), ("fast", 3.25, 3), ("slow", 19.5, 10)],
        "sum_t": 23.35,
        "priority_sum": 23,
    },
}


def _scenario(tmp_path: Path, kind: str) -> Path:
    if kind == "trace":
        (tmp_path / "trace.jsonl").write_text("".join(json.dumps(e) + "\n" for e in TRACE))
        workload: dict[str, Any] = {"type": "trace", "path": "trace.jsonl"}
    else:
        workload = OPEN_LOOP if kind == "open" else CLOSED_LOOP
    return write_scenario(tmp_path, toy_scenario(tmp_path, workload=workload), f"{kind}.yaml")


@pytest.mark.parametrize(("kind", "arm"), list(PINNED))
def test_the_simulators_arrivals_are_pinned(tmp_path: Path, kind: str, arm: str) -> None:
    log = simulate(load_scenario(_scenario(tmp_path, kind)), arm).requests
    want = PINNED[(kind, arm)]
    assert len(log) == want["n"]
    assert {m: log.model.count(m) for m in want["per_model"]} == want["per_model"]
    head = list(zip(log.model, log.arrival_s, log.priority, strict=True))[: len(want["head"])]
    for (m, t, p), (wm, wt, wp) in zip(head, want["head"], strict=True):
        assert (m, p) == (wm, wp) and t == pytest.approx(wt, abs=1e-9)
    assert sum(log.arrival_s) == pytest.approx(want["sum_t"], abs=1e-5)
    assert sum(log.priority) == want["priority_sum"]


@pytest.mark.parametrize("arm", ["optimized", "central-queue"])
def test_open_loop_arrivals_are_the_simulators(tmp_path: Path, arm: str) -> None:
    loaded = load_scenario(_scenario(tmp_path, "open"))
    sc = loaded.scenario
    assert isinstance(sc.workload, OpenLoop)
    log = simulate(loaded, arm).requests
    arrivals = open_loop_arrivals(sc.workload, sc.seed, sc.duration_s)
    own = {m: spec.priority_value for m, spec in sc.models.items()}  # a stream without a class
    assert [
        (a.t_s, a.model, own[a.model] if a.priority is None else a.priority) for a in arrivals
    ] == (list(zip(log.arrival_s, log.model, log.priority, strict=True)))


def test_trace_arrivals_are_the_simulators(tmp_path: Path) -> None:
    loaded = load_scenario(_scenario(tmp_path, "trace"))
    log = simulate(loaded, "optimized").requests
    entries = [e for e in read_trace(tmp_path / "trace.jsonl") if e.t_s < 20.0]
    assert [(e.t_s, e.model) for e in entries] == list(zip(log.arrival_s, log.model, strict=True))
