"""Simulating an LLM pool (``sim.llm_pool_scenario``): a router in front of several devices,
each the device scheduler the worker drives, hosting an engine of the LLM next to classic
models.

What runs. Each device is ``sim.llm``'s simulated device (engine steps, KV blocks, the
interleaving with classic batches, a token visible at its step's end plus the CPU per output
token). In front of the engines, ``policy.llm_routing.LlmRouter`` with the arm's policy, driven
as the gateway drives it: ``route`` on arrival, ``sent`` when the request is offered to the
chosen engine, ``first_token`` when the client would see its first token, ``done`` when it
ends (a refusal by the engine included). A refusal by the router (``ttft-unreachable``) is
the request's outcome, answered at once. Each engine's signals (running and waiting
sequences, KV use, queued prompt tokens, preemptions) are read every ``scrape_s`` and reach
the router ``stale_s`` after they were read. A request's prefix is named as the engine names
it (``sched.engine.prompt_hashes`` over its token ids), so the router's index and the
engine's cache speak of the same blocks.

Arrivals: each LLM workload open loop (Poisson with its phases, its rate times the arm's
``rate_scale``) or closed loop; each classic model a Poisson stream per device that hosts it,
at its rate split evenly over them (streams seeded per device). Arrivals stop at
``duration_s``; the run goes on until everything is answered (at most ``drain_s`` more; a
request not answered by then is ``unfinished``, not completed, as the live run's at its
horizon). Figures count requests scheduled in ``[warmup_s, duration_s)``.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from evenserve.core.llm import GenerationRecord, load_step_profiles, mark_unfinished
from evenserve.core.profile import load_profile_set
from evenserve.policy.llm_routing import EngineSample, EngineView, LlmRequestInfo, LlmRouter
from evenserve.report.llm_summary import LlmSummary, summarize_generations
from evenserve.sched import DeviceScheduler, scheduler_for
from evenserve.sched.engine import GenSpec, prompt_hashes
from evenserve.sim.engine import EventLoop
from evenserve.sim.llm import (
    ArmRun,
    LlmSimRequest,
    _classic_setup,
    _Device,
    classic_figures,
    classic_stream,
    engine_setup,
)
from evenserve.sim.llm_pool_scenario import LlmPoolScenario
from evenserve.workload.llm import LlmRequest, LlmUser, iter_llm_open_loop, llm_users


@dataclass
class _PoolDevice:
    name: str
    dev: _Device
    sched: DeviceScheduler[LlmSimRequest]
    view: EngineView
    run: ArmRun


@dataclass
class PoolRun:
    """What one arm's run saw."""

    arm: str
    records: list[GenerationRecord] = field(default_factory=list)
    #: The workload of each record, by request id.
    workload_of: dict[int, str] = field(default_factory=dict)
    #: Where each routed request went, by request id.
    engine_of: dict[int, str] = field(default_factory=dict)
    devices: dict[str, ArmRun] = field(default_factory=dict)
    end_s: float = 0.0
    #: Router decision counts: engine name -> requests, and refusals.
    routed: dict[str, int] = field(default_factory=dict)
    refused: int = 0
    #: The policy's predicted TTFT of each routed request (policies that predict).
    predicted_ttft: dict[int, float] = field(default_factory=dict)


def run_pool_arm(
    sc: LlmPoolScenario,
    arm: str,
    seed: int | None = None,
    *,
    arrival_jitter_s: float = 0.0,
    jitter_seed: int = 0,
) -> PoolRun:
    """Run one arm of ``sc`` (see the module docstring). ``arrival_jitter_s`` > 0: each
    open-loop LLM request reaches the router U(0, it) seconds after it is due (in order, a
    generator seeded by ``jitter_seed`` and the workload), its TTFT still counted from when
    it was due, as a live client's late sends are: how far the figures move under a
    perturbation that small is the simulator's own spread (``bench/llm_pool_sensitivity.py``)."""
    if not arrival_jitter_s >= 0:
        raise ValueError(f"arrival_jitter_s: must be >= 0, got {arrival_jitter_s}")
    doc = sc.doc
    a = doc.arms[arm]
    seed = doc.seed if seed is None else seed
    loop = EventLoop()
    out = PoolRun(arm)
    router = LlmRouter.build(a.routing, seed)
    scrape_s = a.signals.scrape_s if a.signals and a.signals.scrape_s else doc.signals.scrape_s
    stale_s = doc.signals.stale_s
    if a.signals is not None and a.signals.stale_s is not None:
        stale_s = a.signals.stale_s
    llm = doc.llm
    classic_by_model = {c.model: c for c in doc.classic}
    tpots = [w.tpot_ms for _, w in sc.workloads if w.tpot_ms is not None]
    devices: dict[str, _PoolDevice] = {}
    ids = iter(range(1, 1 << 62))
    for d in doc.devices:
        pdir = sc.profile_dir(d.profiles)
        steps = load_step_profiles(pdir)
        if llm.model not in steps:
            raise KeyError(f"devices.{d.name}: no step profile of {llm.model!r} in {pdir}")
        prof = steps[llm.model]
        classic_profiles = load_profile_set(pdir) if d.classic else {}
        setups = []
        for m in d.classic:
            if m not in classic_profiles:
                raise KeyError(f"devices.{d.name}: classic model {m!r}: no profile in {pdir}")
            setups.append(_classic_setup(classic_by_model[m], classic_profiles[m]))
        run = ArmRun(d.name)
        for m in d.classic:
            run.classic[m] = []
        dev = _Device(loop, run, prof.cpu_s_per_output_token)
        sched: DeviceScheduler[LlmSimRequest] = scheduler_for(
            setups, dev, memory_total_bytes=prof.device_memory_bytes
        )
        dev.sched = sched
        spec = llm.engine.merged(d.engine)
        setup = engine_setup(spec, prof, min(tpots) / 1e3 if tpots else None)
        host = sched.add_engine(llm.model, setup, 0.0, spec.num_blocks, llm.priority)
        kv = host.engine.kv
        run.kv_blocks = kv.num_blocks
        view = router.add_engine(
            d.name, [llm.model], prof, kv.num_blocks, kv.block_tokens,
            setup.max_num_seqs, setup.max_num_batched_tokens,
        )  # fmt: skip
        devices[d.name] = _PoolDevice(d.name, dev, sched, view, run)
        out.devices[d.name] = run
        out.routed[d.name] = 0
    block_tokens = {p.name: p.view.block_tokens for p in devices.values()}
    bt = next(iter(block_tokens.values()))
    if any(b != bt for b in block_tokens.values()):
        raise KeyError("devices: every engine of one pool must use the same block size")

    def first(r: LlmSimRequest, seen: float, cached: int | None) -> None:
        loop.at(seen, _first, (r.request_id, cached))

    def _first(arg: tuple[int, int | None]) -> None:
        router.first_token(arg[0], loop.now, arg[1])

    def finished(r: LlmSimRequest) -> None:
        rec = r.record
        assert rec is not None
        t = rec.finished_s if rec.finished_s is not None else loop.now
        loop.at(t, _done, (r.request_id, rec.output_tokens, r.user))

    end = doc.duration_s

    def _done(arg: tuple[int, int, LlmUser | None]) -> None:
        rid, n_out, user = arg
        router.done(rid, loop.now, n_out)
        if user is not None:
            t = loop.now + user.think_s()
            if t < end:
                loop.at(t, send_user, user)

    for p in devices.values():
        p.dev.on_first = first
        p.dev.on_finish = finished

    def offer(r: LlmRequest, wl: str, user: LlmUser | None) -> None:
        now = loop.now
        rid = next(ids)
        rec = r.record()  # due at its arrival time (later than now only with a jitter)
        rec.request_id = rid
        rec.token_times_s = []
        out.records.append(rec)
        out.workload_of[rid] = wl
        info = LlmRequestInfo(
            request_id=rid, model=r.model, arrival_s=now, prompt_tokens=len(r.prompt_ids),
            max_tokens=r.max_tokens, prefix_hashes=prompt_hashes(r.prompt_ids, bt),
            priority=r.priority, ttft_target_s=r.ttft_target_s, tpot_target_s=r.tpot_target_s,
        )  # fmt: skip
        decision = router.route(info, now)
        q = LlmSimRequest(rid, r.model, now, r.priority, None, 1, record=rec, user=user)
        if decision.engine is None:
            out.refused += 1
            rec.outcome = decision.reason or "refused"
            rec.finished_s = now
            if user is not None:
                t = now + user.think_s()
                if t < end:
                    loop.at(t, send_user, user)
            return
        p = devices[decision.engine.name]
        out.routed[p.name] += 1
        out.engine_of[rid] = p.name
        if decision.ttft_s is not None:
            out.predicted_ttft[rid] = decision.ttft_s
        router.sent(info, p.view, now)
        why = p.sched.offer_generation(q, GenSpec(r.prompt_ids, r.max_tokens, r.ignore_eos), now)
        if why is not None:
            p.dev.refused(q, why)

    wl_of_user: dict[int, str] = {}

    def send_user(u: LlmUser) -> None:
        offer(u.next_request(loop.now), wl_of_user[id(u)], u)

    for k, (name, wl) in enumerate(sc.workloads):
        if wl.closed_loop:
            for u in llm_users(wl, seed + 1000 * k):
                wl_of_user[id(u)] = name
                loop.at(u.think_s(), send_user, u)
        else:
            wspec = wl if a.rate_scale == 1.0 else _scaled(wl, a.rate_scale)
            late = None
            if arrival_jitter_s > 0:
                late = functools.partial(
                    random.Random(f"{jitter_seed}:{name}").uniform, 0.0, arrival_jitter_s
                )
            it = iter_llm_open_loop(wspec, seed + 1000 * k, end)
            _open_loop(it, loop, offer, name, late)

    for d in doc.devices:
        p = devices[d.name]
        for m in d.classic:
            c = classic_by_model[m]
            hosts = sum(1 for x in doc.devices if m in x.classic)
            classic_stream(
                c.model, c.priority, c.rate_rps / hosts, f"classic:{c.model}:{p.name}", loop,
                p.sched, p.run.classic[c.model], seed, end, ids,
            )  # fmt: skip

    drain_end = doc.duration_s + doc.drain_s

    def scrape(_: Any) -> None:
        now = loop.now
        for p in devices.values():
            e = p.sched.engines[llm.model].engine
            s = EngineSample(
                taken_s=now, running=e.num_running, waiting=e.num_waiting,
                kv_usage=e.kv.usage(), queued_prompt_tokens=e.queued_prompt_tokens,
                preemptions=e.counters.preemptions, kv_blocks=e.kv.num_blocks,
                block_tokens=e.kv.block_tokens,
            )  # fmt: skip
            if stale_s > 0:
                loop.at(now + stale_s, _observe, (p.name, s))
            else:
                router.observe(p.name, s, now)
        nxt = now + scrape_s
        if nxt < end or (nxt < drain_end and router.in_flight()):
            loop.at(nxt, scrape)

    def _observe(arg: tuple[str, EngineSample]) -> None:
        router.observe(arg[0], arg[1], loop.now)

    loop.at(0.0, scrape)
    loop.run(doc.duration_s)
    while loop.heap:
        t = loop.heap[0][0]
        if t > drain_end:
            break
        if router.in_flight() == 0 and all(p.sched.idle for p in devices.values()):
            break
        loop.run(t)
    out.end_s = loop.now
    mark_unfinished(out.records)
    for p in devices.values():
        host = p.sched.engines[llm.model]
        p.run.preemptions += host.engine.counters.preemptions
        p.run.prefix_query_tokens += host.engine.kv.query_tokens
        p.run.prefix_hit_tokens += host.engine.kv.hit_tokens
        p.run.end_s = out.end_s
    return out


def _scaled(wl: Any, scale: float) -> Any:
    return wl.model_copy(update={"rate_rps": wl.rate_rps * scale})


def _open_loop(
    it: Iterator[LlmRequest],
    loop: EventLoop,
    offer: Any,
    name: str,
    late: Callable[[], float] | None = None,
) -> None:
    """Each request of ``it`` offered at its arrival time (plus ``late()``, in order)."""

    def at(r: LlmRequest) -> None:
        t = r.arrival_s
        if late is not None:
            t = max(loop.now, t + late())
        loop.at(t, arrive, r)

    def arrive(r: LlmRequest) -> None:
        offer(r, name, None)
        nxt = next(it, None)
        if nxt is not None:
            at(nxt)

    first = next(it, None)
    if first is not None:
        at(first)


# -- figures ---------------------------------------------------------------------------------


@dataclass
class PoolFigures:
    """An arm's figures: the LLM's overall and per workload, each classic model's, each
    device's."""

    arm: str
    routing: str
    llm: LlmSummary
    by_workload: dict[str, LlmSummary]
    classic: dict[str, dict[str, Any]]
    devices: dict[str, dict[str, Any]]
    refused_by_router: int
    #: Among the completed requests with a TTFT target (``ttft_over_target``): the largest
    #: TTFT over its target, how many went over, how many there were.
    admitted: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "arm": self.arm,
            "routing": self.routing,
            "llm": self.llm.to_dict(),
            "by_workload": {k: v.to_dict() for k, v in self.by_workload.items()},
            "classic": self.classic,
            "devices": self.devices,
            "refused_by_router": self.refused_by_router,
            "admitted": self.admitted,
        }


def ttft_over_target(
    records: Iterable[GenerationRecord], lo: float, hi: float
) -> tuple[float | None, int, int]:
    """Among the completed requests scheduled in ``[lo, hi)`` that have a TTFT target: the
    largest TTFT over its target (None: none), how many were over, how many there were."""
    worst: float | None = None
    over = n = 0
    for r in records:
        if r.outcome != "completed" or not lo <= r.scheduled_s < hi or r.ttft_target_s is None:
            continue
        t = r.ttft_s
        if t is None:
            continue
        n += 1
        x = t / r.ttft_target_s
        worst = x if worst is None else max(worst, x)
        over += x > 1.0
    return worst, over, n


def summarize_pool_arm(sc: LlmPoolScenario, run: PoolRun) -> PoolFigures:
    """An arm's figures (``report.llm_summary`` for the LLM; classic goodput within SLO)."""
    from evenserve.policy.registry import spec_label

    doc = sc.doc
    lo, hi = doc.warmup_s, doc.duration_s
    preempt = sum(r.preemptions for r in run.devices.values())
    llm = summarize_generations(run.records, arm=run.arm, window=(lo, hi), preemptions=preempt)
    by_wl: dict[str, LlmSummary] = {}
    for name, _ in sc.workloads:
        recs = [r for r in run.records if run.workload_of.get(r.request_id) == name]
        if recs:
            by_wl[name] = summarize_generations(recs, arm=run.arm, window=(lo, hi))
    classic: dict[str, dict[str, Any]] = {}
    for c in doc.classic:
        reqs = [r for dr in run.devices.values() for r in dr.classic.get(c.model, [])]
        classic[c.model] = classic_figures(reqs, c.slo_ms / 1e3, lo, hi)
    devices: dict[str, dict[str, Any]] = {}
    for name, dr in run.devices.items():
        devices[name] = {
            "routed": run.routed.get(name, 0),
            "utilization": dr.busy_s / run.end_s if run.end_s else None,
            "kv_usage": dr.kv_usage_s / dr.step_s if dr.step_s else None,
            "kv_blocks": dr.kv_blocks,
            "preemptions": dr.preemptions,
            "prefix_cache_hit_rate": (
                dr.prefix_hit_tokens / dr.prefix_query_tokens if dr.prefix_query_tokens else None
            ),
        }
    worst, over, n = ttft_over_target(run.records, lo, hi)
    admitted = {"worst_ttft_over_target": worst, "over_target": over, "with_target": n}
    return PoolFigures(
        run.arm, spec_label(doc.arms[run.arm].routing), llm, by_wl, classic, devices,
        run.refused, admitted,
    )  # fmt: skip


def ttft_p90_s(s: LlmSummary) -> float:
    """TTFT P90 over the completed requests (inf when none completed)."""
    return math.inf if s.ttft_s.p90 is None else s.ttft_s.p90
