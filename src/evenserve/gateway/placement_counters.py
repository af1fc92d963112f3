"""What the live placement driver counts (the controller counts its own decisions): the
figures its metrics and its admin view show."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class PlacementCounters:
    """What the placement driver counted (the controller counts its own decisions)."""

    #: Per (device, model): loads and unloads the gateway started.
    loads: dict[tuple[str, str], int] = field(default_factory=dict)
    evictions: dict[tuple[str, str], int] = field(default_factory=dict)
    #: Loads done as the workers' replies say they came: from the host pool or from disk.
    live_sources: dict[str, int] = field(default_factory=lambda: {"host": 0, "disk": 0})
    scale_decisions: dict[str, int] = field(default_factory=lambda: {"up": 0, "down": 0})
    #: Seconds from the first request of the last burst to its ScaleUp (None: none yet).
    last_scale_up_s: float | None = None
    scale_up_log: list[float] = field(default_factory=list)
    #: The wall time (Unix seconds) of every ScaleUp decision, for a bench to measure the
    #: decision time from its own burst's start (``/admin/placement`` ``scale_ups_unix_s``).
    scale_up_unix_s: list[float] = field(default_factory=list)
    #: Per device, how many times it was lost; per (device, model), adoptions and drops.
    lost: dict[str, int] = field(default_factory=dict)
    adopted: dict[tuple[str, str], int] = field(default_factory=dict)
    dropped: dict[tuple[str, str], int] = field(default_factory=dict)


def bump(counts: dict[Any, int], key: Any) -> None:
    counts[key] = counts.get(key, 0) + 1
