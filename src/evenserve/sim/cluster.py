"""A simulated cluster: devices with per-model queues, driven by the shared policy objects.

Theory of operation. Everything happens on one EventLoop with a virtual clock.
- Arrivals come from the workload (Poisson per model, closed-loop users, or a trace). In push
  mode the Router (the same class the live gateway uses) picks a device; the request joins that
  device's queue for its model. In ``central-queue`` mode the request joins one shared queue per
  model and any idle device that hosts the model may take it (work-conserving late binding).
- A device runs one batch at a time per instance (``instances`` in the scenario, default 1).
  Whenever an instance is free and something changed (an arrival, a batch finished, a
  policy's wake-up time came), it asks each hosted model's batching policy; among the models
  that say Dispatch it runs the one whose oldest request is oldest. If none does, it
  schedules a wake-up at the earliest WaitUntil. Batches running at once share the device
  (``core.contention``): each runs slower, and every start or end moves the others' ends.
- Every ``signals.interval_ms`` the devices are sampled (queue depth, in-flight, busy fraction
  over ``utilization_window_ms``, memory) and the samples are fed to the Router, exactly as the
  gateway's poller does.
- A batch's duration is the device profile's latency for its size; it occupies the profile's
  working memory while it runs, on top of the resident weights of every hosted model.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from evenserve.core.contention import DEFAULT_INTERFERENCE, SharedDevice, occupancy
from evenserve.core.profile import LatencyProfile
from evenserve.core.results import DeviceTrace, RequestLog, RunRecords
from evenserve.core.scenario import CENTRAL_QUEUE, ClosedLoop, OpenLoop, Phase, TraceWorkload
from evenserve.core.types import PRIORITY_CLASSES, LoadSample, QueueView, RequestInfo
from evenserve.policy.batching import BATCHING, BatchingPolicy
from evenserve.policy.batching.device import next_batch
from evenserve.policy.batching.queue import RequestQueue
from evenserve.policy.batching.rate import QUEUE_RATE_TAU_S, RateEstimator
from evenserve.policy.registry import spec_label
from evenserve.policy.routing import ROUTING, Router
from evenserve.sim.engine import EventLoop
from evenserve.sim.loader import LoadedScenario
from evenserve.workload import Arrival as TraceEntry
from evenserve.workload import PoissonProcess, read_trace


@dataclass(slots=True)
class SimRequest(RequestInfo):
    idx: int = -1
    user: int = -1


@dataclass(slots=True)
class SimBatch:
    requests: list[SimRequest]
    model: str
    memory_bytes: float
    trace_index: int


class ModelQueue:
    """One model's FIFO queue with its batching policy and exact depth accounting."""

    __slots__ = (
        "area",
        "items",
        "last_change_s",
        "max_depth",
        "model",
        "policy",
        "priority",
        "rate",
        "warmup_s",
    )

    def __init__(
        self, model: str, policy: BatchingPolicy, warmup_s: float, items: RequestQueue[SimRequest]
    ) -> None:
        self.model = model
        self.policy = policy
        self.items = items
        self.rate = RateEstimator(QUEUE_RATE_TAU_S)
        self.priority = 10
        self.area = 0.0
        self.last_change_s = 0.0
        self.max_depth = 0
        self.warmup_s = warmup_s


class SimDevice:
    __slots__ = (
        "area",
        "batch_mem_bytes",
        "busy",
        "busy_acc_s",
        "busy_mark_s",
        "epoch",
        "free_at_s",
        "idle_since_s",
        "in_flight",
        "instances",
        "last_change_s",
        "max_depth",
        "memory_total_bytes",
        "models",
        "name",
        "next_batch_id",
        "next_wake_s",
        "profiles",
        "q_len",
        "queues",
        "runs",
        "shared",
        "trace",
        "util_hist",
        "weights_bytes",
    )

    def __init__(
        self,
        name: str,
        profiles: dict[str, LatencyProfile],
        queues: dict[str, ModelQueue],
        memory_total_bytes: float,
        util_hist_len: int,
        instances: int = 1,
        interference: float = DEFAULT_INTERFERENCE,
    ) -> None:
        self.name = name
        self.models = tuple(sorted(profiles))
        self.profiles = profiles
        self.queues = queues
        self.memory_total_bytes = memory_total_bytes
        self.weights_bytes = sum(p.weights_bytes for p in profiles.values())
        self.instances = instances
        #: True while every instance runs a batch (no batch can start).
        self.busy = False
        self.busy_mark_s = 0.0
        self.busy_acc_s = 0.0
        self.idle_since_s = 0.0
        self.shared = SharedDevice(interference)
        self.runs: dict[int, SimBatch] = {}
        self.next_batch_id = 0
        self.epoch = 0
        #: When the first running batch ends (if nothing changes).
        self.free_at_s = 0.0
        self.in_flight = 0
        self.batch_mem_bytes = 0.0
        self.next_wake_s = math.inf
        self.q_len = 0
        self.area = 0.0
        self.last_change_s = 0.0
        self.max_depth = 0
        self.trace = DeviceTrace(name=name, instances=instances)
        self.util_hist: deque[tuple[float, float]] = deque(maxlen=util_hist_len)

    def busy_cum_s(self, now_s: float) -> float:
        """Busy seconds so far, summed over instances and divided by their number."""
        return self.busy_acc_s + len(self.runs) * (now_s - self.busy_mark_s) / self.instances

    def account_busy(self, now_s: float) -> None:
        """Bank busy time up to ``now_s``; call before the number of running batches changes."""
        self.busy_acc_s = self.busy_cum_s(now_s)
        self.busy_mark_s = now_s

    def wait_s(self, now_s: float) -> float:
        """Seconds until an instance is free (0 when one is free now), if nothing changes."""
        return max(0.0, self.free_at_s - now_s) if self.busy else 0.0

    def memory_used_bytes(self) -> float:
        return self.weights_bytes + self.batch_mem_bytes


class Simulation:
    """One arm of one scenario, run once with one seed."""

    def __init__(self, loaded: LoadedScenario, arm: str, seed: int | None = None) -> None:
        sc = loaded.scenario
        if arm not in sc.arms:
            raise KeyError(f"unknown arm {arm!r} (arms: {', '.join(sc.arms)})")
        self.loaded = loaded
        self.sc = sc
        self.arm_name = arm
        self.arm = sc.arms[arm]
        self.seed = sc.seed if seed is None else seed
        self.loop = EventLoop()
        self.log = RequestLog()
        self.warmup_s = sc.warmup_s
        self.end_s = sc.duration_s
        self.central = self.arm.routing == CENTRAL_QUEUE
        self.max_queue = self.arm.max_queue_per_model
        policy_rng = random.Random(f"{self.seed}:policy")
        self.workload_rng = random.Random(f"{self.seed}:workload")

        sig = sc.signals
        self.signal_interval_s = sig.interval_ms / 1000.0
        hist_len = max(2, round(sig.utilization_window_ms / sig.interval_ms) + 1)

        starvation_s = None if self.arm.starvation_ms is None else self.arm.starvation_ms / 1000.0
        self.starvation_s = starvation_s

        def make_queue(model: str) -> ModelQueue:
            spec = self.arm.batching_per_model.get(model, self.arm.batching)
            items: RequestQueue[SimRequest] = RequestQueue(
                slo_s=sc.models[model].slo_ms / 1000.0,
                max_len=self.max_queue,
                starvation_s=starvation_s,
            )
            q = ModelQueue(model, BATCHING.build(spec, policy_rng), self.warmup_s, items)
            q.priority = sc.models[model].priority
            return q

        self.central_queues: dict[str, ModelQueue] = {}
        if self.central:
            for m in sc.models:
                self.central_queues[m] = make_queue(m)

        self.devices: list[SimDevice] = []
        self.hosts: dict[str, list[SimDevice]] = {m: [] for m in sc.models}
        for spec in sc.expanded_devices():
            profiles = loaded.profiles_for(spec)
            if self.central:
                queues = {m: self.central_queues[m] for m in profiles}
            else:
                queues = {m: make_queue(m) for m in profiles}
            dev = SimDevice(
                spec.name,
                profiles,
                queues,
                spec.memory_gb * 1024.0**3,
                hist_len,
                instances=spec.instances,
                interference=spec.interference,
            )
            self.devices.append(dev)
            for m in profiles:
                self.hosts[m].append(dev)
        self.by_name = {d.name: d for d in self.devices}

        self.router: Router | None = None
        if not self.central:
            self.router = Router(ROUTING.build(self.arm.routing, policy_rng), window=sig.window)
            for d in self.devices:
                self.router.add_backend(
                    d.name,
                    d.models,
                    profiles=d.profiles,
                    max_batch_size={m: d.queues[m].policy.max_batch_size for m in d.models},
                )
        self._slo = {m: spec.slo_ms for m, spec in sc.models.items()}
        self._slo_s = {m: spec.slo_ms / 1000.0 for m, spec in sc.models.items()}
        self._priority = {m: spec.priority for m, spec in sc.models.items()}
        self._deadline_ms = {m: spec.deadline_ms for m, spec in sc.models.items()}
        self._closed: ClosedLoop | None = None
        self._mix_models: list[str] = []
        self._mix_cum: list[float] = []
        self._think_s = 0.0
        self._next_id = 0

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
        idx = self.log.add(model, now, prio)
        self._next_id += 1
        if deadline_ms is None:
            deadline_ms = self._deadline_ms[model]
        return SimRequest(
            request_id=self._next_id,
            model=model,
            arrival_s=now,
            priority=PRIORITY_CLASSES["online"] if self.arm.ignore_priority else prio,
            deadline_s=None if deadline_ms is None else now + deadline_ms / 1000.0,
            idx=idx,
            user=user,
        )

    def _start_open_loop(self, wl: OpenLoop) -> None:
        streams: list[tuple[str, float, int | None, float | None, list[Phase]]] = [
            (m, wl.rates_rps[m], None, None, wl.phases) for m in sorted(wl.rates_rps)
        ]
        for st in wl.streams:
            streams.append(
                (
                    st.model,
                    st.rate_rps,
                    st.priority_value(),
                    st.deadline_ms,
                    wl.phases if st.phases is None else st.phases,
                )
            )
        for i, (m, rate, prio, deadline_ms, phases) in enumerate(streams):
            if rate <= 0:
                continue
            name = m if i < len(wl.rates_rps) else f"{m}:{i}"
            proc = PoissonProcess(rate, phases, random.Random(f"{self.seed}:arrivals:{name}"))
            t = proc.next_after(0.0)
            if t < self.end_s:
                self.loop.at(t, self._open_arrival, (m, proc, prio, deadline_ms))

    def _open_arrival(self, arg: tuple[str, PoissonProcess, int | None, float | None]) -> None:
        m, proc, prio, deadline_ms = arg
        self._arrive(self._new_request(m, deadline_ms=deadline_ms, priority=prio))
        t = proc.next_after(self.loop.now)
        if t < self.end_s:
            self.loop.at(t, self._open_arrival, arg)

    def _start_closed_loop(self, wl: ClosedLoop) -> None:
        self._closed = wl
        total = sum(wl.mix.values())
        acc = 0.0
        for m in sorted(wl.mix):
            if wl.mix[m] > 0:
                acc += wl.mix[m] / total
                self._mix_models.append(m)
                self._mix_cum.append(acc)
        self._mix_cum[-1] = 1.0
        self._think_s = wl.think_ms / 1000.0
        for u in range(wl.users):
            self._schedule_user(u)

    def _schedule_user(self, user: int) -> None:
        rng = self.workload_rng
        think = rng.expovariate(1.0 / self._think_s) if self._think_s > 0 else 0.0
        t = self.loop.now + think
        if t < self.end_s:
            self.loop.at(t, self._user_arrival, user)

    def _user_arrival(self, user: int) -> None:
        x = self.workload_rng.random()
        models, cum = self._mix_models, self._mix_cum
        i = 0
        while cum[i] < x:
            i += 1
        self._arrive(self._new_request(models[i], user=user))

    def _start_trace(self, wl: TraceWorkload) -> None:
        entries = read_trace(self.loaded.resolve(wl.path), list(self.sc.models))
        it = iter([e for e in entries if e.t_s < self.end_s])
        self._trace_next(it)

    def _trace_next(self, it: Iterator[TraceEntry]) -> None:
        e = next(it, None)
        if e is not None:
            self.loop.at(e.t_s, self._trace_arrival, (e, it))

    def _trace_arrival(self, arg: tuple[TraceEntry, Iterator[TraceEntry]]) -> None:
        e, it = arg
        self._arrive(self._new_request(e.model, deadline_ms=e.deadline_ms, priority=e.priority))
        self._trace_next(it)

    # -- requests and devices ---------------------------------------------------------------
    def _drop(self, r: SimRequest, reason: str) -> None:
        self.log.drop_reason[r.idx] = reason
        if r.user >= 0:
            self._schedule_user(r.user)

    def _offer(self, q: ModelQueue, r: SimRequest, d: SimDevice | None) -> int:
        """Admission: enqueue ``r`` or drop it with a reason. Returns the change in queue
        length: 1 admitted, 0 admitted by shedding a lower-class request, -1 refused."""
        now = self.loop.now
        prof = d.profiles[r.model] if d is not None else self.hosts[r.model][0].profiles[r.model]
        busy = d.wait_s(now) if d is not None else 0.0
        offer = q.items.offer(r, now, profile=prof, busy_remaining_s=busy)
        for gone in offer.expired:  # a full queue first lets go of hopeless requests
            if d is None:
                self._drop(gone, "deadline-expired")
            else:
                self._expired(q, d, gone, now)
        if not offer.admitted:
            self._drop(r, offer.reason or "refused")
            return -1
        if offer.evicted is None:
            return 1
        self._drop(offer.evicted, "shed")
        if d is not None and self.router is not None:
            self.router.done(d.name, offer.evicted.model)
        return 0

    def _arrive(self, r: SimRequest) -> None:
        now = self.loop.now
        m = r.model
        if self.central:
            q = self.central_queues[m]
            self._q_account(q, now)
            if self._offer(q, r, None) < 0:
                return
            self._q_peak(q, now)
            q.policy.on_arrival(now)
            q.rate.observe(now)
            idle = [d for d in self.hosts[m] if not d.busy]
            idle.sort(key=lambda d: d.idle_since_s)
            for d in idle:
                if not q.items:
                    break
                self._try_start(d)
            return
        router = self.router
        assert router is not None
        view = router.choose(r, now)
        if view is None:
            self._drop(r, "no-backend")
            return
        dev = self.by_name[view.name]
        q = dev.queues[m]
        router.sent(dev.name, m)
        delta = self._offer(q, r, dev)
        if delta < 0:
            router.done(dev.name, m)
            return
        self._dev_change(dev, now, delta)
        q.policy.on_arrival(now)
        q.rate.observe(now)
        if not dev.busy:
            self._try_start(dev)

    def _q_account(self, q: ModelQueue, now: float) -> None:
        """Time-weighted depth up to ``now``; call before the queue changes."""
        if now > q.warmup_s:
            q.area += len(q.items) * (now - max(q.last_change_s, q.warmup_s))
        q.last_change_s = now

    def _q_peak(self, q: ModelQueue, now: float) -> None:
        if now >= q.warmup_s and len(q.items) > q.max_depth:
            q.max_depth = len(q.items)

    def _dev_change(self, d: SimDevice, now: float, delta: int) -> None:
        w = self.warmup_s
        if now > w:
            d.area += d.q_len * (now - max(d.last_change_s, w))
        d.last_change_s = now
        d.q_len += delta
        if now >= w and d.q_len > d.max_depth:
            d.max_depth = d.q_len

    def _try_start(self, d: SimDevice) -> None:
        if d.busy:
            return
        now = self.loop.now
        free = d.memory_total_bytes - d.memory_used_bytes()
        queues = d.queues
        profiles = d.profiles
        for m in d.models:
            q = queues[m]
            if q.items:
                if self.central:
                    self._q_account(q, now)
                for r in q.items.expire(now, profiles[m]):
                    self._expired(q, d, r, now)
                if self.starvation_s is not None:
                    q.items.promote_starved(now)
        headroom = self.arm.class_headroom
        nb = next_batch(
            (
                (
                    QueueView(
                        m,
                        queues[m].items.items,
                        profiles[m],
                        free,
                        True,
                        self._slo_s[m],
                        queues[m].rate.rate_at(now) if headroom is not None else None,
                        queues[m].priority,
                    ),
                    queues[m].policy,
                )
                for m in d.models
                if queues[m].items or headroom is not None
            ),
            now,
            starvation_s=self.starvation_s,
            class_headroom=headroom,
            rate_tau_s=QUEUE_RATE_TAU_S if headroom is not None else None,
        )
        if nb.model is None:
            wake = nb.wake_s
            if wake < math.inf and (wake < d.next_wake_s or d.next_wake_s <= now):
                d.next_wake_s = wake
                self.loop.at(wake, self._wake, d)
            return
        best_q = queues[nb.model]
        best_n = nb.n
        n = min(best_n, len(best_q.items))
        if self.central:
            self._q_account(best_q, now)
        else:
            self._dev_change(d, now, -n)
        batch = best_q.items.pop(n)
        best_q.policy.on_dispatch(n, now)
        prof = d.profiles[best_q.model]
        dur = prof.latency_s(n)
        mem = prof.batch_memory_bytes(n)
        tr = d.trace
        tr.busy_start_s.append(now)
        tr.busy_end_s.append(now + dur)  # corrected at the end if other batches slow it
        tr.batch_sizes.append(n)
        d.account_busy(now)
        key = d.next_batch_id
        d.next_batch_id += 1
        d.runs[key] = SimBatch(batch, best_q.model, mem, len(tr.batch_sizes) - 1)
        d.batch_mem_bytes += mem
        d.in_flight += n
        if d.instances == 1:  # the common case, kept fast: nothing shares the device
            d.busy = True
            d.epoch += 1
            d.free_at_s = now + dur
            self.loop.at(now + dur, self._finish, (d, d.epoch))
            return
        d.shared.start(key, now, dur, occupancy(prof, n))
        d.busy = len(d.runs) >= d.instances
        self._schedule_end(d)
        if not d.busy:
            self._try_start(d)

    def _schedule_end(self, d: SimDevice) -> None:
        d.epoch += 1
        nxt = d.shared.next_end()
        if nxt is not None:
            d.free_at_s = nxt[1]
            self.loop.at(nxt[1], self._finish, (d, d.epoch))

    def _expired(self, q: ModelQueue, d: SimDevice, r: SimRequest, now: float) -> None:
        self._drop(r, "deadline-expired")
        if not self.central:
            self._dev_change(d, now, -1)
            if self.router is not None:
                self.router.done(d.name, r.model)

    def _wake(self, d: SimDevice) -> None:
        if d.next_wake_s <= self.loop.now:
            d.next_wake_s = math.inf
        self._try_start(d)

    def _finish(self, arg: tuple[SimDevice, int]) -> None:
        d, epoch = arg
        if epoch != d.epoch:
            return  # a batch started or ended since: its end was rescheduled
        now = self.loop.now
        d.account_busy(now)
        if d.instances == 1:
            key, run = d.runs.popitem()
        else:
            nxt = d.shared.next_end()
            assert nxt is not None and isinstance(nxt[0], int)
            key = nxt[0]
            d.shared.finish(key, now)
            run = d.runs.pop(key)
        d.trace.busy_end_s[run.trace_index] = now
        d.busy = False
        d.idle_since_s = now
        d.batch_mem_bytes = max(0.0, d.batch_mem_bytes - run.memory_bytes) if d.runs else 0.0
        d.in_flight -= len(run.requests)
        log_finish = self.log.finish_s
        log_dev = self.log.device
        router = self.router
        name = d.name
        for r in run.requests:
            log_finish[r.idx] = now
            log_dev[r.idx] = name
            if router is not None:
                router.done(name, r.model)
            if r.user >= 0:
                self._schedule_user(r.user)
        if d.instances > 1:
            self._schedule_end(d)
        self._try_start(d)

    # -- signals ----------------------------------------------------------------------------
    def _sample(self, _: object) -> None:
        now = self.loop.now
        router = self.router
        for d in self.devices:
            cum = d.busy_cum_s(now)
            d.util_hist.append((now, cum))
            t0, c0 = d.util_hist[0]
            util = (cum - c0) / (now - t0) if now > t0 else (1.0 if d.runs else 0.0)
            depth = float(d.q_len)
            d.trace.queue_t_s.append(now)
            d.trace.queue_depth.append(depth)
            if router is not None:
                router.observe(
                    d.name,
                    LoadSample(
                        timestamp_s=now,
                        queue_depth=depth,
                        in_flight=float(d.in_flight),
                        utilization=min(1.0, max(0.0, util)),
                        memory_used_bytes=d.memory_used_bytes(),
                        memory_total_bytes=d.memory_total_bytes,
                        queued_by_model={m: float(len(d.queues[m].items)) for m in d.models},
                        busy_remaining_s=d.wait_s(now),
                    ),
                )
        nxt = now + self.signal_interval_s
        if nxt <= self.end_s:
            self.loop.at(nxt, self._sample, None)

    # -- run --------------------------------------------------------------------------------
    def run(self) -> RunRecords:
        self.loop.at(0.0, self._sample, None)
        wl = self.sc.workload
        if isinstance(wl, OpenLoop):
            self._start_open_loop(wl)
        elif isinstance(wl, ClosedLoop):
            self._start_closed_loop(wl)
        else:
            self._start_trace(wl)
        self.loop.run(self.end_s)
        end = self.end_s
        w = self.warmup_s
        window = end - w
        for d in self.devices:
            self._dev_change(d, end, 0)
            d.trace.exact_mean_queue_depth = d.area / window if not self.central else 0.0
            d.trace.exact_max_queue_depth = float(d.max_depth) if not self.central else 0.0
        central_max = central_mean = None
        if self.central:
            for q in self.central_queues.values():
                self._q_account(q, end)
            central_max = float(max(q.max_depth for q in self.central_queues.values()))
            central_mean = sum(q.area for q in self.central_queues.values()) / window
        arm = self.arm
        batching = spec_label(arm.batching)
        if arm.batching_per_model:
            batching += "; " + "; ".join(
                f"{m}: {spec_label(s)}" for m, s in sorted(arm.batching_per_model.items())
            )
        return RunRecords(
            scenario=self.sc.name,
            arm=self.arm_name,
            routing=spec_label(arm.routing),
            batching=batching,
            seed=self.seed,
            warmup_s=w,
            end_s=end,
            slo_ms=dict(self._slo),
            requests=self.log,
            devices=[d.trace for d in self.devices],
            timeseries_interval_s=self.sc.timeseries_interval_s,
            central_max_queue_depth=central_max,
            central_mean_queue_depth=central_mean,
        )


def simulate(loaded: LoadedScenario, arm: str, seed: int | None = None) -> RunRecords:
    return Simulation(loaded, arm, seed).run()


def arm_names(loaded: LoadedScenario) -> Sequence[str]:
    return list(loaded.scenario.arms)
