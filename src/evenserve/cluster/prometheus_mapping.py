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
