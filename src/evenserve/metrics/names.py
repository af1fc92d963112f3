"""Every metric name evenserve exports, in one place (Prometheus conventions).

Units are in the names (``_seconds``, ``_bytes``, ``_ratio``); counters end in ``_total``.
Labels: ``model`` for per-model series, ``device`` for per-device ones, ``outcome`` for
request outcomes (see OUTCOMES), ``reason`` for refusals (``core.wire.REFUSAL_REASONS``, the
simulator's drop reasons), ``gpu`` (NVML index) for NVML figures.
"""

from __future__ import annotations

PREFIX = "evenserve_worker"

# Per model.
QUEUE_DEPTH = f"{PREFIX}_queue_depth"  # gauge: requests waiting
IN_FLIGHT = f"{PREFIX}_in_flight"  # gauge: requests inside running batches
BATCH_SIZE = f"{PREFIX}_batch_size"  # histogram: items per batch
QUEUE_TIME = f"{PREFIX}_queue_time_seconds"  # histogram: arrival -> batch start, per request
COMPUTE_TIME = f"{PREFIX}_compute_time_seconds"  # histogram: one batch on the device
REQUEST_LATENCY = f"{PREFIX}_request_latency_seconds"  # histogram: received -> answered
REQUESTS = f"{PREFIX}_requests"  # counter (exported as _total), by model and outcome
BATCHES = f"{PREFIX}_batches"  # counter (exported as _total), by model
REFUSALS = f"{PREFIX}_refusals"  # counter (_total): requests refused, by model and reason
# Diagnosis (design 0012), per model: counters (_total) of the seconds batches' instances sat
# idle while their oldest request waited (``sched.Batch.held_s``), of the profile's expected
# seconds (``Batch.solo_s``, batches with a profile only), of input staging (the executor's
# compute_input phase); a gauge of the policy's batch cap now.
BATCH_HELD = f"{PREFIX}_batch_held_seconds"
BATCH_EXPECTED = f"{PREFIX}_batch_expected_seconds"
COMPUTE_INPUT = f"{PREFIX}_compute_input_seconds"
BATCH_CAP = f"{PREFIX}_batch_cap"

# Model control (the repository extension), per model.
MODEL_LOADS = "evenserve_model_loads"  # counter (_total): load attempts, by model and outcome
MODEL_UNLOADS = "evenserve_model_unloads"  # counter (_total): unloads done, by model
#: Counter (_total): loads done, by model and source (host: the warm pool; disk: cold).
MODEL_LOAD_SOURCES = "evenserve_model_load_sources"
#: Histogram: how long an inference request waited for its model's load, by model.
LOAD_WAIT = "evenserve_load_wait_seconds"
#: The ``outcome`` label of MODEL_LOADS.
LOAD_OUTCOMES = ("success", "failure")

# Per device.
DEVICE_BUSY_RATIO = f"{PREFIX}_device_busy_ratio"  # gauge: busy fraction over the window
DEVICE_BUSY_SECONDS = f"{PREFIX}_device_busy_seconds"  # counter (_total): busy time, summed
DEVICE_MEMORY_USED = f"{PREFIX}_device_memory_used_bytes"  # gauge
DEVICE_MEMORY_TOTAL = f"{PREFIX}_device_memory_total_bytes"  # gauge
DEVICE_INSTANCES = f"{PREFIX}_device_instances"  # gauge: batch slots on the device
#: Gauge, 1: labels device, kind, slice (mig-3g.20gb ...) and DCGM_LABELS.
DEVICE_INFO = f"{PREFIX}_device_info"
#: dcgm-exporter's device labels, also on DEVICE_INFO (``metrics.worker.DcgmLabels``), so a
#: query joins the worker's series with DCGM's: ``... * on(instance) group_left(gpu, UUID,
#: modelName) evenserve_worker_device_info``, then ``on(UUID)`` with ``DCGM_FI_DEV_*``.
DCGM_LABELS = ("gpu", "UUID", "modelName")

# NVML (only when a GPU and pynvml are present).
GPU_SM_UTILIZATION = "evenserve_gpu_sm_utilization_ratio"  # gauge: NVML "gpu" utilization
GPU_MEMORY_USED = "evenserve_gpu_memory_used_bytes"  # gauge
GPU_MEMORY_TOTAL = "evenserve_gpu_memory_total_bytes"  # gauge
GPU_PCIE_TX = "evenserve_gpu_pcie_tx_bytes_per_second"  # gauge
GPU_PCIE_RX = "evenserve_gpu_pcie_rx_bytes_per_second"  # gauge

#: Request outcomes (the ``outcome`` label of REQUESTS).
OUTCOMES = (
    "success",
    "bad_request",  # 400: malformed body, wrong input
    "not_found",  # 404: unknown model or version
    "too_large",  # 413: body over the limit
    "rejected_queue_full",  # 429: the queue was full of requests of its class or higher
    "shed",  # 429: shed from a full queue for a request of a higher class
    "deadline_infeasible",  # 504 at once: the profile says its deadline cannot be met
    "deadline_expired",  # 504: could no longer meet its deadline while it waited
    "unavailable",  # 503: not ready or shutting down
    "error",  # 500: the runtime failed
    "cancelled",  # the client went away before its batch started
)

BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TIME_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30)

# Gateway (collectors in evenserve.metrics.gateway). Labels: ``backend`` (a backend's name,
# ``none`` when no backend answered), ``model``, ``outcome`` (GATEWAY_OUTCOMES), ``reason``.
GATEWAY_PREFIX = "evenserve_gateway"
GATEWAY_REQUESTS = f"{GATEWAY_PREFIX}_requests"  # counter (_total): by backend, model, outcome
GATEWAY_REQUEST_DURATION = f"{GATEWAY_PREFIX}_request_duration_seconds"  # histogram: by model
GATEWAY_ROUTING_DECISION = f"{GATEWAY_PREFIX}_routing_decision_seconds"  # histogram
GATEWAY_RETRIES = f"{GATEWAY_PREFIX}_retries"  # counter (_total): sent to a second backend
GATEWAY_BACKEND_HEALTHY = f"{GATEWAY_PREFIX}_backend_healthy"  # gauge: 1 routable, 0 ejected
GATEWAY_BACKEND_EJECTIONS = f"{GATEWAY_PREFIX}_backend_ejections"  # counter (_total): by reason
GATEWAY_BACKEND_SIGNAL_AGE = f"{GATEWAY_PREFIX}_backend_signal_age_seconds"  # gauge
GATEWAY_BACKEND_IN_FLIGHT = f"{GATEWAY_PREFIX}_backend_in_flight"  # gauge
GATEWAY_BACKEND_QUEUE_DEPTH = f"{GATEWAY_PREFIX}_backend_queue_depth"  # gauge: router's estimate
# Placement (only with gateway.placement): counters (_total) by backend and model, the
# device-seconds each device was on (the cost), autoscaler decisions by direction (up/down).
GATEWAY_MODEL_LOADS = f"{GATEWAY_PREFIX}_model_loads"
GATEWAY_EVICTIONS = f"{GATEWAY_PREFIX}_evictions"
GATEWAY_DEVICE_ACTIVE_SECONDS = f"{GATEWAY_PREFIX}_device_active_seconds"
GATEWAY_SCALE_DECISIONS = f"{GATEWAY_PREFIX}_scale_decisions"
GATEWAY_SCALE_UP_DECISION_SECONDS = f"{GATEWAY_PREFIX}_scale_up_decision_seconds"  # gauge
# Reconciliation: devices lost (ejected while on), models adopted from / dropped after a
# backend's index (by backend and model).
GATEWAY_DEVICES_LOST = f"{GATEWAY_PREFIX}_devices_lost"
GATEWAY_PLACEMENT_ADOPTED = f"{GATEWAY_PREFIX}_placement_adopted"
GATEWAY_PLACEMENT_DROPPED = f"{GATEWAY_PREFIX}_placement_dropped"
#: The LLM router (OpenAI requests of LLM models; ``gateway.llm_router``): per engine
#: (``backend/model``) the age of its newest signal sample and the requests it has of the
#: router's (by state: waiting for a first token, running); refusals by model and reason.
GATEWAY_LLM_SIGNAL_AGE = f"{GATEWAY_PREFIX}_llm_engine_signal_age_seconds"  # gauge
GATEWAY_LLM_IN_FLIGHT = f"{GATEWAY_PREFIX}_llm_engine_in_flight"  # gauge
GATEWAY_LLM_REFUSALS = f"{GATEWAY_PREFIX}_llm_refusals"  # counter (_total)
#: Request-log records lost because the writer fell behind (``--record``; counter, _total).
GATEWAY_RECORD_DROPPED = f"{GATEWAY_PREFIX}_record_dropped"
WORKER_RECORD_DROPPED = "evenserve_worker_record_dropped"

#: Gateway request outcomes (the ``outcome`` label of GATEWAY_REQUESTS).
GATEWAY_OUTCOMES = (
    "ok",  # the backend's 2xx/3xx, relayed
    "client_error",  # the backend's 4xx (not 429), relayed
    "backend_error",  # the backend's 5xx, relayed (after the retry, for 503)
    "backend_overloaded",  # the backend's 429, relayed (after the retry)
    "overloaded",  # the gateway's 429: every host full or late (policy.routing.refusal)
    "unavailable",  # the gateway's 503: no host could take it
    "timeout",  # the gateway's 504: the backend did not answer in time
    "unknown_model",  # the gateway's 404: no backend hosts the model
)
#: The ``model`` label of requests for a model nobody serves (worker and gateway): a client
#: choosing names must not choose the series (a worker's repository skips folders whose
#: names start with "_").
UNKNOWN_MODEL_LABEL = "_unknown"
#: Routing decision buckets (seconds): the budget is 0.5 ms.
GATEWAY_DECISION_BUCKETS_S = (5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3)
