"""``predicted-ttft``: each engine's time to first token and per output token predicted from
its step profile, its queued and running work and the request's uncached tokens; the soonest
first token that keeps the TPOT target, the risk of preemption priced, early refusal.

The prediction, for request r on engine e (design note 0020 derives it):
- ``u`` = r's prompt tokens less the leading blocks the router's prefix index says e holds
  (at least 1); ``Q`` = prompt tokens waiting at e that it serves before r (r's class and
  higher; the router's own count plus what e's last sample added); ``R`` = running sequences
  (capped at e's ``max_num_seqs``); ``K`` = KV tokens they read per step.
- A step takes ``step(p, d, k) = c0 + c_p p + c_d d + c_kv k`` (e's step profile); while
  prompts wait, every step is full: its ``d = R`` decodes and ``P = max(1, B - R)`` prompt
  tokens (``B``: e's ``max_num_batched_tokens``: decodes take their token of the budget
  first). r's first token comes after ``n = ceil((Q + u) / P)`` steps, the last one
  carrying the remainder, plus half a step (the step running at the send) and the CPU per
  output token: ``TTFT = (n - 1) step(P, R, K) + step(rem, R, K) + step(P, R, K) / 2 + cpu``
  (the half step only when e is busy).
- Per output token: a decode step of ``R + 1`` sequences, stretched by the prompt tokens the
  router keeps sending e (``rate``: uncached tokens per second, ``router.sent``): a step of
  length t carries ``rate x t`` prompt tokens, so ``t = step(0, R+1, K+u) / (1 - c_p rate)``
  (``c_p rate`` capped at ``max_prefill_share``); and at least the mean over the steps that
  drain the prompts waiting now (full steps, then decode steps).
- Preemption risk: ``over`` = (tokens the in-flight requests will hold at most, the others'
  KV, r's uncached prompt and ``max_tokens``) / e's KV capacity - ``kv_risk_threshold``;
  when positive, the TTFT is priced up by ``risk_weight x over x (TPOT x max_tokens)``:
  a preempted sequence recomputes, and the fuller e's blocks, the likelier.
- An engine without a step profile (a foreign server) uses what the router learned of it:
  ``TTFT = base + (Q + u) x seconds per token``, ``TPOT`` its observed mean.

The choice: among the engines whose predicted TPOT meets r's target (all of them when none
does or r has none), the smallest priced TTFT (ties: the first at or after a rotating start).
If that TTFT is over r's TTFT target x ``refuse_over``, r is refused (``ttft-unreachable``)
with a retry after the predicted excess: no engine can give it its first token in time, and
admitting it would only delay the requests that can.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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
    refuse_over: float = Field(default=1.0, ge=0)
    kv_risk_threshold: float = Field(default=0.9, gt=0)
    risk_weight: float = Field(default=1.0, ge=0)
    #: The most of a step's time the prompt tokens may take in the TPOT prediction.
    max_prefill_share: float = Field(default=0.9, gt=0, lt=1)
    #: For an engine without a profile and nothing learned yet.
    default_base_s: float = Field(default=0.05, gt=0)
    default_s_per_token: float = Field(default=50e-6, gt=0)
    default_tpot_s: float = Field(default=0.02, gt=0)


@dataclass(frozen=True, slots=True)
class Prediction:
    ttft_s: float
    tpot_s: float
    #: What the preemption risk adds to the TTFT when choosing, seconds.
    risk_s: float


def predict(
    v: EngineView, r: LlmRequestInfo, cached_blocks: int, p: PredictedTtftParams, now: float
) -> Prediction:
    """r on v (module docstring)."""
    u = max(1, r.prompt_tokens - cached_blocks * v.block_tokens)
    ahead = v.waiting_tokens_at_or_above(r.priority)
    prof = v.profile
    out = max(1, r.max_tokens)
    if prof is None:
        base = v.learned_base_s if v.learned_base_s is not None else p.default_base_s
        spt = v.learned_s_per_token if v.learned_s_per_token is not None else p.default_s_per_token
        ttft = base + (ahead + u) * spt
        tpot = v.learned_tpot_s if v.learned_tpot_s is not None else p.default_tpot_s
    else:
        running = min(v.running, v.max_num_seqs)
        budget = v.max_num_batched_tokens
        per_step = max(1, budget - running)
        kv = v.own_context_tokens + v.extra_kv_tokens
        full = prof.step_s(per_step, running, kv)
        work = ahead + u
        n = -(-work // per_step)
        rem = work - (n - 1) * per_step
        ttft = (n - 1) * full + prof.step_s(rem, running, kv) + prof.cpu_s_per_output_token
        if running or ahead:
            ttft += full / 2
        d = running + 1
        kv2 = kv + u
        decode = prof.step_s(0, d, kv2)
        share = min(p.max_prefill_share, prof.prefill_s_per_token * v.token_rate(now))
        tpot = decode / (1.0 - share)
        backlog = v.own_waiting_tokens + v.extra_waiting_tokens - ahead
        if backlog > 0 and out > 1:
            per2 = max(1, budget - d)
            nb = min(out - 1, -(-backlog // per2))
            drain = (nb * prof.step_s(per2, d, kv2) + (out - 1 - nb) * decode) / (out - 1)
            tpot = max(tpot, drain)
    risk = 0.0
    cap = v.kv_tokens
    if cap > 0:
        held = v.own_committed_tokens + v.extra_kv_tokens + u + r.max_tokens
        over = held / cap - p.kv_risk_threshold
        if over > 0:
            risk = p.risk_weight * over * tpot * out
    return Prediction(ttft, tpot, risk)


@LLM_ROUTING.register(
    "predicted-ttft",
    PredictedTtftParams,
    "soonest predicted first token that keeps the TPOT target; refuses early",
)
class PredictedTtft:
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
        ok = [target_tpot is None or pr.tpot_s <= target_tpot for pr in preds]
        if not any(ok):
            ok = [True] * n
        self._start = (self._start + 1) % n
        best_i = -1
        best = math.inf
        for k in range(n):
            i = (self._start + k) % n
            if not ok[i]:
                continue
            key = preds[i].ttft_s + preds[i].risk_s
            if key < best:
                best, best_i = key, i
        pr = preds[best_i]
        target = request.ttft_target_s
        if target is not None and p.refuse_over > 0 and pr.ttft_s > target * p.refuse_over:
            return LlmDecision(None, pr.ttft_s, pr.tpot_s, REFUSED, max(0.0, pr.ttft_s - target))
        return LlmDecision(engines[best_i], pr.ttft_s, pr.tpot_s)
