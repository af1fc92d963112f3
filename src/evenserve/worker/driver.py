"""The worker's batcher driver: a DeviceScheduler (sched) driven from asyncio and an executor.

Theory of operation. Every decision (admission, refusals, which batch to start when, the
deadline watch, instance slots, busy time) is the scheduler's, the very object the
simulator's devices drive; this module only carries out its actions on the event loop:
- ``submit`` makes a PendingRequest with a future and offers it; a refusal raises at once
  (RefusedError with its reason, or DrainingError).
- ``start_batch``: the executor runs the batch (a device thread running the runtime). When
  it ends, the device thread itself tells the scheduler (``finished``), so the scheduler
  starts the next batch at once, on that thread, as the simulator's device does: the device
  never waits for the event loop, which may be busy reading a large request (the reference
  device in bench/vs_nginx.py forms its batches the same way). The outputs go to the loop,
  which resolves each request's future exactly once. With a VirtualExecutor (tests and
  replays) nothing runs: the batch ends when the scheduler's timing says (``end_at``), on
  the loop, as in the simulator.
- ``drop``: a queued request that will not run gets its error (RefusedError: ``shed``,
  ``deadline-expired``; DrainingError at shutdown).
- ``wake_at``: a timer (asyncio's live, a FakeTimer in tests) calls ``wake`` back.
Clock and timer are injected: on a FakeClock with a FakeTimer and a VirtualExecutor the
driver makes exactly the decisions the simulator makes for the same arrival trace (a golden
test checks it).

Threads. The scheduler is called from the loop (requests, wake-ups, model control, load
reports) and from device threads (a batch's end), always under ``lock``; whoever reads the
scheduler from outside holds it too. What belongs to the loop (futures, timers, the
observer's metrics and statistics) is posted to it when an action comes on a device thread,
in the order the actions came.

Every request submitted is either refused at once or gets exactly one outcome on its
future: outputs, or a RefusedError (shed, deadline-expired), BatchFailedError, DrainingError.
A request whose caller went away (future cancelled) leaves the queue at once and is never
run. Every refusal is reported once to the observer with its reason (``REFUSAL_REASONS``).
The errors and their messages are ``worker.refusals``'; what the driver hands its executor
and observer (the pending request, a batch's result), ``worker.batch``'s.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import threading
from collections.abc import Callable, Sequence
from typing import Any

from evenserve.core.clock import Clock
from evenserve.core.options import DeviceOptions, QueueOptions
from evenserve.sched import (
    DRAINING,
    NO_QUEUE_OPTIONS,
    ONE_INSTANCE,
    QUEUED,
    UNLOADED,
    DeviceScheduler,
    ModelQueue,
    ModelSetup,
    scheduler_for,
)
from evenserve.worker.batch import (
    BatchExecutor,
    BatchResult,
    DriverObserver,
    PendingRequest,
    RunningBatch,
)
from evenserve.worker.refusals import (
    BatchFailedError,
    DrainingError,
    UnknownModelError,
    refused_at_once,
    refused_later,
)
from evenserve.worker.timer import Timer


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
        #: Held around every call into ``sched`` (module docstring, "Threads").
        self.lock = threading.RLock()
        #: The loop the driver serves requests on, and its thread (known from the first
        #: request; until then every call comes from the thread that made the driver).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = threading.get_ident()
        self._ids = itertools.count(1)
        self._submitting: PendingRequest | None = None
        self._idle_waiters: list[asyncio.Future[None]] = []
        #: Unloads waiting for their model to have nothing queued or running.
        self._model_waiters: dict[str, list[asyncio.Future[None]]] = {}

    def _bind_loop(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._loop_thread = threading.get_ident()

    def _post(self, fn: Callable[..., object], *args: Any) -> None:
        """``fn(*args)`` on the loop: now when this is the loop's thread, else as soon as the
        loop runs it (calls posted from one thread run in the order they were posted)."""
        if threading.get_ident() == self._loop_thread:
            fn(*args)
            return
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(fn, *args)

    # The device's figures are the scheduler's: ``self.sched`` (queued_by_model, busy, ...),
    # read under ``lock``.
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
        self._bind_loop()
        with self.lock:
            return self._submit(model, payload, items, priority, deadline_in_s)

    def _submit(
        self,
        model: str,
        payload: Any,
        items: int,
        priority: int | None,
        deadline_in_s: float | None,
    ) -> PendingRequest:
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
            raise refused_at_once(self.sched, req, reason, len(mq.queue), now)
        fut.add_done_callback(functools.partial(self._on_future_done, req))
        if self._model_waiters:  # planning may have expired an unloading model's last ones
            self._notify_if_idle()
        return req

    def _on_future_done(self, req: PendingRequest, fut: asyncio.Future[Any]) -> None:
        if not fut.cancelled() or req.state != QUEUED:
            return
        with self.lock:
            now = self.clock.now()
            cancelled = self.sched.cancel(req, now)
        if cancelled:
            self.observer.request_dropped(req.model, "cancelled", now - req.arrival_s)
            self._notify_if_idle()

    # -- the scheduler's actions ----------------------------------------------------------
    # Called by the scheduler, under ``lock``, on the loop or on a device thread.
    def start_batch(self, batch: RunningBatch) -> None:
        self._post(self.observer.batch_started, batch, batch.started_s)
        self._executor.start(batch, functools.partial(self._batch_done, batch))

    def drop(self, request: PendingRequest, reason: str) -> None:
        now = self.clock.now()
        waited = now - request.arrival_s
        self._post(
            self._settle_drop,
            request,
            reason,
            refused_later(self.sched, request, reason, now, self._submitting),
            waited,
        )

    def _settle_drop(
        self, request: PendingRequest, reason: str, error: Exception, waited: float
    ) -> None:
        """On the loop: a dropped request's future gets its error; the observer hears it."""
        fut = request.future
        if fut is not None and not fut.done():
            fut.set_exception(error)
        self.observer.request_dropped(request.model, reason, waited)

    def wake_at(self, t_s: float) -> None:
        self._post(self._timer_service.call_at, t_s, functools.partial(self._wake, t_s))

    def end_at(self, t_s: float, token: int) -> None:
        if self._executor.timed_by_scheduler:
            self._timer_service.call_at(t_s, functools.partial(self._end, token))

    # -- events back to the scheduler -----------------------------------------------------
    def _wake(self, at_s: float) -> None:
        with self.lock:
            self.sched.wake(at_s, self.clock.now())
        self._notify_if_idle()

    def _end(self, token: int) -> None:
        with self.lock:
            batch = self.sched.announced(token)
        if batch is not None:
            self._executor.complete(batch)

    def _took(self, batch: RunningBatch, result: BatchResult, now: float) -> float:
        """What an ended batch took: a scheduler-timed executor's, what the scheduler's clock
        says (the end it announced, a slowdown's included); a threaded one's, what the
        executor measured."""
        if self._executor.timed_by_scheduler or result.compute_s <= 0:
            return now - batch.started_s
        return result.compute_s

    def _batch_done(self, batch: RunningBatch, result: BatchResult) -> None:
        """A batch ended: on the loop (a scheduler-timed executor) or on the device thread
        that ran it, which then starts the next batch itself (module docstring)."""
        with self.lock:
            now = self.clock.now()
            took = self._took(batch, result, now)
            for r in batch.requests:
                r.queue_s = batch.started_s - r.arrival_s
                r.compute_s = took
            self._post(self._answer, batch, result, now)
            if self._probe is not None:
                self.sched.observe_memory(*self._probe())
            self.sched.finished(batch, now, took if result.error is None else None)
        self._post(self._notify_if_idle)

    def _answer(self, batch: RunningBatch, result: BatchResult, now: float) -> None:
        """On the loop: each request of an ended batch gets its outputs or the error."""
        outputs = result.outputs
        for i, r in enumerate(batch.requests):
            fut = r.future
            if fut is None or fut.done():
                continue
            if result.error is not None or outputs is None:
                fut.set_exception(BatchFailedError(result.error or "batch produced no outputs"))
            else:
                fut.set_result(outputs[i])
        self.observer.batch_finished(batch, result, now)

    # -- shutdown ---------------------------------------------------------------------------
    @property
    def idle(self) -> bool:
        with self.lock:
            return self.sched.idle

    def _notify_if_idle(self) -> None:
        """On the loop: wake the drains waiting for a model, or the device, to be idle."""
        if self._model_waiters:
            for model in [m for m in self._model_waiters if self.model_idle(m)]:
                for w in self._model_waiters.pop(model):
                    if not w.done():
                        w.set_result(None)
        if self._idle_waiters and self.idle:
            for w in self._idle_waiters:
                if not w.done():
                    w.set_result(None)
            self._idle_waiters.clear()

    # -- model control --------------------------------------------------------------------
    def add_model(self, setup: ModelSetup) -> None:
        """Serve one more model from now on (its executor must already run it)."""
        with self.lock:
            self.sched.add_model(setup, self.clock.now())

    def model_idle(self, model: str) -> bool:
        """Nothing of ``model`` queued or running (True when it is not hosted)."""
        with self.lock:
            mq = self.sched.queues.queues.get(model)
            return mq is None or (not mq.queue.items and mq.in_flight == 0)

    async def drain_model(self, model: str, timeout_s: float | None = None) -> int:
        """Run what is queued for ``model`` without waiting for its policy's windows and wait
        until nothing of it is queued or running; after ``timeout_s`` its requests still
        queued are answered with DrainingError (running batches are waited for). The caller
        refuses new requests for it meanwhile. Returns how many were dropped so."""
        self._bind_loop()
        with self.lock:
            self.sched.flush_model(model, self.clock.now())
        return await self._drain(model, timeout_s)

    async def _drain(self, model: str, timeout_s: float | None) -> int:
        """Wait until nothing of ``model`` is queued or running; after ``timeout_s`` drop
        what is left (``drain_model``'s rule) and wait for the step in flight."""
        dropped = 0
        if self.model_idle(model):
            return dropped
        waiter = self._wait_model(model)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout_s)
        except TimeoutError:
            with self.lock:
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
        with self.lock:
            self.sched.remove_model(model, self.clock.now())

    def begin_drain(self) -> None:
        """Refuse new requests from now on and run what is queued without waiting."""
        with self.lock:
            self.sched.begin_drain(self.clock.now())

    async def drain(self, timeout_s: float | None = None) -> None:
        """Refuse new requests, run everything queued now, wait until the device is idle.

        After ``timeout_s`` the requests still queued are answered with DrainingError
        (batches already running are waited for: a thread cannot be interrupted).
        """
        self._bind_loop()
        self.begin_drain()
        if self.idle:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._idle_waiters.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout_s)
        except TimeoutError:
            with self.lock:
                self.sched.abandon(self.clock.now())
                running = bool(self.sched.running())
            if running:
                waiter2: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._idle_waiters.append(waiter2)
                await waiter2
