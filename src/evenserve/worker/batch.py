"""What the worker's driver hands its collaborators: the pending request (what the scheduler
queues, with its payload and its caller's future), a running batch, what an executor reports
of it (``BatchResult``), the executor's protocol and the observer's hooks (metrics,
statistics, tests)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from evenserve.sched import Batch, QueuedRequest


@dataclass(slots=True, eq=False)
class PendingRequest(QueuedRequest):
    """A queued request: what the scheduler holds plus its payload and its caller's future."""

    payload: Any = None
    future: asyncio.Future[Any] | None = None
    #: Set when its batch ends: seconds from arrival to the batch's start, and the batch's
    #: compute time (the response headers x-evenserve-queue-ms / -compute-ms).
    queue_s: float | None = None
    compute_s: float | None = None


@dataclass(slots=True)
class BatchResult:
    """What an executor reports for one batch: per-request outputs, or one error for all."""

    outputs: Sequence[Any] | None
    error: str | None = None
    compute_input_s: float = 0.0
    compute_infer_s: float = 0.0
    compute_output_s: float = 0.0
    #: An engine step's sampled token per seq id (a real model's; None: the engine's own).
    sampled: Mapping[int, int] | None = None

    @property
    def compute_s(self) -> float:
        return self.compute_input_s + self.compute_infer_s + self.compute_output_s


RunningBatch = Batch[PendingRequest]


class BatchExecutor(Protocol):
    #: True when batches end at the scheduler's times (nothing runs): the driver then
    #: honours ``end_at`` and asks the executor to ``complete`` the batch.
    timed_by_scheduler: bool

    def start(self, batch: RunningBatch, done: Callable[[BatchResult], None]) -> None:
        """Start running a batch; call ``done`` once when it ends: on the device thread that
        ran it (a threaded executor) or on the driver's loop (a scheduler-timed one)."""

    def complete(self, batch: RunningBatch) -> None:
        """(Scheduler-timed executors) the batch's time is up: call its ``done`` now."""


class DriverObserver:
    """Hooks for metrics and statistics (no-ops here)."""

    def batch_started(self, batch: RunningBatch, now_s: float) -> None:
        return None

    def batch_finished(self, batch: RunningBatch, result: BatchResult, now_s: float) -> None:
        return None

    def request_dropped(self, model: str, reason: str, waited_s: float) -> None:
        """A request that will not run: a refusal (REFUSAL_REASONS, counted once each),
        ``cancelled`` (its caller went away) or ``shutdown``."""
        return None
