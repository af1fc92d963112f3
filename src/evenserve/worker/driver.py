"""The batcher driver: per-model queues on one device, driven by the shared batching policies.

Theory of operation.
- Each model on the device has a ``RequestQueue`` (policy.batching.queue, the simulator's own
  class: service order by priority class, then deadline or arrival + SLO, then arrival) and
  its own batching policy object (the very class the simulator runs). The device has
  ``instances`` slots; each runs one batch at a time.
- Admission mirrors the simulator's ``_offer``: ``RequestQueue.offer`` refuses a request whose
  deadline the profile says it cannot meet even alone right after the running batch
  (``deadline-infeasible``), and at the queue bound either refuses the newcomer
  (``queue-full``) or, when it outranks the lowest queued request, sheds that one (``shed``).
  Admitted requests feed the policy's ``on_arrival`` and the queue's arrival-rate estimate.
- The driver is event-driven and never sleeps. It re-plans (``_schedule``) after every
  arrival, batch completion, cancelled request, and at the wake-up times the policies asked
  for ("WaitUntil(t)"), exactly where the simulator calls ``_try_start``. Re-planning, while
  an instance is free: drop the requests that can no longer meet their deadline
  (``RequestQueue.expire`` with the profile), promote starved lower-class requests, then ask
  ``policy.batching.device.next_batch`` (the simulator's function, with the same starvation
  bound, class headroom and per-queue arrival rates) which model's batch to start.
- Deadlines are also watched by a second timer that only answers: at the moment a queued
  request can no longer finish in time (its deadline minus a batch of one, or its deadline
  without a profile) its caller gets 504 at once. It stays counted in its queue until the
  next re-plan removes it, as in the simulator, so both make the same batch decisions.
- Starting a batch pops the head of the queue and hands it to an executor (a thread running
  the runtime, or a virtual device on a FakeTimer); the executor calls back on the event loop
  with the outputs, which resolve each request's future exactly once.
- Clock and timer are injected: on a FakeClock with a FakeTimer the driver makes exactly the
  decisions the simulator makes for the same arrival trace (a golden test checks it).
- Draining (graceful shutdown) replaces every policy by "dispatch what is queued now", so
  queued work finishes even under a policy that would wait for a full batch.

Every request submitted is either refused at once (``submit`` raises QueueFullError or
DeadlineInfeasibleError) or gets exactly one outcome on its future: outputs, or one of
ShedError, DeadlineExpiredError, BatchFailedError, DrainingError. A request whose caller went
away (future cancelled) leaves the queue at once and is never run. Every refusal is reported
once to the observer with its reason (``REFUSAL_REASONS``).
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
from evenserve.core.contention import DEFAULT_INTERFERENCE, SharedDevice, occupancy
from evenserve.core.errors import EvenserveError
from evenserve.core.profile import LatencyProfile
from evenserve.core.types import BatchDecision, Dispatch, QueueView, RequestInfo, WaitUntil
from evenserve.policy.batching import BatchingPolicy
from evenserve.policy.batching.device import next_batch
from evenserve.policy.batching.queue import RequestQueue
from evenserve.policy.batching.rate import QUEUE_RATE_TAU_S, RateEstimator
from evenserve.worker.timer import Timer, TimerHandle

#: A request's life: waiting in its queue, inside a running batch, answered. EXPIRED: answered
#: 504 by the deadline watch but still counted in its queue until the next re-plan.
QUEUED, RUNNING, DONE, EXPIRED = 0, 1, 2, 3

#: Why a request was refused (the simulator's drop reasons, the ``reason`` label of the
#: worker's refusal counter).
QUEUE_FULL = "queue-full"
SHED = "shed"
DEADLINE_INFEASIBLE = "deadline-infeasible"
DEADLINE_EXPIRED = "deadline-expired"
REFUSAL_REASONS = (QUEUE_FULL, SHED, DEADLINE_INFEASIBLE, DEADLINE_EXPIRED)


class UnknownModelError(EvenserveError):
    pass


class RefusedError(EvenserveError):
    """The worker will not run this request; ``reason`` is one of REFUSAL_REASONS."""

    reason = ""


class QueueFullError(RefusedError):
    reason = QUEUE_FULL

    def __init__(self, model: str, depth: int, retry_after_s: float) -> None:
        super().__init__(
            f"queue-full: model {model!r}: queue full ({depth} requests waiting); none is of "
            f"a lower class than this one; retry after {retry_after_s:.3f} s"
        )
        self.retry_after_s = retry_after_s


class ShedError(RefusedError):
    reason = SHED

    def __init__(self, model: str, priority: int, by_priority: int, retry_after_s: float) -> None:
        super().__init__(
            f"shed: model {model!r}: the queue was full and this request (priority "
            f"{priority}) was the lowest class; a request of priority {by_priority} took its "
            f"place. Retry after {retry_after_s:.3f} s"
        )
        self.retry_after_s = retry_after_s


class DeadlineInfeasibleError(RefusedError):
    reason = DEADLINE_INFEASIBLE

    def __init__(self, model: str, deadline_in_s: float, earliest_end_in_s: float) -> None:
        super().__init__(
            f"deadline-infeasible: model {model!r}: the request's deadline is "
            f"{deadline_in_s * 1000:.1f} ms away, but even alone right after the running "
            f"batch it would end in {earliest_end_in_s * 1000:.1f} ms (latency profile)"
        )


class DrainingError(EvenserveError):
    pass


class DeadlineExpiredError(RefusedError):
    reason = DEADLINE_EXPIRED

    def __init__(self, model: str, waited_s: float, timeout_s: float) -> None:
        super().__init__(
            f"deadline-expired: model {model!r}: the request can no longer finish by its "
            f"deadline, so it will not run (waited {waited_s * 1000:.1f} ms in the queue, "
            f"deadline {timeout_s * 1000:.1f} ms after arrival)"
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
        """A request that will not run: a refusal (REFUSAL_REASONS, counted once each),
        ``cancelled`` (its caller went away) or ``shutdown``."""
        return None


@dataclass
class ModelQueueConfig:
    name: str
    policy: BatchingPolicy
    max_batch_size: int
    max_queue: int
    profile: LatencyProfile | None = None
    #: Priority class of requests that bring none (online = 10, offline = 0).
    priority: int = 10
    #: Deadline (seconds after arrival) of requests that bring none; None: no deadline.
    default_timeout_s: float | None = None
    #: The model's latency SLO: requests without a deadline are ordered by arrival + SLO.
    slo_s: float | None = None


@dataclass(eq=False)
class _Slot:
    cfg: ModelQueueConfig
    queue: RequestQueue[PendingRequest]
    rate: RateEstimator = field(default_factory=lambda: RateEstimator(QUEUE_RATE_TAU_S))
    in_flight: int = 0
    #: Requests answered by the deadline watch, still in ``queue`` until the next re-plan.
    expired_waiting: int = 0
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
    """Per-model queues of one device, batched by the shared policy objects.

    ``starvation_s`` and ``class_headroom`` are the simulator's arm options of the same names
    (``starvation_ms`` / 1000, ``class_headroom``), passed to the queues and to ``next_batch``
    exactly as the simulator passes them; None keeps them off.
    """

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
        starvation_s: float | None = None,
        class_headroom: float | None = None,
        interference: float = DEFAULT_INTERFERENCE,
    ) -> None:
        if instances < 1:
            raise ValueError("instances must be >= 1")
        if starvation_s is not None and starvation_s <= 0:
            raise ValueError("starvation_s must be > 0")
        if class_headroom is not None and not 0 < class_headroom <= 1:
            raise ValueError("class_headroom must be in (0, 1]")
        self.clock = clock
        self.instances = instances
        self.starvation_s = starvation_s
        self.class_headroom = class_headroom
        self._timer_service = timer
        self._executor = executor
        self._slots: dict[str, _Slot] = {
            m.name: _Slot(
                m,
                RequestQueue(slo_s=m.slo_s, max_len=m.max_queue, starvation_s=starvation_s),
            )
            for m in models
        }
        # The simulator visits a device's models in name order; ties in next_batch go to the
        # first visited, so the same order gives the same decisions.
        self._order = sorted(self._slots)
        self._free: list[int] = list(range(instances))
        self._running: dict[int, RunningBatch] = {}
        # With several instances, when a running batch ends is estimated as the simulator
        # computes it: concurrent batches share the device (core.contention).
        self._shared = SharedDevice(interference) if instances > 1 else None
        self._deadlines: list[tuple[float, int, PendingRequest]] = []
        self._ids = itertools.count(1)
        self._timer_at = math.inf
        self._deadline_timer: TimerHandle | None = None
        self._deadline_timer_at = math.inf
        self._in_schedule = False
        self._again = False
        self._draining = False
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._free_memory = free_memory_bytes or (lambda: None)
        self.observer = observer or DriverObserver()
        self.busy = BusyTracker(instances, utilization_window_s, clock.now())
        #: Requests in the queues (those answered by the deadline watch included).
        self.queued_total = 0
        self._expired_waiting_total = 0

    # -- introspection ----------------------------------------------------------------------
    @property
    def models(self) -> list[str]:
        return list(self._order)

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def waiting_total(self) -> int:
        """Requests waiting for a batch (not counting those already answered 504)."""
        return self.queued_total - self._expired_waiting_total

    def config(self, model: str) -> ModelQueueConfig:
        return self._slot(model).cfg

    def queued_by_model(self) -> dict[str, int]:
        return {m: len(s.queue) - s.expired_waiting for m, s in self._slots.items()}

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
        if self._shared is not None:
            nxt = self._shared.next_end()
            return 0.0 if nxt is None else max(0.0, nxt[1] - now_s)
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
        items = sum(r.items for r in slot.queue if r.state == QUEUED)
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
        """Queue one request; its future resolves exactly once.

        Raises on refusal: QueueFullError (the queue is full of requests of its class or
        higher), DeadlineInfeasibleError (the profile says its deadline cannot be met),
        DrainingError, ValueError (items out of range), UnknownModelError.
        """
        slot = self._slot(model)
        if self._draining:
            raise DrainingError("the worker is shutting down and accepts no new requests")
        if items < 1 or items > slot.cfg.max_batch_size:
            raise ValueError(f"items must be in 1..{slot.cfg.max_batch_size}")
        now = self.clock.now()
        timeout = timeout_s if timeout_s is not None else slot.cfg.default_timeout_s
        req = PendingRequest(
            request_id=next(self._ids),
            model=model,
            arrival_s=now,
            priority=slot.cfg.priority if priority is None else priority,
            deadline_s=None if timeout is None else now + timeout,
            items=items,
            payload=payload,
        )
        busy = self.busy_remaining_s(now)
        offer = slot.queue.offer(req, now, profile=slot.cfg.profile, busy_remaining_s=busy)
        for gone in offer.expired:  # a full queue first lets go of hopeless requests
            self.queued_total -= 1
            if gone.state == EXPIRED:  # already answered by the deadline watch
                slot.expired_waiting -= 1
                self._expired_waiting_total -= 1
            else:
                self._answer_expired(gone, now)
            gone.state = DONE
        if not offer.admitted:
            req.state = DONE
            reason = offer.reason or QUEUE_FULL
            self.observer.request_dropped(model, reason, 0.0)
            if reason == DEADLINE_INFEASIBLE:
                prof = slot.cfg.profile
                assert timeout is not None and prof is not None
                raise DeadlineInfeasibleError(model, timeout, busy + prof.latency_s(1))
            raise QueueFullError(model, len(slot.queue), self.estimate_wait_s(model))
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        req.future = fut
        self.queued_total += 1
        if offer.evicted is not None:
            self._shed(offer.evicted, req, now)
        if req.deadline_s is not None:
            heapq.heappush(self._deadlines, (self._hopeless_at(req), req.request_id, req))
        fut.add_done_callback(functools.partial(self._on_future_done, req))
        slot.cfg.policy.on_arrival(now)
        slot.rate.observe(now)
        self._schedule()
        return req

    def _hopeless_at(self, req: PendingRequest) -> float:
        """When ``req`` can no longer finish by its deadline even if it started alone."""
        assert req.deadline_s is not None
        prof = self._slots[req.model].cfg.profile
        return req.deadline_s - (prof.latency_s(1) if prof is not None else 0.0)

    def _shed(self, victim: PendingRequest, by: PendingRequest, now: float) -> None:
        """``victim`` left its full queue for ``by`` (already removed by the queue)."""
        self.queued_total -= 1
        if victim.state == EXPIRED:  # already answered 504; it only held a place
            self._slots[victim.model].expired_waiting -= 1
            self._expired_waiting_total -= 1
            victim.state = DONE
            return
        victim.state = DONE
        fut = victim.future
        if fut is not None and not fut.done():
            fut.set_exception(
                ShedError(
                    victim.model, victim.priority, by.priority, self.estimate_wait_s(victim.model)
                )
            )
        self.observer.request_dropped(victim.model, SHED, now - victim.arrival_s)

    def _on_future_done(self, req: PendingRequest, fut: asyncio.Future[Any]) -> None:
        if not fut.cancelled() or req.state != QUEUED:
            return
        self._slots[req.model].queue.remove(req)
        req.state = DONE
        self.queued_total -= 1
        self.observer.request_dropped(req.model, "cancelled", self.clock.now() - req.arrival_s)
        self._notify_if_idle()
        self._schedule()

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
        self._watch_deadlines()

    def _views(
        self, free_memory: float | None, now: float
    ) -> Iterator[tuple[QueueView, BatchingPolicy]]:
        headroom = self.class_headroom
        for m in self._order:
            slot = self._slots[m]
            if slot.queue or headroom is not None:
                policy: BatchingPolicy = (
                    _Flush(slot.cfg.policy) if self._draining else slot.cfg.policy
                )
                view = QueueView(
                    m,
                    slot.queue.items,
                    slot.cfg.profile,
                    free_memory,
                    True,
                    slot.cfg.slo_s,
                    slot.rate.rate_at(now) if headroom is not None else None,
                    slot.cfg.priority,
                )
                yield view, policy

    def _plan(self) -> None:
        now = self.clock.now()
        wake = math.inf
        if self._free and self.queued_total:
            free_memory = self._free_memory()
            while self._free and self.queued_total:
                self._expire(now)
                nb = next_batch(
                    self._views(free_memory, now),
                    now,
                    starvation_s=None if self._draining else self.starvation_s,
                    class_headroom=None if self._draining else self.class_headroom,
                    rate_tau_s=QUEUE_RATE_TAU_S if self.class_headroom is not None else None,
                )
                if nb.model is None:
                    wake = nb.wake_s
                    break
                self._start(nb.model, nb.n, now)
            self._notify_if_idle()
        self._arm(wake)

    def _expire(self, now: float) -> None:
        """Before a dispatch, as the simulator does: drop what can no longer make its deadline
        and promote starved lower-class requests."""
        for m in self._order:
            slot = self._slots[m]
            if not slot.queue:
                continue
            if slot.expired_waiting:
                for r in [r for r in slot.queue if r.state == EXPIRED]:
                    slot.queue.remove(r)
                    r.state = DONE
                self.queued_total -= slot.expired_waiting
                self._expired_waiting_total -= slot.expired_waiting
                slot.expired_waiting = 0
            for r in slot.queue.expire(now, slot.cfg.profile):
                self.queued_total -= 1
                self._answer_expired(r, now)
                r.state = DONE
            if self.starvation_s is not None:
                slot.queue.promote_starved(now)

    def _answer_expired(self, req: PendingRequest, now: float) -> None:
        assert req.deadline_s is not None
        fut = req.future
        if fut is not None and not fut.done():
            fut.set_exception(
                DeadlineExpiredError(req.model, now - req.arrival_s, req.deadline_s - req.arrival_s)
            )
        self.observer.request_dropped(req.model, DEADLINE_EXPIRED, now - req.arrival_s)

    def _watch_deadlines(self) -> None:
        """Answer 504 at once to queued requests that can no longer finish in time; arm the
        watch for the next one. Does not re-plan (the simulator would not either)."""
        now = self.clock.now()
        heap = self._deadlines
        while heap and (heap[0][0] <= now or heap[0][2].state != QUEUED):
            _, _, req = heapq.heappop(heap)
            if req.state != QUEUED:
                continue
            req.state = EXPIRED
            slot = self._slots[req.model]
            slot.expired_waiting += 1
            self._expired_waiting_total += 1
            self._answer_expired(req, now)
        at = heap[0][0] if heap else math.inf
        if at < self._deadline_timer_at or self._deadline_timer is None:
            if self._deadline_timer is not None:
                self._deadline_timer.cancel()
                self._deadline_timer = None
            self._deadline_timer_at = at
            if at < math.inf:
                self._deadline_timer = self._timer_service.call_at(at, self._on_deadline_timer)

    def _on_deadline_timer(self) -> None:
        self._deadline_timer = None
        self._deadline_timer_at = math.inf
        self._watch_deadlines()
        self._notify_if_idle()

    def _arm(self, wake: float) -> None:
        # As the simulator's device does: a wake-up earlier than the pending one (or the first
        # after it passed) adds a timer; later timers are not cancelled, and each one that
        # fires re-plans. A re-plan at a passed wake-up can decide differently from the one
        # before it (a starvation bound crossed, an arrival rate decayed), so dropping it
        # would make the live driver and the simulator part ways.
        now = self.clock.now()
        if wake == math.inf or not (wake < self._timer_at or self._timer_at <= now):
            return
        self._timer_at = wake
        self._timer_service.call_at(wake, functools.partial(self._on_timer, wake))

    def _on_timer(self, at: float) -> None:
        # ``at``, not only the clock: asyncio may run a timer a hair before its time, and a
        # pending wake-up that is never cleared would stop every later one from being armed.
        if self._timer_at <= max(at, self.clock.now()):
            self._timer_at = math.inf
        self._schedule()

    def _start(self, model: str, n: int, now: float) -> None:
        slot = self._slots[model]
        q = slot.queue
        cap = slot.cfg.max_batch_size
        n = max(1, n)  # a policy answering Dispatch(0) must not stall the device
        # The head of the queue, stopping before the request that would exceed max items.
        k = 0
        items = 0
        while k < n and k < len(q):
            if k and items + q[k].items > cap:
                break
            items += q[k].items
            k += 1
        taken = q.pop(k)
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
        if self._shared is not None:
            prof = slot.cfg.profile
            occ = occupancy(prof, items) if prof is not None else 1.0
            self._shared.start(instance, now, batch.expected_end_s - now, occ)
        self.busy.start(instance, now)
        self.observer.batch_started(batch, now)
        self._executor.start(instance, model, taken, functools.partial(self._finish, batch))

    def _finish(self, batch: RunningBatch, result: BatchResult) -> None:
        now = self.clock.now()
        slot = self._slots[batch.model]
        del self._running[batch.instance]
        if self._shared is not None:
            self._shared.finish(batch.instance, now)
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
        return not self._running and self.waiting_total == 0

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
                for req in slot.queue.pop(len(slot.queue)):
                    self.queued_total -= 1
                    if req.state == EXPIRED:
                        req.state = DONE
                        continue
                    req.state = DONE
                    if req.future is not None and not req.future.done():
                        req.future.set_exception(
                            DrainingError("the worker shut down before this request could run")
                        )
                    self.observer.request_dropped(req.model, "shutdown", 0.0)
                self._expired_waiting_total -= slot.expired_waiting
                slot.expired_waiting = 0
            if self._running:
                waiter2: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._idle_waiters.append(waiter2)
                await waiter2
