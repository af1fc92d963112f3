"""The LLM router (policy.llm_routing): the prefix index, the router's own accounting and
the samples as corrections, llm-d's baselines and predicted-ttft, decided on fixed inputs."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evenserve.core.llm import StepProfile
from evenserve.policy.llm_routing import (
    LLM_ROUTING,
    EngineSample,
    LlmRequestInfo,
    LlmRouter,
    PrefixIndex,
)
from evenserve.policy.llm_routing.predicted import REFUSED, PredictedTtftParams, predict
from evenserve.policy.registry import PolicySpecError

H100 = StepProfile(
    model="m", device="h100", runtime="vllm", precision="bf16", source="test",
    c0_s=5.75e-3, prefill_s_per_token=17.25e-6, decode_s_per_seq=6e-6, kv_s_per_token=0.0,
    cpu_s_per_output_token=0.0, weights_bytes=16e9, kv_bytes_per_token=131072,
    device_memory_bytes=80e9,
)  # fmt: skip
A100 = replace(H100, device="a100", c0_s=16.4e-3, prefill_s_per_token=47.8e-6)


def req(
    rid: int, prompt: int = 1000, out: int = 100, hashes: tuple[int, ...] = (),
    priority: int = 10, ttft: float | None = 1.0, tpot: float | None = 0.05,
) -> LlmRequestInfo:  # fmt: skip
    return LlmRequestInfo(rid, "m", 0.0, prompt, out, hashes, priority, ttft, tpot)


def router(spec: object, *profiles: StepProfile | None, kv_blocks: int = 4096) -> LlmRouter:
    r = LlmRouter.build(spec, seed=1)
    for i, p in enumerate(profiles):
        r.add_engine(f"e{i}", ["m"], p, kv_blocks, 16, 256, 512)
    return r


# -- the prefix index ------------------------------------------------------------------------


def test_prefix_index_matches_each_engines_longest_leading_run() -> None:
    ix = PrefixIndex()
    ix.record(0, [1, 2, 3, 4], capacity=100)
    ix.record(1, [1, 2, 9], capacity=100)
    assert ix.match([1, 2, 3, 4, 5]) == {0: 4, 1: 2}
    assert ix.match([1, 2, 9]) == {0: 2, 1: 3}
    assert ix.match([7, 1, 2]) == {}


def test_prefix_index_forgets_least_recently_used_past_its_capacity() -> None:
    ix = PrefixIndex()
    ix.record(0, [1, 2], capacity=3)
    ix.record(0, [5, 6], capacity=3)  # 2 goes (a prompt's tail first): 1, 5, 6 held
    assert ix.size(0) == 3
    assert ix.match([1, 2]) == {0: 1}
    assert ix.match([5, 6]) == {0: 2}
    ix.trim(0, 1)  # 5 is the most recent
    assert ix.match([5, 6]) == {0: 1}
    ix.remove_engine(0)
    assert ix.match([6]) == {}


def _names(prompts: list[tuple[int, int, int, int]]) -> list[list[int]]:
    """Block names as chains: prompt (group, shared, branch, length) shares its group's
    first ``shared`` names and has its own after (a name stands for its whole prefix)."""
    out = []
    for g, k, b, n in prompts:
        out.append([hash(("g", g, j)) if j < k else hash(("b", g, b, k, j)) for j in range(n)])
    return out


prompt_st = st.tuples(st.integers(0, 2), st.integers(0, 40), st.integers(0, 3), st.integers(0, 60))


@settings(max_examples=80, deadline=None, derandomize=True)
@given(
    st.lists(st.tuples(st.integers(0, 3), prompt_st), max_size=25),
    prompt_st,
    st.integers(1, 120),
    st.integers(1, 80),
)
def test_prefix_index_agrees_with_a_plain_lru_per_engine(
    records: list[tuple[int, tuple[int, int, int, int]]],
    query: tuple[int, int, int, int],
    cap: int,
    max_blocks: int,
) -> None:
    ix = PrefixIndex(max_blocks)
    plain: dict[int, list[int]] = {}
    for (e, _), hs in zip(records, _names([p for _, p in records]), strict=True):
        ix.record(e, hs, cap)
        lru = plain.setdefault(e, [])
        for h in reversed(hs[:max_blocks]):  # the head most recently used
            if h in lru:
                lru.remove(h)
            lru.append(h)
        del lru[: max(0, len(lru) - cap)]
    q = _names([query])[0]
    want = {}
    for e, lru in plain.items():
        held = set(lru)
        n = 0
        for h in q[:max_blocks]:
            if h not in held:
                break
            n += 1
        if n:
            want[e] = n
    assert ix.match(q) == want


# -- the router's accounting -----------------------------------------------------------------


def test_accounting_follows_a_request_and_returns_to_zero() -> None:
    r = router("round-robin", H100)
    v = r.engines["e0"]
    a = req(1, prompt=800, out=100, priority=10)
    b = req(2, prompt=300, out=50, priority=0)
    r.sent(a, v, 0.0)
    r.sent(b, v, 0.0)
    assert (v.own_waiting, v.own_waiting_tokens) == (2, 1100)
    assert v.waiting_tokens_at_or_above(10) == 800
    assert v.waiting_tokens_at_or_above(0) == 1100
    r.first_token(1, 0.2)
    assert (v.own_waiting, v.own_running) == (1, 1)
    assert v.own_context_tokens == 800 + 50
    r.done(1, 2.0, output_tokens=100)
    r.done(2, 2.0)  # ended before a first token (refused, cancelled)
    assert (v.own_waiting, v.own_running, v.own_waiting_tokens) == (0, 0, 0)
    assert (v.own_context_tokens, v.own_committed_tokens, v.own_out_tokens) == (0, 0, 0)
    assert v.own_waiting_tokens_by_class == {} and v.own_deadlines == {}
    assert r.in_flight() == 0
    assert v.learned_tpot_s == pytest.approx(1.8 / 99)
    r.done(1, 3.0)  # a second end of the same request changes nothing
    assert r.in_flight() == 0


def test_a_request_sent_twice_is_an_error() -> None:
    r = router("round-robin", H100)
    r.sent(req(1), r.engines["e0"], 0.0)
    with pytest.raises(ValueError, match="sent twice"):
        r.sent(req(1), r.engines["e0"], 0.0)


def test_sent_prompt_counts_only_what_the_engine_has_not_cached() -> None:
    r = router("round-robin", H100)
    v = r.engines["e0"]
    hashes = tuple(range(10))  # 10 blocks of 16: 160 tokens named
    r.sent(req(1, prompt=170, hashes=hashes), v, 0.0)
    assert v.own_waiting_tokens == 170  # nothing recorded before the first
    r.sent(req(2, prompt=170, hashes=hashes), v, 0.0)
    assert v.own_waiting_tokens == 170 + 10
    # the 160 cached tokens request 2 shares are held once, while it is in flight
    assert v.own_shared_tokens == 160
    r.sent(req(3, prompt=170, hashes=hashes), v, 0.0)
    assert v.own_shared_tokens == 160
    for i in (1, 2, 3):
        r.done(i, 1.0)
    assert v.own_shared_tokens == 0 and v.held_tokens == 0


def test_a_sample_corrects_by_what_it_holds_beyond_the_routers_own_work_then() -> None:
    r = router("round-robin", H100)
    v = r.engines["e0"]
    for i in range(3):
        r.sent(req(i, prompt=100), v, 1.0)
    # Read at 1.5 (three of ours waiting, and two others'), arriving at 6.5 after all of
    # ours got their first token: the correction is the two others, not minus three.
    for i in range(3):
        r.first_token(i, 2.0)
    r.observe("e0", EngineSample(1.5, running=0, waiting=5, queued_prompt_tokens=500), 6.5)
    assert (v.extra_waiting, v.extra_waiting_tokens) == (2, 200)
    assert v.waiting == 2 and v.running == 3
    assert v.age_s(6.5) == pytest.approx(5.0)
    # an older reading than the one held is ignored
    r.observe("e0", EngineSample(1.0, running=0, waiting=50), 7.0)
    assert v.extra_waiting == 2


def test_cached_tokens_below_the_promise_shrink_the_index_capacity_and_grow_back() -> None:
    r = router("round-robin", H100, kv_blocks=1000)
    v = r.engines["e0"]
    hashes = tuple(range(20))
    r.sent(req(1, prompt=330, hashes=hashes), v, 0.0)
    r.first_token(1, 0.1, cached_tokens=0)
    assert v.prefix_capacity == 1000  # nothing was promised
    r.sent(req(2, prompt=330, hashes=hashes), v, 0.2)  # 20 blocks promised
    r.first_token(2, 0.3, cached_tokens=0)
    assert v.prefix_capacity == 900
    r.sent(req(3, prompt=330, hashes=hashes), v, 0.4)
    r.first_token(3, 0.5, cached_tokens=320)
    assert v.prefix_capacity == 910


def test_an_engine_known_without_kv_blocks_gets_its_prefix_memory_from_a_sample() -> None:
    """An OpenAI server's engine starts with no KV blocks known (0: the index keeps nothing
    for it); the first sample that names them gives the index that many, in blocks or in
    tokens (SGLang's capacity, counted in the router's blocks)."""
    for sample, want in (
        (EngineSample(0.0, 0, 0, kv_blocks=1000, block_tokens=16), 1000),
        (EngineSample(0.0, 0, 0, kv_tokens=32000), 2000),
    ):
        r = router("prefix-approx", None, None, kv_blocks=0)
        v = r.engines["e0"]
        hashes = tuple(range(20))
        r.sent(req(1, prompt=330, hashes=hashes), v, 0.0)
        assert r.prefix.size(v.index) == 0  # nothing kept while the capacity is unknown
        r.observe("e0", sample, 0.1)
        assert (v.kv_blocks, v.prefix_capacity) == (want, want)
        r.sent(req(2, prompt=330, hashes=hashes), v, 0.2)
        assert r.prefix.match(list(hashes)) == {v.index: 20}


def test_fewer_kv_blocks_in_a_sample_trim_the_prefix_memory() -> None:
    r = router("round-robin", H100, kv_blocks=1000)
    v = r.engines["e0"]
    r.sent(req(1, prompt=330, hashes=tuple(range(20))), v, 0.0)
    r.observe("e0", EngineSample(0.0, 0, 0, kv_blocks=8), 0.1)
    assert (v.kv_blocks, v.prefix_capacity, v.prefix_held) == (8, 8, 8)
    assert r.prefix.size(v.index) == 8


# -- the baselines ---------------------------------------------------------------------------


def test_round_robin_takes_each_engine_in_turn() -> None:
    r = router("round-robin", H100, A100, H100)
    picks = [r.route(req(i), 0.0).engine for i in range(6)]
    assert [p.name for p in picks if p] == ["e0", "e1", "e2", "e0", "e1", "e2"]


def test_least_outstanding_takes_the_engine_with_the_fewest_in_flight_ties_by_name() -> None:
    # The LLM-placement simulator's pool rule (fewest outstanding, ties by name), so the
    # night's live run routes as the simulator does.
    r = router("least-outstanding", H100, A100, H100)
    e0, e1, e2 = (r.engines[n] for n in ("e0", "e1", "e2"))
    picks = []
    for i in range(4):
        d = r.route(req(i), 0.0).engine
        assert d is not None
        r.sent(req(i), d, 0.0)
        picks.append(d.name)
    assert picks == ["e0", "e1", "e2", "e0"]  # all at 0, then ties by name
    r.first_token(0, 0.1)  # running counts as in flight as much as waiting
    assert r.route(req(9), 0.1).engine is e1
    r.done(0, 0.5)
    r.done(3, 0.5)  # e0 empty again
    assert r.route(req(10), 0.5).engine is e0
    r.sent(req(11), e0, 0.5)
    r.sent(req(12), e0, 0.5)
    assert (e0.own_waiting, e1.own_waiting, e2.own_waiting) == (2, 1, 1)
    assert r.route(req(13), 0.5).engine is e1


def test_kv_load_scores_queue_and_kv_use_of_fresh_unsaturated_engines() -> None:
    r = router({"policy": "kv-load", "staleness_s": 1.0}, H100, H100, H100)
    r.observe("e0", EngineSample(0.0, 4, 1, kv_usage=0.5), 0.0)
    r.observe("e1", EngineSample(0.0, 4, 0, kv_usage=0.3), 0.0)
    r.observe("e2", EngineSample(0.0, 4, 9, kv_usage=0.0), 0.0)  # saturated: filtered
    assert r.route(req(1), 0.5).engine.name == "e1"  # type: ignore[union-attr]
    # every sample stale: the filter keeps them all, the scores still read the samples
    d = r.route(req(2), 5.0).engine
    assert d is not None and d.name == "e1"


def test_prefix_approx_goes_where_its_history_put_the_prefix() -> None:
    r = router({"policy": "prefix-approx", "staleness_s": 10.0}, H100, H100)
    for n in ("e0", "e1"):
        r.observe(n, EngineSample(0.0, 0, 0, kv_usage=0.1), 0.0)
    hashes = tuple(range(50))
    first = r.route(req(1, prompt=900, hashes=hashes), 0.0).engine
    assert first is not None
    r.sent(req(1, prompt=900, hashes=hashes), first, 0.0)
    for i in range(2, 6):
        d = r.route(req(i, prompt=900, hashes=hashes), 0.1).engine
        assert d is first


def test_unknown_policy_or_parameter_names_the_field() -> None:
    with pytest.raises(PolicySpecError, match="llm_routing: unknown llm-routing policy"):
        LlmRouter.build("fastest")
    with pytest.raises(PolicySpecError, match="refuse_over"):
        LLM_ROUTING.build({"policy": "predicted-ttft", "refuse_over": -1})


# -- predicted-ttft --------------------------------------------------------------------------


def test_ours_predicts_the_faster_engine_sooner_and_sends_there_when_idle() -> None:
    r = router({"policy": "predicted-ttft", "headroom": 0}, A100, H100)
    d = r.route(req(1, prompt=4000), 0.0)
    assert d.engine is not None and d.engine.name == "e1"
    # 4000 tokens in 512-token steps on the H100: 8 steps, nothing ahead, nothing running
    assert d.ttft_s == pytest.approx(7 * H100.step_s(512, 0, 0) + H100.step_s(416, 0, 0))


def test_ours_queues_behind_its_own_sends_and_spreads_a_burst() -> None:
    r = router({"policy": "predicted-ttft", "headroom": 0}, H100, H100)
    seen = []
    for i in range(6):
        d = r.route(req(i, prompt=3000), 0.0)
        assert d.engine is not None
        r.sent(req(i, prompt=3000), d.engine, 0.0)
        seen.append(d.engine.name)
    assert seen.count("e0") == seen.count("e1") == 3


def test_ours_keeps_a_prefix_on_the_engine_that_holds_it_within_the_headroom() -> None:
    r = router("predicted-ttft", A100, H100)
    hashes = tuple(range(400))  # a 6,400-token prefix
    a100 = r.engines["e0"]
    r.sent(req(1, prompt=7000, hashes=hashes), a100, 0.0)
    r.first_token(1, 0.3)
    r.done(1, 1.0, 10)
    d = r.route(req(2, prompt=7000, hashes=hashes), 1.0)
    # the H100 would compute all 7,000 tokens; the A100 only the last 600: less device time
    assert d.engine is a100


def test_ours_counts_a_cached_prefix_only_as_far_as_the_free_blocks_keep_it() -> None:
    r = router("predicted-ttft", H100, kv_blocks=1000)  # 16,000 tokens
    v = r.engines["e0"]
    hashes = tuple(range(400))  # a 6,400-token prefix, named at e0 by a request now gone
    r.sent(req(1, prompt=7000, hashes=hashes), v, 0.0)
    r.first_token(1, 0.1)
    r.done(1, 0.2, 10)

    def uncached(rid: int) -> int:
        info = req(rid, prompt=7000, hashes=hashes)
        r.route(info, 0.3)
        return r.uncached_tokens(info, v)

    r.sent(req(2, prompt=9000, ttft=None), v, 0.3)  # waiting: 563 blocks, 437 free
    assert uncached(3) == 7000 - 6400
    r.sent(req(4, prompt=1000, ttft=None), v, 0.3)  # 625 blocks taken, 375 free
    assert uncached(5) == 7000 - 375 * 16
    assert r.prefix.match(hashes) == {v.index: 400}  # the index itself still names 400
    # A request in flight that shares the first 375 blocks holds them whatever the room.
    assert uncached(6) == 7000 - 375 * 16
    r.sent(req(6, prompt=7000, hashes=hashes), v, 0.3)  # routed: the 375 blocks promised
    assert v.own_shared_tokens == 375 * 16  # no block free now
    assert uncached(7) == 7000 - 375 * 16
    # The baselines' prefix scorer reads the index as llm-d's does: all 400.
    pa = router("prefix-approx", H100, kv_blocks=1000)
    w = pa.engines["e0"]
    pa.sent(req(1, prompt=7000, hashes=hashes), w, 0.0)
    pa.sent(req(2, prompt=10000, ttft=None), w, 0.0)
    info = req(3, prompt=7000, hashes=hashes)
    pa.route(info, 0.1)
    assert pa.uncached_tokens(info, w) == 7000 - 6400


def test_ours_prices_preemption_risk_with_the_shared_prefix_blocks_held() -> None:
    r = router("predicted-ttft", H100, kv_blocks=1000)  # 16,000 tokens
    v = r.engines["e0"]
    p = PredictedTtftParams()
    info = req(1, prompt=1000, out=100)
    assert predict(v, info, 0, p, 0.0).risk_s == 0.0
    # 14,000 tokens of prefix blocks the requests in flight share: 15,100 of 16,000 held
    # at most with this one, past the 0.9 threshold.
    v.own_shared_tokens = 14000
    assert predict(v, info, 0, p, 0.0).risk_s > 0.0


def test_ours_refuses_when_no_engine_can_meet_the_ttft_target() -> None:
    r = router("predicted-ttft", H100)
    v = r.engines["e0"]
    for i in range(40):
        r.sent(req(i, prompt=8000, ttft=None), v, 0.0)
    d = r.route(req(99, prompt=1000, ttft=1.0), 0.0)
    assert d.engine is None and d.reason == REFUSED
    assert d.ttft_s is not None and d.ttft_s > 0.9
    assert d.retry_after_s == pytest.approx(d.ttft_s - 1.0)
    # no TTFT target: nothing to refuse for
    assert r.route(req(100, prompt=1000, ttft=None), 0.0).engine is v


def test_ours_keeps_an_admitted_lower_class_request_within_its_promise() -> None:
    r = router({"policy": "predicted-ttft", "protect_over": 1.5}, H100)
    v = r.engines["e0"]
    r.sent(req(1, prompt=2000, priority=0, ttft=0.5), v, 0.0)
    # an online request of 30,000 tokens would be served first and push it past 0.75 s
    big = req(2, prompt=30000, priority=10, ttft=None)
    assert r.route(big, 0.1).engine is None
    small = req(3, prompt=500, priority=10, ttft=None)
    assert r.route(small, 0.1).engine is v


def test_ours_uses_what_it_learned_of_an_engine_without_a_profile() -> None:
    r = router({"policy": "predicted-ttft", "headroom": 0}, None, None)
    slow, fast = r.engines["e0"], r.engines["e1"]
    for i, (v, t) in enumerate(((slow, 2.0), (fast, 0.2)) * 3):
        r.sent(req(i, prompt=1000), v, 10.0 * i)
        r.first_token(i, 10.0 * i + t)
        r.done(i, 10.0 * i + t + 1.0, 100)
    d = r.route(req(50, prompt=1000), 100.0)
    assert d.engine is fast
    assert d.ttft_s is not None and d.ttft_s < 1.0


def test_ours_routes_an_engine_that_learned_zero_times() -> None:
    """An engine without a profile whose answers came at the instant they were sent learns a
    time per prompt token and per output token of 0: a prediction, not a division by 0."""
    r = router("predicted-ttft", None, kv_blocks=8)
    v = r.engines["e0"]
    for i in range(3):  # first token and end at the send's instant
        r.sent(req(i, prompt=40, out=4), v, 0.0)
        r.first_token(i, 0.0)
        r.done(i, 0.0, output_tokens=4)
    assert v.learned_s_per_token == 0.0 and v.learned_tpot_s == 0.0
    r.sent(req(10, prompt=120, out=8, priority=0, ttft=0.5), v, 0.0)  # a lower class waits
    r.sent(req(11, prompt=100, out=8), v, 0.0)
    r.first_token(11, 0.0)  # one running, holding KV blocks past kv_admit of 8
    d = r.route(req(12, prompt=60, out=8, priority=10), 0.0)
    assert d.engine is v
