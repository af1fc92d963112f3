"""Arrival processes: open-loop Poisson (with rate phases), closed-loop users, trace replay.

Trace format (JSON Lines, shared with the load generator): one object per request with
``t_s`` (seconds from the start), ``model``, and optionally ``priority`` (an integer or a
class name such as ``online``/``offline``) and ``deadline_ms`` (relative to ``t_s``).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from evenserve.core.errors import ConfigError
from evenserve.core.scenario import Phase
from evenserve.core.types import PRIORITY_CLASSES


class PoissonProcess:
    """Arrival times of a Poisson process whose rate is ``base_rps`` times a phase multiplier.

    Exact for piecewise-constant rates: an exponential gap that would cross a phase boundary
    is redrawn from the boundary (memorylessness).
    """

    def __init__(self, base_rps: float, phases: Sequence[Phase], rng: random.Random) -> None:
        self.base_rps = base_rps
        self.phases = sorted(phases, key=lambda p: p.start_s)
        self.rng = rng
        edges = {0.0}
        for p in self.phases:
            edges.add(p.start_s)
            edges.add(p.end_s)
        self._edges = sorted(edges)

    def rate_at(self, t_s: float) -> float:
        mult = 1.0
        for p in self.phases:
            if p.start_s <= t_s < p.end_s:
                mult = p.multiplier
        return self.base_rps * mult

    def _next_edge(self, t_s: float) -> float:
        for e in self._edges:
            if e > t_s:
                return e
        return math.inf

    def next_after(self, t_s: float) -> float:
        if not self.phases:  # a constant rate (the common case)
            return t_s + self.rng.expovariate(self.base_rps) if self.base_rps > 0 else math.inf
        while True:
            rate = self.rate_at(t_s)
            edge = self._next_edge(t_s)
            if rate <= 0:
                if edge == math.inf:
                    return math.inf
                t_s = edge
                continue
            nxt = t_s + self.rng.expovariate(rate)
            if nxt < edge or edge == math.inf:
                return nxt
            t_s = edge


@dataclass(frozen=True, slots=True)
class TraceEntry:
    t_s: float
    model: str
    priority: int | None = None
    deadline_ms: float | None = None


def parse_priority(value: object, where: str) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{where}: priority must be an integer or a class name")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value in PRIORITY_CLASSES:
        return PRIORITY_CLASSES[value]
    raise ConfigError(f"{where}: priority must be an integer or one of {sorted(PRIORITY_CLASSES)}")


def read_trace(path: Path, known_models: Sequence[str] | None = None) -> list[TraceEntry]:
    """Read and validate a JSONL trace; errors name the line and the field."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"trace file not found: {path}") from None
    out: list[TraceEntry] = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: not valid JSON: {exc.msg}") from None
        if not isinstance(obj, dict):
            raise ConfigError(f"{where}: expected a JSON object")
        t = obj.get("t_s")
        if not isinstance(t, int | float) or isinstance(t, bool) or t < 0 or not math.isfinite(t):
            raise ConfigError(f"{where}: t_s must be a number >= 0")
        model = obj.get("model")
        if not isinstance(model, str) or not model:
            raise ConfigError(f"{where}: model must be a non-empty string")
        if known_models is not None and model not in known_models:
            raise ConfigError(f"{where}: model {model!r} is not in the scenario")
        prio = obj.get("priority")
        dl = obj.get("deadline_ms")
        if dl is not None and (not isinstance(dl, int | float) or isinstance(dl, bool) or dl <= 0):
            raise ConfigError(f"{where}: deadline_ms must be a number > 0")
        out.append(
            TraceEntry(
                t_s=float(t),
                model=model,
                priority=None if prio is None else parse_priority(prio, f"{where}: priority"),
                deadline_ms=None if dl is None else float(dl),
            )
        )
    out.sort(key=lambda e: e.t_s)
    return out


def write_trace(path: Path, entries: Iterator[TraceEntry] | Sequence[TraceEntry]) -> None:
    with path.open("w") as f:
        for e in entries:
            obj: dict[str, object] = {"t_s": round(e.t_s, 6), "model": e.model}
            if e.priority is not None:
                obj["priority"] = e.priority
            if e.deadline_ms is not None:
                obj["deadline_ms"] = e.deadline_ms
            f.write(json.dumps(obj) + "\n")
