"""Traces: JSON Lines files of arrivals, shared by the simulator and the load generator.

One object per line: ``t_s`` (seconds from the start, >= 0), ``model``, and optionally
``priority`` (an integer, or a class name such as ``online``/``offline``) and ``deadline_ms``
(milliseconds after ``t_s``), read with the wire contract's parsers (``core.wire``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

from evenserve.core.errors import ConfigError
from evenserve.core.wire import parse_deadline_ms, parse_priority
from evenserve.workload.arrival import Arrival


def read_trace(path: Path, known_models: Sequence[str] | None = None) -> list[Arrival]:
    """Read and validate a JSONL trace, sorted by time; errors name the file, line and field."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"trace file not found: {path}") from None
    out: list[Arrival] = []
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
        try:
            priority = parse_priority(obj.get("priority"), f"{where}: priority")
            deadline_ms = parse_deadline_ms(obj.get("deadline_ms"), f"{where}: deadline_ms")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        out.append(Arrival(float(t), model, priority, deadline_ms))
    out.sort(key=lambda e: e.t_s)
    return out


def write_trace(path: Path, arrivals: Iterable[Arrival]) -> None:
    with path.open("w") as f:
        for e in arrivals:
            obj: dict[str, object] = {"t_s": round(e.t_s, 6), "model": e.model}
            if e.priority is not None:
                obj["priority"] = e.priority
            if e.deadline_ms is not None:
                obj["deadline_ms"] = e.deadline_ms
            f.write(json.dumps(obj) + "\n")


def replay(
    arrivals: Sequence[Arrival], duration_s: float, max_requests: int, time_scale: float = 1.0
) -> list[Arrival]:
    """A trace's arrivals with times stretched by ``time_scale``, cut at the duration and cap."""
    out: list[Arrival] = []
    for a in sorted(arrivals, key=lambda a: a.t_s):
        t = a.t_s * time_scale
        if t >= duration_s or len(out) >= max_requests:
            break
        out.append(Arrival(t, a.model, a.priority, a.deadline_ms))
    return out
