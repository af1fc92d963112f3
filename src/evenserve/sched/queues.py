"""The queues a device serves: admission and refusals, the deadline watch, expiry, starvation,
arrival rates and exact depth accounting, for every model placed on the device.

A QueueSet belongs to one DeviceScheduler, or is shared by several (the simulator's
``central-queue`` reference arm: one queue per model, served by whichever device frees up).

Theory of operation.
- ``offer`` puts a request in its model's RequestQueue (sched.queue) or refuses it with a
  reason (``deadline-infeasible``, ``queue-full``); a full queue first lets go of hopeless
  requests and may shed a lower-class one. Every request that leaves without running is
  reported once through ``on_drop(request, reason)``.
- The deadline watch: a request with a deadline becomes hopeless once ``deadline - t(1)`` has
  passed (even alone it would end after its deadline; ending exactly at it is in time, as
  admission counts it). ``watch(now)`` drops every request hopeless by ``now`` at
  once, so its caller hears at that moment (not when a device next frees), and the device
  never spends time on it. Removing it then is decision-neutral: the expiry that precedes
  every batch decision would have removed it anyway, so batching policies see the same
  queues whether the watch ran or not.
- ``waiting`` is the number of queued requests; its exact time-weighted mean and maximum
  since ``stats_since_s`` (the warm-up's end) are kept at every change.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from evenserve.core.options import QueueOptions
from evenserve.core.profile import LatencyProfile
from evenserve.core.types import RequestInfo
from evenserve.core.wire import DEADLINE_EXPIRED, ONLINE, SHED
from evenserve.policy.batching import BatchingPolicy
from evenserve.policy.batching.base import BatchingPolicyBase
from evenserve.policy.batching.rate import QUEUE_RATE_TAU_S, RateEstimator
from evenserve.sched.queue import ADMITTED, Offer, RequestQueue

_ITEMS = operator.attrgetter("items")
_ONE = {1}

#: Queue options when none are given: unbounded (per model bounds aside), no class rules.
NO_QUEUE_OPTIONS = QueueOptions()

_NOOP_ARRIVAL = BatchingPolicyBase.on_arrival
_NOOP_DISPATCH = BatchingPolicyBase.on_dispatch

#: A request's life in a scheduler: waiting in its queue; taken into a batch (it stays so after
#: the batch ends); left without running (refused after admission, expired, shed, cancelled).
QUEUED, DISPATCHED, GONE = 0, 1, 2
#: Drop reason of requests still queued when a worker shuts down (not a wire refusal).
SHUTDOWN = "shutdown"
#: Drop reason of requests still queued when their model's unload timed out (not a wire
#: refusal: the worker answers 503).
UNLOADED = "unloaded"


@dataclass(slots=True, eq=False)
class QueuedRequest(RequestInfo):
    """A request as a scheduler holds it: what policies see plus its size and state."""

    #: Items along the leading (batch) dimension; a batch holds at most ``max_batch_size``.
    items: int = 1
    state: int = QUEUED


R = TypeVar("R", bound=QueuedRequest)


@dataclass(frozen=True, slots=True)
class ModelSetup:
    """One model as its device serves it."""

    name: str
    policy: BatchingPolicy
    profile: LatencyProfile | None = None
    #: Most items in one batch; None: the policy's own ``max_batch_size``.
    max_batch_size: int | None = None
    #: Requests waiting before refusals (None: unbounded).
    max_queue: int | None = None
    #: Class of requests that bring none.
    priority: int = ONLINE
    #: Deadline (seconds after arrival) of requests that bring none; None: no deadline.
    deadline_s: float | None = None
    #: Latency SLO: requests without a deadline are ordered by arrival + SLO in their class.
    slo_s: float | None = None

    def class_of(self, priority: int | None) -> int:
        return self.priority if priority is None else priority

    def deadline_at(self, arrival_s: float, deadline_in_s: float | None) -> float | None:
        """Absolute deadline of a request arriving at ``arrival_s`` (its own, else the model's)."""
        rel = self.deadline_s if deadline_in_s is None else deadline_in_s
        return None if rel is None else arrival_s + rel


class ModelQueue(Generic[R]):
    """One model's queue with its batching policy, the view the policy reads, and counters."""

    __slots__ = (
        "cap",
        "hears_arrivals",
        "hears_dispatches",
        "in_flight",
        "lead_s",
        "name",
        "observed_s",
        "policy",
        "profile",
        "queue",
        "rate",
        "setup",
    )

    def __init__(self, setup: ModelSetup, starvation_s: float | None) -> None:
        self.setup = setup
        self.name = setup.name
        self.policy: BatchingPolicy = setup.policy
        # Policies without state leave the hooks as no-ops: skip the calls (per request).
        kind = type(setup.policy)
        self.hears_arrivals = getattr(kind, "on_arrival", None) is not _NOOP_ARRIVAL
        self.hears_dispatches = getattr(kind, "on_dispatch", None) is not _NOOP_DISPATCH
        self.profile = setup.profile
        cap = setup.max_batch_size
        self.cap = setup.policy.max_batch_size if cap is None else cap
        self.queue: RequestQueue[R] = RequestQueue(setup.slo_s, setup.max_queue, starvation_s)
        self.rate = RateEstimator(QUEUE_RATE_TAU_S)
        #: How long before its deadline a request becomes hopeless: a batch of one.
        self.lead_s = setup.profile.latency_s(1) if setup.profile is not None else 0.0
        self.in_flight = 0
        #: Observed seconds per batch by size (exponentially weighted), when no profile.
        self.observed_s: dict[int, float] = {}

    def set_policy(self, policy: BatchingPolicy) -> None:
        """Batch with ``policy`` from now on (the queue and its requests stay as they are);
        the cap follows the policy unless the setup fixes it."""
        self.setup = dataclasses.replace(self.setup, policy=policy)
        self.policy = policy
        kind = type(policy)
        self.hears_arrivals = getattr(kind, "on_arrival", None) is not _NOOP_ARRIVAL
        self.hears_dispatches = getattr(kind, "on_dispatch", None) is not _NOOP_DISPATCH
        cap = self.setup.max_batch_size
        self.cap = policy.max_batch_size if cap is None else cap

    def observed_batch_s(self, items: int) -> float:
        """Expected seconds for a batch alone without a profile: observed at this size, else
        scaled from the nearest observed size, else 0."""
        obs = self.observed_s
        if items in obs:
            return obs[items]
        if obs:
            b, s = min(obs.items(), key=lambda kv: abs(kv[0] - items))
            return s * items / b
        return 0.0


class QueueSet(Generic[R]):
    # Attributes in slots: the per-request path reads them on one of many devices.
    __slots__ = (
        "_depth_t",
        "_seq",
        "_track_rates",
        "class_headroom",
        "deadlines",
        "depth_area",
        "depth_max",
        "ignore_priority",
        "on_drop",
        "queues",
        "starvation_s",
        "stats_since_s",
        "waiting",
        "watches",
    )

    def __init__(
        self,
        models: Sequence[ModelSetup],
        on_drop: Callable[[R, str], None],
        options: QueueOptions = NO_QUEUE_OPTIONS,
        stats_since_s: float = 0.0,
        watch_deadlines: bool = True,
    ) -> None:
        starvation_s = options.starvation_s
        names = [m.name for m in models]
        if len(set(names)) != len(names):
            raise ValueError("a model is listed twice")
        self.queues: dict[str, ModelQueue[R]] = {
            m.name: ModelQueue(m, starvation_s) for m in models
        }
        self.on_drop = on_drop
        self.starvation_s = starvation_s
        self.class_headroom = options.class_headroom
        self.ignore_priority = options.ignore_priority
        self._track_rates = options.class_headroom is not None
        #: Whether the deadline watch runs (a device drives it; shared queues have none).
        self.watches = watch_deadlines
        #: The deadline watch: (hopeless at, sequence, request), a heap (empty: no request
        #: with a deadline is queued).
        self.deadlines: list[tuple[float, int, R]] = []
        self._seq = itertools.count()
        self.waiting = 0
        self.stats_since_s = stats_since_s
        self.depth_area = 0.0
        self.depth_max = 0
        #: The later of the last change of ``waiting`` and ``stats_since_s``: where the next
        #: change's share of ``depth_area`` starts.
        self._depth_t = stats_since_s

    def set_class_headroom(self, class_headroom: float | None) -> None:
        """Use ``class_headroom`` from now on (arrival rates are tracked from now when on)."""
        self.class_headroom = class_headroom
        self._track_rates = class_headroom is not None

    def __contains__(self, model: str) -> bool:
        return model in self.queues

    # -- models come and go ---------------------------------------------------------------
    def add(self, setup: ModelSetup) -> ModelQueue[R]:
        """A queue for one more model (ValueError: it has one)."""
        if setup.name in self.queues:
            raise ValueError(f"model {setup.name!r} already has a queue")
        mq = self.queues[setup.name] = ModelQueue(setup, self.starvation_s)
        return mq

    def remove(self, model: str) -> None:
        """Remove an empty model queue (ValueError: unknown, or requests still queued)."""
        mq = self.queues.get(model)
        if mq is None:
            raise ValueError(f"model {model!r} has no queue")
        if mq.queue.items:
            raise ValueError(f"model {model!r}: {len(mq.queue.items)} request(s) still queued")
        del self.queues[model]

    # -- depth accounting -----------------------------------------------------------------
    def _depth(self, now: float, delta: int) -> None:
        since = self.stats_since_s
        if now > since:
            self.depth_area += self.waiting * (now - self._depth_t)
            self._depth_t = now
        self.waiting += delta
        if self.waiting > self.depth_max and now >= since:
            self.depth_max = self.waiting

    def mean_depth(self, end_s: float) -> float:
        """Exact time-weighted mean of ``waiting`` from ``stats_since_s`` to ``end_s``."""
        self._depth(end_s, 0)
        span = end_s - self.stats_since_s
        return self.depth_area / span if span > 0 else 0.0

    # -- admission --------------------------------------------------------------------------
    def offer(self, r: R, now: float, busy_remaining_s: float = 0.0) -> str | None:
        """Queue ``r`` (None) or refuse it (the reason). KeyError: the model is not here."""
        mq = self.queues[r.model]
        if self.ignore_priority:
            r.priority = ONLINE
        q = mq.queue
        items = q.items
        res: Offer[R]
        # RequestQueue.offer's first cases, inlined (the per-request path): no deadline, room,
        # the queue in arrival order, and it is empty or of the request's class and it comes
        # last.
        if (
            r.deadline_s is None
            and q.sort_keys is None
            and (q.max_len is None or len(items) < q.max_len)
            and (
                not items
                or (
                    r.priority == q.fifo_class
                    and (
                        r.arrival_s > (tail := items[-1]).arrival_s
                        or (r.arrival_s == tail.arrival_s and r.request_id >= tail.request_id)
                    )
                )
            )
        ):
            if not items:
                q.fifo_class = r.priority
            items.append(r)
            res = ADMITTED  # type: ignore[assignment]
        else:
            res = q.offer(r, now, mq.profile, busy_remaining_s)
        if res is not ADMITTED:
            for gone in res.expired:  # a full queue first lets go of hopeless requests
                self._leave(gone, now, DEADLINE_EXPIRED)
            if not res.admitted:
                return res.reason
            if res.evicted is not None:
                self._leave(res.evicted, now, SHED)
        # _depth(now, 1), inlined: this is the per-request path.
        since = self.stats_since_s
        waiting = self.waiting
        if now > since:
            self.depth_area += waiting * (now - self._depth_t)
            self._depth_t = now
        self.waiting = waiting = waiting + 1
        if waiting > self.depth_max and now >= since:
            self.depth_max = waiting
        if r.deadline_s is not None and self.watches:
            # Hopeless once deadline - lead < now: the first double after deadline - lead.
            at = math.nextafter(r.deadline_s - mq.lead_s, math.inf)
            heapq.heappush(self.deadlines, (at, next(self._seq), r))
        if mq.hears_arrivals:
            mq.policy.on_arrival(now)
        if self._track_rates:
            mq.rate.observe(now)
        return None

    def _leave(self, r: R, now: float, reason: str) -> None:
        """``r`` left its queue without running (already removed from the RequestQueue)."""
        r.state = GONE
        self._depth(now, -1)
        self.on_drop(r, reason)

    # -- deadlines --------------------------------------------------------------------------
    @property
    def watch_at(self) -> float:
        """When the next queued request becomes hopeless (inf: none has a deadline)."""
        w = self.deadlines
        if not w:
            return math.inf
        while w and w[0][2].state != QUEUED:
            heapq.heappop(w)
        return w[0][0] if w else math.inf

    def watch(self, now: float) -> None:
        """Drop (``deadline-expired``) every queued request that is hopeless by ``now``."""
        w = self.deadlines
        while w and w[0][0] <= now:
            _, _, r = heapq.heappop(w)
            if r.state == QUEUED and self.queues[r.model].queue.remove(r):
                self._leave(r, now, DEADLINE_EXPIRED)

    def prune(self, mq: ModelQueue[R], lead_s: float, now: float) -> None:
        """Before a batch decision on a device whose batch of one takes ``lead_s``: expire
        hopeless requests of ``mq`` and promote its starved ones."""
        q = mq.queue
        if not q.items:
            return
        for r in q.expire(now, lead_s):
            self._leave(r, now, DEADLINE_EXPIRED)
        if self.starvation_s is not None:
            q.promote_starved(now)

    # -- leaving ----------------------------------------------------------------------------
    def take(self, mq: ModelQueue[R], n: int, now: float) -> tuple[list[R], int]:
        """Pop the head of ``mq`` for a batch of ``n`` requests, stopping before the request
        that would take the batch over its item cap; returns the requests and their items."""
        items_q = mq.queue.items
        if n < 1:  # a policy answering Dispatch(0) must not stall
            n = 1
        if n > len(items_q):
            n = len(items_q)
        cap = mq.cap
        k = n if n < cap else (cap if cap > 1 else 1)
        # One item each (the usual case), and the next would go over the cap: k of them.
        if set(map(_ITEMS, items_q[:k])) == _ONE and (k == n or items_q[k].items > 0):
            items = k
        else:
            k = 0
            items = 0
            for r in items_q:
                size = r.items
                if k and items + size > cap:
                    break
                items += size
                k += 1
                if k == n:
                    break
        taken = mq.queue.pop(k)
        if mq.hears_dispatches:
            mq.policy.on_dispatch(k, now)
        self._depth(now, -k)
        for r in taken:
            r.state = DISPATCHED
        return taken, items

    def drop_queued(self, r: R, now: float, reason: str) -> bool:
        """Drop one queued request with ``reason`` (reported through ``on_drop``); False if
        it was not queued."""
        if r.state != QUEUED or not self.queues[r.model].queue.remove(r):
            return False
        self._leave(r, now, reason)
        return True

    def cancel(self, r: R, now: float) -> bool:
        """Take a queued request out (its caller went away); False if it was not queued."""
        if r.state != QUEUED or not self.queues[r.model].queue.remove(r):
            return False
        r.state = GONE
        self._depth(now, -1)
        return True

    def abandon(self, now: float, reason: str = SHUTDOWN, model: str | None = None) -> int:
        """Drop every queued request (of ``model``: all models when None) with ``reason``;
        returns how many."""
        n = 0
        chosen = self.queues.values() if model is None else [self.queues[model]]
        for mq in list(chosen):
            for r in mq.queue.pop(len(mq.queue)):
                n += 1
                self._leave(r, now, reason)
        return n
