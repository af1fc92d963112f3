"""The baselines, as llm-d's endpoint picker defines them (gateway-api-inference-extension):

- ``round-robin``: each model's engines in turn; reads nothing.
- ``least-outstanding``: the engine with the fewest of the router's own requests in flight
  (sent and not finished: ``own_waiting + own_running``), ties by name; reads no sample.
  The rule of the LLM-placement simulator's pool (``sim.llm_placement``: the device with
  the fewest of the model's requests outstanding, ties by name), so a live run of its
  scenario routes as it does (design 0022).
- ``kv-load``: the saturation filter, then the queue scorer and the KV-cache-utilization
  scorer, weighted, and the engine with the highest score (ties at random):
  - saturation filter: keep the engines whose sample is fresh (``staleness_s``) with a
    waiting queue under ``queue_threshold x (1 + headroom)`` and KV use under
    ``kv_threshold x (1 + headroom)``; when none is left, keep them all (llm-d's defaults:
    5 waiting, 0.8 KV use, 200 ms, no headroom);
  - queue scorer: ``(max waiting - waiting) / (max waiting - min waiting)`` over the
    candidates (1 for all when they are equal);
  - KV-cache-utilization scorer: ``1 - kv use``.
  It reads the engines' *samples* only (waiting sequences, KV use), as llm-d does: an engine
  never sampled scores 0 on both.
- ``prefix-approx``: the same filter and scorers plus the approximate prefix-cache scorer:
  the fraction of the prompt's blocks the router's own history says the engine holds
  (``prefix_index``; llm-d hashes 64-character chunks of the text, the router's driver
  names blocks as it can). Default weights are llm-d's scheduler profile for this setting:
  prefix 3, queue 2, KV utilization 2.

None of them refuses: an overloaded pool queues.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from pydantic import Field

from evenserve.policy.llm_routing.base import (
    LLM_ROUTING,
    EngineView,
    LlmDecision,
    LlmRequestInfo,
)
from evenserve.policy.registry import PolicyParams


class RoundRobinParams(PolicyParams):
    pass


@LLM_ROUTING.register("round-robin", RoundRobinParams, "each model's engines in turn")
class LlmRoundRobin:
    uses_prefix = False

    def __init__(self, params: RoundRobinParams) -> None:
        self.params = params
        self._cursor: dict[str, int] = {}

    def choose(
        self,
        request: LlmRequestInfo,
        engines: Sequence[EngineView],
        prefix_blocks: Mapping[int, int],
        now_s: float,
    ) -> LlmDecision:
        k = self._cursor.get(request.model, 0)
        self._cursor[request.model] = k + 1
        return LlmDecision(engines[k % len(engines)])


class LeastOutstandingParams(PolicyParams):
    pass


@LLM_ROUTING.register(
    "least-outstanding",
    LeastOutstandingParams,
    "the engine with the fewest of the router's requests in flight",
)
class LlmLeastOutstanding:
    uses_prefix = False

    def __init__(self, params: LeastOutstandingParams) -> None:
        self.params = params

    def choose(
        self,
        request: LlmRequestInfo,
        engines: Sequence[EngineView],
        prefix_blocks: Mapping[int, int],
        now_s: float,
    ) -> LlmDecision:
        return LlmDecision(min(engines, key=lambda e: (e.own_waiting + e.own_running, e.name)))


class KvLoadParams(PolicyParams):
    queue_weight: float = Field(default=1.0, ge=0)
    kv_weight: float = Field(default=1.0, ge=0)
    queue_threshold: float = Field(default=5.0, gt=0)
    kv_threshold: float = Field(default=0.8, gt=0, le=1)
    headroom: float = Field(default=0.0, ge=0, le=1)
    #: A sample older than this is stale (the filter drops its engine).
    staleness_s: float = Field(default=0.2, gt=0)


class PrefixApproxParams(KvLoadParams):
    queue_weight: float = Field(default=2.0, ge=0)
    kv_weight: float = Field(default=2.0, ge=0)
    prefix_weight: float = Field(default=3.0, ge=0)


def saturation_filter(
    engines: Sequence[EngineView], p: KvLoadParams, now: float
) -> Sequence[EngineView]:
    """llm-d's utilization detector as a filter (module docstring)."""
    q_limit = p.queue_threshold * (1.0 + p.headroom)
    kv_limit = p.kv_threshold * (1.0 + p.headroom)
    kept = []
    for v in engines:
        s = v.sample
        if s is None or now - s.taken_s > p.staleness_s:
            continue
        kv = s.kv_usage if s.kv_usage is not None else 0.0
        if s.waiting < q_limit and kv < kv_limit:
            kept.append(v)
    return kept or engines


def _scores(
    engines: Sequence[EngineView],
    p: KvLoadParams,
    prefix_weight: float,
    request: LlmRequestInfo,
    prefix_blocks: Mapping[int, int],
) -> list[float]:
    waits = [v.sample.waiting if v.sample is not None else None for v in engines]
    known = [w for w in waits if w is not None]
    lo = min(known) if known else 0
    hi = max(known) if known else 0
    total_blocks = len(request.prefix_hashes)
    out = []
    for v, w in zip(engines, waits, strict=True):
        s = v.sample
        if w is None:
            q = 0.0
        elif hi == lo:
            q = 1.0
        else:
            q = (hi - w) / (hi - lo)
        kv = 0.0 if s is None or s.kv_usage is None else 1.0 - s.kv_usage
        score = p.queue_weight * q + p.kv_weight * kv
        if prefix_weight and total_blocks:
            score += prefix_weight * prefix_blocks.get(v.index, 0) / total_blocks
        out.append(score)
    return out


def _pick(engines: Sequence[EngineView], scores: list[float], rng: random.Random) -> EngineView:
    best = max(scores)
    top = [v for v, s in zip(engines, scores, strict=True) if s >= best - 1e-12]
    return top[0] if len(top) == 1 else top[rng.randrange(len(top))]


@LLM_ROUTING.register(
    "kv-load", KvLoadParams, "llm-d's queue + KV-utilization scorers", seeded=True
)
class KvLoad:
    uses_prefix = False

    def __init__(self, params: KvLoadParams, rng: random.Random) -> None:
        self.params = params
        self.rng = rng

    def choose(
        self,
        request: LlmRequestInfo,
        engines: Sequence[EngineView],
        prefix_blocks: Mapping[int, int],
        now_s: float,
    ) -> LlmDecision:
        p = self.params
        kept = saturation_filter(engines, p, now_s)
        w = p.prefix_weight if isinstance(p, PrefixApproxParams) else 0.0
        return LlmDecision(_pick(kept, _scores(kept, p, w, request, prefix_blocks), self.rng))


@LLM_ROUTING.register(
    "prefix-approx",
    PrefixApproxParams,
    "llm-d's approximate prefix-cache scorer with its queue and KV scorers",
    seeded=True,
)
class PrefixApprox(KvLoad):
    """``kv-load`` with the approximate prefix scorer (its weight in the params)."""

    uses_prefix = True
