"""The gateway's LLM router driver (``gateway.llm_router``) on a FakeClock: prompt blocks
named from text, what a request is to the router, evenserve load reports as engines and
samples, a try's accounting from its streamed pieces (cut anywhere), one end per try, and
stale samples dropped to the router's own accounting."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from evenserve.cluster.file import parse_cluster
from evenserve.core.clock import FakeClock
from evenserve.core.load import LlmLoad
from evenserve.gateway.llm_router import (
    LlmGateway,
    chat_text,
    id_block_hashes,
    profile_of_report,
    retry_after_header,
    text_block_hashes,
)
from evenserve.policy.llm_routing import EngineSample

STEP = {
    "c0_ms": 5.0, "prefill_us_per_token": 100.0, "decode_us_per_seq": 50.0,
    "kv_us_per_token": 0.1, "cpu_ms_per_output_token": 0.0, "weights_gib": 16.0,
    "kv_bytes_per_token": 131072, "device_memory_gib": 80.0, "memory_utilization": 0.9,
    "block_tokens": 16, "max_model_len": 8192, "model": "llama", "device": "h100",
    "runtime": "emulated", "precision": "bf16", "source": "a test's",
}  # fmt: skip


def llm_gateway(clock: FakeClock, **llm: Any) -> LlmGateway:
    cfg = parse_cluster(
        {"gateway": {"llm": llm}, "backends": [{"name": "b", "url": "http://127.0.0.1:1"}]},
        Path("."),
    ).config.gateway
    return LlmGateway(cfg, clock, lambda name: True)


def load(**kw: Any) -> LlmLoad:
    base: dict[str, Any] = dict(
        running=2, waiting=3, queued_prompt_tokens=900, kv_usage=0.25, kv_blocks=1000,
        block_tokens=16, max_num_seqs=64, max_num_batched_tokens=512, preemptions=1,
        step_profile=STEP,
    )  # fmt: skip
    base.update(kw)
    return LlmLoad(**base)


def test_block_names_are_chained_over_the_text_before() -> None:
    a = text_block_hashes("x" * 64 + "y" * 64 + "z" * 10, 64)
    b = text_block_hashes("x" * 64 + "y" * 64 + "w" * 70, 64)
    c = text_block_hashes("q" * 64 + "y" * 64, 64)
    assert len(a) == 2 and len(b) == 3  # a partial last block is not named
    assert a == b[:2]
    assert c[1] != a[1]  # the same second block after another first: another prefix
    assert text_block_hashes("x" * 63, 64) == []
    ids = list(range(40))
    assert len(id_block_hashes(ids, 16)) == 2
    assert id_block_hashes(ids, 16) == id_block_hashes(ids[:32], 16)


def test_chat_text_joins_contents_and_text_parts() -> None:
    msgs = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}]},
        {"role": "user"},
        "junk",
    ]
    assert chat_text(msgs) == "sys\na"
    assert chat_text("not a list") == ""


def test_request_info_from_text_ids_headers_and_defaults() -> None:
    clock = FakeClock()
    g = llm_gateway(clock, chars_per_token=4, prefix_block_tokens=16, ttft_ms=800)
    assert g.block_chars == 64
    info = g.request_info(1, "m", False, {"prompt": "a" * 130}, {}, 2.0, 10)
    assert (info.prompt_tokens, info.max_tokens, len(info.prefix_hashes)) == (33, 16, 2)
    assert (info.ttft_target_s, info.tpot_target_s, info.arrival_s) == (0.8, None, 2.0)
    hdr = {"x-evenserve-ttft-ms": "250", "x-evenserve-tpot-ms": "40"}
    info = g.request_info(2, "m", True, {"messages": [{"role": "user", "content": "b" * 64}],
                                         "max_completion_tokens": 7}, hdr, 0.0, 0)  # fmt: skip
    assert (info.prompt_tokens, info.max_tokens, info.priority) == (16, 7, 0)
    assert (info.ttft_target_s, info.tpot_target_s) == (0.25, 0.04)
    chat_default = g.request_info(3, "m", True, {"messages": []}, {}, 0.0, 10)
    assert (chat_default.max_tokens, chat_default.prompt_tokens) == (256, 1)
    ids = g.request_info(4, "m", False, {"prompt": list(range(40)), "max_tokens": 3}, {}, 0, 10)
    assert (ids.prompt_tokens, len(ids.prefix_hashes), ids.max_tokens) == (40, 2, 3)
    # A target that is no number is no target (the worker judges the request).
    bad = g.request_info(5, "m", False, {"prompt": "x"}, {"x-evenserve-ttft-ms": "soon"}, 0, 10)
    assert bad.ttft_target_s == 0.8


def test_a_whole_step_profile_is_the_engines_and_a_partial_one_is_none() -> None:
    p = profile_of_report(STEP)
    assert p is not None and p.c0_s == pytest.approx(0.005)
    assert p.prefill_s_per_token == pytest.approx(1e-4)
    partial = {k: v for k, v in STEP.items() if k != "weights_gib"}
    assert profile_of_report(partial) is None


def test_load_reports_add_update_and_drop_engines_and_feed_samples() -> None:
    clock = FakeClock()
    g = llm_gateway(clock)
    g.observe_report("w0", {"llama": load(step_profile={})}, 1.5)
    v = g.router.engines["w0/llama"]
    assert v.profile is None and (v.kv_blocks, v.max_num_seqs) == (1000, 64)
    assert v.sample == EngineSample(taken_s=1.5, running=2, waiting=3, kv_usage=0.25,
                                    queued_prompt_tokens=900, preemptions=1, kv_blocks=1000,
                                    block_tokens=16)  # fmt: skip
    assert (v.extra_waiting, v.extra_running, v.extra_waiting_tokens) == (3, 2, 900)
    g.observe_report("w0", {"llama": load(max_num_seqs=32)}, 2.0)
    assert g.router.engines["w0/llama"] is v and v.profile is not None and v.max_num_seqs == 32
    assert g.handles("llama") and not g.handles("bert")
    g.observe_report("w0", {}, 3.0)
    assert g.router.engines == {} and not g.handles("llama")


def test_an_engines_kv_blocks_are_counted_in_the_gateways_prompt_blocks() -> None:
    """The router names a prompt's blocks ``prefix_block_tokens`` long; an engine whose own
    blocks are longer (TensorRT-LLM's 64 tokens) holds 4x as many of the router's, from its
    report and from a sample alike (a prefix hit of n blocks is n x 16 cached tokens)."""
    g = llm_gateway(FakeClock(), prefix_block_tokens=16)
    g.observe_report("w0", {"llama": load(kv_blocks=1000, block_tokens=64)}, 1.0)
    v = g.router.engines["w0/llama"]
    assert (v.kv_blocks, v.block_tokens, v.prefix_capacity) == (4000, 16, 4000)
    g.set_openai_models("t", ["m"])
    g.observe("t", "m", EngineSample(taken_s=1.0, running=0, waiting=0, kv_blocks=512,
                                     block_tokens=64), 1.0)  # fmt: skip
    t = g.router.engines["t/m"]
    assert (t.kv_blocks, t.block_tokens, t.prefix_capacity) == (2048, 16, 2048)


def test_openai_models_engines_and_samples_by_model() -> None:
    clock = FakeClock()
    g = llm_gateway(clock)
    g.set_openai_models("v", ["a", "b"])
    assert sorted(g.router.engines) == ["v/a", "v/b"]
    g.observe("v", None, EngineSample(taken_s=0.0, running=1, waiting=0), 0.0)
    assert all(e.sample is not None for e in g.router.engines.values())
    g.observe("v", "b", EngineSample(taken_s=1.0, running=0, waiting=4, kv_blocks=500), 1.0)
    assert g.router.engines["v/b"].kv_blocks == 500
    g.observe("v", "zzz", EngineSample(taken_s=1.0, running=0, waiting=4), 1.0)  # unknown
    g.set_openai_models("v", ["b"])
    assert sorted(g.router.engines) == ["v/b"]


def test_openai_engines_prefix_memory_from_the_cluster_files_kv_tokens() -> None:
    """A server whose /metrics name no KV size (TGI): the backend entry's ``kv_tokens``, in
    the router's blocks (``prefix_block_tokens``), is its engines' prefix memory."""
    g = llm_gateway(FakeClock(), prefix_block_tokens=16)
    g.set_openai_models("t", ["m"], kv_tokens=160_000)
    g.set_openai_models("v", ["m"])
    t, v = g.router.engines["t/m"], g.router.engines["v/m"]
    assert (t.kv_blocks, t.prefix_capacity) == (10_000, 10_000)
    assert (v.kv_blocks, v.prefix_capacity) == (0, 0)  # until its /metrics say


def test_choose_among_routable_untried_backends() -> None:
    clock = FakeClock()
    g = llm_gateway(clock)
    g.set_openai_models("v0", ["m"])
    g.set_openai_models("v1", ["m"])
    info = g.request_info(1, "m", False, {"prompt": "hi"}, {}, 0.0, 10)
    d = g.choose(info, 0.0, ["v0", "v1"], ["v0"])
    assert d.engine is not None and g.backend_of[d.engine.index] == "v1"
    assert g.choose(info, 0.0, ["v0"], ["v0"]).reason == "no-engine"


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def test_a_streamed_try_first_token_usage_and_one_end() -> None:
    clock = FakeClock()
    g = llm_gateway(clock)
    g.set_openai_models("v", ["m"])
    v = g.router.engines["v/m"]
    info = g.request_info(7, "m", True, {"messages": [{"role": "user", "content": "hi"}],
                                         "max_tokens": 4}, {}, 0.0, 10)  # fmt: skip
    t = g.start(info, v, 0.0)
    assert (v.own_waiting, v.own_running) == (1, 0)
    role = sse({"choices": [{"delta": {"role": "assistant"}, "index": 0}]})
    t.feed(role)
    assert not t.first and v.own_waiting == 1  # no text yet
    clock.advance(0.2)
    piece = sse({"choices": [{"delta": {"content": "ab"}, "index": 0}]})
    t.feed(piece[:9])  # cut mid-event
    assert not t.first
    t.feed(piece[9:])
    assert t.first and (v.own_waiting, v.own_running) == (0, 1)
    clock.advance(0.3)
    t.feed(sse({"choices": [{"delta": {"content": "cd"}, "index": 0}]}))
    t.feed(sse({"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 4}}))
    t.feed(b"data: [DONE]\n\n")
    assert (t.text_events, t.usage) == (2, 4)
    t.end_stream()
    t.end()  # a second end does nothing
    assert g.router.in_flight() == 0 and (v.own_waiting, v.own_running) == (0, 0)
    assert v.learned_tpot_s == pytest.approx(0.1)  # 0.3 s over 4 - 1 tokens
    assert v.learned_base_s is not None


def test_a_whole_answer_and_a_failed_try() -> None:
    clock = FakeClock()
    g = llm_gateway(clock)
    g.set_openai_models("v", ["m"])
    v = g.router.engines["v/m"]
    info = g.request_info(8, "m", False, {"prompt": "hello"}, {}, 0.0, 10)
    t = g.start(info, v, 0.0)
    t.end()  # failed before any answer: ended, nothing learned
    assert g.router.in_flight() == 0 and v.learned_base_s is None
    t2 = g.start(info, v, 0.0)  # the retry (same request id, after its end)
    clock.advance(0.5)
    t2.whole(orjson.dumps({"choices": [{"text": "x"}], "usage": {"completion_tokens": 6}}))
    assert g.router.in_flight() == 0 and v.learned_base_s is not None


def test_stale_samples_are_dropped_to_the_routers_own_accounting() -> None:
    clock = FakeClock()
    g = llm_gateway(clock, stale_after_ms=1000)
    g.observe_report("w0", {"llama": load()}, 0.0)
    v = g.router.engines["w0/llama"]
    assert v.extra_waiting == 3
    g.expire(0.9)
    assert v.extra_waiting == 3
    g.expire(1.5)
    assert (v.extra_waiting, v.extra_running, v.extra_waiting_tokens, v.extra_kv_tokens) == (
        0, 0, 0, 0,
    )  # fmt: skip
    assert v.age_s(1.5) == pytest.approx(1.5)  # the sample stays: its age keeps growing


async def test_a_delayed_sample_reaches_the_router_later_with_its_read_time() -> None:
    clock = FakeClock()
    g = llm_gateway(clock, signal_delay_ms=50)
    g.observe_report("w0", {"llama": load()}, 0.0)
    v = g.router.engines["w0/llama"]  # the engine is known at once ...
    assert v.sample is None and v.extra_waiting == 0  # ... its sample is held back
    clock.advance(7.0)
    await asyncio.sleep(0.2)  # the loop's timer for the sample (50 ms) fires first
    assert v.sample is not None and v.sample.taken_s == 0.0 and v.received_s == 7.0
    assert v.extra_waiting == 3 and v.age_s(7.0) == pytest.approx(7.0)


def test_retry_after_whole_seconds_rounded_up_at_least_one() -> None:
    assert [retry_after_header(x) for x in (None, 0.0, 0.2, 1.0, 1.01, 7.9)] == [
        "1", "1", "1", "1", "2", "8",
    ]  # fmt: skip


def test_refusals_and_engine_gauges_in_the_collector() -> None:
    clock = FakeClock()
    g = llm_gateway(clock)
    g.set_openai_models("v", ["m"])
    g.refused("m", "ttft-unreachable")
    g.refused("m", "ttft-unreachable")
    fams = {f.name: f for f in g.collector().collect()}
    age = fams["evenserve_gateway_llm_engine_signal_age_seconds"].samples
    assert age[0].labels == {"engine": "v/m"} and age[0].value != age[0].value  # NaN: never
    refused = fams["evenserve_gateway_llm_refusals"].samples
    assert [(s.labels, s.value) for s in refused if s.name.endswith("_total")] == [
        ({"model": "m", "reason": "ttft-unreachable"}, 2.0)
    ]
