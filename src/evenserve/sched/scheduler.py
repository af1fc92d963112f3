"""The device scheduler: one device's queues, instance slots, timing and load, sans I/O.

One object decides everything a device does, for the simulator and the live worker alike
(design note 0006): events come in as method calls with their time, actions go out to the
driver's ``SchedulerActions``; it never reads a clock, sleeps or touches a loop (h11's way).

Theory of operation.
- Events in: ``offer(request, now)`` (None, or the refusal reason), ``finished(batch, now)``
  (it ended: an executor ran it, or the end the scheduler announced came; ``announced(token)``
  names that batch), ``wake(at, now)`` (a wake-up it asked for), ``cancel``, ``begin_drain``,
  ``abandon``, ``observe_memory``, ``queues_changed`` (shared queues).
- Actions out: ``start_batch(batch)``, ``drop(request, reason)`` (a queued request that will
  not run), ``wake_at(t)``, ``end_at(t, token)`` (the earliest running batch ends at t unless
  a later announcement supersedes it).
- Planning, whenever an instance is free after a change: expire hopeless requests, promote
  starved ones, and ask ``policy.batching.device.next_batch`` which model's batch to start;
  repeat while instances are free. When no policy is ready, the earliest WaitUntil becomes
  the pending wake-up, replacing the last one. A device that hosts one model without class
  rules asks its policy directly (the same answer without the general machinery).
- Timers: the scheduler keeps the wake-ups it asked for and not yet received, and asks for
  another only when none comes soon enough for the pending wake-up or the next deadline-watch
  time; a wake-up that finds nothing due does nothing. So drivers never cancel a timer (an
  event heap cannot), and both drivers see the same calls at the same times.
- Timing and busy time are ``sched.slots``'; memory is ``sched.memory``'s account.
- Loading models (``begin_load`` ... ``loaded``): a model being loaded onto the device holds
  its weights from the load's start; its requests are admitted and queue, but no batch of it
  starts until ``loaded``. With a bound (``load_wait_s``), a request that has waited that long
  for the load is dropped as ``load-timeout`` (503 with Retry-After), on a wake-up the
  scheduler asks for, like the deadline watch. Devices without loading models never take
  these paths.
"""

from __future__ import annotations

import heapq
import math
import operator
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Generic, TypeVar

from evenserve.core.options import DeviceOptions, QueueOptions
from evenserve.core.profile import LatencyProfile
from evenserve.core.types import Dispatch, LoadSample
from evenserve.core.wire import DEADLINE_EXPIRED, LOAD_TIMEOUT, ONLINE
from evenserve.policy.batching import BatchingPolicy
from evenserve.policy.batching.device import next_batch
from evenserve.policy.batching.rate import QUEUE_RATE_TAU_S
from evenserve.sched.actions import Batch, SchedulerActions
from evenserve.sched.engine.engine import EngineSetup, GenSpec
from evenserve.sched.engine.hosting import EngineHost
from evenserve.sched.engine.interleave import CLASSIC, ENGINE, Side, first
from evenserve.sched.hosted import Hosted, flush
from evenserve.sched.memory import MemoryAccount
from evenserve.sched.queues import (
    NO_QUEUE_OPTIONS,
    QUEUED,
    SHUTDOWN,
    ModelSetup,
    QueuedRequest,
    QueueSet,
)
from evenserve.sched.slots import Slots

R = TypeVar("R", bound=QueuedRequest)
_ARRIVAL = operator.attrgetter("arrival_s")

#: ``offer``'s answer while the device drains (the worker answers 503).
DRAINING = "draining"
#: Device options when none are given: one instance.
ONE_INSTANCE = DeviceOptions()


class DeviceScheduler(Generic[R]):
    """Everything one device decides. ``models``: the hosted models of ``queues`` (all of
    them by default; a subset when several devices share one QueueSet); ``profiles``: this
    device's (by default the queues')."""

    # Attributes in slots: the per-request path reads them on one of many devices.
    __slots__ = (
        "_announces",
        "_by_name",
        "_deadlines",
        "_direct",
        "_free",
        "_hosted",
        "_last_kind",
        "_loading",
        "_owns_queues",
        "_plan_wake",
        "_planning",
        "_replan",
        "_serving",
        "_timers",
        "_watch",
        "actions",
        "batches_started",
        "busy",
        "draining",
        "engines",
        "in_flight",
        "instances",
        "learn_profiles",
        "max_batch_size",
        "max_queue",
        "memory",
        "models",
        "queues",
        "slo_s",
        "slots",
    )

    def __init__(
        self,
        queues: QueueSet[R],
        actions: SchedulerActions[R],
        *,
        models: Sequence[str] | None = None,
        device: DeviceOptions = ONE_INSTANCE,
        memory_total_bytes: float | None = None,
        utilization_window_s: float = 1.0,
        origin_s: float = 0.0,
        profiles: Mapping[str, LatencyProfile | None] | None = None,
        learn_profiles: bool = False,
    ) -> None:
        instances = device.instances
        #: LLM engines hosted here (``add_engine``), by model name, and which kind of work
        #: started last (engine steps and classic batches alternate).
        self.engines: dict[str, EngineHost[R]] = {}
        self._last_kind: str | None = None
        names = sorted(queues.queues if models is None else models)
        for m in names:
            if m not in queues:
                raise ValueError(f"model {m!r} has no queue")
        self.queues = queues
        self.actions = actions
        self.draining = False
        #: Profiles that learn: each hosted model's profile follows its observed batch
        #: times (``finished``'s ``took_s``; ``core.profile_learning``).
        self.learn_profiles = learn_profiles
        #: Models loading here: name -> (load-wait bound or None, the queued requests with
        #: the time each times out, in offer order).
        self._loading: dict[str, tuple[float | None, deque[tuple[float, R]]]] = {}
        # Models in name order: next_batch breaks ties by the order it sees them.
        self._hosted: list[Hosted[R]] = [
            Hosted(
                queues.queues[m],
                queues.queues[m].profile if profiles is None else profiles.get(m),
                learn_profiles,
            )
            for m in names
        ]
        self._derive()
        self.instances = instances
        self.slots: Slots[R] = Slots(device, actions, utilization_window_s, origin_s)
        self._free = self.slots.free
        self.busy = self.slots.busy
        self.in_flight = 0
        self.batches_started = 0
        self.memory = MemoryAccount(self._weights_bytes(), memory_total_bytes)
        self._watch = queues.watches
        #: The queues' deadline watch (empty: nothing to watch, the calls are skipped).
        self._deadlines = queues.deadlines
        #: Whether batches share the device (several instances): only then do starts and
        #: ends move the announced end (``Slots.announce``).
        self._announces = self.slots.instances > 1
        self._plan_wake = math.inf
        self._timers: list[float] = []
        self._planning = False
        self._replan = False

    def _derive(self) -> None:
        """The figures that follow the hosted models (at start, and when models come and go)."""
        self.models = tuple(h.mq.name for h in self._hosted)
        self._by_name = {h.mq.name: h for h in self._hosted}
        #: The most requests one batch of each model takes here (its policy's cap; the load
        #: snapshot carries it to routers that predict work).
        self.max_batch_size = {h.mq.name: h.mq.policy.max_batch_size for h in self._hosted}
        #: Each model's SLO and queue bound here (the snapshot carries them to the router,
        #: which refuses work only on evidence: a predicted wait past the SLO, full queues).
        self.slo_s = {
            h.mq.name: h.mq.setup.slo_s for h in self._hosted if h.mq.setup.slo_s is not None
        }
        self.max_queue = {
            h.mq.name: h.mq.setup.max_queue
            for h in self._hosted
            if h.mq.setup.max_queue is not None
        }
        self._owns_queues = len(self._hosted) == len(self.queues.queues)
        #: The models that may start batches (all but those loading).
        loading = self._loading
        self._serving = (
            [h for h in self._hosted if h.mq.name not in loading] if loading else self._hosted
        )
        qs = self.queues
        self._direct = (
            not self.engines
            and len(self._serving) == 1
            and (self.draining or (qs.starvation_s is None and qs.class_headroom is None))
        )

    def _weights_bytes(self) -> float:
        held = sum(e.reserved_bytes for e in self.engines.values())
        return held + sum(h.profile.weights_bytes for h in self._hosted if h.profile)

    # -- models come and go (model control) ------------------------------------------------
    def add_model(
        self, setup: ModelSetup, now: float, profile: LatencyProfile | None = None
    ) -> None:
        """Host one more model with a queue of its own (``profile``: this device's, by default
        the setup's). ValueError: it is hosted already, or this device shares its queues."""
        if not self._owns_queues:
            raise ValueError("add_model: this device shares its queues with others")
        if setup.name in self._by_name:
            raise ValueError(f"model {setup.name!r} is hosted here already")
        mq = self.queues.add(setup)
        h = Hosted(mq, setup.profile if profile is None else profile, self.learn_profiles)
        if self.draining:
            h.policy = flush(mq.policy)
        # Models in name order: next_batch breaks ties by the order it sees them.
        self._hosted = sorted([*self._hosted, h], key=lambda x: x.mq.name)
        self._derive()
        self.memory.weights_bytes = self._weights_bytes()

    def add_engine(
        self,
        name: str,
        setup: EngineSetup,
        now: float,
        num_blocks: int | None = None,
        priority: int = ONLINE,
    ) -> EngineHost[R]:
        """Host an LLM engine for ``name``. ``num_blocks``: its KV blocks (None: what its
        step profile's device memory holds after the weights and the classic models here
        hold: their weights and their largest batch's working memory). ValueError: the name
        is hosted already."""
        if name in self._by_name or name in self.engines:
            raise ValueError(f"model {name!r} is hosted here already")
        if num_blocks is None:
            other = self._weights_bytes() + max(
                (h.cost(h.mq.cap)[1] for h in self._hosted), default=0.0
            )
            num_blocks = setup.profile.kv_blocks(other)
        need = -(-setup.profile.max_model_len // setup.profile.block_tokens)
        if num_blocks < need:
            raise ValueError(
                f"model {name!r}: {num_blocks} KV blocks left on this device after the other "
                f"models' memory, fewer than one sequence of max_model_len "
                f"({setup.profile.max_model_len} tokens) needs ({need}): give the engine's "
                "num_blocks, or a shorter max_model_len"
            )
        host: EngineHost[R] = EngineHost(name, setup, num_blocks, now, priority)
        self.engines[name] = host
        self._derive()
        self.memory.weights_bytes = self._weights_bytes()
        return host

    def remove_engine(self, name: str, now: float) -> None:
        """Stop hosting ``name``'s engine (it is unloaded, or put to sleep): its weights and
        KV blocks are freed. ValueError: no engine of it here, or it still has sequences
        waiting or running, or a step of it runs (a model leaves only when it has none)."""
        host = self.engines.get(name)
        if host is None:
            raise ValueError(f"model {name!r} has no engine here")
        e = host.engine
        if host.in_flight or e.has_work:
            raise ValueError(
                f"model {name!r}: {e.num_waiting} sequence(s) waiting and {e.num_running} "
                "running; an engine leaves only when it has none"
            )
        del self.engines[name]
        self._derive()
        self.memory.weights_bytes = self._weights_bytes()

    def begin_load(
        self,
        setup: ModelSetup,
        now: float,
        profile: LatencyProfile | None = None,
        load_wait_s: float | None = None,
    ) -> None:
        """Start loading one more model (as ``add_model``; its weights are held from now):
        its requests queue, none runs, until ``loaded``. ``load_wait_s``: a request that
        waits this long for the load is dropped as ``load-timeout`` (None: no bound)."""
        if load_wait_s is not None and load_wait_s < 0:
            raise ValueError("load_wait_s must be >= 0")
        self.add_model(setup, now, profile)
        self._loading[setup.name] = (load_wait_s, deque())
        self._derive()

    def loaded(self, name: str, now: float) -> list[R]:
        """``name`` finished loading: its batches may start. Returns the requests that were
        waiting for the load (queued now), so a driver can count their wait. ValueError: it
        is not loading here."""
        if self._loading.pop(name, None) is None:
            raise ValueError(f"model {name!r} is not loading here")
        waited = list(self._by_name[name].mq.queue.items)
        self._derive()
        self._plan(now)
        return waited

    @property
    def loading(self) -> frozenset[str]:
        """The models loading here now."""
        return frozenset(self._loading)

    def _expire_loads(self, now: float) -> None:
        """Drop (``load-timeout``) the requests that have waited their bound for a load."""
        qs = self.queues
        for _, waits in list(self._loading.values()):
            while waits and waits[0][0] <= now:
                _, r = waits.popleft()
                qs.drop_queued(r, now, LOAD_TIMEOUT)

    def _load_watch_at(self) -> float:
        """When the next request waiting for a load times out (inf: none)."""
        at = math.inf
        for _, waits in self._loading.values():
            while waits and waits[0][1].state != QUEUED:
                waits.popleft()
            if waits and waits[0][0] < at:
                at = waits[0][0]
        return at

    def remove_model(self, name: str, now: float) -> None:
        """Stop hosting ``name``. ValueError: not hosted, or requests of it are still queued or
        running (drain it first: ``flush_model``, then ``abandon(now, model=...)``)."""
        h = self._by_name.get(name)
        if h is None:
            raise ValueError(f"model {name!r} is not hosted here")
        if not self._owns_queues:
            raise ValueError("remove_model: this device shares its queues with others")
        queued, running = len(h.mq.queue.items), h.mq.in_flight
        if queued or running or any(b.model == name for b in self.slots.running.values()):
            raise ValueError(
                f"model {name!r}: {queued} request(s) queued and {running} running; "
                "a model leaves only when it has none"
            )
        self.queues.remove(name)
        self._loading.pop(name, None)
        self._hosted = [x for x in self._hosted if x is not h]
        self._derive()
        self.memory.weights_bytes = self._weights_bytes()

    def flush_model(self, name: str, now: float) -> None:
        """Run what is queued for ``name`` without waiting for its policy's windows (the
        model is being unloaded); KeyError: not hosted."""
        h = self._by_name[name]
        h.policy = flush(h.mq.policy)
        self._plan(now)

    # -- parameters change (a tuner's push) -----------------------------------------------
    def set_policy(self, name: str, policy: BatchingPolicy, now: float) -> None:
        """Batch ``name`` with ``policy`` from the next decision on. Queued requests stay
        queued (in their order) and running batches run on; a draining or flushing model
        keeps flushing, at the new policy's cap. KeyError: not hosted. The policy's own
        state (rates, windows) starts afresh."""
        h = self._by_name[name]
        mq = h.mq
        flushing = h.policy is not mq.policy
        mq.set_policy(policy)
        for x in self._hosted:  # a shared queue may be hosted here once only, but be exact
            if x.mq is mq:
                x.policy = flush(policy) if flushing else policy
        self._derive()
        self._plan(now)

    def set_class_headroom(self, class_headroom: float | None, now: float) -> None:
        """Use ``class_headroom`` (None: off) from the next decision on."""
        self.queues.set_class_headroom(class_headroom)
        self._derive()
        self._plan(now)

    def set_learn_profiles(self, on: bool, now: float) -> None:
        """Profiles that learn, on or off, from the next decision on. On: each hosted model
        with a profile gets a fresh learner from its base (unlearned) profile; off: each
        model's profile goes back to its base profile and its learner is dropped. Queued
        requests stay queued and running batches run on."""
        self.learn_profiles = on
        for h in self._hosted:
            h.set_learning(on, self._owns_queues)
        self._plan(now)

    # -- events ---------------------------------------------------------------------------
    def offer(self, r: R, now: float) -> str | None:
        """Queue ``r`` (None) or refuse it: the reason (``queue-full``,
        ``deadline-infeasible``, or ``draining``). KeyError: its model is not hosted here."""
        if self.draining:
            return DRAINING
        if self._loading and r.model in self._loading:
            return self._offer_loading(r, now)
        if r.deadline_s is None:
            reason = self.queues.offer(r, now)
            if reason is None and self._free and not self._keeps_wait(r, now):
                self._plan(now)
            return reason
        reason = self.queues.offer(r, now, self.busy_remaining_s(now))
        if reason is None:
            if self._free:
                self._plan(now)
            else:
                self._ensure_timer()
        return reason

    def offer_generation(self, r: R, spec: GenSpec, now: float) -> str | None:
        """Queue an LLM generation with its model's engine (None) or refuse it: the reason
        (``context-too-long``, ``queue-full``, ``draining``). KeyError: no engine for it."""
        host = self.engines[r.model]
        if self.draining:
            return DRAINING
        reason = host.engine.add(r, spec)
        host.blocked = False
        if reason is None and self._free and not host.in_flight:
            self._plan(now)
        return reason

    def _keeps_wait(self, r: R, now: float) -> bool:
        """Whether planning after ``r`` joined the queue would answer what the last plan did:
        one model served directly, its policy's wait stands (``arrivals_keep_wait``: the
        same head, still short of a full batch, before the wake-up already asked for), no
        deadlines to expire. Then the plan is skipped (the arrival path of a device waiting
        on its batching window)."""
        if not self._direct or self._planning or not now < self._plan_wake:
            return False
        h = self._serving[0]
        q = h.mq.queue
        items = q.items
        return (
            getattr(h.policy, "arrivals_keep_wait", False)
            and items[0] is not r
            and len(items) < h.policy.max_batch_size
            and not q.with_deadline
        )

    def _offer_loading(self, r: R, now: float) -> str | None:
        """Queue a request of a model that is loading (it waits for ``loaded``)."""
        reason = self.queues.offer(r, now, self.busy_remaining_s(now))
        if reason is None:
            bound, waits = self._loading[r.model]
            if bound is not None:
                waits.append((now + bound, r))
            self._ensure_timer()
        return reason

    def finished(
        self,
        batch: Batch[R],
        now: float,
        took_s: float | None = None,
        sampled: Mapping[int, int] | None = None,
    ) -> None:
        """``batch`` ended at ``now`` (``took_s``: its measured compute time, if known). An
        engine step's tokens (``sampled``: a real executor's, by seq id) are set on
        ``batch.events`` before the next plan."""
        if batch.step is not None:
            self.slots.finish(batch, now)
            batch.events = self.engines[batch.model].done(batch.step, now, sampled)
            self.in_flight = sum(len(e.engine.running) for e in self.engines.values())
            self._plan(now)
            return
        self.slots.finish(batch, now)
        h = self._by_name[batch.model]
        k = len(batch.requests)
        h.mq.in_flight -= k
        self.in_flight -= k
        mem = self.memory
        mem.batches_bytes = mem.batches_bytes - batch.memory_bytes if self.slots.running else 0.0
        if took_s is not None:
            learner = h.learner
            if learner is not None:
                if learner.observe(batch.items, took_s):
                    h.use_profile(learner.profile(), self._owns_queues)
            elif h.profile is None:
                obs = h.mq.observed_s
                prev = obs.get(batch.items)
                obs[batch.items] = took_s if prev is None else prev + 0.2 * (took_s - prev)
        self._plan(now)

    def announced(self, token: int) -> Batch[R] | None:
        """The batch whose end was announced with ``token`` (``end_at``); None when a later
        announcement superseded it. The driver then reports it ``finished``."""
        return self.slots.announced(token)

    def wake(self, at_s: float, now: float) -> None:
        """The wake-up asked for at ``at_s`` came (``now`` may be a hair earlier live)."""
        timers = self._timers
        if timers and timers[0] == at_s:
            heapq.heappop(timers)
        elif at_s in timers:
            timers.remove(at_s)
            heapq.heapify(timers)
        if self._watch and self._deadlines:
            self.queues.watch(now)
        if self._loading:
            self._expire_loads(now)
        if self._plan_wake <= now:
            self._plan(now)
        else:
            self._ensure_timer()

    def queues_changed(self, now: float) -> None:
        """Shared queues changed under this device (another's offer): plan if it is free."""
        if self._free:
            self._plan(now)

    def cancel(self, r: R, now: float) -> bool:
        """Take a queued request out (its caller went away); False if it was not queued.
        An LLM generation leaves its engine wherever it is (its blocks are freed)."""
        host = self.engines.get(r.model) if self.engines else None
        if host is not None:
            if not host.engine.cancel(r):
                return False
            host.blocked = False
            self._plan(now)
            return True
        if not self.queues.cancel(r, now):
            return False
        self._plan(now)
        return True

    def begin_drain(self, now: float) -> None:
        """Refuse new requests; run what is queued now without waiting for windows."""
        self.draining = True
        for h in self._hosted:
            h.policy = flush(h.mq.policy)
        self._derive()
        self._plan(now)

    def end_drain(self, now: float) -> None:
        """Take new requests again (a device turned off after draining, and on again): every
        hosted model batches with its own policy."""
        self.draining = False
        for h in self._hosted:
            h.policy = h.mq.policy
        self._derive()
        self._plan(now)

    def abandon(self, now: float, reason: str = SHUTDOWN, model: str | None = None) -> int:
        """Drop everything still queued (shutdown), or only ``model``'s; returns how many.
        An engine's generations are dropped whether waiting or running."""
        n = 0
        for name, host in self.engines.items():
            if model is None or model == name:
                for r in host.engine.abandon():
                    self.actions.drop(r, reason)
                    n += 1
        if model is not None and model in self.engines:
            return n
        return n + self.queues.abandon(now, reason, model)

    def observe_memory(self, used_bytes: float | None, total_bytes: float | None) -> None:
        """Measured device memory (a real device); replaces the profiles' account."""
        self.memory.measured = (used_bytes, total_bytes)

    # -- planning -------------------------------------------------------------------------
    def _plan(self, now: float) -> None:
        if self._planning:  # an action called back into the scheduler: plan again after
            self._replan = True
            return
        self._planning = True
        try:
            self._plan_once(now)
            while self._replan:
                self._replan = False
                self._plan_once(now)
        finally:
            self._planning = False
        if self._announces:
            self.slots.announce()
        self._ensure_timer()

    def _plan_once(self, now: float) -> None:
        if self.engines:
            self._plan_mixed(now)
            return
        wake = math.inf
        free = self._free
        hosted = self._serving
        queues = self.queues
        while free:
            if self._direct:  # one model, no class rules: ask its policy directly
                h = hosted[0]
                q = h.mq.queue
                if not q.items:
                    break
                if q.with_deadline:
                    queues.prune(h.mq, h.lead_s, now)
                    if not q.items:
                        break
            else:
                ready: Hosted[R] | None = None
                several = False
                for h in hosted:
                    if h.mq.queue.items:
                        queues.prune(h.mq, h.lead_s, now)
                        if h.mq.queue.items:
                            if ready is None:
                                ready = h
                            else:
                                several = True
                if ready is None:
                    break
                if several or not (self.draining or queues.class_headroom is None):
                    nb = self._next_batch(now)
                    if nb[0] is None:
                        wake = nb[2]
                        break
                    self._start(nb[0], nb[1], now)
                    continue
                # next_batch over one ready queue without class headroom is its policy's
                # answer (the starvation bound only ranks queues against each other).
                h = ready
            view = h.view
            view.memory_free_bytes = self.memory.free_bytes()
            dec = h.policy.decide(view, now)
            if isinstance(dec, Dispatch):
                self._start(h, dec.n, now)
                continue
            wake = dec.t_s
            break
        self._plan_wake = wake

    def _plan_mixed(self, now: float) -> None:
        """Planning with LLM engines here: engine steps interleaved with classic batches
        (``sched.engine.interleave``)."""
        wake = math.inf
        free = self._free
        queues = self.queues
        while free:
            host = None
            for e in self.engines.values():
                if e.ready and (host is None or e.idle_since_s < host.idle_since_s):
                    host = e
            cand: tuple[Hosted[R] | None, int, float] = (None, 0, math.inf)
            if self._serving:
                ready = False
                for h in self._serving:
                    if h.mq.queue.items:
                        queues.prune(h.mq, h.lead_s, now)
                        ready = ready or bool(h.mq.queue.items)
                if ready:
                    cand = self._next_batch(now)
            hc, n, w = cand
            if hc is None:
                wake = min(wake, w)
                if host is None:
                    break
                self._start_step(host, now)
                continue
            if host is None:
                self._start(hc, n, now)
                continue
            head = hc.mq.queue.items[0]
            batch_s = hc.cost(min(n, hc.mq.cap) or 1)[0]
            slo = hc.mq.setup.slo_s
            if head.deadline_s is not None:
                slack = head.deadline_s - now - batch_s
            elif slo is not None:
                slack = head.arrival_s + slo - now - batch_s
            else:
                slack = math.inf
            classic = Side(head.priority, batch_s, slack)
            if first(host.side(now), classic, self._last_kind) == ENGINE:
                self._start_step(host, now)
            else:
                self._start(hc, n, now)
        self._plan_wake = wake

    def _start_step(self, host: EngineHost[R], now: float) -> None:
        for r in host.engine.expire(now):
            self.actions.drop(r, DEADLINE_EXPIRED)
        step = host.engine.plan(now)
        if step is None:  # nothing can run (waiting for blocks that a running step frees)
            host.blocked = True
            return
        inst = self._free.pop(0)
        reqs = [p.seq.req for p in step.parts]
        batch = Batch(host.name, reqs, len(reqs), inst, now, step.seconds, 0.0,
                      self.batches_started)  # fmt: skip
        batch.step = step
        batch.held_s = 0.0
        batch.cap = host.engine.setup.max_num_seqs
        self.batches_started += 1
        host.in_flight = True
        self._last_kind = ENGINE
        self.slots.start(batch, 1.0, now)
        self.actions.start_batch(batch)

    def _next_batch(self, now: float) -> tuple[Hosted[R] | None, int, float]:
        qs = self.queues
        free_mem = self.memory.free_bytes()
        drain = self.draining
        headroom = None if drain else qs.class_headroom
        serving = self._serving
        for h in serving:
            h.view.memory_free_bytes = free_mem
            if headroom is not None:
                h.view.arrival_rate_rps = h.mq.rate.rate_at(now)
        nb = next_batch(
            [(h.view, h.policy) for h in serving if h.view.requests or headroom is not None],
            now,
            starvation_s=None if drain else qs.starvation_s,
            class_headroom=headroom,
            rate_tau_s=QUEUE_RATE_TAU_S if headroom is not None else None,
        )
        if nb.model is None:
            return None, 0, nb.wake_s
        return self._by_name[nb.model], nb.n, nb.wake_s

    def _start(self, h: Hosted[R], n: int, now: float) -> None:
        # Arrival order is service order: the head is the oldest (``RequestQueue``).
        in_order = h.mq.queue.sort_keys is None
        taken, items = self.queues.take(h.mq, n, now)
        k = len(taken)
        h.mq.in_flight += k
        self.in_flight += k
        solo, mem, occ = h.cost(items)
        inst = self._free.pop(0)
        batch = Batch(h.mq.name, taken, items, inst, now, solo, mem, self.batches_started)
        if taken:
            oldest = taken[0].arrival_s if in_order else min(map(_ARRIVAL, taken))
            since = self.slots.free_since[inst]
            held = now - (oldest if oldest > since else since)
            batch.held_s = held if held > 0.0 else 0.0
        batch.cap = h.mq.policy.max_batch_size
        self.batches_started += 1
        self._last_kind = CLASSIC
        self.memory.batches_bytes += mem
        # What it really takes alone on a device as fast as its (unlearned) profile; the
        # slots apply any slowdown (``solo``: the estimate, a learned profile's).
        learner = h.learner
        self.slots.start(
            batch, occ, now, solo if learner is None else learner.base.latency_s(items)
        )
        self.actions.start_batch(batch)

    def _ensure_timer(self) -> None:
        need = self._plan_wake
        if self._watch and self._deadlines:
            w = self.queues.watch_at
            if w < need:
                need = w
        if self._loading:
            w = self._load_watch_at()
            if w < need:
                need = w
        if need == math.inf:
            return
        timers = self._timers
        if timers and timers[0] <= need:
            return  # an earlier wake-up is coming; it will ask again
        heapq.heappush(timers, need)
        self.actions.wake_at(need)

    # -- readings -------------------------------------------------------------------------
    def running(self) -> list[Batch[R]]:
        return list(self.slots.running.values())

    @property
    def free_instances(self) -> int:
        return len(self._free)

    def busy_remaining_s(self, now: float) -> float:
        """Seconds until an instance is free (0 when one is free now), from estimates."""
        return self.slots.busy_remaining_s(now)

    def estimate_batch_s(self, model: str, items: int) -> float:
        """Expected seconds for a batch of ``items`` of ``model`` alone on this device."""
        return self._by_name[model].cost(items)[0]

    def estimate_wait_s(self, model: str, now: float) -> float:
        """Rough time for the queue of ``model`` to clear (for Retry-After)."""
        h = self._by_name[model]
        items = sum(r.items for r in h.mq.queue.items)
        cap = h.mq.cap
        batches = math.ceil(items / cap) if items else 0
        per_batch = h.cost(min(cap, max(1, items)))[0]
        return batches * per_batch / self.instances + self.busy_remaining_s(now)

    @property
    def waiting(self) -> int:
        """Requests queued for this device's models."""
        if self._owns_queues:
            return self.queues.waiting
        return sum(len(h.mq.queue.items) for h in self._hosted)

    def queued_by_model(self) -> dict[str, int]:
        return {h.mq.name: len(h.mq.queue.items) for h in self._hosted}

    def in_flight_by_model(self) -> dict[str, int]:
        return {h.mq.name: h.mq.in_flight for h in self._hosted}

    @property
    def idle(self) -> bool:
        return (
            not self.slots.running
            and self.waiting == 0
            and not any(e.engine.has_work for e in self.engines.values())
        )

    def learned(self) -> tuple[dict[str, float], dict[str, dict[int, float]]]:
        """With learning on: each model's learned scale and its smoothed observed batch
        times, ms by size (what a router rebuilds the learned profile from); empty without."""
        scale: dict[str, float] = {}
        observed: dict[str, dict[int, float]] = {}
        if self.learn_profiles:
            for h in self._hosted:
                if h.learner is not None:
                    scale[h.mq.name] = h.learner.scale
                    observed[h.mq.name] = h.learner.observed_ms()
        return scale, observed

    def snapshot(self, now: float) -> LoadSample:
        """The load signals the router reads (the worker's load report, the simulator's
        samples)."""
        used, total = self.memory.used_total()
        scale, observed = self.learned()
        return LoadSample(
            timestamp_s=now,
            queue_depth=float(self.waiting),
            in_flight=float(self.in_flight),
            utilization=self.busy.fraction(now),
            memory_used_bytes=used,
            memory_total_bytes=total,
            queued_by_model={h.mq.name: float(len(h.mq.queue.items)) for h in self._hosted},
            busy_remaining_s=self.busy_remaining_s(now),
            max_batch_size=self.max_batch_size,
            slo_s=self.slo_s,
            max_queue=self.max_queue,
            profile_scale=scale,
            observed_ms=observed,
        )


def scheduler_for(
    models: Sequence[ModelSetup],
    actions: SchedulerActions[R],
    device: DeviceOptions = ONE_INSTANCE,
    queue: QueueOptions = NO_QUEUE_OPTIONS,
    *,
    stats_since_s: float = 0.0,
    memory_total_bytes: float | None = None,
    utilization_window_s: float = 1.0,
    origin_s: float = 0.0,
    learn_profiles: bool = False,
) -> DeviceScheduler[R]:
    """A device with queues of its own (the usual case)."""
    return DeviceScheduler(
        QueueSet(models, actions.drop, queue, stats_since_s),
        actions,
        device=device,
        memory_total_bytes=memory_total_bytes,
        utilization_window_s=utilization_window_s,
        origin_s=origin_s,
        learn_profiles=learn_profiles,
    )
