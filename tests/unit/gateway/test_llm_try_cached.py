"""The gateway's try accounting passes the engine's cached prompt tokens (``usage.
prompt_tokens_details.cached_tokens``) to the LLM router: at the first token when the event
with the first text carries them (a whole answer), else at the end (a stream's final usage
chunk), where the router corrects its prefix index's size for the engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from evenserve.cluster.file import parse_cluster
from evenserve.core.clock import FakeClock
from evenserve.core.load import LlmLoad
from evenserve.gateway.llm_router import LlmGateway

STEP = {
    "c0_ms": 5.0, "prefill_us_per_token": 100.0, "decode_us_per_seq": 50.0,
    "kv_us_per_token": 0.1, "cpu_ms_per_output_token": 0.0, "weights_gib": 16.0,
    "kv_bytes_per_token": 131072, "device_memory_gib": 80.0, "memory_utilization": 0.9,
    "block_tokens": 16, "max_model_len": 8192, "model": "llama", "device": "h100",
    "runtime": "emulated", "precision": "bf16", "source": "a test's",
}  # fmt: skip
PROMPT = list(range(100, 100 + 330))  # 20 whole blocks of 16 ids


def _gateway(clock: FakeClock) -> LlmGateway:
    cfg = parse_cluster(
        {"gateway": {"llm_routing": "round-robin"},
         "backends": [{"name": "b", "url": "http://127.0.0.1:1"}]},
        Path("."),
    ).config.gateway  # fmt: skip
    g = LlmGateway(cfg, clock, lambda name: True)
    load = LlmLoad(
        running=0, waiting=0, queued_prompt_tokens=0, kv_usage=0.0, kv_blocks=1000,
        block_tokens=16, max_num_seqs=64, max_num_batched_tokens=512, preemptions=0,
        step_profile=STEP,
    )  # fmt: skip
    g.observe_report("b", {"llama": load}, 0.0)
    return g


def _sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _usage(cached: int | None) -> dict[str, Any]:
    u: dict[str, Any] = {"prompt_tokens": 330, "completion_tokens": 2, "total_tokens": 332}
    if cached is not None:
        u["prompt_tokens_details"] = {"cached_tokens": cached}
    return u


def _streamed(g: LlmGateway, clock: FakeClock, rid: int, cached: int | None) -> None:
    info = g.request_info(rid, "llama", False, {"prompt": PROMPT, "max_tokens": 2}, {},
                          clock.now(), 10)  # fmt: skip
    t = g.start(info, g.router.engines["b/llama"], clock.now())
    clock.advance(0.1)
    t.feed(_sse({"choices": [{"text": "a", "index": 0}], "usage": None}))
    t.feed(_sse({"choices": [{"text": "b", "index": 0, "finish_reason": "length"}]}))
    t.feed(_sse({"choices": [], "usage": _usage(cached)}) + b"data: [DONE]\n\n")
    t.end_stream()


def test_the_final_usage_chunks_cached_tokens_reach_the_router_at_the_end() -> None:
    clock = FakeClock()
    g = _gateway(clock)
    v = g.router.engines["b/llama"]
    _streamed(g, clock, 1, 0)  # nothing promised: nothing to learn
    assert v.prefix_capacity == 1000
    _streamed(g, clock, 2, 0)  # 20 blocks promised, none cached: the index shrinks
    assert v.prefix_capacity == 900
    _streamed(g, clock, 3, None)  # the usage does not say: nothing learned
    assert v.prefix_capacity == 900
    _streamed(g, clock, 4, 320)  # every promised block cached: it grows back
    assert v.prefix_capacity == 910
    assert g.router.in_flight() == 0


def test_a_whole_answers_cached_tokens_reach_the_router_at_the_first_token() -> None:
    clock = FakeClock()
    g = _gateway(clock)
    v = g.router.engines["b/llama"]
    for rid in (1, 2):
        info = g.request_info(rid, "llama", False, {"prompt": PROMPT, "max_tokens": 2}, {},
                              clock.now(), 10)  # fmt: skip
        t = g.start(info, v, clock.now())
        clock.advance(0.1)
        t.whole(orjson.dumps({"choices": [{"text": "ab"}], "usage": _usage(0)}))
    assert v.prefix_capacity == 900
    assert g.router.in_flight() == 0


def test_engines_are_offered_in_the_backends_listed_order() -> None:
    """Round robin cycles the backends as the cluster file lists them (the classic router's
    order), whatever order their first load reports came in."""
    clock = FakeClock()
    cfg = parse_cluster(
        {"gateway": {"llm_routing": "round-robin"},
         "backends": [{"name": n, "url": "http://127.0.0.1:1"} for n in ("a", "b", "c")]},
        Path("."),
    ).config.gateway  # fmt: skip
    g = LlmGateway(cfg, clock, lambda name: True)
    load = LlmLoad(
        running=0, waiting=0, queued_prompt_tokens=0, kv_usage=0.0, kv_blocks=1000,
        block_tokens=16, max_num_seqs=64, max_num_batched_tokens=512, preemptions=0,
        step_profile=STEP,
    )  # fmt: skip
    for name in ("c", "a", "b"):  # reports arrive out of order
        g.observe_report(name, {"llama": load}, 0.0)
    picks = []
    for rid in range(6):
        info = g.request_info(rid, "llama", False, {"prompt": [1, 2, 3]}, {}, 0.0, 10)
        d = g.choose(info, 0.0, ["a", "b", "c"], [])
        assert d.engine is not None
        picks.append(g.backend_of[d.engine.index])
    assert picks == ["a", "b", "c", "a", "b", "c"]
    info = g.request_info(9, "llama", False, {"prompt": [1, 2, 3]}, {}, 0.0, 10)
    d = g.choose(info, 0.0, ["a", "b", "c"], ["a", "b"])  # tried already
    assert d.engine is not None and g.backend_of[d.engine.index] == "c"
