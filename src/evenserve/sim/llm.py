"""Simulating an LLM scenario (``sim.llm_scenario``): one device, its DeviceScheduler hosting
an LLM engine next to classic models, on the simulation's event heap.

The device is the very scheduler the worker drives (engine steps, KV blocks, the interleaving
with classic batches); this driver carries out its actions on virtual time: a step or a batch
ends when the scheduler's timing says, a step's tokens become visible at its end plus the step
profile's CPU per output token (off the device's clock: the next step does not wait for it),
a classic batch's requests are answered at its end.

Arrivals: each LLM workload open loop (Poisson, its phases) or closed loop (users who send the
next request when the last one finished, after a think time), and each classic model a Poisson
stream. Arrivals stop at ``duration_s``; the run goes on until everything that arrived is
answered (at most ``drain_s`` more; an LLM request not answered by then is ``unfinished``,
not completed). Figures count requests scheduled in ``[warmup_s,
duration_s)``: the LLM's through ``report.llm_summary``, the classic models' latency and
goodput (answered within the SLO) per second of that window.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from evenserve.core.llm import GenerationRecord, load_step_profiles, mark_unfinished
from evenserve.core.profile import load_profile_set
from evenserve.policy.batching import BATCHING
from evenserve.report.llm_summary import LlmSummary, summarize_generations
from evenserve.sched import Batch, DeviceScheduler, ModelSetup, QueuedRequest, scheduler_for
from evenserve.sched.engine import EngineSetup, GenSpec
from evenserve.sim.engine import EventLoop
from evenserve.sim.llm_scenario import ClassicSection, EngineSpec, LlmScenario
from evenserve.workload.llm import LlmRequest, LlmUser, iter_llm_open_loop, llm_users
from evenserve.workload.poisson import PoissonProcess
from evenserve.workload.seeding import arrivals_rng


@dataclass(slots=True, eq=False)
class LlmSimRequest(QueuedRequest):
    """A request on the simulated device: an LLM generation's record, or a classic one's
    answer time and outcome."""

    record: GenerationRecord | None = None
    user: LlmUser | None = None
    done_s: float = math.nan
    outcome: str = ""


@dataclass
class ArmRun:
    """What one arm's run saw."""

    arm: str
    records: list[GenerationRecord] = field(default_factory=list)
    classic: dict[str, list[LlmSimRequest]] = field(default_factory=dict)
    busy_s: float = 0.0
    steps: int = 0
    batches: int = 0
    #: Time-weighted KV use (fraction of blocks) while steps ran, and the blocks.
    kv_usage_s: float = 0.0
    step_s: float = 0.0
    kv_blocks: int = 0
    preemptions: int = 0
    prefix_query_tokens: int = 0
    prefix_hit_tokens: int = 0
    end_s: float = 0.0


class _Device:
    """SchedulerActions on the event heap."""

    def __init__(self, loop: EventLoop, run: ArmRun, cpu_per_token_s: float) -> None:
        self.loop = loop
        self.run = run
        self.cpu_s = cpu_per_token_s
        self.sched: DeviceScheduler[LlmSimRequest]
        self.on_finish: Any = None
        #: Called with a request, when its first token becomes visible and the prompt tokens
        #: the prefix cache gave it, on its first token (a router's cue).
        self.on_first: Any = None

    def start_batch(self, batch: Batch[LlmSimRequest]) -> None:
        run = self.run
        run.busy_s += batch.solo_s
        if batch.step is not None:
            run.steps += 1
            host = self.sched.engines[batch.model]
            run.kv_usage_s += host.engine.kv.usage() * batch.solo_s
            run.step_s += batch.solo_s
        else:
            run.batches += 1

    def drop(self, request: LlmSimRequest, reason: str) -> None:
        self.refused(request, reason)

    def refused(self, r: LlmSimRequest, reason: str) -> None:
        now = self.loop.now
        r.outcome = reason
        r.done_s = now
        if r.record is not None:
            r.record.outcome = reason
            r.record.finished_s = now
            if self.on_finish is not None:
                self.on_finish(r)

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
        if batch.step is None:
            for r in batch.requests:
                r.done_s = now
                r.outcome = "completed"
            return
        seen = now + self.cpu_s
        for ev in batch.events or ():
            r = ev.req
            rec = r.record
            assert rec is not None and rec.token_times_s is not None
            rec.token_times_s.append(seen)
            if self.on_first is not None and len(rec.token_times_s) == 1:
                self.on_first(r, seen, ev.cached)
            if ev.finish is not None:
                rec.finished_s = seen
                r.done_s = seen
                r.outcome = "completed"
                if self.on_finish is not None:
                    self.on_finish(r)


def _classic_setup(c: ClassicSection, profile: Any) -> ModelSetup:
    spec = dict(c.batching)
    spec.setdefault("max_batch_size", c.max_batch_size)
    policy = BATCHING.build(spec, where=f"classic.{c.model}.batching")
    return ModelSetup(
        c.model, policy, profile, max_batch_size=c.max_batch_size, slo_s=c.slo_ms / 1e3,
        priority=c.priority,
    )  # fmt: skip


def engine_setup(spec: EngineSpec, profile: Any, wl_tpot_s: float | None) -> EngineSetup:
    mode = spec.mode or "continuous"
    budget = spec.max_num_batched_tokens
    if budget is None:
        budget = 512 if mode == "continuous-chunked" else max(8192, profile.max_model_len)
    return EngineSetup(
        profile,
        mode=mode,
        max_num_seqs=spec.max_num_seqs or 256,
        max_num_batched_tokens=budget,
        chunk_tokens=spec.chunk_tokens,
        prefix_caching=True if spec.prefix_caching is None else spec.prefix_caching,
        max_waiting=spec.max_waiting,
        tpot_s=wl_tpot_s,
    )


def run_arm(sc: LlmScenario, arm: str, seed: int | None = None) -> ArmRun:
    """Run one arm of ``sc`` (see the module docstring)."""
    doc = sc.doc
    a = doc.arms[arm]
    seed = doc.seed if seed is None else seed
    pdir = sc.profile_dir()
    classic_profiles = load_profile_set(pdir)
    steps = load_step_profiles(pdir)
    loop = EventLoop()
    run = ArmRun(arm)
    setups = []
    if a.classic:
        for c in doc.classic:
            if c.model not in classic_profiles:
                raise KeyError(f"classic model {c.model!r}: no profile in {pdir}")
            setups.append(_classic_setup(c, classic_profiles[c.model]))
            run.classic[c.model] = []
    llm = doc.llm if a.llm else None
    step_profile = steps[llm.model] if llm is not None else None
    memory = step_profile.device_memory_bytes if step_profile is not None else None
    dev = _Device(loop, run, step_profile.cpu_s_per_output_token if step_profile else 0.0)
    sched: DeviceScheduler[LlmSimRequest] = scheduler_for(setups, dev, memory_total_bytes=memory)
    dev.sched = sched
    ids = iter(range(1, 1 << 62))
    if llm is not None and step_profile is not None:
        tpots = [w.tpot_ms for w in sc.workloads if w.tpot_ms is not None]
        spec = llm.engine.merged(a.engine)
        setup = engine_setup(spec, step_profile, min(tpots) / 1e3 if tpots else None)
        host = sched.add_engine(llm.model, setup, 0.0, spec.num_blocks, llm.priority)
        run.kv_blocks = host.engine.kv.num_blocks
        _llm_arrivals(sc, loop, sched, dev, run, seed, ids)
    for i, c in enumerate(doc.classic if a.classic else []):
        _classic_arrivals(c, i, loop, sched, run, seed, doc.duration_s, ids)
    loop.run(doc.duration_s)
    limit = doc.duration_s + doc.drain_s
    while loop.heap and not sched.idle:
        t = loop.heap[0][0]
        if t > limit:
            break
        loop.run(t)
    run.end_s = loop.now
    mark_unfinished(run.records)
    for host in sched.engines.values():
        run.preemptions += host.engine.counters.preemptions
        run.prefix_query_tokens += host.engine.kv.query_tokens
        run.prefix_hit_tokens += host.engine.kv.hit_tokens
    return run


def _offer_llm(
    r: LlmRequest, loop: EventLoop, sched: DeviceScheduler[LlmSimRequest], run: ArmRun,
    ids: Iterator[int], user: LlmUser | None, dev: _Device,
) -> None:  # fmt: skip
    now = loop.now
    rec = r.record(now)
    rec.token_times_s = []
    run.records.append(rec)
    q = LlmSimRequest(next(ids), r.model, now, r.priority, None, 1, record=rec, user=user)
    why = sched.offer_generation(q, GenSpec(r.prompt_ids, r.max_tokens, r.ignore_eos), now)
    if why is not None:
        dev.refused(q, why)


def _llm_arrivals(
    sc: LlmScenario, loop: EventLoop, sched: DeviceScheduler[LlmSimRequest], dev: _Device,
    run: ArmRun, seed: int, ids: Iterator[int],
) -> None:  # fmt: skip
    end = sc.doc.duration_s

    def send(u: LlmUser) -> None:
        _offer_llm(u.next_request(loop.now), loop, sched, run, ids, u, dev)

    def finished(r: LlmSimRequest) -> None:
        u = r.user
        if u is not None:
            t = loop.now + u.think_s()
            if t < end:
                loop.at(t, send, u)

    for k, wl in enumerate(sc.workloads):
        if wl.closed_loop:
            dev.on_finish = finished
            for u in llm_users(wl, seed + 1000 * k):
                loop.at(u.think_s(), send, u)
        else:
            _open_loop(iter_llm_open_loop(wl, seed + 1000 * k, end), loop, sched, dev, run, ids)


def _open_loop(
    it: Iterator[LlmRequest], loop: EventLoop, sched: DeviceScheduler[LlmSimRequest],
    dev: _Device, run: ArmRun, ids: Iterator[int],
) -> None:  # fmt: skip
    """One open-loop workload: each arrival offers its request and schedules the next."""

    def arrive(r: LlmRequest) -> None:
        _offer_llm(r, loop, sched, run, ids, None, dev)
        nxt = next(it, None)
        if nxt is not None:
            loop.at(nxt.arrival_s, arrive, nxt)

    first = next(it, None)
    if first is not None:
        loop.at(first.arrival_s, arrive, first)


def _classic_arrivals(
    c: ClassicSection, i: int, loop: EventLoop, sched: DeviceScheduler[LlmSimRequest],
    run: ArmRun, seed: int, end_s: float, ids: Iterator[int],
) -> None:  # fmt: skip
    classic_stream(
        c.model, c.priority, c.rate_rps, f"classic:{c.model}", loop, sched,
        run.classic[c.model], seed, end_s, ids,
    )  # fmt: skip


def classic_stream(
    model: str, priority: int, rate: float, stream: str, loop: EventLoop,
    sched: DeviceScheduler[LlmSimRequest], out: list[LlmSimRequest], seed: int, end_s: float,
    ids: Iterator[int],
) -> None:  # fmt: skip
    """A classic model's Poisson stream at ``rate`` (seeded ``stream``) offered to ``sched``
    until ``end_s``; each request appended to ``out`` (a refusal is its outcome)."""
    proc = PoissonProcess(rate, [], arrivals_rng(seed, stream))

    def arrive(_: Any) -> None:
        now = loop.now
        r = LlmSimRequest(next(ids), model, now, priority, None, 1)
        out.append(r)
        why = sched.offer(r, now)
        if why is not None:
            r.outcome = why
            r.done_s = now
        t = proc.next_after(now)
        if t < end_s:
            loop.at(t, arrive)

    t0 = proc.next_after(0.0)
    if t0 < end_s:
        loop.at(t0, arrive)


def classic_figures(
    reqs: list[LlmSimRequest], slo_s: float, lo: float, hi: float
) -> dict[str, Any]:
    """A classic model's figures over the requests that arrived in ``[lo, hi)``: latency of
    the completed ones, refusals by reason, goodput (answered within ``slo_s``) per second."""
    inw = [r for r in reqs if lo <= r.arrival_s < hi]
    ok = [r.done_s - r.arrival_s for r in inw if r.outcome == "completed"]
    good = sum(1 for x in ok if x <= slo_s)
    refused: dict[str, int] = {}
    for r in inw:
        if r.outcome not in ("completed", ""):
            refused[r.outcome] = refused.get(r.outcome, 0) + 1
    lat = np.asarray(ok) if ok else np.zeros(0)
    return {
        "requests": len(inw),
        "completed": len(ok),
        "refused": refused,
        "p50_ms": float(np.percentile(lat, 50)) * 1e3 if ok else None,
        "p99_ms": float(np.percentile(lat, 99)) * 1e3 if ok else None,
        "slo_ms": slo_s * 1e3,
        "goodput_rps": good / (hi - lo),
        "goodput_fraction": good / len(inw) if inw else None,
    }


@dataclass
class ArmFigures:
    """An arm's figures: the LLM's, each classic model's, the device's."""

    arm: str
    llm: LlmSummary | None
    classic: dict[str, dict[str, Any]]
    device: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "arm": self.arm,
            "llm": None if self.llm is None else self.llm.to_dict(),
            "classic": self.classic,
            "device": self.device,
        }


def summarize_arm(sc: LlmScenario, run: ArmRun) -> ArmFigures:
    """An arm's figures: the LLM's (``report.llm_summary``), each classic model's latency
    and goodput (answered within its SLO, per second of the window), the device's."""
    doc = sc.doc
    lo, hi = doc.warmup_s, doc.duration_s
    llm: LlmSummary | None = None
    if run.records:
        s = summarize_generations(
            run.records,
            arm=run.arm,
            window=(lo, hi),
            kv_usage=run.kv_usage_s / run.step_s if run.step_s else None,
            preemptions=run.preemptions,
            extra={
                "kv_blocks": run.kv_blocks,
                "prefix_cache_hit_rate": (
                    run.prefix_hit_tokens / run.prefix_query_tokens
                    if run.prefix_query_tokens
                    else None
                ),
            },
        )
        llm = s
    classic: dict[str, Any] = {}
    slos = {c.model: c.slo_ms / 1e3 for c in doc.classic}
    for model, reqs in run.classic.items():
        classic[model] = classic_figures(reqs, slos[model], lo, hi)
    device = {
        "utilization": run.busy_s / run.end_s if run.end_s else None,
        "steps": run.steps,
        "batches": run.batches,
        "kv_blocks": run.kv_blocks,
        "preemptions": run.preemptions,
        "ran_s": run.end_s,
    }
    return ArmFigures(run.arm, llm, classic, device)
