"""Diagnose runs and verify the recommended changes in the simulator.

``diagnose_summary`` turns every arm of a summary (``simulate``, ``compare``, ``bench``, or a
live collection) into findings (``report.diagnose``). With the scenario the run came from
(``Replay``: its file, arm, seed and overrides, or a recorded trace on a placement),
``verify`` replays the run's arrivals with each finding's candidate changes, each in its own
simulator run, and keeps as the finding's ``recommendation`` the one with the lowest P99
whose goodput is no lower than the run's (within 0.5 %): the predicted change in P99,
goodput, SLO attainment and utilization spread, against a replay of the run as it was.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evenserve.core.errors import ConfigError
from evenserve.experiment import tune
from evenserve.experiment.scaling import scale_scenario
from evenserve.report.diagnose import DEFAULT, Candidate, Thresholds, diagnose_arm, window_of
from evenserve.report.summary import summarize
from evenserve.sim.cluster import simulate
from evenserve.sim.loader import LoadedScenario, load_scenario, with_level

#: Goodput a recommendation may lose against the replay of the run as it was (0.5 %).
GOODPUT_TOLERANCE = 0.995


@dataclass(frozen=True)
class Replay:
    """Where a run's arrivals and placement come from, for the simulator to replay."""

    scenario: Path
    arm: str | None = None
    seed: int | None = None
    overrides: tuple[str, ...] = ()
    level: str | None = None
    #: A recorded trace (JSONL) replayed on the scenario's placement instead of its workload.
    trace: Path | None = None
    #: Replay only the first this many seconds (None: the whole run).
    duration_s: float | None = None
    #: A live bench's time scale K, and its run's duration and warm-up (live seconds): the
    #: replay is the scenario K times slower, as the bench ran it (``scale_scenario``).
    time_scale: float = 1.0
    run_duration_s: float | None = None
    run_warmup_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": str(self.scenario),
            "arm": self.arm,
            "seed": self.seed,
            "set": list(self.overrides),
            "level": self.level,
            "trace": None if self.trace is None else str(self.trace),
            "duration_s": self.duration_s,
            "time_scale": self.time_scale,
            "run_duration_s": self.run_duration_s,
            "run_warmup_s": self.run_warmup_s,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Replay:
        return cls(
            scenario=Path(raw["scenario"]),
            arm=raw.get("arm"),
            seed=raw.get("seed"),
            overrides=tuple(raw.get("set") or ()),
            level=raw.get("level"),
            trace=None if raw.get("trace") is None else Path(raw["trace"]),
            duration_s=raw.get("duration_s"),
            time_scale=float(raw.get("time_scale") or 1.0),
            run_duration_s=raw.get("run_duration_s"),
            run_warmup_s=raw.get("run_warmup_s"),
        )

    def load(self, workdir: Path | None = None) -> LoadedScenario:
        """The scenario to replay. ``workdir``: where a time-scaled trace is rewritten (the
        caller owns and removes it; default a new temporary folder)."""
        loaded = with_level(load_scenario(self.scenario, list(self.overrides)), self.level)
        if self.trace is not None:
            loaded = tune.replay_trace(loaded, self.trace)
        if self.time_scale != 1.0:
            sc = loaded.scenario
            k = self.time_scale
            dur = sc.duration_s * k if self.run_duration_s is None else self.run_duration_s
            wu = sc.warmup_s * k if self.run_warmup_s is None else self.run_warmup_s
            work = workdir if workdir is not None else Path(tempfile.mkdtemp(prefix="evenserve-"))
            loaded = scale_scenario(loaded, k, dur, wu, work)
        if self.duration_s is not None and self.duration_s < loaded.scenario.duration_s:
            sc = loaded.scenario
            d = float(self.duration_s)
            sc = sc.model_copy(update={"duration_s": d, "warmup_s": min(sc.warmup_s, d / 4)})
            loaded = LoadedScenario(sc, loaded.base_dir, loaded.profile_sets)
        return loaded


def with_candidate(loaded: LoadedScenario, arm: str, cand: Mapping[str, Any]) -> LoadedScenario:
    """``loaded`` with a candidate change: its parameter set on ``arm`` (as a push puts it),
    its models added to devices, its device fields changed (ConfigError naming the field)."""
    if cand.get("params"):
        loaded = tune.apply(loaded, arm, cand["params"])
    placement = cand.get("placement") or {}
    devices = cand.get("devices") or {}
    if not placement and not devices:
        return loaded
    sc = loaded.scenario
    expanded = sc.expanded_devices()
    names = {d.name for d in expanded}
    for where, wanted in (("placement", placement), ("devices", devices)):
        for n in wanted:
            if n not in names:
                raise ConfigError(f"{where}.{n}: no such device in {sc.name}")
    new = []
    for d in expanded:
        update: dict[str, Any] = dict(devices.get(d.name, {}))
        add = [m for m in placement.get(d.name, []) if m not in d.models]
        if add:
            update["models"] = [*d.models, *add]
        new.append(d.model_copy(update=update) if update else d)
    new_sc = type(sc).model_validate({**sc.model_dump(), "devices": [d.model_dump() for d in new]})
    return LoadedScenario(new_sc, loaded.base_dir, loaded.profile_sets)


def figures(arm: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "p99_ms": arm["latency_ms"]["p99"],
        "goodput_rps": round(tune.goodput_rps(arm), 3),
        "slo_attainment": arm["slo_attainment"],
        "utilization_spread_pts": arm["utilization_spread_pts"],
    }


def _run(job: tuple[dict[str, Any], str, int, dict[str, Any] | None]) -> dict[str, Any]:
    """One simulator run (a process pool's task): the figures, or the error."""
    replay_json, arm, seed, cand = job
    try:
        with tempfile.TemporaryDirectory(prefix="evenserve-diagnose-") as work:
            loaded = Replay.from_json(replay_json).load(Path(work))
            if cand is not None:
                loaded = with_candidate(loaded, arm, cand)
            run = summarize(simulate(loaded, arm, seed), timeseries=False)
        return {"figures": figures(run)}
    except (ConfigError, ValueError) as exc:
        return {"error": str(exc)}


def _change(before: float | None, after: float | None) -> dict[str, float | None]:
    pct = None
    if before is not None and after is not None and before:
        pct = round(100.0 * (after - before) / before, 2)
    return {"before": before, "after": after, "change_pct": pct}


def _predicted(base: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _change(base[k], new[k]) for k in base}


def _better(base: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Lower P99 at goodput no lower (within the tolerance)."""
    p0, p1 = base["p99_ms"], new["p99_ms"]
    if p1 is None or new["goodput_rps"] < GOODPUT_TOLERANCE * base["goodput_rps"]:
        return False
    return p0 is None or p1 < p0


def combine(recs: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """One parameter set from several pushable recommendations, best first: the first
    routing and learn_profiles given, each model's batching from the first that names it.
    None when fewer than two changes combine."""
    out: dict[str, Any] = {}
    per_model: dict[str, Any] = {}
    used = []
    for r in recs:
        p = r.get("params") or {}
        if not r.get("pushable") or not p:
            continue
        took = False
        for k in ("routing", "learn_profiles", "class_headroom"):
            if k in p and k not in out:
                out[k] = p[k]
                took = True
        for m, spec in (p.get("batching_per_model") or {}).items():
            if m not in per_model:
                per_model[m] = spec
                took = True
        if took:
            used.append(r["change"])
    if per_model:
        out["batching_per_model"] = per_model
    if len(used) < 2:
        return None
    return {
        "change": "together: " + "; ".join(used),
        "params": out,
        "placement": None,
        "devices": None,
        "pushable": True,
    }


def _key(c: Mapping[str, Any]) -> str:
    return json.dumps({k: c.get(k) for k in ("params", "placement", "devices")}, sort_keys=True)


@dataclass
class Verified:
    replay: dict[str, Any]
    baseline: dict[str, Any]
    runs: int
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Every pushable recommendation at once (``combine``), with its predicted change and
    #: whether it beat the replay; None when fewer than two combine.
    combined: dict[str, Any] | None = None


def verify(
    findings: list[dict[str, Any]],
    replay: Replay,
    arm: str,
    *,
    jobs: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Verified:
    """Replay the run, and the run with each finding's candidates (each distinct change once,
    ``jobs`` at a time); set each finding's ``recommendation`` (None when no candidate was
    better in the simulator) and ``tried``."""
    rj = replay.to_json()
    with tempfile.TemporaryDirectory(prefix="evenserve-diagnose-") as work:
        loaded = replay.load(Path(work))  # errors in the replay surface here, before any run
    sc = loaded.scenario
    if arm not in sc.arms:
        raise ConfigError(f"--arm: unknown arm {arm!r} (arms: {', '.join(sc.arms)})")
    seed = sc.seed if replay.seed is None else replay.seed
    distinct: dict[str, dict[str, Any]] = {}
    for f in findings:
        for c in f["candidates"]:
            distinct.setdefault(_key(c), c)
    job_list: list[tuple[dict[str, Any], str, int, dict[str, Any] | None]] = [
        (rj, arm, seed, None),
        *((rj, arm, seed, c) for c in distinct.values()),
    ]
    n = max(1, min(jobs or os.cpu_count() or 1, len(job_list)))
    out: list[dict[str, Any]] = []
    if n == 1:
        for i, j in enumerate(job_list):
            out.append(_run(j))
            if progress:
                progress(i + 1, len(job_list))
    else:
        with ProcessPoolExecutor(n) as pool:
            for i, r in enumerate(pool.map(_run, job_list)):
                out.append(r)
                if progress:
                    progress(i + 1, len(job_list))
    if "error" in out[0]:
        raise ConfigError(f"replaying the run: {out[0]['error']}")
    base = out[0]["figures"]
    v = Verified(rj, base, len(job_list))
    v.results = dict(zip(distinct, out[1:], strict=True))
    for f in findings:
        tried = []
        best: tuple[tuple[float, float], dict[str, Any]] | None = None
        for c in f["candidates"]:
            r = v.results[_key(c)]
            entry = {"change": c["change"], "pushable": c["pushable"]}
            if "error" in r:
                tried.append(entry | {"error": r["error"]})
                continue
            new = r["figures"]
            entry["predicted"] = _predicted(base, new)
            entry["better"] = _better(base, new)
            tried.append(entry)
            if entry["better"]:
                k = (new["p99_ms"], -new["goodput_rps"])
                if best is None or k < best[0]:
                    best = (k, c | {"predicted": entry["predicted"]})
        f["tried"] = tried
        f["recommendation"] = None if best is None else best[1]
    recs = [f["recommendation"] for f in findings if f["recommendation"] is not None]
    recs.sort(key=lambda r: r["predicted"]["p99_ms"]["after"])
    together = combine(recs)
    if together is not None:
        r = _run((rj, arm, seed, together))
        v.runs += 1
        if progress:
            progress(v.runs, v.runs)
        if "error" in r:
            together["error"] = r["error"]
        else:
            together["predicted"] = _predicted(base, r["figures"])
            together["better"] = _better(base, r["figures"])
        v.combined = together
    return v


def diagnose_summary(
    summary: Mapping[str, Any], th: Thresholds = DEFAULT
) -> dict[str, list[dict[str, Any]]]:
    """Findings per arm of a summary (``{"arms": {NAME: ARM}}``)."""
    arms = summary.get("arms")
    if not isinstance(arms, Mapping) or not arms:
        raise ConfigError("the summary has no 'arms' (expected the JSON simulate/bench write)")
    out = {}
    for name, arm in arms.items():
        if not isinstance(arm, Mapping) or "devices" not in arm:
            raise ConfigError(f"arms.{name}: not an arm summary (no 'devices')")
        out[name] = [f.to_json(window_of(arm)) for f in diagnose_arm(arm, th)]
    return out


def replay_of(summary: Mapping[str, Any]) -> Replay | None:
    """The replay a simulated summary names (``source``, written by simulate/compare)."""
    src = summary.get("source")
    return Replay.from_json(src) if isinstance(src, Mapping) and src.get("scenario") else None


def arms_to_verify(summary: Mapping[str, Any], only: Sequence[str] | None) -> list[str]:
    names = list((summary.get("arms") or {}).keys())
    if only:
        for a in only:
            if a not in names:
                raise ConfigError(f"--arm: {a!r} is not in the summary (arms: {', '.join(names)})")
        return list(only)
    return names


__all__ = [
    "Candidate",
    "Replay",
    "diagnose_summary",
    "verify",
    "with_candidate",
]
