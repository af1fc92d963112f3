"""The LLM router learns the engine's cached prompt tokens at a request's end when the driver
learns them only then (a stream's final usage chunk): the same correction as at the first
token, applied once."""

from __future__ import annotations

from evenserve.core.llm import StepProfile
from evenserve.policy.llm_routing import LlmRequestInfo, LlmRouter

H100 = StepProfile(
    model="m", device="h100", runtime="vllm", precision="bf16", source="test",
    c0_s=5.75e-3, prefill_s_per_token=17.25e-6, decode_s_per_seq=6e-6, kv_s_per_token=0.0,
    cpu_s_per_output_token=0.0, weights_bytes=16e9, kv_bytes_per_token=131072,
    device_memory_bytes=80e9,
)  # fmt: skip
HASHES = tuple(range(20))


def _req(rid: int) -> LlmRequestInfo:
    return LlmRequestInfo(rid, "m", 0.0, 330, 10, HASHES, 10, 1.0, 0.05)


def _router() -> LlmRouter:
    r = LlmRouter.build("round-robin", seed=1)
    r.add_engine("e0", ["m"], H100, 1000, 16, 256, 512)
    return r


def test_cached_tokens_at_done_shrink_the_capacity_as_at_the_first_token() -> None:
    r = _router()
    v = r.engines["e0"]
    r.sent(_req(1), v, 0.0)  # nothing promised yet: the index learns the blocks
    r.first_token(1, 0.1)
    r.done(1, 0.2, 10, cached_tokens=0)
    assert v.prefix_capacity == 1000  # nothing was promised
    r.sent(_req(2), v, 0.3)  # 20 blocks promised
    r.first_token(2, 0.4)
    assert v.prefix_capacity == 1000  # not known yet
    r.done(2, 0.5, 10, cached_tokens=0)
    assert v.prefix_capacity == 900
    r.sent(_req(3), v, 0.6)
    r.first_token(3, 0.7)
    r.done(3, 0.8, 10, cached_tokens=320)
    assert v.prefix_capacity == 910


def test_cached_tokens_are_learned_once_a_request() -> None:
    r = _router()
    v = r.engines["e0"]
    r.sent(_req(1), v, 0.0)
    r.first_token(1, 0.1)
    r.done(1, 0.2, 10)
    r.sent(_req(2), v, 0.3)
    r.first_token(2, 0.4, cached_tokens=0)
    assert v.prefix_capacity == 900
    r.done(2, 0.5, 10, cached_tokens=0)  # already learned at the first token
    assert v.prefix_capacity == 900


def test_a_request_ended_before_its_first_token_learns_nothing() -> None:
    r = _router()
    v = r.engines["e0"]
    r.sent(_req(1), v, 0.0)
    r.first_token(1, 0.1)
    r.done(1, 0.2, 10)
    r.sent(_req(2), v, 0.3)
    r.done(2, 0.4, None, cached_tokens=0)  # refused by the engine: no prefill happened
    assert v.prefix_capacity == 1000
