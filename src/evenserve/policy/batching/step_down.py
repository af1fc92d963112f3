"""step-down: the articles' rule: a fixed window that steps down when batches stay unfilled.

Formula: behaves like fixed-window with the current delay ``delays_ms[level]`` (start at
level 0 = 100 ms). After every ``window_batches`` dispatches, if the mean fill (batch size /
``max_batch_size``) was under ``fill_threshold`` (0.7) step to the next shorter delay (50,
then 30 ms); if it was at or above ``step_up_threshold`` (0.9) step back up.
Params: ``max_batch_size`` (8), ``delays_ms`` ([100, 50, 30]), ``fill_threshold`` (0.7),
``step_up_threshold`` (0.9), ``window_batches`` (8).
"""

from __future__ import annotations

from pydantic import Field, field_validator

from evenserve.core.types import BatchDecision, QueueView
from evenserve.policy.batching.base import BATCHING, BatchingPolicyBase
from evenserve.policy.batching.fixed_window import window_decision
from evenserve.policy.registry import PolicyParams


class StepDownParams(PolicyParams):
    max_batch_size: int = Field(default=8, ge=1)
    delays_ms: list[float] = Field(default_factory=lambda: [100.0, 50.0, 30.0], min_length=1)
    fill_threshold: float = Field(default=0.7, gt=0, le=1)
    step_up_threshold: float = Field(default=0.9, gt=0, le=1)
    window_batches: int = Field(default=8, ge=1)

    @field_validator("delays_ms")
    @classmethod
    def _non_negative(cls, v: list[float]) -> list[float]:
        if any(d < 0 for d in v):
            raise ValueError("delays must be >= 0")
        return v


@BATCHING.register("step-down", StepDownParams, "articles' rule: 100 -> 50 -> 30 ms when unfilled")
class StepDown(BatchingPolicyBase):
    __slots__ = ("_fills", "level", "params")

    def __init__(self, params: StepDownParams) -> None:
        self.params = params
        self.level = 0
        self._fills: list[float] = []

    @property
    def max_batch_size(self) -> int:
        return self.params.max_batch_size

    @property
    def delay_s(self) -> float:
        return self.params.delays_ms[self.level] / 1000.0

    def decide(self, queue: QueueView, now_s: float) -> BatchDecision:
        return window_decision(queue, now_s, self.params.max_batch_size, self.delay_s)

    def on_dispatch(self, n: int, now_s: float) -> None:
        p = self.params
        self._fills.append(n / p.max_batch_size)
        if len(self._fills) < p.window_batches:
            return
        fill = sum(self._fills) / len(self._fills)
        self._fills.clear()
        if fill < p.fill_threshold and self.level < len(p.delays_ms) - 1:
            self.level += 1
        elif fill >= p.step_up_threshold and self.level > 0:
            self.level -= 1
