"""The one arrival record: what the simulator replays, the load generator sends, traces hold."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request: when (seconds from the start), which model, its class and deadline.

    ``priority`` and ``deadline_ms`` (milliseconds after ``t_s``) are ``None`` when the
    request carries none: the model's own priority class and deadline then apply.
    """

    t_s: float
    model: str
    priority: int | None = None
    deadline_ms: float | None = None
