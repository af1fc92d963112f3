"""What a device scheduler hands its driver: the batches it starts and the actions it asks
for (see ``sched.scheduler``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from evenserve.sched.queues import QueuedRequest

if TYPE_CHECKING:
    from evenserve.sched.engine.engine import Step, TokenEvent

R = TypeVar("R", bound=QueuedRequest)


@dataclass(slots=True, eq=False)
class Batch(Generic[R]):
    """A batch the scheduler started on one instance."""

    model: str
    requests: list[R]
    items: int
    instance: int
    started_s: float
    #: Expected seconds alone (profile, else observed).
    solo_s: float
    memory_bytes: float
    #: The device's batch number, from 0.
    index: int
    #: Expected end while it runs (start + solo time; shared devices move it), actual end once
    #: finished.
    end_s: float = math.nan
    #: Seconds its instance sat idle while the batch's oldest request waited (the batching
    #: policy held it: a window, a static size to fill, memory): from the later of that
    #: request's arrival and the instance's last batch end, to this start.
    held_s: float = 0.0
    #: The most requests the model's policy put in one batch when this one started.
    cap: int = 0
    #: An LLM engine's step (the batch's requests are its sequences' requests), else None.
    step: Step[Any] | None = None
    #: The step's tokens, once it finished (``DeviceScheduler.finished`` sets them).
    events: list[TokenEvent[Any]] | None = None


class SchedulerActions(Protocol[R]):
    def start_batch(self, batch: Batch[R]) -> None: ...

    def drop(self, request: R, reason: str) -> None: ...

    def wake_at(self, t_s: float) -> None: ...

    def end_at(self, t_s: float, token: int) -> None: ...
