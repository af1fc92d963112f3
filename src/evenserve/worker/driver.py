"""The worker's batcher driver: a DeviceScheduler (sched) driven from asyncio and an executor.

Theory of operation. Every decision (admission, refusals, which batch to start when, the
deadline watch, instance slots, busy time) is the scheduler's, the very object the
simulator's devices drive; this module only carries out its actions on the event loop:
- ``submit`` makes a PendingRequest with a future and offers it; a refusal raises at once
  (RefusedError with its reason, or DrainingError).
- ``start_batch``: the executor runs the batch (a thread running the runtime); it calls back
  on the loop with the outputs, which resolve each request's future exactly once, and the
  scheduler hears ``finished``. With a VirtualExecutor (tests and replays) nothing runs: the
  batch ends when the scheduler's timing says (``end_at``), as in the simulator.
- ``drop``: a queued request that will not run gets its error (RefusedError: ``shed``,
  ``deadline-expired``; DrainingError at shutdown).
- ``wake_at``: a timer (asyncio's live, a FakeTimer in tests) calls ``wake`` back.
Clock and timer are injected: on a FakeClock with a FakeTimer and a VirtualExecutor the
driver makes exactly the decisions the simulator makes for the same arrival trace (a golden
test checks it).

Every request submitted is either refused at once or gets exactly one outcome on its
future: outputs, or a RefusedError (shed, deadline-expired), BatchFailedError, DrainingError.
A request whose caller went away (future cancelled) leaves the queue at once and is never
run. Every refusal is reported once to the observer with its reason (``REFUSAL_REASONS``).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from evenserve.core.clock import Clock
from evenserve.core.errors import EvenserveError
from evenserve.core.options import DeviceOptions, QueueOptions
from evenserve.core.wire import DEADLINE_EXPIRED, DEADLINE_INFEASIBLE, LOAD_TIMEOUT, SHED
from evenserve.sched import (
    DRAINING,
    NO_QUEUE_OPTIONS,
    ONE_INSTANCE,
    QUEUED,
    UNLOADED,
    Batch,
    DeviceScheduler,
    ModelQueue,
    ModelSetup,
    QueuedRequest,
    scheduler_for,
)
from evenserve.worker.timer import Timer


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

    @property
    def compute_s(self) -> float:
        return self.compute_input_s + self.compute_infer_s + self.compute_output_s


RunningBatch = Batch[PendingRequest]


class BatchExecutor(Protocol):
    #: True when batches end at the scheduler's times (nothing runs): the driver then
    #: honours ``end_at`` and asks the executor to ``complete`` the batch.
    timed_by_scheduler: bool

    def start(self, batch: RunningBatch, done: Callable[[BatchResult], None]) -> None:
        """Start running a batch; call ``done`` once, on the driver's loop, when it ends."""

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


class BatchDriver:
    """One device's scheduler on the event loop. ``memory_probe``: measured (used, total)
    device memory, read before decisions (a real device); without it memory is the
    profiles' account against ``memory_total_bytes``."""

    def __init__(
        self,
        models: Sequence[ModelSetup],
        executor: BatchExecutor,
        *,
        clock: Clock,
        timer: Timer,
        device: DeviceOptions = ONE_INSTANCE,
        queue: QueueOptions = NO_QUEUE_OPTIONS,
        observer: DriverObserver | None = None,
        utilization_window_s: float = 1.0,
        memory_total_bytes: float | None = None,
        memory_probe: Callable[[], tuple[float | None, float | None]] | None = None,
        learn_profiles: bool = False,
    ) -> None:
        self.clock = clock
        self._timer_service = timer
        self._executor = executor
        self.observer = observer or DriverObserver()
        self._probe = memory_probe
        self.sched: DeviceScheduler[PendingRequest] = scheduler_for(
            models,
            self,
            device,
            queue,
            memory_total_bytes=memory_total_bytes,
            utilization_window_s=utilization_window_s,
            origin_s=clock.now(),
            learn_profiles=learn_profiles,
        )
        self._ids = itertools.count(1)
        self._submitting: PendingRequest | None = None
        self._idle_waiters: list[asyncio.Future[None]] = []
        #: Unloads waiting for their model to have nothing queued or running.
        self._model_waiters: dict[str, list[asyncio.Future[None]]] = {}

    # The device's figures are the scheduler's: ``self.sched`` (queued_by_model, busy, ...).
    def _queue(self, model: str) -> ModelQueue[PendingRequest]:
        try:
            return self.sched.queues.queues[model]
        except KeyError:
            raise UnknownModelError(f"model {model!r} is not served here") from None

    # -- requests ---------------------------------------------------------------------------
    def submit(
        self,
        model: str,
        payload: Any = None,
        *,
        items: int = 1,
        priority: int | None = None,
        deadline_in_s: float | None = None,
    ) -> PendingRequest:
        """Queue one request; its future resolves exactly once. ``deadline_in_s``: it must
        finish within this many seconds of arriving (default: the model's deadline).

        Raises on refusal: RefusedError (``queue-full``: the queue is full of requests of
        its class or higher; ``deadline-infeasible``: the profile says its deadline cannot
        be met), DrainingError, ValueError (items out of range), UnknownModelError.
        """
        mq = self._queue(model)
        if self.sched.draining:
            raise DrainingError("the worker is shutting down and accepts no new requests")
        if items < 1 or items > mq.cap:
            raise ValueError(f"items must be in 1..{mq.cap}")
        now = self.clock.now()
        if self._probe is not None:
            self.sched.observe_memory(*self._probe())
        setup = mq.setup
        req = PendingRequest(
            request_id=next(self._ids),
            model=model,
            arrival_s=now,
            priority=setup.class_of(priority),
            deadline_s=setup.deadline_at(now, deadline_in_s),
            items=items,
            payload=payload,
        )
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        req.future = fut
        self._submitting = req
        try:
            reason = self.sched.offer(req, now)
        finally:
            self._submitting = None
        if reason is not None:
            fut.cancel()
            if reason == DRAINING:
                raise DrainingError("the worker is shutting down and accepts no new requests")
            self.observer.request_dropped(model, reason, 0.0)
            if reason == DEADLINE_INFEASIBLE:
                assert req.deadline_s is not None
                # Refused before anything changed: the same wait the scheduler weighed.
                end = self.sched.busy_remaining_s(now) + self.sched.estimate_batch_s(model, 1)
                raise RefusedError(
                    reason,
                    f"model {model!r}: the request's deadline is "
                    f"{(req.deadline_s - now) * 1000:.1f} ms away, but even alone right after "
                    f"the running batch it would end in {end * 1000:.1f} ms (latency profile)",
                )
            wait = self.sched.estimate_wait_s(model, now)
            raise RefusedError(
                reason,
                f"model {model!r}: queue full ({len(mq.queue)} requests waiting); none is of a "
                f"lower class than this one; retry after {wait:.3f} s",
                wait,
            )
        fut.add_done_callback(functools.partial(self._on_future_done, req))
        if self._model_waiters:  # planning may have expired an unloading model's last ones
            self._notify_if_idle()
        return req

    def _on_future_done(self, req: PendingRequest, fut: asyncio.Future[Any]) -> None:
        if not fut.cancelled() or req.state != QUEUED:
            return
        now = self.clock.now()
        if self.sched.cancel(req, now):
            self.observer.request_dropped(req.model, "cancelled", now - req.arrival_s)
            self._notify_if_idle()

    # -- the scheduler's actions ----------------------------------------------------------
    def start_batch(self, batch: RunningBatch) -> None:
        self.observer.batch_started(batch, batch.started_s)
        self._executor.start(batch, functools.partial(self._batch_done, batch))

    def drop(self, request: PendingRequest, reason: str) -> None:
        now = self.clock.now()
        waited = now - request.arrival_s
        fut = request.future
        if fut is not None and not fut.done():
            model = request.model
            if reason == SHED:
                by = self._submitting
                wait = self.sched.estimate_wait_s(model, now)
                fut.set_exception(
                    RefusedError(
                        reason,
                        f"model {model!r}: the queue was full and this request (priority "
                        f"{request.priority}) was the lowest class; a request of priority "
                        f"{request.priority if by is None else by.priority} took its place. "
                        f"Retry after {wait:.3f} s",
                        wait,
                    )
                )
            elif reason == DEADLINE_EXPIRED:
                assert request.deadline_s is not None
                deadline_ms = (request.deadline_s - request.arrival_s) * 1000
                fut.set_exception(
                    RefusedError(
                        reason,
                        f"model {model!r}: the request can no longer finish by its deadline, so "
                        f"it will not run (waited {waited * 1000:.1f} ms in the queue, deadline "
                        f"{deadline_ms:.1f} ms after arrival)",
                    )
                )
            elif reason == LOAD_TIMEOUT:
                wait = self.sched.estimate_wait_s(model, now)
                fut.set_exception(
                    RefusedError(
                        reason,
                        f"model {model!r} is loading and this request waited "
                        f"{waited * 1000:.1f} ms for it, the most a request waits for a load",
                        wait,
                    )
                )
            elif reason == UNLOADED:
                fut.set_exception(
                    DrainingError(
                        f"model {model!r} was unloaded before this request could run (it "
                        "waited past the unload's drain timeout)"
                    )
                )
            else:
                fut.set_exception(
                    DrainingError("the worker shut down before this request could run")
                )
        self.observer.request_dropped(request.model, reason, waited)

    def wake_at(self, t_s: float) -> None:
        self._timer_service.call_at(t_s, functools.partial(self._wake, t_s))

    def end_at(self, t_s: float, token: int) -> None:
        if self._executor.timed_by_scheduler:
            self._timer_service.call_at(t_s, functools.partial(self._end, token))

    # -- events back to the scheduler -----------------------------------------------------
    def _wake(self, at_s: float) -> None:
        self.sched.wake(at_s, self.clock.now())
        self._notify_if_idle()

    def _end(self, token: int) -> None:
        batch = self.sched.announced(token)
        if batch is not None:
            self._executor.complete(batch)

    def _batch_done(self, batch: RunningBatch, result: BatchResult) -> None:
        now = self.clock.now()
        outputs = result.outputs
        # A scheduler-timed executor's batch took what the scheduler's clock says (the end it
        # announced, a slowdown's included); a threaded one's what the executor measured.
        if self._executor.timed_by_scheduler or result.compute_s <= 0:
            took = now - batch.started_s
        else:
            took = result.compute_s
        for i, r in enumerate(batch.requests):
            fut = r.future
            if fut is None or fut.done():
                continue
            r.queue_s = batch.started_s - r.arrival_s
            r.compute_s = took
            if result.error is not None or outputs is None:
                fut.set_exception(BatchFailedError(result.error or "batch produced no outputs"))
            else:
                fut.set_result(outputs[i])
        self.observer.batch_finished(batch, result, now)
        if self._probe is not None:
            self.sched.observe_memory(*self._probe())
        self.sched.finished(batch, now, took if result.error is None else None)
        self._notify_if_idle()

    # -- shutdown ---------------------------------------------------------------------------
    @property
    def idle(self) -> bool:
        return self.sched.idle

    def _notify_if_idle(self) -> None:
        if self._model_waiters:
            for model in [m for m in self._model_waiters if self.model_idle(m)]:
                for w in self._model_waiters.pop(model):
                    if not w.done():
                        w.set_result(None)
        if self._idle_waiters and self.sched.idle:
            for w in self._idle_waiters:
                if not w.done():
                    w.set_result(None)
            self._idle_waiters.clear()

    # -- model control --------------------------------------------------------------------
    def add_model(self, setup: ModelSetup) -> None:
        """Serve one more model from now on (its executor must already run it)."""
        self.sched.add_model(setup, self.clock.now())

    def model_idle(self, model: str) -> bool:
        """Nothing of ``model`` queued or running (True when it is not hosted)."""
        mq = self.sched.queues.queues.get(model)
        return mq is None or (not mq.queue.items and mq.in_flight == 0)

    async def drain_model(self, model: str, timeout_s: float | None = None) -> int:
        """Run what is queued for ``model`` without waiting for its policy's windows and wait
        until nothing of it is queued or running; after ``timeout_s`` its requests still
        queued are answered with DrainingError (running batches are waited for). The caller
        refuses new requests for it meanwhile. Returns how many were dropped so."""
        self.sched.flush_model(model, self.clock.now())
        dropped = 0
        if self.model_idle(model):
            return dropped
        waiter = self._wait_model(model)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout_s)
        except TimeoutError:
            dropped = self.sched.abandon(self.clock.now(), UNLOADED, model=model)
            if not self.model_idle(model):
                await self._wait_model(model)
        return dropped

    def _wait_model(self, model: str) -> asyncio.Future[None]:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._model_waiters.setdefault(model, []).append(waiter)
        return waiter

    def remove_model(self, model: str) -> None:
        """Stop serving ``model`` (ValueError unless ``drain_model`` left it idle)."""
        self.sched.remove_model(model, self.clock.now())

    def begin_drain(self) -> None:
        """Refuse new requests from now on and run what is queued without waiting."""
        self.sched.begin_drain(self.clock.now())

    async def drain(self, timeout_s: float | None = None) -> None:
        """Refuse new requests, run everything queued now, wait until the device is idle.

        After ``timeout_s`` the requests still queued are answered with DrainingError
        (batches already running are waited for: a thread cannot be interrupted).
        """
        self.begin_drain()
        if self.idle:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._idle_waiters.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout_s)
        except TimeoutError:
            self.sched.abandon(self.clock.now())
            if self.sched.running():
                waiter2: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._idle_waiters.append(waiter2)
                await waiter2
