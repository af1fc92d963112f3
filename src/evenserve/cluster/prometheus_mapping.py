"""How a backend's Prometheus text maps to the gateway's signals (``backends[].signals.mapping``);
``gateway.prometheus_signals`` reads a text through it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from evenserve.core.validation import Strict


class MetricRef(Strict):
    """Where one signal lives in a Prometheus text: a metric, label filters, an aggregate."""

    metric: str = Field(min_length=1)
    labels: dict[str, str] = Field(default_factory=dict, description="keep samples matching")
    aggregate: Literal["sum", "mean", "max", "min"] = "sum"
    scale: float = Field(default=1.0, gt=0, description="multiply (e.g. 0.01 for percent)")


class QueueMetricRef(MetricRef):
    by_model_label: str | None = Field(
        default="model", description="label that names the model (for per-model queues)"
    )


class PrometheusMapping(Strict):
    """Signal -> metric. ``queue_depth`` is required; the others are unknown when absent."""

    queue_depth: QueueMetricRef
    in_flight: MetricRef | None = None
    utilization: MetricRef | None = None
    memory_used_bytes: MetricRef | None = None
    memory_total_bytes: MetricRef | None = None


#: Triton Inference Server's own names (docs: user_guide/metrics.md). ``nv_gpu_utilization`` is
#: a fraction in [0, 1]; per-GPU series are averaged (utilization) or summed (memory).
TRITON_MAPPING: dict[str, Any] = {
    "queue_depth": {"metric": "nv_inference_pending_request_count", "aggregate": "sum"},
    "utilization": {"metric": "nv_gpu_utilization", "aggregate": "mean"},
    "memory_used_bytes": {"metric": "nv_gpu_memory_used_bytes", "aggregate": "sum"},
    "memory_total_bytes": {"metric": "nv_gpu_memory_total_bytes", "aggregate": "sum"},
}
PRESETS: dict[str, dict[str, Any]] = {"triton": TRITON_MAPPING}


# -- LLM servers ----------------------------------------------------------------------------
# The signals the LLM router reads from an OpenAI-compatible server's own ``/metrics``
# (``backends[].kind: openai``), by engine family. The names are llm-d's / the Gateway API
# Inference Extension's model-server protocol table (TotalQueuedRequests,
# TotalRunningRequests, KVCacheUtilization, BlockSize, NumGPUBlocks) for vLLM, SGLang,
# Triton's TensorRT-LLM backend and trtllm-serve; TGI is not in that table, its names are
# TGI's own (docs: reference/metrics). Design note 0021 lists the sources.


class LlmMetricRef(Strict):
    """One LLM signal: the first of ``metrics`` the text has (a rename across versions:
    vLLM's ``kv_cache_usage_perc`` was ``gpu_cache_usage_perc``), samples kept by
    ``labels``, aggregated per model (several series of one model: data-parallel engines
    behind one server; counts are summed, fractions averaged), times ``scale``."""

    metrics: list[str] = Field(min_length=1)
    labels: dict[str, str] = Field(default_factory=dict, description="keep samples matching")
    aggregate: Literal["sum", "mean"] = "sum"
    scale: float = Field(default=1.0, gt=0, description="multiply (e.g. 0.01 for percent)")


class LlmInfoRef(Strict):
    """A gauge whose labels carry the KV cache's configuration (vLLM's
    ``cache_config_info``): the labels naming its block size and its number of blocks."""

    metric: str = Field(min_length=1)
    block_size_label: str | None = "block_size"
    num_blocks_label: str | None = "num_gpu_blocks"


class LlmMetricMapping(Strict):
    """LLM signal -> metric. ``waiting`` is required (a text without it gives no sample);
    the others are unknown (None) when absent, never zero. ``model_label``: the label naming
    the model (one engine per model); a series without it counts for every model the server
    lists."""

    model_label: str | None = "model_name"
    waiting: LlmMetricRef
    running: LlmMetricRef | None = None
    kv_usage: LlmMetricRef | None = None
    preemptions: LlmMetricRef | None = None
    prefix_queries: LlmMetricRef | None = None
    prefix_hits: LlmMetricRef | None = None
    kv_blocks: LlmMetricRef | None = None
    block_tokens: LlmMetricRef | None = None
    #: The KV cache's capacity in tokens, for a server that reports no block count (the
    #: router counts it in its own blocks).
    kv_tokens: LlmMetricRef | None = None
    cache_info: LlmInfoRef | None = None

    def metric_names(self) -> list[str]:
        refs = (
            self.waiting,
            self.running,
            self.kv_usage,
            self.preemptions,
            self.prefix_queries,
            self.prefix_hits,
            self.kv_blocks,
            self.block_tokens,
            self.kv_tokens,
        )
        names = {m for r in refs if r is not None for m in r.metrics}
        if self.cache_info is not None:
            names.add(self.cache_info.metric)
        return sorted(names)


#: vLLM (V1 names; ``gpu_cache_usage_perc`` and ``gpu_prefix_cache_*``: V0's). Counters are
#: read under their exposition name (``_total``).
VLLM_LLM_MAPPING: dict[str, Any] = {
    "model_label": "model_name",
    "waiting": {"metrics": ["vllm:num_requests_waiting"]},
    "running": {"metrics": ["vllm:num_requests_running"]},
    "kv_usage": {
        "metrics": ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
        "aggregate": "mean",
    },
    "preemptions": {"metrics": ["vllm:num_preemptions_total"]},
    "prefix_queries": {
        "metrics": ["vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"]
    },
    "prefix_hits": {
        "metrics": ["vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"]
    },
    "cache_info": {"metric": "vllm:cache_config_info"},
}
#: SGLang: ``num_queue_reqs`` / ``num_running_reqs``; ``token_usage`` is its KV use (a
#: fraction of the token pool) and ``max_total_num_tokens`` that pool's size in tokens; it
#: labels series with ``model_name``.
SGLANG_LLM_MAPPING: dict[str, Any] = {
    "model_label": "model_name",
    "waiting": {"metrics": ["sglang:num_queue_reqs"]},
    "running": {"metrics": ["sglang:num_running_reqs"]},
    "kv_usage": {"metrics": ["sglang:token_usage"], "aggregate": "mean"},
    "kv_tokens": {"metrics": ["sglang:max_total_num_tokens"]},
}
#: Hugging Face TGI: ``tgi_queue_size`` waiting, ``tgi_batch_current_size`` running; no KV
#: use, no model label (one model per server).
TGI_LLM_MAPPING: dict[str, Any] = {
    "model_label": None,
    "waiting": {"metrics": ["tgi_queue_size"]},
    "running": {"metrics": ["tgi_batch_current_size"]},
}
#: Triton's TensorRT-LLM backend: one family per kind, told apart by a label
#: (``request_type`` waiting / scheduled; ``kv_cache_block_type`` fraction / max /
#: tokens_per); Triton names the model in ``model``.
TRTLLM_LLM_MAPPING: dict[str, Any] = {
    "model_label": "model",
    "waiting": {"metrics": ["nv_trt_llm_request_metrics"], "labels": {"request_type": "waiting"}},
    "running": {
        "metrics": ["nv_trt_llm_request_metrics"],
        "labels": {"request_type": "scheduled"},
    },
    "kv_usage": {
        "metrics": ["nv_trt_llm_kv_cache_block_metrics"],
        "labels": {"kv_cache_block_type": "fraction"},
        "aggregate": "mean",
    },
    "kv_blocks": {
        "metrics": ["nv_trt_llm_kv_cache_block_metrics"],
        "labels": {"kv_cache_block_type": "max"},
    },
    "block_tokens": {
        "metrics": ["nv_trt_llm_kv_cache_block_metrics"],
        "labels": {"kv_cache_block_type": "tokens_per"},
    },
}
#: trtllm-serve's own endpoint (the protocol table's column).
TRTLLM_SERVE_LLM_MAPPING: dict[str, Any] = {
    "model_label": "model_name",
    "waiting": {"metrics": ["trtllm_num_requests_waiting"]},
    "running": {"metrics": ["trtllm_num_requests_running"]},
    "kv_usage": {"metrics": ["trtllm_kv_cache_utilization"], "aggregate": "mean"},
}
LLM_PRESETS: dict[str, dict[str, Any]] = {
    "vllm": VLLM_LLM_MAPPING,
    "sglang": SGLANG_LLM_MAPPING,
    "tgi": TGI_LLM_MAPPING,
    "trtllm": TRTLLM_LLM_MAPPING,
    "trtllm-serve": TRTLLM_SERVE_LLM_MAPPING,
}
#: ``engine: auto``: the presets tried in this order; the first whose ``waiting`` metric the
#: text has is the server's.
LLM_ENGINES = tuple(LLM_PRESETS)
