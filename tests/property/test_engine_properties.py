"""Properties of the LLM engine (sched.engine) under random arrivals, steps and cancels, in
every mode: KV blocks are never over capacity and never lost; every request is answered
exactly once (finished, refused or cancelled); every preempted sequence completes; a cancelled
sequence's blocks are freed; tokens come in order, one index at a time."""

from __future__ import annotations

from hypothesis import given, settings, target
from hypothesis import strategies as st

from evenserve.core.llm import StepProfile
from evenserve.sched import QueuedRequest
from evenserve.sched.engine import MODES, Engine, EngineSetup, GenSpec

PROFILE = StepProfile(
    model="llm", device="test", runtime="emulated", precision="bf16", source="test",
    c0_s=0.005, prefill_s_per_token=1e-5, decode_s_per_seq=1e-4, kv_s_per_token=1e-7,
    cpu_s_per_output_token=0.0, weights_bytes=0.0, kv_bytes_per_token=1,
    device_memory_bytes=1.0, block_tokens=4, max_model_len=48,
)  # fmt: skip
EOS = 3

op = st.one_of(
    st.tuples(
        st.just("add"),
        st.lists(st.integers(0, 3), min_size=0, max_size=30),  # small alphabet: shared prefixes
        st.integers(1, 20),
        st.sampled_from([0, 10]),
        st.booleans(),
    ),
    st.tuples(st.just("step"), st.lists(st.integers(0, 5), min_size=8, max_size=8)),
    st.tuples(st.just("cancel"), st.integers(0, 40)),
)


@settings(max_examples=150)
@given(
    mode=st.sampled_from(MODES),
    blocks=st.integers(6, 24),
    seqs=st.integers(1, 6),
    budget=st.integers(8, 64),
    caching=st.booleans(),
    ops=st.lists(op, max_size=60),
)
def test_engine_answers_each_request_once_and_keeps_blocks(
    mode: str, blocks: int, seqs: int, budget: int, caching: bool, ops: list[tuple]
) -> None:
    if mode != "continuous-chunked":
        budget = max(budget, PROFILE.max_model_len)
    setup = EngineSetup(
        PROFILE, mode=mode, max_num_seqs=seqs, max_num_batched_tokens=budget,  # type: ignore[arg-type]
        chunk_tokens=6, prefix_caching=caching, eos_token_id=EOS,
    )  # fmt: skip
    e: Engine[QueuedRequest] = Engine(setup, blocks)
    reqs: list[QueuedRequest] = []
    accepted: set[int] = set()
    answered: dict[int, str] = {}
    last_index: dict[int, int] = {}
    preempted: set[int] = set()

    def step(tokens: list[int]) -> None:
        s = e.plan(0.0)
        if s is None:
            return
        sampled = {p.seq.seq_id: tokens[i % len(tokens)] for i, p in enumerate(s.parts)}
        for ev in e.done(s, 0.0, sampled):
            rid = ev.req.request_id
            assert rid not in answered, "a token after the last"
            assert ev.index == last_index.get(rid, 0) + 1
            last_index[rid] = ev.index
            if ev.finish is not None:
                answered[rid] = ev.finish
        for seq in list(e.by_req.values()):
            if seq.preemptions:
                preempted.add(seq.req.request_id)
        e.kv.check()
        assert e.kv.used <= e.kv.num_blocks
        assert len(e.running) <= seqs

    for o in ops:
        if o[0] == "add":
            r = QueuedRequest(len(reqs), "llm", 0.0, o[3])
            reqs.append(r)
            if e.add(r, GenSpec(o[1], o[2], ignore_eos=o[4])) is None:
                accepted.add(r.request_id)
            else:
                answered[r.request_id] = "refused"
        elif o[0] == "step":
            step(o[1])
        elif reqs:
            r = reqs[o[1] % len(reqs)]
            seq = e.by_req.get(r.request_id)
            if e.cancel(r):
                assert r.request_id not in answered
                assert seq is not None and seq.blocks == []
                answered[r.request_id] = "cancelled"
            e.kv.check()
    for _ in range(2000):
        if not e.has_work:
            break
        step([0, 1, 2, 3, 4, 5, 6, 7])
    assert not e.has_work, "the engine got stuck"
    assert set(answered) == {r.request_id for r in reqs}
    done = {rid for rid, why in answered.items() if why in ("stop", "length", "cancelled")}
    assert preempted <= done
    assert e.kv.used == 0
    e.kv.check()
    target(float(e.counters.preemptions))  # steer the search towards preemptions
