"""A simulated cluster: each device a DeviceScheduler (sched), driven from one event heap.

Theory of operation. Everything happens on one EventLoop with a virtual clock.
- Arrivals come from the workload (Poisson per model, closed-loop users, or a trace). The
  Router (the same class the live gateway uses) picks a device, and the request is offered to
  that device's scheduler, the very object the live worker drives. The ``central-queue``
  reference arm instead puts every request in one shared queue per model (sim.central).
- A device is a thin driver (SimDevice): it carries out the scheduler's actions on the event
  heap (a batch start is recorded, a wake-up or a batch end becomes an event, a dropped
  request is logged) and hands the events back (``wake``, ``finished``).
- Every ``signals.interval_ms`` each device's load snapshot is fed to the Router, exactly as
  the gateway's poller feeds it the workers' load reports.
- The Router hears each send and each answer with the virtual time (``sent``/``done``, as
  the gateway's dispatcher calls them), so it learns each device's speed the same way.
- An arm with ``placement`` loads and unloads models and turns devices on and off
  (sim.placement; the controller is policy.placement.controller). Without it every device
  of the arm hosts its models the whole run, on from start to end.
- Arrivals are routed by the front (sim.front): the gateway's front-door rules
  (policy.routing.dispatch) over each gateway's Router. An arm with ``gateways: N`` > 1
  runs N Routers (design 0013), each with its own sends and its own reports (gateway g
  hears the devices at its own phase, ``gateway_offsets_ms``, default g * interval / N);
  arrivals split across them as an L4 balancer does. Each router assumes
  ``gateway_replicas`` gateways (default N; 1: the naive router).
- An arm with ``overload_refusals`` drops a request as ``overloaded`` when the Router's
  refusal rule holds (every host full or predicted late past the SLO), as the gateway with
  ``overload.enabled`` answers 429; off by default, as the live bench's gateway is. A
  device that refuses a request at once (queue full, draining) has it tried on another, up
  to ``retries`` more, as the gateway retries (``forward.retries``).
"""

from __future__ import annotations

import gc
import math
import random
from array import array
from collections.abc import Callable, Iterator, MutableSequence
from contextlib import contextmanager
from heapq import heapify, heappop, heappush, heapreplace
from typing import TYPE_CHECKING, Any, cast

from evenserve.core.profile import LatencyProfile
from evenserve.core.results import RequestLog, RunRecords
from evenserve.core.scenario import (
    CENTRAL_QUEUE,
    ClosedLoop,
    DeviceSpec,
    OpenLoop,
    TraceWorkload,
)
from evenserve.core.wire import LOAD_TIMEOUT, NO_BACKEND
from evenserve.policy.batching import BATCHING
from evenserve.policy.registry import batching_label, spec_label
from evenserve.policy.routing import ROUTING, Router
from evenserve.sched import (
    QUEUED,
    Batch,
    Batching,
    DeviceScheduler,
    ModelSetup,
    batching_setup,
    scheduler_for,
)
from evenserve.sim.central import CentralQueue
from evenserve.sim.device import SimDevice, SimRequest
from evenserve.sim.engine import EventLoop
from evenserve.sim.front import SimFront
from evenserve.sim.loader import LoadedScenario
from evenserve.workload import (
    Arrival,
    ClosedLoopUsers,
    PoissonProcess,
    open_loop_streams,
    read_trace,
)

if TYPE_CHECKING:  # imported when an arm has placement (``_build_devices``)
    from evenserve.sim.placement import PlacementClock, SimPlacement

NAN = math.nan
_log = math.log


def doubles_view(col: MutableSequence[float]) -> memoryview[float]:
    """A writable view of a typed array of doubles (``array('d')``): a store through it
    converts the float itself, where the array's own store parses it as an argument (about
    2.5x the cost). The array cannot grow or shrink until the view is released. Worth it
    for columns written on every request (the request log's), whose views stay in cache:
    a view per device column (the traces', written once per batch on one device of many)
    cost more in cache misses than it saved."""
    view = memoryview(col)  # type: ignore[arg-type]
    return cast("memoryview[float]", view)


GIB = 1024.0**3
#: An open-loop stream as ``Simulation._open_arrival_routed`` reads it: its model, process,
#: class, relative deadline (seconds, or None), for a constant rate its generator's
#: ``random`` (else None) and its rate.
_Stream = tuple[str, PoissonProcess, int, float | None, Callable[[], float] | None, float]
#: Requests the log's preallocated columns grow by at first (``Simulation._grow_log``; then
#: by what they hold: doubling, so a growth that copies them copies each entry about once).
LOG_CHUNK = 4096


class Simulation:
    """One arm of one scenario, run once with one seed."""

    def __init__(
        self,
        loaded: LoadedScenario,
        arm: str,
        seed: int | None = None,
        placement_clock: PlacementClock | None = None,
    ) -> None:
        sc = loaded.scenario
        if arm not in sc.arms:
            raise KeyError(f"unknown arm {arm!r} (arms: {', '.join(sc.arms)})")
        self.loaded = loaded
        self.sc = sc
        self.arm_name = arm
        self.arm = self.spec = sc.arms[arm]
        self.seed = sc.seed if seed is None else seed
        self.loop = EventLoop()
        # Times as doubles: no float object kept per request (the log of a million).
        arrival_s, finish_s = array("d"), array("d")
        self.log = RequestLog(arrival_s=arrival_s, finish_s=finish_s)
        #: Writable views of those two columns, which the run writes through
        #: (``doubles_view``); ``_grow_log`` renews them (an array cannot grow while a view
        #: of it exists), ``run`` lets them go at its end.
        self._arrival_w = doubles_view(arrival_s)
        self._finish_w = doubles_view(finish_s)
        #: Requests the log's preallocated columns have room for (``_grow_log``).
        self._log_room = 0
        self.warmup_s = sc.warmup_s
        self.end_s = sc.duration_s
        #: What an answer costs on its way back (the scenario's request_overhead_ms): the
        #: request's latency, and a closed-loop user's next think, count from then.
        self.overhead_s = sc.request_overhead_ms / 1000.0
        self.policy_rng = random.Random(f"{self.seed}:policy")
        sig = sc.signals
        self.signal_interval_s = sig.interval_ms / 1000.0
        self.utilization_window_s = sig.utilization_window_ms / 1000.0
        self.starvation_s = self.arm.starvation_s
        self.refusals = self.arm.overload_refusals
        self._priority = {m: spec.priority_value for m, spec in sc.models.items()}
        self._deadline_s = {m: spec.deadline_s for m, spec in sc.models.items()}
        self.devices: list[SimDevice] = []
        self.hosts: dict[str, list[SimDevice]] = {m: [] for m in sc.models}
        self.router: Router | None = None
        #: Every gateway's router (``router`` is the first); with several, which gateway
        #: routed each request in flight (by log index).
        self.routers: list[Router] = []
        #: The front door (``sim.front``): the routers under the gateway's rules.
        self.front: SimFront | None = None
        self._slo = {m: spec.slo_ms for m, spec in sc.models.items()}
        self._users: ClosedLoopUsers | None = None
        #: One bound method for every open-loop arrival event (``_open_arrival``, or
        #: ``_open_arrival_routed``, which takes its arrivals from ``_streams``).
        self._open_arrival_cb: Callable[[Any], None] = self._open_arrival
        #: ``_open_arrival_routed``'s streams: each one's next arrival (time, the sequence
        #: number ``EventLoop.at`` would have given it, the stream), a heap.
        self._streams: list[tuple[float, int, _Stream]] = []
        #: Per device, its scheduler's ``offer`` (``_open_arrival_routed``'s first try).
        self._offers: dict[str, Callable[[SimRequest, float], str | None]] = {}
        self.central: CentralQueue | None = None
        self.placement: SimPlacement | None = None
        #: A live run's controller clock to replay (``sim.placement.PlacementClock``).
        self._placement_clock = placement_clock
        if self.arm.routing == CENTRAL_QUEUE:
            self.central = CentralQueue(self)
            self._arrive = self.central.arrive
        else:
            self._build_devices()
            if self.placement is not None:
                self._arrive = self.placement.arrive
            else:
                self._arrive = self._routed_arrival
                if len(self.routers) == 1:
                    self._open_arrival_cb = self._open_arrival_routed
                    # Each device scheduler's ``offer``, for its first try (a plain arm
                    # keeps its schedulers the whole run).
                    self._offers = {d.name: d.sched.offer for d in self.devices}

    def batching(self, model: str, rng: random.Random | None = None) -> Batching:
        """``model``'s batching in this arm under the batch-cap rule the worker applies
        (``sched.setup``: the scenario model's ``max_batch_size`` filled in, a larger batch
        refused)."""
        per_model = self.arm.batching_per_model
        where = f"arms.{self.arm_name}.batching" + (
            f"_per_model.{model}" if model in per_model else ""
        )
        spec = per_model.get(model, self.arm.batching)
        return batching_setup(spec, self.sc.models[model].max_batch_size, where, rng)

    def model_setup(self, model: str, profile: LatencyProfile | None) -> ModelSetup:
        """How ``model`` is queued on a device with ``profile`` (its own policy object)."""
        spec = self.sc.models[model]
        return ModelSetup(
            name=model,
            policy=self.batching(model, self.policy_rng).policy,
            profile=profile,
            max_batch_size=spec.max_batch_size,
            max_queue=self.arm.max_queue_per_model,
            priority=spec.priority_value,
            deadline_s=spec.deadline_s,
            slo_s=spec.slo_s,
        )

    def add_device(self, name: str, profiles: dict[str, LatencyProfile]) -> SimDevice:
        d = SimDevice(self, name, profiles)
        self.devices.append(d)
        for m in d.models:
            self.hosts[m].append(d)
        return d

    def new_scheduler(
        self, d: SimDevice, spec: DeviceSpec, models: tuple[str, ...] | list[str]
    ) -> DeviceScheduler[SimRequest]:
        """A scheduler for device ``d`` hosting ``models`` (its own queues), running at the
        device's slowdown now."""
        sched = scheduler_for(
            [self.model_setup(m, d.profiles[m]) for m in models],
            d,
            spec,  # a scenario device has the DeviceOptions, an arm the QueueOptions
            self.arm,
            stats_since_s=self.warmup_s,
            memory_total_bytes=spec.memory_total_bytes,
            utilization_window_s=self.utilization_window_s,
            learn_profiles=self.arm.learn_profiles,
        )
        sched.slots.slowdown = spec.slowdown_at(self.loop.now)
        sched.slots.staging_s_per_item = spec.staging_ms_per_item / 1000.0
        return sched

    def _slowdown_edge(self, arg: tuple[SimDevice, DeviceSpec]) -> None:
        """A slowdown phase of a device starts or ends: batches started from now on run at
        the new speed (a running batch keeps its end)."""
        d, spec = arg
        d.sched.slots.slowdown = spec.slowdown_at(self.loop.now)

    def _build_devices(self) -> None:
        sc, arm = self.sc, self.arm
        placed = arm.placement is not None
        built: list[tuple[SimDevice, DeviceSpec]] = []
        for spec in sc.arm_devices(self.arm_name):
            if not placed and not spec.active:
                continue  # spares are placement's
            if placed:  # any model may be loaded here; it starts with its own
                profiles = {m: self.loaded.profile_of(spec, m) for m in sc.models}
                d = SimDevice(self, spec.name, profiles)
                d.models = tuple(sorted(spec.models))
                self.devices.append(d)
                for m in d.models:
                    self.hosts[m].append(d)
            else:
                d = self.add_device(spec.name, self.loaded.profiles_for(spec))
            d.trace.instances = spec.instances
            d.sched = self.new_scheduler(d, spec, d.models)
            for ph in spec.slowdown_phases:
                for t in (ph.start_s, ph.end_s):
                    self.loop.at(t, self._slowdown_edge, (d, spec))
            built.append((d, spec))
        self.by_name = {d.name: d for d in self.devices}
        replicas = arm.gateway_replicas or arm.gateways
        for g in range(arm.gateways):
            rng = self.policy_rng if g == 0 else random.Random(f"{self.seed}:policy:{g}")
            router = Router(
                ROUTING.build(arm.routing, rng),
                window=sc.signals.window,
                replicas=replicas,
                peer_weight=arm.gateway_peer_weight,
            )
            for d in self.devices:
                router.add_backend(
                    d.name,
                    d.models,
                    profiles=d.profiles if not placed else {m: d.profiles[m] for m in d.models},
                    max_batch_size=d.sched.max_batch_size,
                )
            self.routers.append(router)
        self.router = self.routers[0]
        pl = None
        if placed:
            from evenserve.sim.placement import SimPlacement  # only arms with placement

            pl = self.placement = SimPlacement(self, built, self._placement_clock)
        self.front = SimFront(
            self.routers,
            retries=arm.retries,
            refusals=self.refusals,
            models=sc.models,
            offer=self._offer if pl is None else pl.offer,
            drop=self.drop,
            done=None if pl is None else pl.done_one,
        )

    # -- workload ---------------------------------------------------------------------------
    def _new_request(
        self,
        model: str,
        user: int = -1,
        deadline_ms: float | None = None,
        priority: int | None = None,
    ) -> SimRequest:
        now = self.loop.now
        prio = self._priority[model] if priority is None else priority
        if deadline_ms is None:
            rel = self._deadline_s[model]
            deadline_s = None if rel is None else now + rel
        else:
            deadline_s = now + deadline_ms / 1000.0
        log = self.log  # RequestLog.add, inlined (see _grow_log)
        idx = len(log.model)
        log.model.append(model)
        log.priority.append(prio)
        if idx >= self._log_room:
            self._grow_log()
        self._arrival_w[idx] = now
        # Positional, as SimRequest lists its fields (a million per benchmark run); the id is
        # the log index + 1.
        return SimRequest(idx + 1, model, now, prio, deadline_s, 1, QUEUED, idx, user)

    def _grow_log(self) -> None:
        """Room in the log's preallocated columns (arrival, and finish, device, drop reason
        filled as unfinished) for as many requests again as they hold (LOG_CHUNK at first):
        one length check per request instead of four appends, and a growth that copies a
        column copies each entry about once. ``run`` trims them to the requests that
        arrived."""
        log = self.log
        k = self._log_room if self._log_room > LOG_CHUNK else LOG_CHUNK
        self._arrival_w.release()
        self._finish_w.release()
        log.arrival_s.extend(array("d", [NAN]) * k)
        log.finish_s.extend(array("d", [NAN]) * k)
        self._arrival_w = doubles_view(log.arrival_s)
        self._finish_w = doubles_view(log.finish_s)
        log.device.extend([""] * k)
        log.drop_reason.extend([None] * k)
        self._log_room += k

    def _start_open_loop(self, wl: OpenLoop) -> None:
        routed = self._open_arrival_cb == self._open_arrival_routed
        loop = self.loop
        for st in open_loop_streams(wl):
            proc = st.process(self.seed)
            t = proc.next_after(0.0)
            if t < self.end_s:
                if routed:
                    # Its class and relative deadline (seconds), resolved once, and its
                    # draw; held off the heap under the sequence number ``loop.at`` would
                    # have given it (``_open_arrival_routed``).
                    m = st.model
                    stream: _Stream = (
                        m,
                        proc,
                        self._priority[m] if st.priority is None else st.priority,
                        self._deadline_s[m] if st.deadline_ms is None else st.deadline_ms / 1000.0,
                        proc.rng.random if not proc.phases and proc.base_rps > 0 else None,
                        proc.base_rps,
                    )
                    self._streams.append((t, next(loop.count), stream))
                else:
                    loop.at(t, self._open_arrival_cb, (st.model, proc, st.priority, st.deadline_ms))
        if self._streams:
            heapify(self._streams)
            t, seq, _ = self._streams[0]
            heappush(loop.heap, (t, seq, self._open_arrival_cb, None))

    def _open_arrival(self, arg: tuple[str, PoissonProcess, int | None, float | None]) -> None:
        m, proc, prio, deadline_ms = arg
        self._arrive(self._new_request(m, -1, deadline_ms, prio))
        t = proc.next_after(self.loop.now)
        if t < self.end_s:
            self.loop.at(t, self._open_arrival_cb, arg)

    def _open_arrival_routed(self, _: object) -> None:
        """The open-loop arrivals of an arm with one router and no placement (the
        benchmark's per-request path): ``_open_arrival`` with ``_new_request`` and
        ``_routed_arrival`` inlined (and, with the overload rule off, ``SimFront.route``:
        the router's pick, ``sent``, the device's ``offer``, the front's retries only on a
        refusal).

        Each stream's next arrival is held off the event heap, in ``_streams`` (a heap of
        (time, sequence number, stream), the number ``EventLoop.at`` would have given it);
        the event heap holds one event for the earliest of them, under its time and number.
        This handles that arrival and then, while the earliest one held still comes before
        every event on the heap (by time, then number: the heap's own order), the next one
        too, without a trip through the heap: the same events in the same order. A
        ``_Stream`` carries its model, its class and relative deadline in seconds, resolved,
        its process, and for a constant rate its generator's ``random`` and the rate: the
        next arrival is then ``PoissonProcess.next_after`` inlined (``Random.expovariate``'s
        formula, the same float)."""
        loop = self.loop
        heap = loop.heap
        count = loop.count
        streams = self._streams
        log = self.log
        model_col = log.model
        prio_col = log.priority
        front = self.front
        assert front is not None
        router = self.router
        assert router is not None
        offers = self._offers
        end_s = self.end_s
        refusals = self.refusals
        arrival_w = self._arrival_w
        queued = QUEUED
        log_ = _log
        new = object.__new__
        now, _, stream = streams[0]
        while True:
            m, proc, prio, rel_s, draw, rate = stream
            idx = len(model_col)
            model_col.append(m)
            prio_col.append(prio)
            if idx >= self._log_room:
                self._grow_log()
                arrival_w = self._arrival_w
            arrival_w[idx] = now
            # SimRequest(idx + 1, m, now, prio, deadline, 1, QUEUED, idx, -1) without its
            # __init__'s frame: every field set here (a test holds this to the dataclass's
            # fields), for a million requests a run.
            r = new(SimRequest)
            r.request_id = idx + 1
            r.model = m
            r.arrival_s = now
            r.priority = prio
            r.deadline_s = None if rel_s is None else now + rel_s
            r.items = 1
            r.state = queued
            r.idx = idx
            r.user = -1
            if refusals:
                front.route(r, 0, now)
            else:  # SimFront.route without the overload rule, inlined: its first try
                view = router.choose(r, now)
                if view is None:
                    self.drop(r, NO_BACKEND, None)
                else:
                    name = view.name
                    router.sent(name, m, now)
                    reason = offers[name](r, now)
                    if reason is not None:
                        front.refused(r, 0, name, reason, now)
            # This stream's next arrival (``loop.at`` clamps a time before now to now).
            if draw is None:
                t = proc.next_after(now)
                if t < now:
                    t = now
            else:
                t = now - log_(1.0 - draw()) / rate
            if t < end_s:
                heapreplace(streams, (t, next(count), stream))
            else:
                heappop(streams)
                if not streams:
                    return
            now, seq, stream = streams[0]
            if heap:
                first = heap[0]
                if now > first[0] or (now == first[0] and seq > first[1]):
                    heappush(heap, (now, seq, self._open_arrival_cb, None))
                    return
            loop.now = now

    def _start_closed_loop(self, wl: ClosedLoop) -> None:
        self._users = ClosedLoopUsers.for_workload(wl, self.seed)
        for u in range(wl.users):
            self._schedule_user(u)

    def _schedule_user(self, user: int, answered_s: float = 0.0) -> None:
        assert self._users is not None
        t = self.loop.now + answered_s + self._users.think_s()
        if t < self.end_s:
            self.loop.at(t, self._user_arrival, user)

    def _user_arrival(self, user: int) -> None:
        assert self._users is not None
        self._arrive(self._new_request(self._users.draw_model(), user))

    def _start_trace(self, wl: TraceWorkload) -> None:
        entries = read_trace(self.loaded.resolve(wl.path), list(self.sc.models))
        self._trace_next(iter([e for e in entries if e.t_s < self.end_s]))

    def _trace_next(self, it: Iterator[Arrival]) -> None:
        e = next(it, None)
        if e is not None:
            self.loop.at(e.t_s, self._trace_arrival, (e, it))

    def _trace_arrival(self, arg: tuple[Arrival, Iterator[Arrival]]) -> None:
        e, it = arg
        self._arrive(self._new_request(e.model, -1, e.deadline_ms, e.priority))
        self._trace_next(it)

    # -- requests and devices ---------------------------------------------------------------
    def drop(self, r: SimRequest, reason: str, device: str | None) -> None:
        """``r`` will not run (refused, shed, expired): log it, and a closed-loop user
        thinks again; the router hears that a request sent to ``device`` is done."""
        self.log.drop_reason[r.idx] = reason
        if len(self.routers) > 1:
            assert self.front is not None
            g = self.front.gateway_of.pop(r.idx, None)
            if device is not None and g is not None:
                self.routers[g].done(device, r.model)
        elif device is not None and self.router is not None:
            self.router.done(device, r.model)
            if self.placement is not None:
                if reason == LOAD_TIMEOUT:
                    self.log.load_wait_s[r.idx] = self.loop.now - r.arrival_s
                self.placement.done(r.model, device, 1)
        if r.user >= 0:
            self._schedule_user(r.user)

    def completed(self, batch: Batch[SimRequest], now: float, device: str) -> None:
        log_finish = self._finish_w
        log_dev = self.log.device
        answered = now + self.overhead_s
        if self._users is None:  # no closed-loop users: nobody thinks again
            for r in batch.requests:
                log_finish[r.idx] = answered
                log_dev[r.idx] = device
        else:
            for r in batch.requests:
                log_finish[r.idx] = answered
                log_dev[r.idx] = device
                if r.user >= 0:
                    self._schedule_user(r.user, self.overhead_s)
        if len(self.routers) > 1:
            per: dict[int, int] = {}
            assert self.front is not None
            gw = self.front.gateway_of
            for r in batch.requests:
                g = gw.pop(r.idx)
                per[g] = per.get(g, 0) + 1
            for g, k in sorted(per.items()):
                self.routers[g].done(device, batch.model, k, now)
        elif self.router is not None:
            self.router.done(device, batch.model, len(batch.requests), now)
            if self.placement is not None:
                self.placement.done(batch.model, device, len(batch.requests))

    def _offer(self, name: str, r: SimRequest, now: float) -> str | None:
        """The front's try of ``r`` on device ``name``: its scheduler takes it or refuses."""
        return self.by_name[name].sched.offer(r, now)

    def _routed_arrival(self, r: SimRequest) -> None:
        front = self.front
        assert front is not None
        front.arrive(r, self.loop.now)

    # -- signals ----------------------------------------------------------------------------
    def gateway_offsets_s(self) -> list[float]:
        """When each gateway hears its first load report (then one every interval)."""
        arm, n = self.arm, self.arm.gateways
        if arm.gateway_offsets_ms is not None:
            return [o / 1000.0 for o in arm.gateway_offsets_ms]
        return [g * self.signal_interval_s / n for g in range(n)]

    def _gateway_sample(self, g: int) -> None:
        """Gateway ``g``'s load reports (several gateways, at its own phase)."""
        now = self.loop.now
        router = self.routers[g]
        for d in self.devices:
            router.observe(d.name, d.sched.snapshot(now))
        nxt = now + self.signal_interval_s
        if nxt <= self.end_s:
            self.loop.at(nxt, self._gateway_sample, g)

    def _sample(self, _: object) -> None:
        now = self.loop.now
        router = self.router if len(self.routers) <= 1 else None  # several: _gateway_sample
        for d in self.devices:
            s = d.sched.snapshot(now)
            d.trace.queue_t_s.append(now)
            d.trace.queue_depth.append(s.queue_depth if self.central is None else 0.0)
            if router is not None:
                router.observe(d.name, s)
        nxt = now + self.signal_interval_s
        if nxt <= self.end_s:
            self.loop.at(nxt, self._sample, None)

    # -- run --------------------------------------------------------------------------------
    def run(self) -> RunRecords:
        self.loop.at(0.0, self._sample, None)
        if len(self.routers) > 1:
            # The devices' own sampling (their traces) stays at 0; each gateway hears them
            # at its own phase.
            for g, off in enumerate(self.gateway_offsets_s()):
                self.loop.at(off, self._gateway_sample, g)
        if self.placement is not None:
            self.loop.at(self.placement.first_tick_s, self.placement.tick, None)
        wl = self.sc.workload
        if isinstance(wl, OpenLoop):
            self._start_open_loop(wl)
        elif isinstance(wl, ClosedLoop):
            self._start_closed_loop(wl)
        else:
            self._start_trace(wl)
        with setup_out_of_collectors_sight():
            self.loop.run(self.end_s)
        log = self.log
        n = len(log.model)
        self._arrival_w.release()
        self._finish_w.release()
        del log.arrival_s[n:], log.finish_s[n:], log.device[n:], log.drop_reason[n:]
        self._log_room = n
        end = self.end_s
        central_max = central_mean = None
        if self.central is not None:
            central_max, central_mean = self.central.depth(end)
        else:
            for d in self.devices:
                d.trace.exact_mean_queue_depth = d.sched.queues.mean_depth(end)
                d.trace.exact_max_queue_depth = float(d.sched.queues.depth_max)
        pl = self.placement
        for d in self.devices:
            d.trim_trace()
            d.trace.active_s = end if pl is None else pl.active_s(d.name, end)
            d.trace.models = list(d.models)
            d.trace.profiles = {
                m: (list(p.batches), list(p.latency_ms)) for m, p in sorted(d.profiles.items())
            }
        counts = None if pl is None else pl.controller.counts
        arm = self.arm
        return RunRecords(
            scenario=self.sc.name,
            arm=self.arm_name,
            routing=spec_label(arm.routing),
            batching=batching_label(arm.batching, arm.batching_per_model),
            seed=self.seed,
            warmup_s=self.warmup_s,
            end_s=end,
            slo_ms=dict(self._slo),
            requests=self.log,
            devices=[d.trace for d in self.devices],
            timeseries_interval_s=self.sc.timeseries_interval_s,
            central_max_queue_depth=central_max,
            central_mean_queue_depth=central_mean,
            device_seconds=sum(d.trace.active_s or 0.0 for d in self.devices),
            loads=0 if counts is None else counts.loads,
            warm_loads=0 if counts is None else counts.warm_loads,
            evictions=0 if counts is None else counts.evictions,
            load_bound_s={}
            if self.placement is None
            else {
                m: i.cold_load_s + 2 * i.batch_s
                for m, i in self.placement.controller.models.items()
            },
            routing_spec=dict(ROUTING.resolved(arm.routing, "routing"))
            if arm.routing != CENTRAL_QUEUE
            else {"policy": CENTRAL_QUEUE},
            batching_spec={
                m: BATCHING.resolved(self.batching(m).spec, "batching")
                for m in sorted(self.sc.models)
            },
            scale_ups_s=[] if pl is None else list(pl.scale_ups_s),
            scale_up_decisions_s=[] if pl is None else list(pl.scale_up_decisions_s),
            placement_decisions=[]
            if pl is None
            else [
                (d.t_s, d.source, d.kind, d.model, d.device, d.rate_rps, d.utilization)
                for d in pl.controller.counts.decisions
            ],
        )


@contextmanager
def setup_out_of_collectors_sight() -> Iterator[None]:
    """While the event loop runs: what was there before it (the scenario, profiles, routers,
    schedulers, the request log's and the traces' columns, which grow to millions of
    entries) is frozen out of the cyclic collector's sight (``gc.freeze``), so its
    collections walk only what the run made since; thawed after. The collector only frees
    cycles nobody reads, so the decisions are the same either way. A process that froze
    objects of its own is left as it is."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def simulate(
    loaded: LoadedScenario,
    arm: str,
    seed: int | None = None,
    placement_clock: PlacementClock | None = None,
) -> RunRecords:
    return Simulation(loaded, arm, seed, placement_clock).run()
