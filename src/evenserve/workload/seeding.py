"""Seeded random streams by name (the convention is in the package docstring)."""

from __future__ import annotations

import random


def arrivals_rng(seed: int, stream: str) -> random.Random:
    """The generator of one open-loop stream's inter-arrival gaps."""
    return random.Random(f"{seed}:arrivals:{stream}")


def workload_rng(seed: int) -> random.Random:
    """The simulator's closed-loop generator: every user's think times and mix draws."""
    return random.Random(f"{seed}:workload")


def user_rng(seed: int, user: int) -> random.Random:
    """One live closed-loop user's generator (think times and mix draws)."""
    return random.Random(f"{seed}:user:{user}")
