"""predicted-ttft keeps each engine's request-independent terms until the router changes the
engine (``EngineView.memo``): its decisions and predictions must be exactly those of the
prediction computed afresh (``predicted.predict`` for every engine, the choice made as before
the terms were kept), whatever the router was told in between."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from evenserve.core.llm import StepProfile
from evenserve.policy.llm_routing import (
    EngineSample,
    EngineView,
    LlmDecision,
    LlmRequestInfo,
    LlmRouter,
)
from evenserve.policy.llm_routing.predicted import (
    REFUSED,
    PredictedTtft,
    PredictedTtftParams,
    predict,
)

H100 = StepProfile(
    model="m", device="h100", runtime="vllm", precision="bf16", source="test",
    c0_s=5.75e-3, prefill_s_per_token=2**-16, decode_s_per_seq=6e-6, kv_s_per_token=1e-8,
    cpu_s_per_output_token=1e-4, weights_bytes=16e9, kv_bytes_per_token=131072,
    device_memory_bytes=80e9,
)  # fmt: skip
A100 = replace(H100, device="a100", c0_s=16.4e-3, prefill_s_per_token=2**-15)
SLOW = replace(H100, device="slow", c0_s=30e-3, prefill_s_per_token=120e-6, kv_s_per_token=0.0)
#: Twins: ties in cost, broken by the rotation (a power of two a prefill token: a cost of
#: uncached tokens and one of fewer plus the blocks it evicts are equal floats too).
PROFILES: list[StepProfile | None] = [H100, H100, A100, A100, SLOW, None]


class Fresh:
    """predicted-ttft's choice with every prediction computed afresh by ``predict``."""

    prefix_room = True  # as predicted-ttft's: the router gives both the same blocks

    def __init__(self, params: PredictedTtftParams) -> None:
        self.params = params
        self._start = 0

    def choose(
        self,
        request: LlmRequestInfo,
        engines: Sequence[EngineView],
        prefix_blocks: Mapping[int, int],
        now_s: float,
    ) -> LlmDecision:
        p = self.params
        n = len(engines)
        preds = [predict(v, request, prefix_blocks.get(v.index, 0), p, now_s) for v in engines]
        target_tpot = request.tpot_target_s
        keeps = [not pr.breaks_promise for pr in preds]
        if not any(keeps):
            return LlmDecision(None, preds[0].ttft_s, preds[0].tpot_s, REFUSED, 1.0)
        ok = [k and (target_tpot is None or pr.tpot_s <= target_tpot)
              for k, pr in zip(keeps, preds, strict=True)]  # fmt: skip
        if not any(ok):
            ok = keeps
        self._start = (self._start + 1) % n
        target = request.ttft_target_s
        best_i = -1
        if target is not None and p.headroom > 0:
            limit = target * p.headroom
            best_cost = math.inf
            for k in range(n):
                i = (self._start + k) % n
                pr = preds[i]
                if ok[i] and pr.ttft_s + pr.risk_s <= limit and pr.cost_s < best_cost:
                    best_cost, best_i = pr.cost_s, i
        if best_i < 0:
            best = math.inf
            for k in range(n):
                i = (self._start + k) % n
                if not ok[i]:
                    continue
                key = preds[i].ttft_s + preds[i].risk_s
                if key < best:
                    best, best_i = key, i
        pr = preds[best_i]
        if target is not None and p.refuse_over > 0 and pr.ttft_s > target * p.refuse_over:
            return LlmDecision(None, pr.ttft_s, pr.tpot_s, REFUSED, max(0.0, pr.ttft_s - target))
        return LlmDecision(engines[best_i], pr.ttft_s, pr.tpot_s)


def _names(group: int, shared: int, own: int, length: int) -> tuple[int, ...]:
    """Block names: a group's first ``shared`` ones, then the prompt's own (``own``)."""
    return tuple(
        hash(("g", group, j)) if j < shared else hash(("o", group, own, j)) for j in range(length)
    )


def _pair(
    kv_blocks: Sequence[int], params: PredictedTtftParams
) -> tuple[LlmRouter, LlmRouter, PredictedTtft]:
    kept = PredictedTtft(params)
    routers = (
        LlmRouter(kept, prefix_max_blocks=64),
        LlmRouter(Fresh(params), prefix_max_blocks=64),
    )
    for r in routers:
        for i, (prof, kv) in enumerate(zip(PROFILES, kv_blocks, strict=True)):
            r.add_engine(f"e{i}", ["m"], prof, kv, 16, 8, 512)
    return routers[0], routers[1], kept


def _same(a: LlmDecision, b: LlmDecision) -> None:
    assert (a.engine and a.engine.name) == (b.engine and b.engine.name)
    assert (a.ttft_s, a.tpot_s, a.reason, a.retry_after_s) == (
        b.ttft_s,
        b.tpot_s,
        b.reason,
        b.retry_after_s,
    )


def _drive(seed: int, kv_blocks: Sequence[int], params: PredictedTtftParams, n_ops: int) -> int:
    """Random calls to a router that keeps the terms and one that does not, the same on
    both; every decision and every engine's prediction compared. Returns the decisions."""
    rng = random.Random(seed)
    kept_r, fresh_r, kept = _pair(kv_blocks, params)
    now = 0.0
    flight: list[int] = []
    decisions = 0
    for rid in range(n_ops):
        x = rng.random()
        if x < 0.5:
            now += rng.choice([0.0, 0.0, 0.001, 0.004, 0.02, 0.1, 0.5, 2.0, 7.0])
            prompt = rng.choice([1, 16, rng.randrange(1, 400), rng.randrange(400, 4000)])
            names = _names(rng.randrange(3), rng.randrange(60), rng.randrange(6), prompt // 16)
            info = LlmRequestInfo(
                rid, "m", now, prompt, rng.choice([0, 1, 2, rng.randrange(400)]),
                names if rng.random() < 0.8 else (), rng.choice([0, 5, 10, 10]),
                rng.choice([None, 0.05, 0.3, 1.0, 5.0]), rng.choice([None, 0.005, 0.02, 0.05]),
            )  # fmt: skip
            subset = rng.randrange(64) if rng.random() < 0.3 else 0
            cands = [kept_r.engines[f"e{i}"] for i in range(6) if subset >> i & 1] or None
            fresh_c = None if cands is None else [fresh_r.engines[v.name] for v in cands]
            a = kept_r.route(info, now, cands)
            b = fresh_r.route(info, now, fresh_c)
            _same(a, b)
            decisions += 1
            engines = kept_r.candidates("m") if cands is None else cands
            blocks = kept_r.prefix.match(info.prefix_hashes) if info.prefix_hashes else {}
            got = kept.predictions(info, engines, blocks, now)
            want = [predict(v, info, blocks.get(v.index, 0), params, now) for v in engines]
            assert got == want
            # Sent where it was refused too (another driver's choice): loads the engines.
            to = a.engine or (engines[rid % len(engines)] if rng.random() < 0.3 else None)
            if to is not None and rng.random() < 0.9:
                kept_r.sent(info, to, now)
                fresh_r.sent(info, fresh_r.engines[to.name], now)
                flight.append(rid)
        elif x < 0.65 and flight:
            now += rng.choice([0.001, 0.01, 0.1, 1.0])
            rid_ = rng.choice(flight)
            cached = rng.choice([None, 0, rng.randrange(3000)])
            for r in (kept_r, fresh_r):
                r.first_token(rid_, now, cached)
        elif x < 0.77 and flight:
            now += rng.choice([0.001, 0.01, 0.1, 1.0])
            rid_ = flight.pop(rng.randrange(len(flight)))
            n_out = rng.choice([None, 1, rng.randrange(400)])
            cached = rng.choice([None, rng.randrange(3000)])
            for r in (kept_r, fresh_r):
                r.done(rid_, now, n_out, cached)
        elif x < 0.9:
            e = f"e{rng.randrange(6)}"
            age = rng.choice([0.0, 0.05, 0.5, 3.0, -1.0])  # -1: older than the one held
            running, waiting = rng.randrange(40), rng.randrange(40)
            kv = rng.choice([None, rng.random()])
            queued = rng.choice([None, rng.randrange(20000)])
            for r in (kept_r, fresh_r):
                v = r.engines[e]
                held = v.sample.taken_s if v.sample is not None else 0.0
                taken = held - 1.0 if age < 0 else max(0.0, now - age)
                r.observe(e, EngineSample(taken, running, waiting, kv, queued), now)
        elif x < 0.94:
            e = f"e{rng.randrange(6)}"
            for r in (kept_r, fresh_r):
                r.forget_corrections(e)
        else:
            # A driver changing a view's profile and batch limits by hand, then an older
            # sample (the gateway does so with a worker's report).
            e = f"e{rng.randrange(6)}"
            prof = rng.choice([H100, A100, SLOW])
            seqs, budget = rng.randrange(1, 64), rng.choice([64, 512, 2048])
            for r in (kept_r, fresh_r):
                v = r.engines[e]
                if v.profile is not None:
                    v.profile = prof
                v.max_num_seqs, v.max_num_batched_tokens = seqs, budget
                held = v.sample.taken_s if v.sample is not None else 0.0
                r.observe(e, EngineSample(held - 1.0, 0, 0), now)
    return decisions


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    st.integers(0, 2**32 - 1),
    st.lists(st.integers(8, 600), min_size=6, max_size=6),
    st.sampled_from([(0.9, 0.5, 1.5), (0.0, 0.0, 0.0), (0.9, 0.5, 0.5), (2.0, 1.0, 1.5)]),
)
def test_kept_terms_decide_and_predict_exactly_as_fresh_ones(
    seed: int, kv_blocks: list[int], knobs: tuple[float, float, float]
) -> None:
    refuse_over, headroom, protect_over = knobs
    params = PredictedTtftParams(
        refuse_over=refuse_over, headroom=headroom, protect_over=protect_over
    )
    assert _drive(seed, kv_blocks, params, 300) > 100


def test_a_kept_term_goes_when_the_router_changes_the_engine() -> None:
    """The memo is what makes decisions cheap; the router must drop it at each change."""
    r = LlmRouter(PredictedTtft(PredictedTtftParams()))
    v = r.add_engine("e0", ["m"], H100, 4096, 16, 256, 512)
    info = LlmRequestInfo(0, "m", 0.0, 1000, 100, (), 10, 1.0, 0.05)
    r.route(info, 0.0)
    assert v.memo is not None and 10 in v.memo
    r.sent(info, v, 0.0)
    assert v.memo is None
    for change in (
        lambda: r.first_token(0, 0.1),
        lambda: r.done(0, 0.2, 50),
        lambda: r.observe("e0", EngineSample(0.2, 1, 1), 0.3),
        lambda: r.forget_corrections("e0"),
    ):
        r.route(replace(info, request_id=9), 0.3)
        assert v.memo is not None
        change()
        assert v.memo is None


def test_the_terms_fields_choose_reads_by_position_are_where_it_reads_them() -> None:
    from evenserve.policy.llm_routing.predicted import _Terms

    assert (_Terms._fields[0], _Terms._fields[2], _Terms._fields[19]) == (
        "params",
        "block_tokens",
        "per_token",
    )
