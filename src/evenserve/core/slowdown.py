"""A device slower than its profiles say, over time: a base slowdown and phases that multiply
it (the scenario's ``devices[].slowdown`` and ``slowdown_phases``; the worker's
``--slowdown`` and ``--slowdown-phases`` on an emulated device). Pure: the caller says what
time it is, in seconds from the phases' origin."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from evenserve.core.errors import ConfigError


@dataclass(frozen=True)
class SlowdownSchedule:
    """``base`` times the multiplier of the phase ``(start_s, end_s, multiplier)`` that holds
    ``t`` (``start_s <= t < end_s``); phases do not overlap."""

    base: float = 1.0
    phases: tuple[tuple[float, float, float], ...] = ()

    def at(self, t_s: float) -> float:
        for start, end, mult in self.phases:
            if start <= t_s < end:
                return self.base * mult
        return self.base

    @property
    def constant(self) -> bool:
        return not self.phases and self.base == 1.0


def parse_slowdown_phases(
    text: str, flag: str = "--slowdown-phases"
) -> tuple[tuple[float, float, float], ...]:
    """``START_S:END_S:MULT,...`` (seconds, seconds, factor) as phases; ConfigError naming
    ``flag`` on anything else: not three numbers, start < 0, end <= start, a multiplier
    <= 0, or phases that overlap."""
    out: list[tuple[float, float, float]] = []
    for i, item in enumerate(x.strip() for x in text.split(",")):
        if not item:
            continue
        parts = item.split(":")
        try:
            if len(parts) != 3:
                raise ValueError
            start, end, mult = (float(p) for p in parts)
        except ValueError:
            raise ConfigError(
                f"{flag}: phase {i + 1} ({item!r}): expected START_S:END_S:MULT (seconds, "
                "seconds, factor)"
            ) from None
        if not all(math.isfinite(v) for v in (start, end, mult)):
            raise ConfigError(f"{flag}: phase {i + 1} ({item!r}): numbers must be finite")
        if start < 0:
            raise ConfigError(f"{flag}: phase {i + 1} ({item!r}): START_S must be >= 0")
        if end <= start:
            raise ConfigError(
                f"{flag}: phase {i + 1} ({item!r}): END_S must be greater than START_S"
            )
        if mult <= 0:
            raise ConfigError(f"{flag}: phase {i + 1} ({item!r}): MULT must be > 0")
        out.append((start, end, mult))
    out.sort()
    for a, b in itertools.pairwise(out):
        if b[0] < a[1]:
            raise ConfigError(f"{flag}: phases overlap ({a[0]:g}-{a[1]:g} and {b[0]:g}-{b[1]:g})")
    return tuple(out)


def phases_flag(
    phases: list[tuple[float, float, float]] | tuple[tuple[float, float, float], ...],
) -> str:
    """The ``--slowdown-phases`` value of ``phases`` (``parse_slowdown_phases`` reads it back)."""
    return ",".join(f"{s!r}:{e!r}:{m!r}" for s, e, m in phases)
