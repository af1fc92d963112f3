"""The LLM router: each engine's view, the router's own accounting, the prefix index, and
the policy's decision (pure; the gateway and the simulator drive it with their clocks).

Theory of operation. A driver adds each engine (``add_engine``: its models, step profile if
known, KV blocks, limits), feeds it samples of the engine's signals as they arrive
(``observe``: the time the sample was *read*, which may be long before it arrives), and
around every request it routes calls ``route`` (the decision), then ``sent`` when it
forwarded the request, ``first_token`` when the first token came back and ``done`` when the
request ended (completed, refused, failed or cancelled). Between those calls the router's
own counts are exact; a sample only adds what the engine holds beyond them.

The correction. The router keeps snapshots of its own counts per engine (one per
``snapshot_s`` of its clock at most, ``history_s`` long). A sample read at ``t`` is compared
with the snapshot of that engine at ``t`` (the newest not after it): what the engine reported
beyond the router's own work then is the engine's other work (``extra_*``). A sample older
than the history, or one read before any own work, is compared with nothing (all of it
counts as other work only when the router has sent nothing in the history window).

Learning a speed. ``first_token`` pairs the observed time to first token with the prompt
tokens that were ahead of it plus its own uncached tokens at the send; ``done`` gives the
observed time per output token. Both are EWMAs per engine (``learn_alpha``): what a policy
uses for an engine without a step profile (a foreign server).
"""

from __future__ import annotations

import random
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from evenserve.core.llm import StepProfile
from evenserve.policy.llm_routing.base import (
    LLM_ROUTING,
    EngineSample,
    EngineView,
    LlmDecision,
    LlmRequestInfo,
    LlmRoutingPolicy,
)
from evenserve.policy.llm_routing.prefix_index import PrefixIndex

LEARN_ALPHA = 0.1


@dataclass(slots=True)
class _Sent:
    view: EngineView
    priority: int
    prompt_tokens: int
    uncached_tokens: int
    max_tokens: int
    sent_s: float
    #: Prompt tokens ahead of it at the send (for learning a speed).
    ahead_tokens: int
    #: Leading prompt blocks the prefix index said the engine held at the send, and their
    #: names (counted in the engine's shared blocks while the request is in flight).
    promised_blocks: int
    shared: Sequence[int] = ()
    first_s: float | None = None
    #: The engine's cached prompt tokens were learned from (``first_token`` or ``done``).
    cache_learned: bool = False


@dataclass(frozen=True, slots=True)
class _Snapshot:
    at_s: float
    waiting: int
    waiting_tokens: int
    running: int
    context_tokens: int


class LlmRouter:
    """Engines, accounting and a policy (see the module docstring)."""

    def __init__(
        self,
        policy: LlmRoutingPolicy,
        *,
        prefix_max_blocks: int = 1024,
        snapshot_s: float = 0.05,
        history_s: float = 30.0,
        learn_alpha: float = LEARN_ALPHA,
        rate_tau_s: float = 5.0,
    ) -> None:
        self.policy = policy
        self.engines: dict[str, EngineView] = {}
        self._by_model: dict[str, list[EngineView]] = {}
        self.prefix = PrefixIndex(prefix_max_blocks)
        self._sent: dict[int, _Sent] = {}
        self._snap: dict[int, deque[_Snapshot]] = {}
        #: By engine: references of the router's requests in flight to cached block names.
        self._shared: dict[int, dict[int, int]] = {}
        self._snapshot_s = snapshot_s
        self._history_s = history_s
        self._alpha = learn_alpha
        self.rate_tau_s = rate_tau_s
        self._next_index = 0
        #: The prefix lookup of the last decision (``sent`` right after reuses it).
        self._last_match: tuple[int, dict[int, int]] | None = None

    @classmethod
    def build(cls, spec: Any, seed: int = 0, **kw: Any) -> LlmRouter:
        """A router with the policy ``spec`` names (``LLM_ROUTING``), seeded."""
        return cls(LLM_ROUTING.build(spec, random.Random(seed), where="llm_routing"), **kw)

    # -- engines ----------------------------------------------------------------------------

    def add_engine(
        self,
        name: str,
        models: Iterable[str],
        profile: StepProfile | None,
        kv_blocks: int,
        block_tokens: int = 16,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 8192,
    ) -> EngineView:
        if name in self.engines:
            raise ValueError(f"engine {name!r} added twice")
        view = EngineView(
            name=name,
            index=self._next_index,
            models=frozenset(models),
            profile=profile,
            kv_blocks=kv_blocks,
            block_tokens=block_tokens,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            rate_tau_s=self.rate_tau_s,
            prefix_capacity=kv_blocks,
        )
        self._next_index += 1
        self.engines[name] = view
        for m in view.models:
            self._by_model.setdefault(m, []).append(view)
        self.prefix.add_engine(view.index)
        self._snap[view.index] = deque()
        self._shared[view.index] = {}
        return view

    def remove_engine(self, name: str) -> None:
        view = self.engines.pop(name)
        for m in view.models:
            self._by_model[m] = [v for v in self._by_model[m] if v is not view]
        self.prefix.remove_engine(view.index)
        self._snap.pop(view.index, None)
        self._shared.pop(view.index, None)

    def candidates(self, model: str) -> list[EngineView]:
        return self._by_model.get(model, [])

    # -- decisions --------------------------------------------------------------------------

    def route(
        self,
        request: LlmRequestInfo,
        now: float,
        candidates: Sequence[EngineView] | None = None,
    ) -> LlmDecision:
        """The policy's decision among ``candidates`` (default: every engine of the model).
        No engine hosts the model: a refusal with reason ``no-engine``."""
        engines = self.candidates(request.model) if candidates is None else candidates
        if not engines:
            return LlmDecision(None, reason="no-engine")
        blocks: dict[int, int] = {}
        if request.prefix_hashes and getattr(self.policy, "uses_prefix", True):
            blocks = self.prefix.match(request.prefix_hashes)
            if blocks and getattr(self.policy, "prefix_room", False):
                blocks = self._surviving(request.prefix_hashes, blocks, engines)
            self._last_match = (request.request_id, blocks)
        return self.policy.choose(request, engines, blocks, now)

    def _surviving(
        self, hashes: Sequence[int], blocks: dict[int, int], engines: Sequence[EngineView]
    ) -> dict[int, int]:
        """Of the leading blocks the index says each engine holds, those likely still there:
        the ones a request of the router's in flight there shares (held while it runs), and
        of the rest only as many as the engine's free blocks can keep (the blocks not taken
        by what is running or waiting there: a cached block nobody uses lives only in them,
        and goes first when the running sequences grow)."""
        views = {v.index: v for v in engines}
        out: dict[int, int] = {}
        for e, c in blocks.items():
            v = views.get(e)
            if v is None or v.kv_blocks <= 0:  # its KV size not known (yet): as the index
                out[e] = c
                continue
            refs = self._shared.get(e, {})
            lo, hi = 0, c  # hashes[:lo] shared by one in flight; refs are prefix-closed
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if hashes[mid - 1] in refs:
                    lo = mid
                else:
                    hi = mid - 1
            used = v.held_tokens + v.own_waiting_tokens + v.extra_waiting_tokens
            room = v.kv_blocks - -(-max(0, used) // v.block_tokens)
            kept = lo + min(c - lo, max(0, room))
            if kept:
                out[e] = kept
        return out

    def uncached_tokens(self, request: LlmRequestInfo, view: EngineView) -> int:
        """The prompt tokens ``view`` must compute for ``request`` by the prefix index (at
        least one: the engine computes the last token)."""
        blocks = 0
        if request.prefix_hashes:
            last = self._last_match
            found = last[1] if last is not None and last[0] == request.request_id else None
            if found is None:
                found = self.prefix.match(request.prefix_hashes)
            blocks = found.get(view.index, 0)
        return max(1, request.prompt_tokens - blocks * view.block_tokens)

    # -- accounting -------------------------------------------------------------------------

    def sent(
        self,
        request: LlmRequestInfo,
        view: EngineView,
        now: float,
        uncached_tokens: int | None = None,
    ) -> None:
        """``request`` was forwarded to ``view``: count it, and record its prompt's blocks
        there in the prefix index."""
        if request.request_id in self._sent:
            raise ValueError(f"request {request.request_id} sent twice")
        u = self.uncached_tokens(request, view) if uncached_tokens is None else uncached_tokens
        view.memo = None
        ahead = view.waiting_tokens_at_or_above(request.priority)
        promised = (request.prompt_tokens - u) // view.block_tokens
        shared: Sequence[int] = ()
        if promised > 0 and request.prefix_hashes:
            shared = request.prefix_hashes[:promised]
            refs = self._shared[view.index]
            fresh = 0
            for h in shared:
                n = refs.get(h, 0)
                refs[h] = n + 1
                fresh += n == 0
            view.own_shared_tokens += fresh * view.block_tokens
        self._sent[request.request_id] = _Sent(
            view, request.priority, request.prompt_tokens, u, request.max_tokens, now, ahead,
            promised, shared,
        )  # fmt: skip
        view.own_waiting += 1
        view.own_waiting_tokens += u
        byc = view.own_waiting_tokens_by_class
        byc[request.priority] = byc.get(request.priority, 0) + u
        view.own_committed_tokens += u + request.max_tokens
        view.own_out_tokens += request.max_tokens
        if request.ttft_target_s is not None:
            dl = view.own_deadlines.get(request.priority)
            if dl is None:
                dl = view.own_deadlines[request.priority] = OrderedDict()
            dl[request.request_id] = (now, request.ttft_target_s, u)
        view.add_sent_tokens(now, request.priority, u)
        if request.prefix_hashes:
            self.prefix.record(view.index, request.prefix_hashes, view.prefix_capacity)
            view.prefix_held = self.prefix.size(view.index)
        self._snapshot(view, now)

    def first_token(self, request_id: int, now: float, cached_tokens: int | None = None) -> None:
        """The first token of ``request_id`` came back: its prompt is prefilled.
        ``cached_tokens``: the prompt tokens the engine's prefix cache gave it, when the
        engine says (vLLM's ``usage.prompt_tokens_details.cached_tokens``): fewer than the
        prefix index promised shrinks the index's capacity for that engine (its cache holds
        less than its KV blocks: running sequences take them), as many or more grows it back
        (additive increase, multiplicative decrease)."""
        s = self._sent.get(request_id)
        if s is None or s.first_s is not None:
            return
        s.first_s = now
        v = s.view
        v.memo = None
        if cached_tokens is not None:
            self._learn_cache(s, cached_tokens)
        self._unwait(s, request_id)
        v.own_running += 1
        v.own_context_tokens += s.uncached_tokens + s.max_tokens // 2
        ttft = now - s.sent_s
        tokens = s.ahead_tokens + s.uncached_tokens
        if v.learned_base_s is None:
            v.learned_base_s = ttft / 2
            v.learned_s_per_token = ttft / 2 / max(1, tokens)
        else:
            a = self._alpha
            base = v.learned_base_s
            v.learned_s_per_token = (1 - a) * (v.learned_s_per_token or 0.0) + a * max(
                0.0, (ttft - base) / max(1, tokens)
            )
            if tokens <= v.block_tokens * 4:
                v.learned_base_s = (1 - a) * base + a * ttft
        self._snapshot(v, now)

    def done(
        self,
        request_id: int,
        now: float,
        output_tokens: int | None = None,
        cached_tokens: int | None = None,
    ) -> None:
        """``request_id`` ended (whatever the outcome); ``output_tokens``: how many it got
        (for the learned time per output token). ``cached_tokens``: as ``first_token``'s, for
        a driver that learns it only at the end (a stream's final usage chunk); used once,
        when ``first_token`` had none."""
        s = self._sent.pop(request_id, None)
        if s is None:
            return
        v = s.view
        v.memo = None
        if cached_tokens is not None and s.first_s is not None:
            self._learn_cache(s, cached_tokens)
        if s.first_s is None:
            self._unwait(s, request_id)
        else:
            v.own_running -= 1
            v.own_context_tokens -= s.uncached_tokens + s.max_tokens // 2
            if output_tokens is not None and output_tokens > 1:
                tpot = (now - s.first_s) / (output_tokens - 1)
                lt, a = v.learned_tpot_s, self._alpha
                v.learned_tpot_s = tpot if lt is None else (1 - a) * lt + a * tpot
        v.own_committed_tokens -= s.uncached_tokens + s.max_tokens
        if s.shared:
            refs = self._shared[v.index]
            gone = 0
            for h in s.shared:
                n = refs[h] - 1
                if n:
                    refs[h] = n
                else:
                    del refs[h]
                    gone += 1
            v.own_shared_tokens -= gone * v.block_tokens
        v.own_out_tokens -= s.max_tokens
        self._snapshot(v, now)

    def _learn_cache(self, s: _Sent, cached_tokens: int) -> None:
        """The engine said how many of ``s``'s prompt tokens its cache gave (once a request:
        ``first_token`` or ``done``)."""
        if s.cache_learned:
            return
        s.cache_learned = True
        v = s.view
        if s.promised_blocks > 0:
            got = cached_tokens // v.block_tokens
            if got < s.promised_blocks:
                v.prefix_capacity = max(v.kv_blocks // 16, int(v.prefix_capacity * 0.9))
                self.prefix.trim(v.index, v.prefix_capacity)
                v.prefix_held = self.prefix.size(v.index)
            elif v.prefix_capacity < v.kv_blocks:
                v.prefix_capacity = min(v.kv_blocks, v.prefix_capacity + max(1, v.kv_blocks // 100))

    def _unwait(self, s: _Sent, request_id: int) -> None:
        v = s.view
        dl = v.own_deadlines.get(s.priority)
        if dl is not None:
            dl.pop(request_id, None)
            if not dl:
                del v.own_deadlines[s.priority]
        v.own_waiting -= 1
        v.own_waiting_tokens -= s.uncached_tokens
        byc = v.own_waiting_tokens_by_class
        left = byc[s.priority] - s.uncached_tokens
        if left:
            byc[s.priority] = left
        else:
            del byc[s.priority]

    def in_flight(self) -> int:
        return len(self._sent)

    # -- signals ----------------------------------------------------------------------------

    def observe(self, name: str, sample: EngineSample, now: float) -> None:
        """A sample of engine ``name`` arrived at ``now`` (read at ``sample.taken_s``)."""
        v = self.engines.get(name)
        if v is None:
            return
        # Before the test below: a driver that changed the view's profile or batch limits by
        # hand calls this right after (``gateway.llm_router``), an older reading or not.
        v.memo = None
        if v.sample is not None and sample.taken_s < v.sample.taken_s:
            return  # an older reading than the one held
        v.sample = sample
        v.received_s = now
        # The engine's KV size in the router's blocks (``block_tokens``, the prefix index's:
        # the request's prompt blocks are named that long), whatever its own block size.
        blocks = sample.kv_blocks
        if blocks and sample.block_tokens:
            blocks = blocks * sample.block_tokens // v.block_tokens
        elif not blocks and sample.kv_tokens:  # a capacity in tokens (SGLang)
            blocks = sample.kv_tokens // v.block_tokens
        if blocks and blocks != v.kv_blocks:
            self._set_kv_blocks(v, blocks)
        snap = self._own_at(v, sample.taken_s)
        v.extra_waiting = max(0, sample.waiting - snap.waiting)
        v.extra_running = max(0, sample.running - snap.running)
        if sample.queued_prompt_tokens is not None:
            v.extra_waiting_tokens = max(0, sample.queued_prompt_tokens - snap.waiting_tokens)
        else:
            v.extra_waiting_tokens = 0
        if sample.kv_usage is not None:
            held = sample.kv_usage * v.kv_tokens
            v.extra_kv_tokens = max(0, int(held) - snap.context_tokens)
        else:
            v.extra_kv_tokens = 0

    def _set_kv_blocks(self, v: EngineView, blocks: int) -> None:
        """``v``'s engine has ``blocks`` KV blocks (a sample said so): the prefix index keeps
        that many for it where it knew none before (an OpenAI server's engine starts at 0,
        before its first metrics), else at most that many of what it learned to keep."""
        before = v.kv_blocks
        v.kv_blocks = blocks
        v.prefix_capacity = blocks if before <= 0 else min(v.prefix_capacity, blocks)
        self.prefix.trim(v.index, v.prefix_capacity)
        v.prefix_held = self.prefix.size(v.index)

    def forget_corrections(self, name: str) -> None:
        """Engine ``name``'s samples stopped coming: drop what its last one added beyond the
        router's own counts (``extra_*``), so the router goes on its own accounting alone;
        the sample itself stays (its age keeps growing for the policy and the driver)."""
        v = self.engines.get(name)
        if v is None:
            return
        v.memo = None
        v.extra_waiting = v.extra_waiting_tokens = v.extra_running = v.extra_kv_tokens = 0

    def _snapshot(self, v: EngineView, now: float) -> None:
        q = self._snap[v.index]
        snap = _Snapshot(
            now,
            v.own_waiting,
            v.own_waiting_tokens,
            v.own_running,
            v.own_context_tokens + v.own_shared_tokens,
        )
        if q and now - q[-1].at_s < self._snapshot_s:
            q[-1] = snap
        else:
            q.append(snap)
        horizon = now - self._history_s
        while len(q) > 1 and q[1].at_s <= horizon:
            q.popleft()

    def _own_at(self, v: EngineView, t: float) -> _Snapshot:
        """The router's own counts for ``v`` at time ``t`` (the newest snapshot not after
        it; none: nothing of its own then)."""
        q = self._snap[v.index]
        best: _Snapshot | None = None
        for s in reversed(q):
            if s.at_s <= t:
                best = s
                break
        if best is None:
            return _Snapshot(t, 0, 0, 0, 0)
        return best
