"""Which goes first on a device that hosts an LLM engine and classic models (pure).

When an instance is free and both an engine step and a classic batch could start, the device
runs one of them; the next decision comes when it ends. The rule protects both SLOs:
- Classes first: the side whose head is of the more urgent class (higher ``priority``) goes
  first (offline work never delays online work on either side).
- Within a class the two alternate (one step, one batch, ...): a classic batch delays the
  engine's next token by at most one batch time, a step delays the classic queue by at most
  one step time (a decode step of an 8B model on an H100 is ~6-10 ms; a ResNet-50 batch of
  8 ~5 ms), so neither starves the other.
- Two overrides of the alternation: the classic batch goes first when its head's slack
  (its SLO's end - now - the batch's time) is under the next step's time (waiting one step
  would make it miss); the engine goes first when its running sequences have waited longer
  than their TPOT target since the last step ended (another batch would make them miss).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ENGINE, CLASSIC = "engine", "classic"


@dataclass(frozen=True, slots=True)
class Side:
    """What the rule reads of one side."""

    #: The class of its head (higher is more urgent: online 10, offline 0).
    priority: int
    #: Seconds its next unit (the step, or the batch) takes.
    next_s: float
    #: Classic: seconds of slack its head has (inf: no SLO). Engine: seconds its running
    #: sequences have waited since the last step ended.
    slack_s: float = math.inf
    #: Engine: its TPOT target (inf: none).
    tpot_s: float = math.inf


def first(engine: Side, classic: Side, last: str | None) -> str:
    """``engine`` or ``classic`` (see the module docstring); ``last``: which ran last."""
    if engine.priority != classic.priority:
        return ENGINE if engine.priority > classic.priority else CLASSIC
    if classic.slack_s < engine.next_s:
        return CLASSIC
    if engine.slack_s + classic.next_s > engine.tpot_s:
        return ENGINE
    return CLASSIC if last == ENGINE else ENGINE
