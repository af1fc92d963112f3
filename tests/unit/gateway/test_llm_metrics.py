# ruff: noqa: E501  (exposition lines as servers write them)
"""LLM servers' /metrics read through each engine family's mapping: hand-written exposition
texts with the metric names each server documents (vLLM, SGLang, TGI, Triton's TensorRT-LLM
backend, trtllm-serve), the engine told by its names, a signal absent read as unknown."""

from __future__ import annotations

import pytest

from evenserve.gateway.prometheus_signals import (
    LLM_MAPPINGS,
    PrometheusParseError,
    detect_engine,
    llm_samples_from_text,
)

VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 3.0
vllm:num_requests_running{engine="1",model_name="llama"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama"} 5.0
vllm:num_requests_waiting{engine="1",model_name="llama"} 1.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="llama"} 0.3
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="llama"} 7.0
vllm:num_preemptions_created{engine="0",model_name="llama"} 1.7e9
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="llama"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="llama"} 250.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",num_gpu_blocks="27000"} 1.0
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="llama"} 4.0
"""

#: vLLM before V1: gpu_cache_usage_perc, no prefix counters, one model per server.
VLLM_V0 = """\
vllm:num_requests_running{model_name="opt"} 1
vllm:num_requests_waiting{model_name="opt"} 0
vllm:gpu_cache_usage_perc{model_name="opt"} 0.125
"""

SGLANG = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="qwen"} 4.0
sglang:num_queue_reqs{model_name="qwen"} 9.0
sglang:token_usage{model_name="qwen"} 0.62
sglang:cache_hit_rate{model_name="qwen"} 0.4
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{model_name="qwen"} 161721.0
"""

TGI = """\
# TYPE tgi_queue_size gauge
tgi_queue_size 6
tgi_batch_current_size 2
tgi_batch_current_max_tokens 4096
"""

TRTLLM = """\
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="waiting",version="1"} 3
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="scheduled",version="1"} 5
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 8
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="tensorrt_llm",version="1"} 0.25
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="tensorrt_llm",version="1"} 4096
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="tensorrt_llm",version="1"} 1024
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="tensorrt_llm",version="1"} 64
nv_inference_pending_request_count{model="tensorrt_llm",version="1"} 3
"""

TRTLLM_SERVE = """\
trtllm_num_requests_waiting{model_name="tinyllama"} 2
trtllm_num_requests_running{model_name="tinyllama"} 6
trtllm_kv_cache_utilization{model_name="tinyllama"} 0.75
"""


def test_vllm_sums_counts_and_averages_fractions_of_its_engines() -> None:
    got = llm_samples_from_text(VLLM, LLM_MAPPINGS["vllm"], 12.5)
    assert set(got) == {"llama"}
    s = got["llama"]
    assert (s.taken_s, s.waiting, s.running) == (12.5, 6, 5)
    assert s.kv_usage == pytest.approx(0.4)
    assert s.preemptions == 7
    assert s.prefix_hit_rate == pytest.approx(0.25)
    # cache_config_info has no model label: it stands for every model of the server.
    assert (s.kv_blocks, s.block_tokens) == (27000, 16)


def test_vllm_v0_names_and_what_it_lacks_is_unknown() -> None:
    s = llm_samples_from_text(VLLM_V0, LLM_MAPPINGS["vllm"], 1.0)["opt"]
    assert (s.waiting, s.running, s.kv_usage) == (0, 1, 0.125)
    assert s.preemptions is None and s.prefix_hit_rate is None
    assert s.kv_blocks is None and s.block_tokens is None


def test_sglang() -> None:
    s = llm_samples_from_text(SGLANG, LLM_MAPPINGS["sglang"], 2.0)["qwen"]
    assert (s.waiting, s.running, s.kv_usage) == (9, 4, 0.62)
    assert s.kv_blocks is None and s.preemptions is None
    assert s.kv_tokens == 161721  # its KV pool in tokens: the router's prefix memory


def test_tgi_has_no_model_label_and_no_kv_use() -> None:
    got = llm_samples_from_text(TGI, LLM_MAPPINGS["tgi"], 3.0)
    assert set(got) == {None}
    s = got[None]
    assert (s.waiting, s.running, s.kv_usage) == (6, 2, None)


def test_triton_trtllm_by_label() -> None:
    s = llm_samples_from_text(TRTLLM, LLM_MAPPINGS["trtllm"], 4.0)["tensorrt_llm"]
    assert (s.waiting, s.running, s.kv_usage) == (3, 5, 0.25)
    assert (s.kv_blocks, s.block_tokens) == (4096, 64)


def test_trtllm_serve() -> None:
    s = llm_samples_from_text(TRTLLM_SERVE, LLM_MAPPINGS["trtllm-serve"], 5.0)["tinyllama"]
    assert (s.waiting, s.running, s.kv_usage) == (2, 6, 0.75)


@pytest.mark.parametrize(
    ("text", "engine"),
    [
        (VLLM, "vllm"),
        (VLLM_V0, "vllm"),
        (SGLANG, "sglang"),
        (TGI, "tgi"),
        (TRTLLM, "trtllm"),
        (TRTLLM_SERVE, "trtllm-serve"),
        ("nv_inference_pending_request_count 1\n", None),
    ],
)
def test_detect_engine(text: str, engine: str | None) -> None:
    assert detect_engine(text) == engine


def test_no_waiting_metric_no_sample_and_bad_lines_raise() -> None:
    assert llm_samples_from_text(SGLANG, LLM_MAPPINGS["vllm"], 0.0) == {}
    with pytest.raises(PrometheusParseError):
        llm_samples_from_text('vllm:num_requests_waiting{model_name="x"} many\n',
                              LLM_MAPPINGS["vllm"], 0.0)  # fmt: skip


def test_two_models_on_one_server_are_two_samples() -> None:
    text = (
        'vllm:num_requests_waiting{model_name="a"} 1\n'
        'vllm:num_requests_waiting{model_name="b"} 4\n'
        'vllm:kv_cache_usage_perc{model_name="b"} 0.9\n'
    )
    got = llm_samples_from_text(text, LLM_MAPPINGS["vllm"], 0.0)
    assert (got["a"].waiting, got["a"].kv_usage) == (1, None)
    assert (got["b"].waiting, got["b"].kv_usage) == (4, 0.9)


def test_evenserve_workers_metrics_read_as_vllm() -> None:
    """An evenserve worker exports its engines under vLLM's names (metrics.llm)."""
    from prometheus_client import CollectorRegistry, generate_latest

    from evenserve.metrics.llm import LlmMetrics

    reg = CollectorRegistry()
    m = LlmMetrics(reg, ["chat"])
    reading = {"running": 2, "waiting": 3, "kv_usage": 0.5, "block_size": 16,
               "num_blocks": 2000, "prefix_caching": 1, "preemptions": 1,
               "prompt_tokens": 10, "generation_tokens": 5, "prefix_queries": 40,
               "prefix_hits": 10}  # fmt: skip
    m.bind(lambda: {"chat": reading})
    text = generate_latest(reg).decode()
    assert detect_engine(text) == "vllm"
    s = llm_samples_from_text(text, LLM_MAPPINGS["vllm"], 0.0)["chat"]
    assert (s.waiting, s.running, s.kv_usage, s.preemptions) == (3, 2, 0.5, 1)
    assert (s.kv_blocks, s.block_tokens, s.prefix_hit_rate) == (2000, 16, 0.25)
