"""A model mix: ``--mix`` text, and an open-loop rate split over the mix's models."""

from __future__ import annotations

import math
from collections.abc import Mapping

from evenserve.core.errors import ConfigError


def parse_mix(text: str) -> dict[str, float]:
    """``resnet50=0.85,bert-base=0.15`` -> weights (a bare name weighs 1); errors name the item."""
    out: dict[str, float] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, weight = item.partition("=")
        name = name.strip()
        if not name:
            raise ConfigError(f"--mix {item!r}: expected MODEL=WEIGHT")
        if not sep:
            out[name] = 1.0
            continue
        try:
            w = float(weight)
        except ValueError:
            raise ConfigError(f"--mix {item!r}: weight {weight!r} is not a number") from None
        if not math.isfinite(w) or w < 0:
            raise ConfigError(f"--mix {item!r}: weight must be a number >= 0")
        out[name] = w
    if not out:
        raise ConfigError("--mix: give at least one model (MODEL=WEIGHT,...)")
    if sum(out.values()) <= 0:
        raise ConfigError("--mix: weights must not all be zero")
    return out


def check_mix(mix: Mapping[str, float], where: str = "mix") -> float:
    """The total weight of a mix; ConfigError naming ``where`` if a weight is bad or all are 0."""
    for m, w in mix.items():
        if not math.isfinite(w) or w < 0:
            raise ConfigError(f"{where}.{m}: weight must be a finite number >= 0, got {w!r}")
    total = sum(mix.values())
    if total <= 0:
        raise ConfigError(f"{where}: weights must not all be zero")
    return total


def mix_rates(rate_rps: float, mix: Mapping[str, float]) -> dict[str, float]:
    """Per-model rates ``rate_rps * w / sum(w)`` in sorted model order; zero weights left out."""
    if not (rate_rps > 0 and math.isfinite(rate_rps)):
        raise ConfigError(f"rate_rps: must be a finite number > 0, got {rate_rps!r}")
    total = check_mix(mix)
    return {m: rate_rps * mix[m] / total for m in sorted(mix) if mix[m] > 0}
