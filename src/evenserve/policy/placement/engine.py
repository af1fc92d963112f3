"""An LLM engine to placement, shared by the simulator (``sim/llm_placement.py``) and the live
system (the worker's ``kind: llm`` folder, the gateway's catalogue), so both build the same
object from the same fields (design 0022).

- ``EnginePlacement``: the fields placement reads of an engine beside its step profile: the
  KV cache it holds on a device (``kv_tokens``), its load from disk (``cold_load_ms``) and its
  wake from host memory (``warm_load_ms``, vLLM's sleep mode level 1), and the mean request
  its capacity is sized by. A scenario's ``llm:`` gives them flat; a ``kind: llm`` folder's
  ``model.yaml`` as its ``placement:`` section.
- ``engine_info``: the ``ModelInfo`` of an engine (``ModelInfo.for_engine``) from them.
- ``engine_utilization`` and ``UtilizationMeter``: a device's load as placement reads it
  with an engine on it (what the simulator's device and the worker's load report give).
"""

from __future__ import annotations

from collections import deque

from pydantic import Field, model_validator

from evenserve.core.llm import StepProfile
from evenserve.core.validation import Strict
from evenserve.policy.placement.base import ModelInfo

#: The span a device's reported utilization is measured over (seconds).
UTILIZATION_WINDOW_S = 1.0


class CapacityMix(Strict):
    """The mean request placement sizes an engine's capacity by (``ModelInfo.for_engine``)."""

    prompt_tokens: float = Field(ge=0)
    output_tokens: float = Field(ge=1)


class EnginePlacement(Strict):
    """What placement reads of an engine beside its step profile (module docstring)."""

    #: The KV cache it holds when placed (>= one max_model_len sequence).
    kv_tokens: int = Field(ge=1)
    #: From disk (weights through host memory to the device).
    cold_load_ms: float = Field(gt=0)
    #: A wake: weights from host memory (vLLM sleep mode level 1).
    warm_load_ms: float = Field(gt=0)
    capacity: CapacityMix

    @model_validator(mode="after")
    def _wake_before_load(self) -> EnginePlacement:
        if self.warm_load_ms > self.cold_load_ms:
            raise ValueError("warm_load_ms: a wake cannot take longer than cold_load_ms")
        return self


def engine_info(
    name: str,
    profile: StepProfile,
    spec: EnginePlacement,
    max_num_seqs: int,
    slo_s: float | None = None,
) -> ModelInfo:
    """The engine as placement sees it (``ModelInfo.for_engine``); ValueError naming the
    field (``kv_tokens`` below one ``max_model_len`` sequence)."""
    return ModelInfo.for_engine(
        name,
        profile,
        kv_tokens=spec.kv_tokens,
        cold_load_s=spec.cold_load_ms / 1e3,
        warm_load_s=spec.warm_load_ms / 1e3,
        max_num_seqs=max_num_seqs,
        prompt_tokens=spec.capacity.prompt_tokens,
        output_tokens=spec.capacity.output_tokens,
        slo_s=slo_s,
    )


def engine_blocks(info: ModelInfo, profile: StepProfile) -> int:
    """The KV blocks an engine placed with ``info`` holds (its ``kv_tokens`` in whole
    blocks)."""
    return round(info.kv_bytes / profile.block_bytes)


def engine_utilization(
    classic_busy: float, step_s: float, steps: int, tpot_s: float | None, kv_usage: float
) -> float:
    """A device's load as placement reads it, with an LLM engine on it: the fraction of the
    time classic batches ran (``classic_busy``), plus, of the rest, the engine's load: its
    mean step time over the TPOT target (a step as long as the target is a full engine:
    more sequences would miss it), or its KV use if higher; at most 1. Why not the busy
    fraction: an engine with any sequence running steps back to back, so the device reads
    100 % busy at a few per cent of what it can serve, and the autoscaler and the busy-device
    rule would ask for devices an engine does not need."""
    load = 0.0
    if steps and tpot_s:
        load = (step_s / steps) / tpot_s
    load = max(load, kv_usage)
    return min(1.0, classic_busy + (1.0 - min(1.0, classic_busy)) * min(1.0, load))


class UtilizationMeter:
    """``engine_utilization`` over the last ``window_s``: the driver adds each classic
    batch's and each engine step's device-seconds as it starts (``classic`` / ``step``) and
    reads the figure (``read``) with its own time; each read marks the totals, and the span
    is from the newest mark at least ``window_s`` old (or the oldest) to now."""

    __slots__ = ("classic_s", "marks", "step_s", "steps", "window_s")

    def __init__(self, window_s: float = UTILIZATION_WINDOW_S) -> None:
        self.window_s = window_s
        self.classic_s = 0.0
        self.step_s = 0.0
        self.steps = 0
        self.marks: deque[tuple[float, float, float, int]] = deque()

    def classic(self, seconds: float) -> None:
        self.classic_s += seconds

    def step(self, seconds: float) -> None:
        self.step_s += seconds
        self.steps += 1

    def read(self, now: float, tpot_s: float | None, kv_usage: float) -> float:
        marks = self.marks
        marks.append((now, self.classic_s, self.step_s, self.steps))
        while len(marks) > 2 and marks[1][0] <= now - self.window_s:
            marks.popleft()
        t0, c0, s0, n0 = marks[0]
        span = now - t0
        if span <= 0:
            return 0.0
        return engine_utilization(
            (self.classic_s - c0) / span, self.step_s - s0, self.steps - n0, tpot_s, kv_usage
        )
