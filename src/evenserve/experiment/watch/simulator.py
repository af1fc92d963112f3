"""The simulator behind ``Predictor``: a window's recorded arrivals written as a trace and
replayed on a scenario's placement under parameters, with the devices' learned profile
scales, and the tuner searching from the parameters in force."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from evenserve.experiment import tune as tuning
from evenserve.experiment.watch.rules import Figures, Params, Record, params_key
from evenserve.sim.loader import LoadedScenario

#: Earlier windows' best sets each window's search tries first.
ELITE = 3


def records_trace(records: Sequence[Record], path: Path) -> None:
    """Write ``records`` as a trace: sorted by ``unix_s``, ``t_s`` from the first."""
    rows = sorted(records, key=lambda r: float(r["unix_s"]))
    t0 = float(rows[0]["unix_s"]) if rows else 0.0
    with path.open("w") as f:
        for r in rows:
            f.write(json.dumps({**r, "t_s": round(float(r["unix_s"]) - t0, 6)}) + "\n")


class SimPredictor:
    """The simulator on a scenario's placement (``loaded``, arm ``arm``): a window's recorded
    arrivals replayed as a trace under parameters (``tune.replay_trace``, ``tune.apply``);
    ``tune`` searches ``budget`` evaluations from the parameters in force (no sweep).

    Replaying with the learned profiles: a device whose backend (same name) reports learned
    profile scales runs, in the simulator, at their mean as its ``slowdown`` (what the
    device was measured to be, in place of what the scenario says); a device without them
    keeps the scenario's."""

    def __init__(self, loaded: LoadedScenario, arm: str, *, budget: int, seed: int) -> None:
        self.loaded = loaded
        self.arm = arm
        self.budget = budget
        self.seed = seed
        self._dir = Path(tempfile.mkdtemp(prefix="evenserve-watch-"))
        self._cache: dict[tuple[tuple[int, float, float], str], Figures] = {}
        self.evaluations = 0
        self._base = loaded
        #: The slowdown each device was given from its learned scales (the last window's).
        self.learned_slowdown: dict[str, float] = {}
        #: The best sets of earlier windows' searches (newest last): each window's search
        #: tries them first, so the loop's search goes on across windows.
        self.elite: list[Params] = []

    def observe_devices(self, scales: Mapping[str, Mapping[str, float]]) -> None:
        sc = self._base.scenario
        slow: dict[str, float] = {}
        for d in sc.devices:
            s = scales.get(d.name)
            if d.count == 1 and s:
                slow[d.name] = round(float(np.mean(list(s.values()))), 3)
        if slow == self.learned_slowdown:
            return
        self.learned_slowdown = slow
        devices = [
            d.model_copy(update={"slowdown": slow[d.name]}) if d.name in slow else d
            for d in sc.devices
        ]
        new_sc = sc.model_copy(update={"devices": devices})
        self.loaded = LoadedScenario(new_sc, self._base.base_dir, self._base.profile_sets)
        self._cache = {}

    def _replayed(self, records: Sequence[Record]) -> LoadedScenario:
        path = self._dir / "window.jsonl"
        records_trace(records, path)
        loaded = tuning.replay_trace(self.loaded, path)
        # The window is what was measured live: no warm-up of its own.
        sc = loaded.scenario.model_copy(update={"warmup_s": 0.0})
        return LoadedScenario(sc, loaded.base_dir, loaded.profile_sets)

    @staticmethod
    def _figures(summary: Mapping[str, Any]) -> Figures:
        f = tuning.figures(summary)
        return Figures(f["p99_ms"], float(f["goodput_rps"]), int(summary["requests"]["completed"]))

    @staticmethod
    def _window(records: Sequence[Record]) -> tuple[int, float, float]:
        if not records:
            return (0, 0.0, 0.0)
        times = [float(r["unix_s"]) for r in records]
        return (len(records), min(times), max(times))

    def predict(self, records: Sequence[Record], params: Params) -> Figures:
        """The window replayed under ``params`` (one simulation per window and set)."""
        w = self._window(records)
        key = (w, params_key(params))
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        self.evaluations += 1
        fig = self._figures(tuning.evaluate(self._replayed(records), self.arm, self.seed, params))
        self._cache = {k: v for k, v in self._cache.items() if k[0] == w}
        self._cache[key] = fig
        return fig

    def tune(self, records: Sequence[Record], params: Params) -> tuple[Params, Figures]:
        loaded = tuning.apply(self._replayed(records), self.arm, params)
        now = params_key(params)
        earlier = [p for p in self.elite if params_key(p) != now][-ELITE:]
        res = tuning.tune(
            loaded,
            self.arm,
            seed=self.seed,
            budget=self.budget,
            sweep=False,
            candidates=earlier[: max(0, self.budget - 2)],
        )
        self.evaluations += res.evaluations
        best = res.best.params if res.best.params is not None else params
        if params_key(best) != now and all(params_key(best) != params_key(p) for p in self.elite):
            self.elite = [*self.elite, best][-ELITE:]
        return best, self._figures(res.best.summary)
