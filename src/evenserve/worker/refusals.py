"""What a request the worker's driver will not run gets: its error and its message.

A refusal (``RefusedError``) carries its reason (``core.wire.REFUSAL_REASONS``, which starts
the message and maps to the answer's status through ``core.wire``'s outcome table) and, when
a retry may cure it, the scheduler's estimate of when; the messages quote the scheduler's own
estimates (the wait it weighed, the latency profile), so a client reads why.
"""

from __future__ import annotations

from typing import Any

from evenserve.core.errors import EvenserveError
from evenserve.core.wire import DEADLINE_EXPIRED, DEADLINE_INFEASIBLE, LOAD_TIMEOUT, SHED
from evenserve.sched import UNLOADED, DeviceScheduler, QueuedRequest


class UnknownModelError(EvenserveError):
    pass


class RefusedError(EvenserveError):
    """The worker will not run this request. ``reason`` is one of ``core.wire``'s
    REFUSAL_REASONS (its HTTP status: ``REFUSAL_STATUS``) and starts the message; refusals a
    retry may cure (429) carry ``retry_after_s``."""

    def __init__(self, reason: str, detail: str, retry_after_s: float | None = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.retry_after_s = retry_after_s


class DrainingError(EvenserveError):
    pass


class BatchFailedError(EvenserveError):
    pass


def refused_at_once(
    sched: DeviceScheduler[Any], request: QueuedRequest, reason: str, queued: int, now: float
) -> RefusedError:
    """The error of a request the scheduler refused on arrival (``queue-full``,
    ``deadline-infeasible``); ``queued``: how many requests wait for its model."""
    model = request.model
    if reason == DEADLINE_INFEASIBLE:
        assert request.deadline_s is not None
        # Refused before anything changed: the same wait the scheduler weighed.
        end = sched.busy_remaining_s(now) + sched.estimate_batch_s(model, 1)
        return RefusedError(
            reason,
            f"model {model!r}: the request's deadline is "
            f"{(request.deadline_s - now) * 1000:.1f} ms away, but even alone right after "
            f"the running batch it would end in {end * 1000:.1f} ms (latency profile)",
        )
    wait = sched.estimate_wait_s(model, now)
    return RefusedError(
        reason,
        f"model {model!r}: queue full ({queued} requests waiting); none is of a "
        f"lower class than this one; retry after {wait:.3f} s",
        wait,
    )


def refused_later(
    sched: DeviceScheduler[Any],
    request: QueuedRequest,
    reason: str,
    now: float,
    by: QueuedRequest | None,
) -> Exception:
    """The error a queued request dropped for ``reason`` gets (under the driver's lock: it
    reads the scheduler's estimates); ``by``: the request being submitted, if any (a shed
    request made room for it)."""
    waited = now - request.arrival_s
    model = request.model
    if reason == SHED:
        wait = sched.estimate_wait_s(model, now)
        return RefusedError(
            reason,
            f"model {model!r}: the queue was full and this request (priority "
            f"{request.priority}) was the lowest class; a request of priority "
            f"{request.priority if by is None else by.priority} took its place. "
            f"Retry after {wait:.3f} s",
            wait,
        )
    if reason == DEADLINE_EXPIRED:
        assert request.deadline_s is not None
        deadline_ms = (request.deadline_s - request.arrival_s) * 1000
        return RefusedError(
            reason,
            f"model {model!r}: the request can no longer finish by its deadline, so "
            f"it will not run (waited {waited * 1000:.1f} ms in the queue, deadline "
            f"{deadline_ms:.1f} ms after arrival)",
        )
    if reason == LOAD_TIMEOUT:
        wait = sched.estimate_wait_s(model, now)
        return RefusedError(
            reason,
            f"model {model!r} is loading and this request waited "
            f"{waited * 1000:.1f} ms for it, the most a request waits for a load",
            wait,
        )
    if reason == UNLOADED:
        return DrainingError(
            f"model {model!r} was unloaded before this request could run (it "
            "waited past the unload's drain timeout)"
        )
    return DrainingError("the worker shut down before this request could run")
