"""``predicted-ttft``: each engine's time to first token and per output token predicted from
its step profile, its queued and running work and the request's uncached tokens; the soonest
first token that keeps the TPOT target, the risk of preemption priced, early refusal.

The prediction, for request r on engine e (design note 0020 derives it):
- ``u`` = r's prompt tokens less the leading blocks the router's prefix index says e holds
  and can still hold (at least 1): those a request of the router's in flight there shares,
  and of the rest no more than e's free blocks (``LlmRouter._surviving``: a cached block
  nobody uses lives only in them, and goes first when the running sequences grow);
  ``Q`` = prompt tokens waiting at e that it serves before r (r's class and higher; the
  router's own count plus what e's last sample added); ``R`` = running sequences
  (capped at e's ``max_num_seqs``); ``K`` = KV tokens they read per step.
- A step takes ``step(p, d, k) = c0 + c_p p + c_d d + c_kv k`` (e's step profile); while
  prompts wait, every step is full: its ``d = R`` decodes and ``P = max(1, B - R)`` prompt
  tokens (``B``: e's ``max_num_batched_tokens``: decodes take their token of the budget
  first). r's first token comes after ``n = ceil((Q + u) / P)`` steps, the last one
  carrying the remainder, plus half a step (the step running at the send) and the CPU per
  output token: ``TTFT = (n - 1) step(P, R, K) + step(rem, R, K) + step(P, R, K) / 2 + cpu``
  (the half step only when e is busy). Classes above r's keep taking the budget while r
  waits: the wait is divided by ``1 - (their token rate x step / P)``.
- KV admission: when the KV held, the prompts ahead, r's uncached prompt and half its
  output pass ``kv_admit`` of e's capacity, r also waits for sequences to finish: the
  excess over the rate the held tokens free (held / a sequence's life: the mean
  ``max_tokens`` in flight x TPOT).
- Per output token: a decode step of ``R + 1`` sequences, stretched by the prompt tokens the
  router keeps sending e (``rate``: uncached tokens per second, ``router.sent``): a step of
  length t carries ``rate x t`` prompt tokens, so ``t = step(0, R+1, K+u) / (1 - c_p rate)``
  (``c_p rate`` capped at ``max_prefill_share``); and at least the mean over the steps that
  drain the prompts waiting now (full steps, then decode steps).
- Device time (``cost``): the request's uncached tokens x ``c_p``, plus as many again for
  the named blocks it brings when the router's index says the engine's cache is full (they
  evict others' blocks, which are prefilled again later).
- Preemption risk: ``over`` = (tokens the in-flight requests will hold at most, the prefix
  blocks they share, the others' KV, r's uncached prompt and ``max_tokens``) / e's KV
  capacity - ``kv_risk_threshold``;
  when positive, the TTFT is priced up by ``risk_weight x over x (TPOT x max_tokens)``:
  a preempted sequence recomputes, and the fuller e's blocks, the likelier.
- An engine without a step profile (a foreign server) uses what the router learned of it:
  ``TTFT = base + (Q + u) x seconds per token``, ``TPOT`` its observed mean.

``K`` and the KV held are the router's own count (uncached prompts and half the outputs of
its sequences running there, the cached prefix blocks they share counted once) plus the
correction of e's last sample.

The choice: among the engines whose predicted TPOT meets r's target (all of them when none
does or r has none), those predicted to give the first token within ``headroom`` x r's TTFT
target compete on device time (the prefix cache, the faster device: what leaves most
capacity to the requests that come next); when none is, the smallest priced TTFT wins
(ties: the first at or after a rotating start). An engine where r would push an admitted
request of a lower class past ``protect_over`` x its target is out; none left: refused.
If that TTFT is over r's TTFT target x ``refuse_over``, r is refused (``ttft-unreachable``)
with a retry after the predicted excess: no engine can give it its first token in time, and
admitting it would only delay the requests that can.

Decision time: ``predict`` is the prediction as stated; ``choose`` computes the same floats by
the same operations from each engine's terms that do not depend on the request (``_terms``:
its queued tokens by class, step times, KV figures, undecayed sent rates, promises), kept in
``EngineView.memo`` by class until the router changes the engine, so a request costs only its
own part per engine (its uncached tokens, the rates' decay to now). It then predicts in full
only the engines that can be its answer: in order of the least device time r can cost each
(its uncached tokens x ``c_p``) while one within the headroom may be, else in order of the
soonest first token each can give (the wait before the higher classes' share, the KV wait
and the risk), each time until none left can beat or tie the best found; when that finds
none, every engine is predicted and the choice made as stated. The decisions are those of
``predict`` on every engine (a seeded test drives both with the same calls).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from pydantic import Field

from evenserve.policy.llm_routing.base import (
    LLM_ROUTING,
    EngineView,
    LlmDecision,
    LlmRequestInfo,
)
from evenserve.policy.registry import PolicyParams

REFUSED = "ttft-unreachable"


class PredictedTtftParams(PolicyParams):
    #: Refuse when the best predicted TTFT is over the target x this (0: never refuse).
    refuse_over: float = Field(default=0.9, ge=0)
    #: Engines predicted to give the first token within the TTFT target x this compete on
    #: the device time the request costs them (its uncached prompt: the prefix cache, the
    #: faster device); 0: always the soonest first token.
    headroom: float = Field(default=0.5, ge=0, le=1)
    kv_risk_threshold: float = Field(default=0.9, gt=0)
    #: The fraction of KV capacity past which a request waits for blocks to free.
    kv_admit: float = Field(default=0.95, gt=0, le=1)
    #: An admitted request of a lower class keeps its first token within this x its TTFT
    #: target: a request that would push the oldest one waiting past it goes elsewhere, or
    #: is refused (0: no such promise).
    protect_over: float = Field(default=1.5, ge=0)
    risk_weight: float = Field(default=1.0, ge=0)
    #: The most of a step's time the prompt tokens may take in the TPOT prediction.
    max_prefill_share: float = Field(default=0.9, gt=0, lt=1)
    #: For an engine without a profile and nothing learned yet.
    default_base_s: float = Field(default=0.05, gt=0)
    default_s_per_token: float = Field(default=50e-6, gt=0)
    default_tpot_s: float = Field(default=0.02, gt=0)


class Prediction(NamedTuple):
    ttft_s: float
    tpot_s: float
    #: What the preemption risk adds to the TTFT when choosing, seconds.
    risk_s: float
    #: Sending r here would push an admitted lower-class request past its promise.
    breaks_promise: bool
    #: Device seconds the request's prefill costs there (its uncached tokens).
    cost_s: float


def predict(
    v: EngineView, r: LlmRequestInfo, cached_blocks: int, p: PredictedTtftParams, now: float
) -> Prediction:
    """r on v (module docstring)."""
    u = r.prompt_tokens - cached_blocks * v.block_tokens
    if u < 1:
        u = 1
    prio = r.priority
    ahead = v.extra_waiting_tokens
    for c, t in v.own_waiting_tokens_by_class.items():
        if c >= prio:
            ahead += t
    prof = v.profile
    out = r.max_tokens if r.max_tokens > 1 else 1
    held = v.own_context_tokens + v.own_shared_tokens + v.extra_kv_tokens
    # The router's recent sends here, all classes and the classes above r's.
    rate = higher = 0.0
    rates = v.sent_tokens_per_s
    if rates:
        for c, x in rates.items():
            rate += x
            if c > prio:
                higher += x
        dt = now - v.rate_at_s
        if dt > 0:
            k = math.exp(-dt / v.rate_tau_s)
            rate *= k
            higher *= k
    share_cap = p.max_prefill_share
    if prof is None:
        base = v.learned_base_s if v.learned_base_s is not None else p.default_base_s
        per_token = (
            v.learned_s_per_token if v.learned_s_per_token is not None else p.default_s_per_token
        )
        ttft = base + (ahead + u) * per_token
        tpot = v.learned_tpot_s if v.learned_tpot_s is not None else p.default_tpot_s
        rate_tok = 1.0 / per_token if per_token > 0 else math.inf  # learned 0: no bound
        breaks = _breaks_promise(v, r, u, rate_tok, p, now)
    else:
        c0, cp, cd, ckv = (
            prof.c0_s,
            prof.prefill_s_per_token,
            prof.decode_s_per_seq,
            prof.kv_s_per_token,
        )
        per_token = cp
        running = v.own_running + v.extra_running
        if running > v.max_num_seqs:
            running = v.max_num_seqs
        budget = v.max_num_batched_tokens
        per_step = budget - running if budget > running else 1
        fixed = c0 + cd * running + ckv * held
        full = fixed + cp * per_step
        work = ahead + u
        n = -(-work // per_step)
        wait = (n - 1) * full + fixed + cp * (work - (n - 1) * per_step)
        if running or ahead:
            wait += full / 2
        # Higher classes sent here keep taking the prefill budget while r waits.
        if higher > 0:
            wait /= 1.0 - min(share_cap, higher * full / per_step)
        ttft = wait + prof.cpu_s_per_output_token
        breaks = _breaks_promise(v, r, u, per_step / full, p, now) if v.own_deadlines else False
        d = running + 1
        decode = c0 + cd * d + ckv * (held + u)
        tpot = decode / (1.0 - min(share_cap, cp * rate))
        backlog = v.own_waiting_tokens + v.extra_waiting_tokens - ahead
        if backlog > 0 and out > 1:
            per2 = budget - d if budget > d else 1
            nb = min(out - 1, -(-backlog // per2))
            drain = (nb * (decode + cp * per2) + (out - 1 - nb) * decode) / (out - 1)
            if drain > tpot:
                tpot = drain
    # KV admission: the engine takes r in when its blocks allow; past ``kv_admit`` of them
    # r waits for running sequences to finish and free theirs.
    cap = v.kv_blocks * v.block_tokens
    risk = 0.0
    if cap > 0:
        excess = held + ahead + u + out / 2 - p.kv_admit * cap
        if excess > 0 and held > 0:
            n_own = v.own_waiting + v.own_running
            mean_out = v.own_out_tokens / n_own if n_own else out
            life = max(1.0, mean_out) * tpot
            if life > 0:  # a learned TPOT of 0: sequences free their blocks at once
                ttft += excess / (held / life)
        committed = (
            v.own_committed_tokens + v.own_shared_tokens + v.extra_kv_tokens + u + r.max_tokens
        )
        over = committed / cap - p.kv_risk_threshold
        if over > 0:
            risk = p.risk_weight * over * tpot * out
    cost = u * per_token
    # Named blocks it brings evict as many others' when the engine's cache is full: those
    # are prefilled again later.
    new = len(r.prefix_hashes) - cached_blocks
    if new > 0 and v.prefix_held + new > v.prefix_capacity:
        cost += new * v.block_tokens * per_token
    return Prediction(ttft, tpot, risk, breaks, cost)


def _breaks_promise(
    v: EngineView, r: LlmRequestInfo, u: int, tokens_per_s: float, p: PredictedTtftParams,
    now: float,
) -> bool:  # fmt: skip
    """Whether r's ``u`` prompt tokens, served before every lower class at v, push the
    oldest waiting request of a lower class past ``protect_over`` x its TTFT target."""
    over = p.protect_over
    if over <= 0:
        return False
    prio = r.priority
    by_class = v.own_waiting_tokens_by_class
    for c, waiting in v.own_deadlines.items():
        if c >= prio or not waiting:
            continue
        sent, target, own = next(iter(waiting.values()))
        before = own + u
        for k, t in by_class.items():
            if k > c:
                before += t
        if now + before / tokens_per_s > sent + over * target:
            return True
    return False


#: An engine's terms of ``predict`` that do not depend on the request, the clock or more
#: than the request's class (``_terms``; field names as ``predict``'s locals).
class _Terms(NamedTuple):
    params: PredictedTtftParams
    profiled: bool
    block_tokens: int
    ahead: int
    held: int
    #: held + ahead
    held_ahead: int
    #: With a profile: the prompt tokens of a full step, its fixed part and its whole time,
    #: half of it when the engine is busy (else 0.0), the profile's figures ...
    per_step: int
    fixed: float
    full: float
    half: float
    cp: float
    ckv: float
    cpu: float
    #: ... c0 + c_d (R + 1), the prompts waiting after r's class, a full step's prompt tokens
    #: beside R + 1 decodes and their time.
    decode0: float
    backlog: int
    per2: int
    cp_per2: float
    #: Without a profile: what the router learned (or the defaults).
    base: float
    tpot: float
    #: Either: seconds per uncached prompt token (``cost``) and prompt tokens per second
    #: (``_breaks_promise``).
    per_token: float
    tokens_per_s: float
    #: The router's sent-token rates, all classes and those above r's, not decayed, whether
    #: any, since when, their time constant.
    rate: float
    higher: float
    has_rates: bool
    rate_at_s: float
    rate_tau_s: float
    cap: int
    admit_cap: float
    n_own: int
    mean_out: float
    committed: int
    prefix_held: int
    prefix_capacity: int
    #: ``_breaks_promise`` less r's tokens: for each lower class with a request waiting, its
    #: oldest one's own tokens and those of the classes above it, and its deadline (sent +
    #: ``protect_over`` x its target); r breaks a promise when ``now + (before + u) /
    #: tokens_per_s`` passes one.
    promises: tuple[tuple[int, float], ...]


def _terms(v: EngineView, prio: int, p: PredictedTtftParams) -> _Terms:
    """``predict``'s terms for class ``prio`` at ``v`` that hold until the view changes: the
    same figures by the same operations in the same order, so the floats are equal."""
    ahead = v.extra_waiting_tokens
    for c, t in v.own_waiting_tokens_by_class.items():
        if c >= prio:
            ahead += t
    prof = v.profile
    held = v.own_context_tokens + v.own_shared_tokens + v.extra_kv_tokens
    rate = higher = 0.0
    rates = v.sent_tokens_per_s
    for c, x in rates.items():
        rate += x
        if c > prio:
            higher += x
    per_step = per2 = backlog = 0
    fixed = full = half = cp = ckv = cpu = decode0 = cp_per2 = base = tpot = 0.0
    if prof is None:
        base = v.learned_base_s if v.learned_base_s is not None else p.default_base_s
        per_token = (
            v.learned_s_per_token if v.learned_s_per_token is not None else p.default_s_per_token
        )
        tokens_per_s = 1.0 / per_token if per_token > 0 else math.inf  # learned 0: no bound
        tpot = v.learned_tpot_s if v.learned_tpot_s is not None else p.default_tpot_s
    else:
        c0, cp, cd, ckv = (
            prof.c0_s,
            prof.prefill_s_per_token,
            prof.decode_s_per_seq,
            prof.kv_s_per_token,
        )
        per_token = cp
        cpu = prof.cpu_s_per_output_token
        running = v.own_running + v.extra_running
        if running > v.max_num_seqs:
            running = v.max_num_seqs
        budget = v.max_num_batched_tokens
        per_step = budget - running if budget > running else 1
        fixed = c0 + cd * running + ckv * held
        full = fixed + cp * per_step
        if running or ahead:
            half = full / 2
        tokens_per_s = per_step / full
        d = running + 1
        decode0 = c0 + cd * d
        backlog = v.own_waiting_tokens + v.extra_waiting_tokens - ahead
        per2 = budget - d if budget > d else 1
        cp_per2 = cp * per2
    cap = v.kv_blocks * v.block_tokens
    n_own = v.own_waiting + v.own_running
    promises = []
    over = p.protect_over
    if over > 0:
        by_class = v.own_waiting_tokens_by_class
        for c, waiting in v.own_deadlines.items():
            if c >= prio or not waiting:
                continue
            sent, target, before = next(iter(waiting.values()))
            for k, t in by_class.items():
                if k > c:
                    before += t
            promises.append((before, sent + over * target))
    return _Terms(
        p, prof is not None, v.block_tokens, ahead, held, held + ahead, per_step, fixed, full,
        half, cp, ckv, cpu, decode0, backlog, per2, cp_per2, base, tpot, per_token,
        tokens_per_s, rate, higher, bool(rates), v.rate_at_s, v.rate_tau_s, cap,
        p.kv_admit * cap, n_own, v.own_out_tokens / n_own if n_own else -1.0,
        v.own_committed_tokens + v.own_shared_tokens + v.extra_kv_tokens, v.prefix_held,
        v.prefix_capacity,
        tuple(promises),
    )  # fmt: skip


def _terms_of(v: EngineView, prio: int, p: PredictedTtftParams) -> _Terms:
    """``v``'s terms for class ``prio``, kept in its ``memo`` until the router changes it."""
    memo = v.memo
    if memo is None:
        memo = v.memo = {}
    t: _Terms | None = memo.get(prio)
    if t is None or t[0] is not p:
        t = memo[prio] = _terms(v, prio, p)
    return t


#: What ``_predict_one`` needs of the request and the policy: r's ``max_tokens``, that at
#: least 1 and half of it, its block names' count, the clock, the prefill share's cap, the
#: risk threshold and weight.
_Ask = tuple[int, int, float, int, float, float, float, float]

#: ttft, tpot, risk, breaks its promise, cost (``Prediction``'s fields).
_Pred = tuple[float, float, float, bool, float]


def _ask(r: LlmRequestInfo, p: PredictedTtftParams, now: float) -> _Ask:
    out = r.max_tokens if r.max_tokens > 1 else 1
    return (r.max_tokens, out, out / 2, len(r.prefix_hashes), now, p.max_prefill_share,
            p.kv_risk_threshold, p.risk_weight)  # fmt: skip


def _predict_one(t: _Terms, u: int, cached: int, ask: _Ask) -> _Pred:
    """``predict(v, r, cached, p, now)`` from v's terms ``t`` for r's class and r's uncached
    tokens ``u``: what depends on r and on the clock only (the decay of the sent rates,
    the promises to waiting requests)."""
    (_, profiled, bt, ahead, held, held_ahead, per_step, fixed, full, half, cp, ckv, cpu,
     decode0, backlog, per2, cp_per2, base, tpot, per_token, tokens_per_s, rate, higher,
     has_rates, rate_at_s, rate_tau_s, cap, admit_cap, n_own, mean_out, committed,
     prefix_held, prefix_capacity, promises) = t  # fmt: skip
    max_tokens, out, half_out, n_hashes, now, share_cap, threshold, weight = ask
    if profiled:
        if has_rates:
            dt = now - rate_at_s
            if dt > 0:
                k = math.exp(-dt / rate_tau_s)
                rate *= k
                higher *= k
        work = ahead + u
        n = -(-work // per_step)
        wait = (n - 1) * full + fixed + cp * (work - (n - 1) * per_step) + half
        if higher > 0:
            x = higher * full / per_step
            wait /= 1.0 - (x if x < share_cap else share_cap)
        ttft = wait + cpu
        decode = decode0 + ckv * (held + u)
        if rate:
            x = cp * rate
            tpot = decode / (1.0 - (x if x < share_cap else share_cap))
        else:
            tpot = decode
        if backlog > 0 and out > 1:
            nb = -(-backlog // per2)
            if nb > out - 1:
                nb = out - 1
            drain = (nb * (decode + cp_per2) + (out - 1 - nb) * decode) / (out - 1)
            if drain > tpot:
                tpot = drain
    else:
        ttft = base + (ahead + u) * per_token
    breaks = False
    for before, deadline in promises:
        if now + (before + u) / tokens_per_s > deadline:
            breaks = True
            break
    risk = 0.0
    if cap > 0:
        excess = held_ahead + u + half_out - admit_cap
        if excess > 0 and held > 0:
            life = max(1.0, mean_out if n_own else out) * tpot
            if life > 0:  # as predict's
                ttft += excess / (held / life)
        over = (committed + u + max_tokens) / cap - threshold
        if over > 0:
            risk = weight * over * tpot * out
    cost = u * per_token
    new = n_hashes - cached
    if new > 0 and prefix_held + new > prefix_capacity:
        cost += new * bt * per_token
    return (ttft, tpot, risk, breaks, cost)


def _soonest(t: _Terms, u: int) -> float:
    """The soonest ``_predict_one(t, u, ...)``'s TTFT can be: before the higher classes'
    share, the KV wait and the risk (each of those adds, and neither a float sum nor a
    division by at most 1 falls), by the same operations."""
    work = t.ahead + u
    if t.profiled:
        per_step = t.per_step
        k = -(-work // per_step) - 1
        return k * t.full + t.fixed + t.cp * (work - k * per_step) + t.half + t.cpu
    return t.base + work * t.per_token


def _predict_all(
    r: LlmRequestInfo,
    engines: Sequence[EngineView],
    prefix_blocks: Mapping[int, int],
    p: PredictedTtftParams,
    now: float,
) -> list[_Pred]:
    """``predict`` for r on each of ``engines`` from their kept terms."""
    ask = _ask(r, p, now)
    out = []
    for v in engines:
        t = _terms_of(v, r.priority, p)
        cached = prefix_blocks.get(v.index, 0)
        u = r.prompt_tokens - cached * t.block_tokens
        out.append(_predict_one(t, u if u > 1 else 1, cached, ask))
    return out


@LLM_ROUTING.register(
    "predicted-ttft",
    PredictedTtftParams,
    "soonest predicted first token that keeps the TPOT target; refuses early",
)
class PredictedTtft:
    #: The router counts an engine's cached prefix as what its free blocks can keep
    #: (``LlmRouter._surviving``).
    prefix_room = True

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
        target = request.ttft_target_s
        prio = request.priority
        prompt = request.prompt_tokens
        ask = _ask(request, p, now_s)
        # Each engine's terms, r's uncached tokens there and the least device time r can
        # cost it (``cost``'s first term: the rest is never negative). Indices into
        # ``_Terms``: 2 block_tokens, 19 per_token.
        terms: list[_Terms] = []
        us: list[int] = []
        cached: list[int] = []
        least: list[float] = []
        soonest: list[float | None] = [None] * n
        for v in engines:
            memo = v.memo
            if memo is None:
                memo = v.memo = {}
            t = memo.get(prio)
            if t is None or t[0] is not p:
                t = memo[prio] = _terms(v, prio, p)
            c = prefix_blocks.get(v.index, 0) if prefix_blocks else 0
            u = prompt - c * t[2]
            if u < 1:
                u = 1
            terms.append(t)
            us.append(u)
            cached.append(c)
            least.append(u * t[19])
        preds: list[_Pred | None] = [None] * n
        start = (self._start + 1) % n
        rotation = itertools.chain(range(start, n), range(start))
        target_tpot = request.tpot_target_s
        if target is not None and p.headroom > 0:
            # The engines in order of that least cost (ties in the rotation's order, which
            # starts one further on for this decision): r's engine is the one of least cost
            # among those that keep their promises and r's TPOT target and give the first
            # token within the headroom; one whose least cost is over the best found cannot
            # be it. None found: the full pass below decides (the TPOT target may be out of
            # every engine's reach, so that any engine within the headroom may be r's).
            order = sorted(rotation, key=least.__getitem__)
            limit = target * p.headroom
            best_cost = math.inf
            best_i = best_rot = -1
            best_pr: _Pred | None = None
            for i in order:
                low = least[i]
                if low > best_cost:
                    break
                rot = i - start if i >= start else i - start + n
                if low == best_cost and rot > best_rot:
                    break
                low = soonest[i] = _soonest(terms[i], us[i])
                if low > limit:
                    continue
                pr = preds[i] = _predict_one(terms[i], us[i], cached[i], ask)
                if (
                    not pr[3]
                    and (target_tpot is None or pr[1] <= target_tpot)
                    and pr[0] + pr[2] <= limit
                    and (pr[4] < best_cost or (pr[4] == best_cost and rot < best_rot))
                ):
                    best_cost, best_i, best_rot, best_pr = pr[4], i, rot, pr
            if best_pr is not None:
                self._start = start
                ttft, tpot = best_pr[0], best_pr[1]
                if p.refuse_over > 0 and ttft > target * p.refuse_over:
                    return LlmDecision(None, ttft, tpot, REFUSED, max(0.0, ttft - target))
                return LlmDecision(engines[best_i], ttft, tpot)
            rotation = itertools.chain(range(start, n), range(start))
        # No engine within the headroom keeps r's TPOT target (each was predicted or cannot
        # be within it): r's engine is the soonest first token (with the risk) among those
        # that keep their promises and r's TPOT target, in order of the soonest each can
        # give, until none left can beat the best found. None found: the full pass decides.
        best_key = math.inf
        best_i = best_rot = -1
        best_pr = None
        soon = [_soonest(terms[i], us[i]) if x is None else x for i, x in enumerate(soonest)]
        for i in sorted(rotation, key=soon.__getitem__):
            low = soon[i]
            if low > best_key:
                break
            rot = i - start if i >= start else i - start + n
            if low == best_key and rot > best_rot:
                break
            q = preds[i]
            if q is None:
                q = preds[i] = _predict_one(terms[i], us[i], cached[i], ask)
            if not q[3] and (target_tpot is None or q[1] <= target_tpot):
                key = q[0] + q[2]
                if key < best_key or (key == best_key and rot < best_rot):
                    best_key, best_i, best_rot, best_pr = key, i, rot, q
        if best_pr is not None:
            self._start = start
            ttft, tpot = best_pr[0], best_pr[1]
            if target is not None and p.refuse_over > 0 and ttft > target * p.refuse_over:
                return LlmDecision(None, ttft, tpot, REFUSED, max(0.0, ttft - target))
            return LlmDecision(engines[best_i], ttft, tpot)
        full = [
            pr if pr is not None else _predict_one(terms[i], us[i], cached[i], ask)
            for i, pr in enumerate(preds)
        ]
        return self._choose(request, engines, full)

    def _choose(
        self, request: LlmRequestInfo, engines: Sequence[EngineView], preds: list[_Pred]
    ) -> LlmDecision:
        """The choice (module docstring) from every engine's prediction."""
        p = self.params
        n = len(engines)
        target_tpot = request.tpot_target_s
        keeps = [not pr[3] for pr in preds]
        if not any(keeps):
            return LlmDecision(None, preds[0][0], preds[0][1], REFUSED, 1.0)
        ok = [k and (target_tpot is None or pr[1] <= target_tpot)
              for k, pr in zip(keeps, preds, strict=True)]  # fmt: skip
        if not any(ok):
            ok = keeps
        self._start = (self._start + 1) % n
        target = request.ttft_target_s
        best_i = -1
        if target is not None and p.headroom > 0:
            # Within the headroom, the engine the request costs least device time on.
            limit = target * p.headroom
            best_cost = math.inf
            for k in range(n):
                i = (self._start + k) % n
                pr = preds[i]
                if ok[i] and pr[0] + pr[2] <= limit and pr[4] < best_cost:
                    best_cost, best_i = pr[4], i
        if best_i < 0:
            best = math.inf
            for k in range(n):
                i = (self._start + k) % n
                if not ok[i]:
                    continue
                key = preds[i][0] + preds[i][2]
                if key < best:
                    best, best_i = key, i
        ttft, tpot = preds[best_i][:2]
        if target is not None and p.refuse_over > 0 and ttft > target * p.refuse_over:
            return LlmDecision(None, ttft, tpot, REFUSED, max(0.0, ttft - target))
        return LlmDecision(engines[best_i], ttft, tpot)

    def predictions(
        self,
        request: LlmRequestInfo,
        engines: Sequence[EngineView],
        prefix_blocks: Mapping[int, int],
        now_s: float,
    ) -> list[Prediction]:
        """What ``choose`` predicts for ``request`` on each of ``engines`` (by the terms it
        keeps per engine; equal to ``predict``'s)."""
        return [Prediction(*pr) for pr in _predict_all(request, engines, prefix_blocks,
                                                       self.params, now_s)]  # fmt: skip
