"""Simulating LLMs in the pools (``sim.llm_placement_scenario``): an LLM engine and classic
models placed on a pool of devices by a placement policy and an autoscaler, by demand.

What runs. Each device is the device scheduler the worker drives (engine steps, KV blocks,
classic batches interleaved with the steps; a token visible at its step's end plus the step
profile's CPU per output token). Over them one ``PlacementController`` (the one the gateway
drives live) with the arm's policy, autoscaler and anti-thrash window. The LLM is a model to
placement like the others (``ModelInfo.for_engine``): on a device it holds its weights and its
KV cache (``kv_tokens``), in host memory its weights (asleep); a load of it is a wake
(``warm_load_ms``) when the warm pool holds it, else a load from disk (``cold_load_ms``).

Routing: a request goes to the device with the fewest of its model's requests outstanding
among those where the model is READY (and the device on, not starting or stopping); none: the
controller's ``route_miss`` (the device loading it, or where the policy loads it; None: refused
as ``no-backend``, the gateway's 503). A request sent to a device where its model is still
loading waits there (parked here) until the load is done, then is offered to the scheduler.

Loads and unloads: a Load takes the controller's ``load_seconds`` (warm or cold); the model
joins the device's scheduler when it is done (an engine with its ``kv_tokens`` of blocks). An
Unload leaves the scheduler at once (the controller only unloads a model with nothing
outstanding) and its memory after ``unload_ms``. An Unload asked while the model loads happens
once it is loaded. ScaleUp: the device counts from then and takes work after its
``start_ms``; ScaleDown: nothing new goes there, it is off once its work and its loads are
done (its residents leave it, warm).

Arrivals stop at ``duration_s``; the run goes on until everything is answered (at most
``drain_s`` more; an LLM request not answered by then is ``unfinished``). Device-seconds
count over ``[0, duration_s)``; SLO attainment over the requests scheduled in ``[warmup_s,
duration_s)``: a classic request within its stream's SLO, an LLM request within its TTFT and
TPOT targets (``GenerationRecord.met_targets``).
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from evenserve.core.errors import ConfigError
from evenserve.core.llm import GenerationRecord, StepProfile, load_step_profiles, mark_unfinished
from evenserve.core.profile import LatencyProfile, load_profile_set
from evenserve.core.scenario import default_load_times_s
from evenserve.core.wire import NO_BACKEND
from evenserve.policy.batching import BATCHING
from evenserve.policy.placement import (
    AUTOSCALING,
    PLACEMENT,
    READY,
    Action,
    DeviceView,
    Load,
    ModelInfo,
    ScaleAction,
    ScaleDown,
    ScaleUp,
    Unload,
)
from evenserve.policy.placement.controller import PlacementController, PlacementCounts
from evenserve.policy.placement.engine import (
    UtilizationMeter,
    engine_blocks,
    engine_info,
    engine_utilization,
)
from evenserve.sched import Batch, DeviceScheduler, ModelSetup, scheduler_for
from evenserve.sched.engine import EngineSetup, GenSpec
from evenserve.sim.engine import EventLoop
from evenserve.sim.llm import LlmSimRequest, engine_setup
from evenserve.sim.llm_placement_scenario import ClassicStream, LlmPlacementScenario
from evenserve.sim.placement import PlacementClock
from evenserve.workload.llm import LlmRequest, iter_llm_open_loop
from evenserve.workload.poisson import PoissonProcess
from evenserve.workload.seeding import arrivals_rng

GIB = 1024.0**3


@dataclass(slots=True, eq=False)
class PoolRequest(LlmSimRequest):
    """A request in the pool: its stream (a classic stream's name, or the LLM's model), the
    device it was sent to, its SLO (classic) and what it generates (LLM)."""

    stream: str = ""
    device: str = ""
    slo_s: float | None = None
    spec: GenSpec | None = None


@dataclass(frozen=True, slots=True)
class LoadEvent:
    model: str
    device: str
    start_s: float
    done_s: float
    warm: bool


@dataclass(frozen=True, slots=True)
class LlmMiss:
    """A request for the LLM that found no engine READY and made the policy place one."""

    request_id: int
    at_s: float
    device: str


@dataclass
class PlacementRun:
    """What one arm's run saw."""

    arm: str
    duration_s: float
    records: list[GenerationRecord] = field(default_factory=list)
    classic: list[PoolRequest] = field(default_factory=list)
    #: Each device's on intervals (start, end; end None: on at the end).
    on: dict[str, list[list[float | None]]] = field(default_factory=dict)
    loads: list[LoadEvent] = field(default_factory=list)
    misses: list[LlmMiss] = field(default_factory=list)
    counts: PlacementCounts = field(default_factory=PlacementCounts)
    #: (time, devices on) at every change.
    active: list[tuple[float, int]] = field(default_factory=list)
    end_s: float = 0.0
    #: The LLM's step profile and warm / cold load seconds (for the burst figures).
    step_profile: StepProfile | None = None
    wake_s: float = 0.0
    cold_s: float = 0.0
    #: The engine's step token budget (``max_num_batched_tokens``).
    budget_tokens: int = 0
    #: Each LLM request's first step (start, end), by request id.
    first_steps: dict[int, tuple[float, float]] = field(default_factory=dict)
    #: At each tick, the utilization each device on reported to the controller.
    utilization: list[tuple[float, dict[str, float]]] = field(default_factory=list)

    def device_seconds(self, lo: float = 0.0, hi: float | None = None) -> float:
        """Seconds devices were on within ``[lo, hi)`` (default ``[0, duration_s)``)."""
        hi = self.duration_s if hi is None else hi
        total = 0.0
        for spans in self.on.values():
            for start, end in spans:
                assert start is not None
                stop = hi if end is None else min(end, hi)
                total += max(0.0, stop - max(start, lo))
        return total


class _Dev:
    """One device: its scheduler's actions on the event heap, and what the driver keeps."""

    def __init__(self, name: str, memory_bytes: float, pool: _Pool, start_s: float) -> None:
        self.name = name
        self.memory_bytes = memory_bytes
        self.pool = pool
        self.loop = pool.loop
        self.start_s = start_s
        self.sched: DeviceScheduler[PoolRequest] = scheduler_for(
            [], self, memory_total_bytes=memory_bytes
        )
        #: Models in the scheduler (loaded), loads under way, unloads asked during a load.
        self.hosted: set[str] = set()
        self.loading: set[str] = set()
        self.unload_after_load: set[str] = set()
        self.parked: dict[str, list[PoolRequest]] = {}
        self.ops = 0
        self.on = False
        self.starting = False
        self.stopping = False
        #: Device-seconds of classic batches and of engine steps started, over the last
        #: second at each tick (``utilization``).
        self.meter = UtilizationMeter()

    @property
    def serving(self) -> bool:
        return self.on and not self.starting and not self.stopping

    # -- SchedulerActions --------------------------------------------------------------
    def start_batch(self, batch: Batch[PoolRequest]) -> None:
        if batch.step is None:
            self.meter.classic(batch.solo_s)
        else:
            self.meter.step(batch.solo_s)

    def utilization(self, now: float, tpot_s: float | None) -> float:
        """What the device reports to placement (``engine_utilization`` over the last
        second)."""
        kv = max((h.engine.kv.usage() for h in self.sched.engines.values()), default=0.0)
        return self.meter.read(now, tpot_s, kv)

    def drop(self, request: PoolRequest, reason: str) -> None:
        self.pool.finish(request, reason)

    def wake_at(self, t_s: float) -> None:
        self.loop.at(t_s, self._wake, t_s)

    def _wake(self, at_s: float) -> None:
        self.sched.wake(at_s, self.loop.now)

    def end_at(self, t_s: float, token: int) -> None:
        self.loop.at(t_s, self._end, token)

    def _end(self, token: int) -> None:
        now = self.loop.now
        batch = self.sched.announced(token)
        if batch is None:
            return
        self.sched.finished(batch, now, now - batch.started_s)
        pool = self.pool
        if batch.step is None:
            for r in batch.requests:
                pool.finish(r, "completed")
            return
        seen = now + pool.cpu_s
        for ev in batch.events or ():
            r = ev.req
            rec = r.record
            assert rec is not None and rec.token_times_s is not None
            if not rec.token_times_s:
                pool.run.first_steps[rec.request_id] = (batch.started_s, now)
            rec.token_times_s.append(seen)
            if ev.finish is not None:
                pool.finish(r, "completed", seen)


class _Pool:
    def __init__(self, sc: LlmPlacementScenario, arm: str, seed: int) -> None:
        doc = sc.doc
        a = doc.arms[arm]
        self.sc, self.doc, self.arm = sc, doc, a
        self.loop = EventLoop()
        self.run = PlacementRun(arm, doc.duration_s)
        pdir = sc.profile_dir()
        classic_profiles = load_profile_set(pdir)
        steps = load_step_profiles(pdir)
        llm = doc.llm
        if llm.model not in steps:
            raise ConfigError(f"{sc.source}: llm.model: no step profile {llm.model!r} in {pdir}")
        prof = steps[llm.model]
        self.llm_model = llm.model
        self.cpu_s = prof.cpu_s_per_output_token
        tpots = [w.tpot_ms for w in sc.workloads if w.tpot_ms is not None]
        spec = llm.engine
        self.engine_setup: EngineSetup = engine_setup(
            spec, prof, min(tpots) / 1e3 if tpots else None
        )
        ttfts = [w.ttft_ms for w in sc.workloads if w.ttft_ms is not None]
        try:
            info = engine_info(
                llm.model,
                prof,
                llm.placement,
                self.engine_setup.max_num_seqs,
                min(ttfts) / 1e3 if ttfts else None,
            )
        except ValueError as exc:
            raise ConfigError(f"{sc.source}: llm: {exc}") from exc
        self.num_blocks = engine_blocks(info, prof)
        self.run.budget_tokens = self.engine_setup.max_num_batched_tokens
        self.run.step_profile = prof
        self.run.wake_s, self.run.cold_s = info.warm_load_s, info.cold_load_s
        infos: dict[str, ModelInfo] = {llm.model: info}
        #: Each classic model's first stream (its serving settings) and profile.
        self.classic_first: dict[str, ClassicStream] = {}
        self.classic_profiles: dict[str, LatencyProfile] = {}
        for i, c in enumerate(doc.classic):
            if c.model == llm.model:
                raise ConfigError(f"{sc.source}: classic.{i}.model: {c.model!r} is the LLM")
            if c.model not in classic_profiles:
                raise ConfigError(f"{sc.source}: classic.{i}.model: no profile {c.model!r}")
            if c.model in self.classic_first:
                continue
            p = classic_profiles[c.model]
            self.classic_first[c.model] = c
            self.classic_profiles[c.model] = p
            cold, warm = default_load_times_s(p.weights_bytes)
            if c.cold_load_ms is not None:
                cold = c.cold_load_ms / 1e3
            if c.warm_load_ms is not None:
                warm = c.warm_load_ms / 1e3
            slo = min(s.slo_ms for s in doc.classic if s.model == c.model) / 1e3
            infos[c.model] = ModelInfo.from_profile(c.model, p, c.max_batch_size, cold, warm, slo)
        self.infos = infos
        self.devs: dict[str, _Dev] = {}
        views = []
        for d in a.devices:
            mem = prof.device_memory_bytes if d.memory_gib is None else d.memory_gib * GIB
            dev = _Dev(d.name, mem, self, d.start_ms / 1e3)
            self.devs[d.name] = dev
            self.run.on[d.name] = []
            if d.active:
                dev.on = True
                self.run.on[d.name].append([0.0, None])
                for m in d.models:
                    self._host(dev, m, 0.0)
            views.append(
                DeviceView(
                    d.name, mem, {m: READY for m in d.models} if d.active else {}, active=d.active
                )
            )
        rng = random.Random(f"{seed}:policy")
        try:
            self.ctl = PlacementController(
                infos,
                views,
                PLACEMENT.build(a.placement, rng, where=f"arms.{arm}.placement"),
                None
                if a.autoscaling is None
                else AUTOSCALING.build(a.autoscaling, rng, where=f"arms.{arm}.autoscaling"),
                host_memory_bytes=a.host_memory_gib * GIB,
                interval_s=a.placement_interval_ms / 1e3,
                min_switch_s=a.min_switch_s,
            )
        except ValueError as exc:
            raise ConfigError(f"{sc.source}: arms.{arm}: {exc}") from exc
        self.run.counts = self.ctl.counts
        self.unload_s = a.unload_ms / 1e3
        self.ids: Iterator[int] = iter(range(1, 1 << 62))
        self._note_active()

    # -- hosting ---------------------------------------------------------------------------
    def _classic_setup(self, model: str) -> ModelSetup:
        c = self.classic_first[model]
        spec = dict(c.batching)
        spec.setdefault("max_batch_size", c.max_batch_size)
        policy = BATCHING.build(spec, where=f"classic.{c.stream}.batching")
        return ModelSetup(
            model, policy, self.classic_profiles[model], max_batch_size=c.max_batch_size,
            slo_s=self.infos[model].slo_s,
        )  # fmt: skip

    def _host(self, dev: _Dev, model: str, now: float) -> None:
        if model == self.llm_model:
            dev.sched.add_engine(
                model, self.engine_setup, now, self.num_blocks, self.doc.llm.priority
            )
        else:
            dev.sched.add_model(self._classic_setup(model), now)
        dev.hosted.add(model)

    def _unhost(self, dev: _Dev, model: str, now: float) -> None:
        if model == self.llm_model:
            dev.sched.remove_engine(model, now)
        else:
            dev.sched.remove_model(model, now)
        dev.hosted.discard(model)

    # -- requests --------------------------------------------------------------------------
    def arrive(self, q: PoolRequest) -> None:
        now = self.loop.now
        ctl = self.ctl
        ctl.arrival(q.model, now)
        views = ctl.devices
        hosts = [
            n
            for n, d in self.devs.items()
            if d.serving and views[n].active and views[n].models.get(q.model) == READY
        ]
        if hosts:
            name = min(hosts, key=lambda n: (views[n].outstanding.get(q.model, 0), n))
        else:
            under_way = any(v.active and q.model in v.models for v in views.values())
            dev, actions = ctl.route_miss(q.model, now)
            if q.model == self.llm_model and dev is not None and not under_way:
                self.run.misses.append(LlmMiss(q.request_id, now, dev))
            self.carry_out(actions, now)
            if dev is None:
                self.finish(q, NO_BACKEND)
                return
            name = dev
        ctl.sent(q.model, name, now)
        q.device = name
        d = self.devs[name]
        if q.model not in d.hosted:  # its load is under way, or waits for room
            d.parked.setdefault(q.model, []).append(q)
            return
        self._offer(d, q, now)

    def _offer(self, d: _Dev, q: PoolRequest, now: float) -> None:
        if q.spec is not None:
            why = d.sched.offer_generation(q, q.spec, now)
        else:
            why = d.sched.offer(q, now)
        if why is not None:
            self.finish(q, why)

    def finish(self, q: PoolRequest, outcome: str, at_s: float | None = None) -> None:
        """``q`` is answered (completed, or refused for ``outcome``)."""
        now = self.loop.now
        t = now if at_s is None else at_s
        q.outcome = outcome
        q.done_s = t
        if q.record is not None:
            q.record.outcome = outcome
            q.record.finished_s = t
        if q.device:
            self.ctl.done(q.model, q.device, 1, now)
            d = self.devs[q.device]
            if d.stopping:
                self.loop.at(now, self._check_stop, d.name)

    # -- actions ---------------------------------------------------------------------------
    def carry_out(self, actions: list[Action] | list[Action | ScaleAction], now: float) -> None:
        for a in actions:
            if isinstance(a, Load):
                self._start_load(a, now)
            elif isinstance(a, Unload):
                self._start_unload(a, now)
            elif isinstance(a, ScaleUp):
                self._scale_up(a.device, now)
            elif isinstance(a, ScaleDown):
                self._scale_down(a.device, now)

    def _start_load(self, a: Load, now: float) -> None:
        d = self.devs[a.device]
        d.ops += 1
        d.loading.add(a.model)
        took = self.ctl.load_seconds(a)
        warm = took == self.infos[a.model].warm_load_s
        self.loop.at(now + took, self._load_done, (a, now, warm))

    def _load_done(self, arg: tuple[Load, float, bool]) -> None:
        a, started, warm = arg
        now = self.loop.now
        d = self.devs[a.device]
        d.ops -= 1
        d.loading.discard(a.model)
        self._host(d, a.model, now)
        self.run.loads.append(LoadEvent(a.model, a.device, started, now, warm))
        self.ctl.load_done(a.model, a.device, now)
        for q in d.parked.pop(a.model, []):
            self._offer(d, q, now)
        if a.model in d.unload_after_load:
            d.unload_after_load.discard(a.model)
            self._start_unload(Unload(a.model, a.device), now)
        self._check_stop(a.device)

    def _start_unload(self, a: Unload, now: float) -> None:
        d = self.devs[a.device]
        if a.model in d.loading:
            d.unload_after_load.add(a.model)
            return
        self._unhost(d, a.model, now)  # nothing outstanding (the controller's rule)
        d.ops += 1
        self.loop.at(now + self.unload_s, self._unload_done, a)

    def _unload_done(self, a: Unload) -> None:
        now = self.loop.now
        d = self.devs[a.device]
        d.ops -= 1
        self.carry_out(self.ctl.unload_done(a.model, a.device, now), now)
        self._check_stop(a.device)

    def _scale_up(self, name: str, now: float) -> None:
        d = self.devs[name]
        d.on = True
        d.starting = True
        self.run.on[name].append([now, None])
        self._note_active()
        self.loop.at(now + d.start_s, self._ready, name)

    def _ready(self, name: str) -> None:
        d = self.devs[name]
        d.starting = False
        self.ctl.device_ready(name, self.loop.now)

    def _scale_down(self, name: str, now: float) -> None:
        self.devs[name].stopping = True
        self.loop.at(now, self._check_stop, name)

    def _check_stop(self, name: str) -> None:
        d = self.devs[name]
        if not d.stopping or d.ops or d.parked or not d.sched.idle:
            return
        now = self.loop.now
        for m in sorted(d.hosted):
            self._unhost(d, m, now)
        self.ctl.device_stopped(name, now)
        d.stopping = False
        d.on = False
        self.run.on[name][-1][1] = now
        self._note_active()

    def _note_active(self) -> None:
        self.run.active.append((self.loop.now, sum(1 for d in self.devs.values() if d.on)))

    def tick(self, _: object) -> None:
        now = self.loop.now
        ctl = self.ctl
        tpot = self.engine_setup.tpot_s
        seen: dict[str, float] = {}
        for name, d in self.devs.items():
            if d.on and not d.starting:
                seen[name] = d.utilization(now, tpot)
                ctl.utilization(name, seen[name])
        self.run.utilization.append((now, seen))
        self.carry_out(ctl.tick(now), now)
        nxt = now + ctl.tick_s
        if nxt < self.doc.duration_s:
            self.loop.at(nxt, self.tick, None)

    # -- arrivals --------------------------------------------------------------------------
    def start_arrivals(self, seed: int) -> None:
        end = self.doc.duration_s
        for k, wl in enumerate(self.sc.workloads):
            if wl.closed_loop:
                raise ConfigError(
                    f"{self.sc.source}: llm.workloads.{k}: an open loop (rate_rps) only here"
                )
            self._open_loop(iter_llm_open_loop(wl, seed + 1000 * k, end))
        for c in self.doc.classic:
            self._classic(c, seed)

    def _open_loop(self, it: Iterator[LlmRequest]) -> None:
        def arrive(r: LlmRequest) -> None:
            now = self.loop.now
            rec = r.record(now)
            rec.token_times_s = []
            self.run.records.append(rec)
            q = PoolRequest(
                next(self.ids), r.model, now, r.priority, None, 1, record=rec,
                stream=r.model, spec=GenSpec(r.prompt_ids, r.max_tokens, r.ignore_eos),
            )  # fmt: skip
            rec.request_id = q.request_id
            self.arrive(q)
            nxt = next(it, None)
            if nxt is not None:
                self.loop.at(nxt.arrival_s, arrive, nxt)

        first = next(it, None)
        if first is not None:
            self.loop.at(first.arrival_s, arrive, first)

    def _classic(self, c: ClassicStream, seed: int) -> None:
        proc = PoissonProcess(c.rate_rps, c.phases, arrivals_rng(seed, f"classic:{c.stream}"))
        end = self.doc.duration_s
        slo = c.slo_ms / 1e3

        def arrive(_: Any) -> None:
            now = self.loop.now
            q = PoolRequest(
                next(self.ids), c.model, now, c.priority, None, 1, stream=c.stream, slo_s=slo
            )
            self.run.classic.append(q)
            self.arrive(q)
            t = proc.next_after(now)
            if t < end:
                self.loop.at(t, arrive)

        t0 = proc.next_after(0.0)
        if t0 < end:
            self.loop.at(t0, arrive)


def run_placement_arm(
    sc: LlmPlacementScenario,
    arm: str,
    seed: int | None = None,
    clock: PlacementClock | None = None,
) -> PlacementRun:
    """Run one arm of ``sc`` (see the module docstring). ``clock``: a live gateway's
    controller clock to replay (``sim.placement.PlacementClock``: its estimates started then,
    its ticks fall there); else the first tick is at 0."""
    if arm not in sc.doc.arms:
        raise ConfigError(f"{sc.source}: arms: no arm {arm!r} ({', '.join(sc.doc.arms)})")
    seed = sc.doc.seed if seed is None else seed
    pool = _Pool(sc, arm, seed)
    pool.start_arrivals(seed)
    loop = pool.loop
    loop.at(0.0 if clock is None else clock.apply(pool.ctl), pool.tick, None)
    doc = sc.doc
    loop.run(doc.duration_s)
    limit = doc.duration_s + doc.drain_s
    while loop.heap and loop.heap[0][0] <= limit:
        loop.run(loop.heap[0][0])
    pool.run.end_s = loop.now
    mark_unfinished(pool.run.records)
    return pool.run


# -- figures -------------------------------------------------------------------------------
def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def switch_gaps(log: Iterable[Sequence[Any]], window_s: float = 30.0) -> tuple[float | None, int]:
    """Over a switch log (``PlacementCounts.switch_log``'s rows: time, model, device, kind),
    the shortest time between two changes of one (model, device) (None: no pair changed
    twice), and how many such pairs of changes came within ``window_s``."""
    last: dict[tuple[str, str], float] = {}
    shortest: float | None = None
    within = 0
    for t, m, d, _ in log:
        prev = last.get((m, d))
        if prev is not None:
            gap = float(t) - prev
            shortest = gap if shortest is None else min(shortest, gap)
            within += gap < window_s
        last[(m, d)] = float(t)
    return shortest, within


def burst_figures(
    run: PlacementRun, ttft_target_s: float, budget_tokens: int
) -> list[dict[str, Any]]:
    """For each LLM load a miss started (the LLM asleep or on disk, a request for it): the
    wake (or load) seconds; the request that missed: its TTFT, and whether its first token
    came from the first step after the load (``first_step_after_load_s``: that step's start
    less the load's end; ``bound_s``: its wait for the load plus that one step and the CPU
    of its token); the worst TTFT beyond the wait for the load among the requests that came
    during it; the TTFT attainment of those that came from the load's end plus one step (a
    full token budget of prefill, ``one_step_s``) to 60 s after; and ``recovered_s``: from
    the miss to the arrival after which every request (to 60 s after the load) met its TTFT
    target."""
    prof = run.step_profile
    assert prof is not None
    one_step_s = prof.step_s(budget_tokens, 0, 0) + prof.cpu_s_per_output_token
    by_id = {r.request_id: r for r in run.records}
    out = []
    for miss in run.misses:
        load = next(
            (
                ld
                for ld in run.loads
                if ld.model == by_id[miss.request_id].model
                and ld.device == miss.device
                and ld.start_s >= miss.at_s - 1e-9
            ),
            None,
        )
        first = by_id[miss.request_id]
        if load is None or first.ttft_s is None:
            continue
        step = one_step_s
        fs = run.first_steps.get(first.request_id)
        if fs is None:
            continue
        first_step_start, first_step_end = fs
        load_s = load.done_s - load.start_s
        waited = [
            r
            for r in run.records
            if miss.at_s <= r.scheduled_s < load.done_s and r.ttft_s is not None
        ]
        beyond = max((r.ttft_s - (load.done_s - r.scheduled_s)) for r in waited if r.ttft_s)
        after = [
            r
            for r in run.records
            if load.done_s + step <= r.scheduled_s < load.done_s + 60.0 and r.outcome == "completed"
        ]
        met = sum(1 for r in after if r.ttft_s is not None and r.ttft_s <= ttft_target_s)
        window = [r for r in run.records if miss.at_s <= r.scheduled_s < load.done_s + 60.0]
        missed = [
            r.scheduled_s
            for r in window
            if r.outcome != "completed" or r.ttft_s is None or r.ttft_s > ttft_target_s
        ]
        recovered = (max(missed) - miss.at_s) if missed else 0.0
        out.append(
            {
                "at_s": miss.at_s,
                "device": miss.device,
                "warm": load.warm,
                "load_s": load_s,
                "waited_for_room_s": load.start_s - miss.at_s,
                "first_ttft_s": first.ttft_s,
                "first_step_after_load_s": first_step_start - load.done_s,
                "bound_s": (load.done_s - miss.at_s)
                + (first_step_end - first_step_start)
                + prof.cpu_s_per_output_token,
                "during_load": len(waited),
                "worst_ttft_beyond_load_s": beyond,
                "after": len(after),
                "after_ttft_met": met / len(after) if after else None,
                "one_step_s": step,
                "recovered_s": recovered,
            }
        )
    return out


def summarize_placement(sc: LlmPlacementScenario, run: PlacementRun) -> dict[str, Any]:
    """An arm's figures: device-seconds, SLO attainment (the LLM's and each classic
    stream's), loads and switches, and the LLM's bursts (``burst_figures``)."""
    doc = sc.doc
    lo, hi = doc.warmup_s, doc.duration_s
    recs = [r for r in run.records if lo <= r.scheduled_s < hi]
    llm_met = sum(1 for r in recs if r.met_targets())
    by_class: dict[int, list[GenerationRecord]] = defaultdict(list)
    for r in recs:
        by_class[r.priority].append(r)
    classes = {}
    for prio, rs in sorted(by_class.items(), reverse=True):
        ttft = [t for r in rs if (t := r.ttft_s) is not None]
        classes[prio] = {
            "requests": len(rs),
            "met": sum(1 for r in rs if r.met_targets()),
            "ttft_p50_s": _pct(ttft, 50),
            "ttft_p99_s": _pct(ttft, 99),
        }
    streams: dict[str, dict[str, Any]] = {}
    cl = [q for q in run.classic if lo <= q.arrival_s < hi]
    for c in doc.classic:
        qs = [q for q in cl if q.stream == c.stream]
        ok = [q.done_s - q.arrival_s for q in qs if q.outcome == "completed"]
        met = sum(1 for x in ok if x <= c.slo_ms / 1e3)
        streams[c.stream] = {
            "requests": len(qs),
            "met": met,
            "p50_ms": None if not ok else _pct(ok, 50) * 1e3,  # type: ignore[operator]
            "p99_ms": None if not ok else _pct(ok, 99) * 1e3,  # type: ignore[operator]
        }
    classic_n = sum(s["requests"] for s in streams.values())
    classic_met = sum(s["met"] for s in streams.values())
    shortest, within = switch_gaps(run.counts.switch_log)
    ttfts = [w.ttft_ms for w in sc.workloads if w.ttft_ms is not None]
    return {
        "arm": run.arm,
        "device_seconds": run.device_seconds(),
        "llm_requests": len(recs),
        "llm_attainment": llm_met / len(recs) if recs else None,
        "llm_classes": classes,
        "classic_requests": classic_n,
        "classic_attainment": classic_met / classic_n if classic_n else None,
        "classic": streams,
        "loads": run.counts.loads,
        "warm_loads": run.counts.warm_loads,
        "cold_loads": run.counts.cold_loads,
        "evictions": run.counts.evictions,
        "unplaced": run.counts.unplaced,
        "scale_ups": run.counts.scale_ups,
        "scale_downs": run.counts.scale_downs,
        "switches": len(run.counts.switch_log),
        "shortest_switch_gap_s": shortest,
        "switches_within_30s": within,
        "bursts": (
            burst_figures(run, min(ttfts) / 1e3, run.budget_tokens)
            if ttfts and run.misses and run.step_profile
            else []
        ),
        "end_s": run.end_s,
    }


__all__ = [
    "LlmMiss",
    "LoadEvent",
    "PlacementRun",
    "PoolRequest",
    "burst_figures",
    "engine_utilization",
    "run_placement_arm",
    "summarize_placement",
    "switch_gaps",
]
