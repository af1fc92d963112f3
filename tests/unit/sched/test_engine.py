"""The LLM engine (sched.engine): KV blocks, the prefix cache, continuous batching, chunked
prefill, preemption by recompute, request-level batching, cancellation."""

from __future__ import annotations

import dataclasses

import pytest

from evenserve.core.llm import StepProfile
from evenserve.core.wire import QUEUE_FULL
from evenserve.sched import QueuedRequest
from evenserve.sched.engine import TOO_LONG, Engine, EngineSetup, GenSpec, KvBlocks
from evenserve.sched.engine.blocks import prompt_hashes

BT = 4


def profile(max_model_len: int = 256, block_tokens: int = BT) -> StepProfile:
    return StepProfile(
        model="llm", device="test", runtime="emulated", precision="bf16", source="test",
        c0_s=0.005, prefill_s_per_token=1e-5, decode_s_per_seq=1e-4, kv_s_per_token=1e-7,
        cpu_s_per_output_token=0.0, weights_bytes=0.0, kv_bytes_per_token=1,
        device_memory_bytes=1.0, block_tokens=block_tokens, max_model_len=max_model_len,
    )  # fmt: skip


def engine(blocks: int = 64, **kw: object) -> Engine[QueuedRequest]:
    kw.setdefault("max_num_batched_tokens", 256)
    return Engine(EngineSetup(profile(), **kw), blocks)  # type: ignore[arg-type]


def req(i: int, priority: int = 10) -> QueuedRequest:
    return QueuedRequest(i, "llm", 0.0, priority)


def run(e: Engine[QueuedRequest], steps: int = 1000) -> list[tuple[int, int, str | None]]:
    out = []
    for _ in range(steps):
        st = e.plan(0.0)
        if st is None:
            break
        for ev in e.done(st, 0.0):
            out.append((ev.req.request_id, ev.index, ev.finish))
        e.kv.check()
    return out


def test_step_profile_formula_and_kv_blocks() -> None:
    p = profile()
    assert p.step_s(100, 10, 1000) == pytest.approx(0.005 + 100e-5 + 10e-4 + 1000e-7)
    q = dataclasses.replace(p, device_memory_bytes=1000.0, weights_bytes=100.0,
                            kv_bytes_per_token=2, memory_utilization=0.9)  # fmt: skip
    # (1000 x 0.9 - 100 - 40 other) / (4 tokens x 2 bytes) = 95 blocks
    assert q.kv_blocks(other_bytes=40.0) == 95


def test_blocks_prefix_cache_reuses_whole_prompt_blocks() -> None:
    kv = KvBlocks(8, BT)
    a = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    h = prompt_hashes(a, BT)
    assert len(h) == 2  # the partial third block has no name
    held: list[int] = []
    assert kv.grow(held, 3)
    kv.publish(held, h, 0, 2)
    kv.release(held)
    kv.check()
    assert kv.available == 8 and len(kv.cached) == 2
    found = kv.lookup(prompt_hashes([1, 2, 3, 4, 5, 6, 7, 8, 0, 0], BT), 2)
    assert len(found) == 2
    assert kv.lookup(prompt_hashes([1, 2, 3, 0, 5, 6, 7, 8], BT), 2) == []
    kv.acquire(found)
    kv.check()
    assert kv.used == 2
    # Evicting: 6 free + 0 cached left; asking for 7 fails and takes nothing.
    other: list[int] = []
    assert not kv.grow(other, 7) and other == []
    kv.release(list(found))
    assert kv.grow(other, 8)  # evicts both cached blocks
    assert kv.by_hash == {} and kv.available == 0
    kv.check()


def test_continuous_batching_admits_while_others_run_and_finishes_each() -> None:
    e = engine()
    e.add(req(1), GenSpec(list(range(10)), 3))
    st = e.plan(0.0)
    assert st is not None and st.prefill_tokens == 10 and st.decode_seqs == 0
    evs = e.done(st, 0.0)
    assert [(x.req.request_id, x.index) for x in evs] == [(1, 1)]
    e.add(req(2), GenSpec(list(range(100, 105)), 2))
    st = e.plan(0.0)
    assert st is not None
    assert st.decode_seqs == 1 and st.prefill_tokens == 5  # 1 decodes while 2 joins
    assert st.kv_tokens == 10
    out = [(1, 1, None)]
    for ev in e.done(st, 0.0):
        out.append((ev.req.request_id, ev.index, ev.finish))
    out += run(e)
    assert sorted(out) == [(1, 1, None), (1, 2, None), (1, 3, "length"), (2, 1, None),
                           (2, 2, "length")]  # fmt: skip
    assert not e.has_work and e.kv.used == 0
    assert e.counters.prompt_tokens == 15 and e.counters.generation_tokens == 5


def test_chunked_prefill_splits_a_long_prompt_and_keeps_decodes_going() -> None:
    e = engine(mode="continuous-chunked", max_num_batched_tokens=16, chunk_tokens=8)
    e.add(req(1), GenSpec([1, 2, 3], 50))
    e.done(e.plan(0.0), 0.0)  # type: ignore[arg-type]
    e.add(req(2), GenSpec(list(range(40)), 1))
    sizes = []
    for _ in range(6):
        st = e.plan(0.0)
        assert st is not None
        assert st.decode_seqs == 1  # the running decode is never stalled by the long prompt
        sizes.append(st.prefill_tokens)
        e.done(st, 0.0)
    assert sizes == [8, 8, 8, 8, 8, 0]


def test_unchunked_prompt_waits_whole_and_setup_refuses_a_small_budget() -> None:
    with pytest.raises(ValueError, match="max_model_len"):
        EngineSetup(profile(), max_num_batched_tokens=16)


def test_prefix_cache_hits_skip_compute_and_are_counted_in_tokens() -> None:
    e = engine()
    prefix = list(range(12))  # three whole blocks
    e.add(req(1), GenSpec([*prefix, 50, 51], 1))
    run(e)
    e.add(req(2), GenSpec([*prefix, 60], 1))
    st = e.plan(0.0)
    assert st is not None and st.prefill_tokens == 1  # 12 cached, the last token computed
    e.done(st, 0.0)
    kv = e.kv
    assert kv.hit_tokens == 12
    assert kv.query_tokens == 12 + 12  # (14 - 1) // 4 = 3 blocks, then (13 - 1) // 4 = 3


def test_preemption_by_recompute_lowest_class_newest_first_and_all_complete() -> None:
    # 6 blocks of 4 tokens: two sequences of 8-token prompts growing to 20 tokens each.
    e = engine(blocks=6)
    e.add(req(1, priority=10), GenSpec(list(range(8)), 12))  # online
    e.add(req(2, priority=0), GenSpec(list(range(8, 16)), 12))  # offline
    out = run(e)
    assert e.counters.preemptions >= 1
    finished = {r for r, _, f in out if f is not None}
    assert finished == {1, 2}
    # The online sequence (class 10) was never the one preempted: its tokens come in order
    # without a repeat, and it finishes first.
    ones = [i for r, i, _ in out if r == 1]
    assert ones == list(range(1, 13))
    assert [r for r, _, f in out if f is not None] == [1, 2]
    assert e.kv.used == 0


def test_preemption_takes_a_lower_class_already_scheduled_in_the_step() -> None:
    # 4 blocks of 4 tokens. The offline sequence runs first, so it comes first in every step;
    # the online one, admitted a step later, is the one whose growth finds no block. The
    # victim is the offline one although its part of the step was already given (vLLM's
    # priority policy), not the online one asking.
    e = engine(blocks=4)
    e.add(req(2, priority=0), GenSpec([100, 101], 12))  # offline, alone at first
    st = e.plan(0.0)
    assert st is not None
    assert [(ev.req.request_id, ev.index) for ev in e.done(st, 0.0)] == [(2, 1)]
    e.add(req(1, priority=10), GenSpec([1, 2, 3, 4], 12))  # online
    online, offline = e.by_req[1], e.by_req[2]
    out = run(e)
    assert online.preemptions == 0
    assert offline.preemptions >= 1
    assert [r for r, _, f in out if f is not None] == [1, 2]
    assert [i for r, i, _ in out if r == 1] == list(range(1, 13))
    assert e.kv.used == 0


def test_request_level_batch_admits_nothing_until_all_finish_and_pads() -> None:
    e = engine(mode="request-level", max_num_seqs=4)
    e.add(req(1), GenSpec([1, 2, 3], 1))
    e.add(req(2), GenSpec([4, 5, 6], 4))
    st = e.plan(0.0)
    assert st is not None and st.prefill_tokens == 6
    e.done(st, 0.0)  # 1 finishes at its first token
    e.add(req(3), GenSpec([7], 1))
    st = e.plan(0.0)
    assert st is not None and len(st.parts) == 1 and st.padding == 1
    assert st.decode_seqs == 2  # the finished row is still computed
    run(e)
    assert e.counters.finished == 3


def test_refusals_too_long_and_queue_full() -> None:
    e = engine(blocks=4, max_waiting=1)
    assert e.add(req(1), GenSpec(list(range(250)), 10)) == TOO_LONG  # over max_model_len
    assert e.add(req(2), GenSpec(list(range(20)), 1)) == TOO_LONG  # over 4 blocks of 4
    assert e.add(req(3), GenSpec([], 1)) == TOO_LONG
    assert e.add(req(4), GenSpec([1], 1)) is None
    assert e.add(req(5), GenSpec([1], 1)) == QUEUE_FULL


def test_cancel_frees_blocks_waiting_or_running_and_mid_step() -> None:
    e = engine()
    r1, r2 = req(1), req(2)
    e.add(r1, GenSpec(list(range(10)), 5))
    e.add(r2, GenSpec(list(range(10)), 5))
    st = e.plan(0.0)
    assert st is not None
    assert e.cancel(r1)  # while its step runs
    evs = e.done(st, 0.0)
    assert [x.req for x in evs] == [r2]
    assert not e.cancel(r1)
    assert e.cancel(r2)
    assert e.kv.used == 0 and not e.has_work
    assert sorted(e.to_free) == [0, 1]
    e.kv.check()


def test_eos_stops_unless_ignored_and_step_entries_feed_the_context() -> None:
    e = Engine(EngineSetup(profile(), max_num_batched_tokens=256, eos_token_id=7), 64)
    r1, r2 = req(1), req(2)
    e.add(r1, GenSpec([1, 2], 5))
    e.add(r2, GenSpec([3], 5, ignore_eos=True))
    st = e.plan(0.0)
    assert st is not None
    assert [(x.seq_id, list(x.tokens), x.start, x.sample) for x in st.entries()] == [
        (0, [1, 2], 0, True),
        (1, [3], 0, True),
    ]
    e.done(st, 0.0, {0: 9, 1: 7})
    st = e.plan(0.0)
    assert st is not None
    assert [(x.seq_id, list(x.tokens), x.start) for x in st.entries()] == [(0, [9], 2), (1, [7], 1)]
    evs = e.done(st, 0.0, {0: 7, 1: 7})
    assert [(x.req.request_id, x.finish) for x in evs] == [(1, "stop"), (2, None)]


def test_a_waiting_sequence_past_its_deadline_is_expired_a_started_one_finishes() -> None:
    e = engine(max_num_seqs=1)
    r1 = QueuedRequest(1, "llm", 0.0, 10, 1.0)
    r2 = QueuedRequest(2, "llm", 0.0, 10, 1.0)
    e.add(r1, GenSpec([1, 2], 5))
    e.add(r2, GenSpec([3, 4], 5))
    assert e.expire(0.5) == []
    e.done(e.plan(0.5), 0.5)  # type: ignore[arg-type]  # r1 starts, r2 waits (one seat)
    assert e.expire(2.0) == [r2]
    assert e.num_waiting == 0 and not e.cancel(r2)
    out = run(e)
    assert [f for r, _, f in out if f] == ["length"] and out[-1][0] == 1


def test_the_higher_class_is_admitted_first_then_arrival_order() -> None:
    e = engine(max_num_seqs=1)
    off, on1, on2 = req(1, priority=0), req(2, priority=10), req(3, priority=10)
    for r in (off, on1, on2):
        e.add(r, GenSpec([1, 2, 3], 1))
    order = [x.req.request_id for st in iter(lambda: e.plan(0.0), None) for x in e.done(st, 0.0)]
    assert order == [2, 3, 1]


def test_interleave_classes_first_then_slack_then_tpot_then_alternation() -> None:
    from evenserve.sched.engine.interleave import CLASSIC, ENGINE, Side, first

    step = Side(10, 0.010, 0.0, 0.050)
    batch = Side(10, 0.005)
    assert first(Side(10, 0.010), Side(0, 0.005), None) == ENGINE  # online LLM, offline batch
    assert first(Side(0, 0.010), Side(10, 0.005), ENGINE) == CLASSIC
    assert first(step, batch, None) == ENGINE and first(step, batch, CLASSIC) == ENGINE
    assert first(step, batch, ENGINE) == CLASSIC  # alternate
    urgent = Side(10, 0.005, slack_s=0.004)  # waiting one step would miss the SLO
    assert first(step, urgent, CLASSIC) == CLASSIC
    late = Side(10, 0.010, slack_s=0.048, tpot_s=0.050)  # a batch now would pass TPOT
    assert first(late, batch, ENGINE) == ENGINE
