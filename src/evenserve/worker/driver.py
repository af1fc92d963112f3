"""The batcher driver: per-model queues on one device, driven by the shared batching policies.

Theory of operation.
- Each model on the device has a FIFO queue and its own batching policy object (the very class
  the simulator runs). The device has ``instances`` slots; each runs one batch at a time.
- The driver is event-driven and never sleeps. It re-plans (``_schedule``) after every change:
  an arrival, a batch completion, a cancelled request, or a timer it armed itself. Re-planning
  first answers requests whose deadline passed while they waited, then, while an instance is
  free, asks ``policy.batching.device.next_batch`` (the function the simulator uses) which
  model's batch to start. If none is ready it arms one timer at the earliest time a policy
  asked to be woken ("WaitUntil(t)") or the earliest deadline, whichever comes first.
- Starting a batch pops the requests from the queue and hands them to an executor (a thread
  running the runtime, or a virtual device on a FakeTimer); the executor calls back on the
  event loop with the outputs, which resolve each request's future exactly once.
- Clock and timer are injected: on a FakeClock with a FakeTimer the driver makes exactly the
  decisions the simulator makes for the same arrival trace (a golden test checks it).
- Draining (graceful shutdown) replaces every policy by "dispatch what is queued now", so
  queued work finishes even under a policy that would wait for a full batch.

Every request submitted gets exactly one outcome on its future: outputs, or one of
DeadlineExpiredError, BatchFailedError, DrainingError. A request whose caller went away
(future cancelled) leaves the queue at once and is never run.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from evenserve.core.clock import Clock
from evenserve.core.errors import EvenserveError
from evenserve.core.profile import LatencyProfile
from evenserve.core.types import BatchDecision, Dispatch, QueueView, RequestInfo, WaitUntil
from evenserve.policy.batching import BatchingPolicy
from evenserve.policy.batching.device import next_batch
from evenserve.worker.timer import Timer, TimerHandle

QUEUED, RUNNING, DONE = 0, 1, 2


class UnknownModelError(EvenserveError):
    pass


class QueueFullError(EvenserveError):
    def __init__(self, model: str, depth: int, retry_after_s: float) -> None:
        super().__init__(
            f"model {model!r}: queue full ({depth} requests waiting); retry after "
            f"{retry_after_s:.3f} s"
        )
        self.retry_after_s = retry_after_s


class DrainingError(EvenserveError):
    pass


class DeadlineExpiredError(EvenserveError):
    def __init__(self, model: str, waited_s: float, timeout_s: float) -> None:
        super().__init__(
            f"model {model!r}: deadline passed before the request could run (waited "
            f"{waited_s * 1000:.1f} ms in the queue, timeout {timeout_s * 1000:.1f} ms)"
        )
        self.waited_s = waited_s


class BatchFailedError(EvenserveError):
    pass


@dataclass(slots=True, eq=False)
class PendingRequest(RequestInfo):
    """A queued request: what policies see (RequestInfo) plus the driver's bookkeeping."""

    items: int = 1
    payload: Any = None
    future: asyncio.Future[Any] | None = None
    state: int = QUEUED
    dispatched_s: float = math.nan


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


class BatchExecutor(Protocol):
    def start(
        self,
        instance: int,
        model: str,
        requests: Sequence[PendingRequest],
        done: Callable[[BatchResult], None],
    ) -> None:
        """Start running a batch; call ``done`` once, on the driver's loop, when it ends."""


@dataclass(slots=True)
class RunningBatch:
    instance: int
    model: str
    requests: list[PendingRequest]
    items: int
    started_s: float
    expected_end_s: float


class DriverObserver:
    """Hooks for metrics and statistics (no-ops here)."""

    def batch_started(self, batch: RunningBatch, now_s: float) -> None:
        return None

    def batch_finished(self, batch: RunningBatch, result: BatchResult, now_s: float) -> None:
        return None

    def request_dropped(self, model: str, reason: str, waited_s: float) -> None:
        return None


@dataclass
class ModelQueueConfig:
    name: str
    policy: BatchingPolicy
    max_batch_size: int
    max_queue: int
    profile: LatencyProfile | None = None
    priority: int = 10
    default_timeout_s: float | None = None


@dataclass(eq=False)
class _Slot:
    cfg: ModelQueueConfig
    queue: deque[PendingRequest] = field(default_factory=deque)
    in_flight: int = 0
    #: Observed seconds per batch by batch size (exponentially weighted), for estimates.
    observed_s: dict[int, float] = field(default_factory=dict)


class _Flush:
    """Drain mode: dispatch whatever is queued, up to the policy's batch cap."""

    name = "flush"

    def __init__(self, inner: BatchingPolicy) -> None:
        self._cap = inner.max_batch_size

    @property
    def max_batch_size(self) -> int:
        return self._cap

    def decide(self, queue: QueueView, now_s: float) -> BatchDecision:
        n = len(queue)
        return Dispatch(min(n, self._cap)) if n else WaitUntil()

    def on_arrival(self, now_s: float) -> None:
        return None

    def on_dispatch(self, n: int, now_s: float) -> None:
        return None


class BusyTracker:
    """Busy time of a device with ``instances`` slots: exact, over a sliding window."""

    def __init__(self, instances: int, window_s: float, origin_s: float) -> None:
        self.instances = instances
        self.window_s = window_s
        self.origin_s = origin_s
        self._done: deque[tuple[float, float]] = deque()
        self._running: dict[int, float] = {}
        self._total_s = 0.0

    def start(self, instance: int, now_s: float) -> None:
        self._running[instance] = now_s

    def stop(self, instance: int, now_s: float) -> None:
        start = self._running.pop(instance)
        self._total_s += now_s - start
        self._done.append((start, now_s))

    def total_s(self, now_s: float) -> float:
        """Busy seconds since start, summed over instances."""
        return self._total_s + sum(now_s - s for s in self._running.values())

    def fraction(self, now_s: float) -> float:
        """Mean busy fraction of the instances over the last ``window_s`` (or since start)."""
        lo = max(now_s - self.window_s, self.origin_s)
        span = now_s - lo
        if span <= 0:
            return 1.0 if self._running else 0.0
        while self._done and self._done[0][1] <= lo:
            self._done.popleft()
        busy = 0.0
        for s, e in self._done:
            busy += min(e, now_s) - max(s, lo)
        for s in self._running.values():
            busy += now_s - max(s, lo)
        return min(1.0, max(0.0, busy / (span * self.instances)))


class BatchDriver:
    """Per-model queues of one device, batched by the shared policy objects."""

    def __init__(
        self,
        models: Sequence[ModelQueueConfig],
        executor: BatchExecutor,
        *,
        clock: Clock,
        timer: Timer,
        instances: int = 1,
        free_memory_bytes: Callable[[], float | None] | None = None,
        observer: DriverObserver | None = None,
        utilization_window_s: float = 1.0,
    ) -> None:
        if instances < 1:
            raise ValueError("instances must be >= 1")
        self.clock = clock
        self.instances = instances
        self._timer_service = timer
        self._executor = executor
        self._slots: dict[str, _Slot] = {m.name: _Slot(m) for m in models}
        self._order = list(self._slots)
        self._free: list[int] = list(range(instances))
        self._running: dict[int, RunningBatch] = {}
        self._deadlines: list[tuple[float, int, PendingRequest]] = []
        self._ids = itertools.count(1)
        self._timer: TimerHandle | None = None
        self._timer_at = math.inf
        self._in_schedule = False
        self._again = False
        self._draining = False
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._free_memory = free_memory_bytes or (lambda: None)
        self.observer = observer or DriverObserver()
        self.busy = BusyTracker(instances, utilization_window_s, clock.now())
        self.queued_total = 0

    # -- introspection ----------------------------------------------------------------------
    @property
    def models(self) -> list[str]:
        return list(self._order)

    @property
    def draining(self) -> bool:
        return self._draining

    def config(self, model: str) -> ModelQueueConfig:
        return self._slot(model).cfg

    def queued_by_model(self) -> dict[str, int]:
        return {m: len(s.queue) for m, s in self._slots.items()}

    def in_flight_by_model(self) -> dict[str, int]:
        return {m: s.in_flight for m, s in self._slots.items()}

    def in_flight_total(self) -> int:
        return sum(s.in_flight for s in self._slots.values())

    def running(self) -> list[RunningBatch]:
        return list(self._running.values())

    def busy_remaining_s(self, now_s: float) -> float:
        """Seconds until an instance frees up (0 when one is free now), from estimates."""
        if self._free:
            return 0.0
        return max(0.0, min(b.expected_end_s for b in self._running.values()) - now_s)

    def estimate_batch_s(self, model: str, items: int) -> float:
        """Expected seconds for a batch: profile, else observed, else observed per item."""
        slot = self._slot(model)
        if slot.cfg.profile is not None:
            return slot.cfg.profile.latency_s(items)
        obs = slot.observed_s
        if items in obs:
            return obs[items]
        if obs:
            b, s = min(obs.items(), key=lambda kv: abs(kv[0] - items))
            return s * items / b
        return 0.0

    def estimate_wait_s(self, model: str) -> float:
        """Rough time for the queue of ``model`` to clear (used for Retry-After)."""
        slot = self._slot(model)
        items = sum(r.items for r in slot.queue)
        cap = slot.cfg.max_batch_size
        batches = math.ceil(items / cap) if items else 0
        per_batch = self.estimate_batch_s(model, min(cap, max(1, items)))
        return batches * per_batch / self.instances + self.busy_remaining_s(self.clock.now())

    def _slot(self, model: str) -> _Slot:
        try:
            return self._slots[model]
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
        timeout_s: float | None = None,
    ) -> PendingRequest:
        """Queue one request; its future resolves exactly once. Raises on refusal."""
        slot = self._slot(model)
        if self._draining:
            raise DrainingError("the worker is shutting down and accepts no new requests")
        if len(slot.queue) >= slot.cfg.max_queue:
            raise QueueFullError(model, len(slot.queue), self.estimate_wait_s(model))
        if items < 1 or items > slot.cfg.max_batch_size:
            raise ValueError(f"items must be in 1..{slot.cfg.max_batch_size}")
        now = self.clock.now()
        timeout = timeout_s if timeout_s is not None else slot.cfg.default_timeout_s
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        req = PendingRequest(
            request_id=next(self._ids),
            model=model,
            arrival_s=now,
            priority=slot.cfg.priority if priority is None else priority,
            deadline_s=None if timeout is None else now + timeout,
            items=items,
            payload=payload,
            future=fut,
        )
        slot.queue.append(req)
        self.queued_total += 1
        if req.deadline_s is not None:
            heapq.heappush(self._deadlines, (req.deadline_s, req.request_id, req))
        fut.add_done_callback(functools.partial(self._on_future_done, req))
        slot.cfg.policy.on_arrival(now)
        self._schedule()
        return req

    def _on_future_done(self, req: PendingRequest, fut: asyncio.Future[Any]) -> None:
        if not fut.cancelled() or req.state != QUEUED:
            return
        self._remove_queued(req)
        self.observer.request_dropped(req.model, "cancelled", self.clock.now() - req.arrival_s)
        self._schedule()

    def _remove_queued(self, req: PendingRequest) -> None:
        q = self._slots[req.model].queue
        for i, r in enumerate(q):
            if r is req:
                del q[i]
                break
        req.state = DONE
        self.queued_total -= 1
        self._notify_if_idle()

    # -- planning ---------------------------------------------------------------------------
    def _schedule(self) -> None:
        if self._in_schedule:
            self._again = True
            return
        self._in_schedule = True
        try:
            self._again = True
            while self._again:
                self._again = False
                self._plan()
        finally:
            self._in_schedule = False

    def _views(self, free_memory: float | None) -> Iterator[tuple[QueueView, BatchingPolicy]]:
        for m in self._order:
            slot = self._slots[m]
            if slot.queue:
                policy: BatchingPolicy = (
                    _Flush(slot.cfg.policy) if self._draining else (slot.cfg.policy)
                )
                yield QueueView(m, slot.queue, slot.cfg.profile, free_memory, True), policy

    def _plan(self) -> None:
        now = self.clock.now()
        next_deadline = self._expire(now)
        wake = math.inf
        if self._free and self.queued_total:
            free_memory = self._free_memory()
            while self._free:
                nb = next_batch(self._views(free_memory), now)
                if nb.model is None:
                    wake = nb.wake_s
                    break
                self._start(nb.model, nb.n, now)
        self._arm(min(wake, next_deadline), now)

    def _expire(self, now: float) -> float:
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            _, _, req = heapq.heappop(heap)
            if req.state != QUEUED:
                continue
            self._remove_queued(req)
            waited = now - req.arrival_s
            assert req.deadline_s is not None
            timeout = req.deadline_s - req.arrival_s
            fut = req.future
            if fut is not None and not fut.done():
                fut.set_exception(DeadlineExpiredError(req.model, waited, timeout))
            self.observer.request_dropped(req.model, "deadline_expired", waited)
        while heap and heap[0][2].state != QUEUED:
            heapq.heappop(heap)
        return heap[0][0] if heap else math.inf

    def _arm(self, wake: float, now: float) -> None:
        if wake == math.inf:
            return
        if self._timer is not None:
            if self._timer_at <= wake:
                return
            self._timer.cancel()
        self._timer_at = wake
        self._timer = self._timer_service.call_at(wake, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = math.inf
        self._schedule()

    def _start(self, model: str, n: int, now: float) -> None:
        slot = self._slots[model]
        q = slot.queue
        cap = slot.cfg.max_batch_size
        taken: list[PendingRequest] = []
        items = 0
        n = max(1, n)  # a policy answering Dispatch(0) must not stall the device
        while len(taken) < n and q:
            head = q[0]
            if taken and items + head.items > cap:
                break
            taken.append(q.popleft())
            items += head.items
        slot.cfg.policy.on_dispatch(len(taken), now)
        self.queued_total -= len(taken)
        for r in taken:
            r.state = RUNNING
            r.dispatched_s = now
        slot.in_flight += len(taken)
        instance = self._free.pop(0)
        batch = RunningBatch(
            instance=instance,
            model=model,
            requests=taken,
            items=items,
            started_s=now,
            expected_end_s=now + self.estimate_batch_s(model, items),
        )
        self._running[instance] = batch
        self.busy.start(instance, now)
        self.observer.batch_started(batch, now)
        self._executor.start(instance, model, taken, functools.partial(self._finish, batch))

    def _finish(self, batch: RunningBatch, result: BatchResult) -> None:
        now = self.clock.now()
        slot = self._slots[batch.model]
        del self._running[batch.instance]
        self.busy.stop(batch.instance, now)
        self._free.append(batch.instance)
        self._free.sort()
        slot.in_flight -= len(batch.requests)
        if result.error is None:
            prev = slot.observed_s.get(batch.items)
            took = result.compute_s if result.compute_s > 0 else now - batch.started_s
            slot.observed_s[batch.items] = took if prev is None else prev + 0.2 * (took - prev)
        outputs = result.outputs
        for i, r in enumerate(batch.requests):
            r.state = DONE
            fut = r.future
            if fut is None or fut.done():
                continue
            if result.error is not None or outputs is None:
                fut.set_exception(BatchFailedError(result.error or "batch produced no outputs"))
            else:
                fut.set_result(outputs[i])
        self.observer.batch_finished(batch, result, now)
        self._schedule()
        self._notify_if_idle()

    # -- shutdown ---------------------------------------------------------------------------
    @property
    def idle(self) -> bool:
        return not self._running and self.queued_total == 0

    def _notify_if_idle(self) -> None:
        if self.idle and self._idle_waiters:
            for w in self._idle_waiters:
                if not w.done():
                    w.set_result(None)
            self._idle_waiters.clear()

    def begin_drain(self) -> None:
        """Refuse new requests from now on and run what is queued without waiting."""
        self._draining = True
        self._schedule()

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
            for slot in self._slots.values():
                while slot.queue:
                    req = slot.queue[0]
                    self._remove_queued(req)
                    if req.future is not None and not req.future.done():
                        req.future.set_exception(
                            DrainingError("the worker shut down before this request could run")
                        )
                    self.observer.request_dropped(req.model, "shutdown", 0.0)
            if self._running:
                waiter2: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._idle_waiters.append(waiter2)
                await waiter2
