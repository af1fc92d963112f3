"""What runs an LLM engine's steps on the worker's device thread.

``EmulatedSteps``: a step takes what the step profile says (``Step.seconds``, computed by the
engine from the same profile the simulator uses), slept precisely (the emulated runtime's
sleeper); it samples a synthetic token per sequence that samples: printable byte-level ids
(words of lowercase letters), so text decodes with the byte tokenizer. An emulated model has
no EOS: every generation runs to its ``max_tokens``.

``TorchSteps``: a real causal LM (``runtime.llm.TorchStepExecutor``): the step's entries run
on it, its sampled tokens come back. The sequences the engine let go (finished, cancelled,
preempted) have their caches dropped on the device thread before the next step runs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from evenserve.core.llm import StepExecutor
from evenserve.runtime.emulated import PreciseSleeper
from evenserve.sched.engine import Step


class StepRunner(Protocol):
    def run(self, step: Step[Any], free: Sequence[int]) -> Mapping[int, int] | None:
        """Run ``step`` (blocking, on the device thread) after dropping ``free``'s caches;
        the sampled token per seq id (None: the engine makes its own)."""
        ...

    def describe(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


#: Byte ids of the emulated text: lowercase letters, a space every few tokens.
_A, _SPACE = ord("a"), ord(" ")


def emulated_token(seq_id: int, index: int) -> int:
    """The ``index``-th synthetic token of a sequence (a byte-level id)."""
    if index % 6 == 5:
        return _SPACE
    return _A + (seq_id * 7 + index * 3) % 26


class EmulatedSteps:
    """Steps that take their step profile's time (see the module docstring)."""

    def __init__(self, slowdown: float = 1.0) -> None:
        self.slowdown = slowdown
        self._sleeper = PreciseSleeper()
        self._steps = 0

    def run(self, step: Step[Any], free: Sequence[int]) -> Mapping[int, int]:
        start = time.perf_counter()
        out = {
            p.seq.seq_id: emulated_token(p.seq.seq_id, p.seq.output) for p in step.parts if p.sample
        }
        self._sleeper.sleep_until(start + step.seconds * self.slowdown)
        self._steps += 1
        return out

    def describe(self) -> dict[str, Any]:
        return {"runtime": "emulated", "kind": "llm", "steps": self._steps}

    def close(self) -> None:
        return None


class TorchSteps:
    """A real model's steps (see the module docstring)."""

    def __init__(self, executor: StepExecutor, description: dict[str, Any]) -> None:
        self.executor = executor
        self._description = description
        self._lock = threading.Lock()

    def run(self, step: Step[Any], free: Sequence[int]) -> Mapping[int, int]:
        with self._lock:
            for sid in free:
                self.executor.free(sid)
            return self.executor.step(step.entries())

    def describe(self) -> dict[str, Any]:
        return dict(self._description)

    def close(self) -> None:
        return None
