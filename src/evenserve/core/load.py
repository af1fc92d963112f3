"""The worker's load report: the JSON body of ``GET /v2/evenserve/load``.

Cheap to produce and to parse; the gateway polls it every 100 ms (by default) and turns it
into a LoadSample stamped with the gateway's own receive time (clocks of two processes are not
comparable, so the worker's ``timestamp_s`` is informational: wall-clock seconds).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from evenserve.core.types import LoadSample


class LlmLoad(BaseModel):
    """One LLM engine's load here (the engine's own figures, not requests in batches)."""

    model_config = ConfigDict(extra="ignore")

    running: int = Field(ge=0, description="sequences in the engine's steps")
    waiting: int = Field(ge=0, description="sequences waiting to be admitted")
    queued_prompt_tokens: int = Field(ge=0, description="prompt tokens still to prefill, waiting")
    kv_usage: float = Field(ge=0, le=1, description="fraction of KV blocks held by sequences")
    kv_blocks: int = Field(ge=0)
    block_tokens: int = Field(ge=1)
    max_num_seqs: int = Field(ge=1)
    max_num_batched_tokens: int = Field(ge=1)
    preemptions: int = Field(ge=0, description="preemptions by recompute so far")
    step_profile: dict[str, float | str] = Field(
        default_factory=dict,
        description="the step profile: a step profile file's fields (core.llm.StepProfileFile "
        "less kind: c0_ms, prefill_us_per_token, decode_us_per_seq, kv_us_per_token, "
        "cpu_ms_per_output_token, weights_gib, kv_bytes_per_token, device_memory_gib, ..., "
        "model, device, runtime, precision, source)",
    )


class LoadReport(BaseModel):
    model_config = ConfigDict(extra="ignore")

    timestamp_s: float = Field(description="worker wall-clock time (time.time())")
    device: str = Field(description="device this worker owns, e.g. cpu, cuda:0, emulated:a10")
    device_kind: str | None = Field(default=None, description="cpu, cuda or emulated")
    device_slice: str | None = Field(
        default=None,
        description="the part of a GPU it owns: mig-3g.20gb, mig-<uuid>, share-1of2 (None: all)",
    )
    queue_depth: int = Field(ge=0, description="requests waiting, all models")
    in_flight: int = Field(ge=0, description="requests inside running batches")
    queued_by_model: dict[str, int] = Field(default_factory=dict)
    in_flight_by_model: dict[str, int] = Field(default_factory=dict)
    utilization: float = Field(ge=0, le=1, description="busy fraction over utilization_window_s")
    utilization_window_s: float = Field(gt=0)
    memory_used_bytes: float | None = Field(default=None, ge=0)
    memory_total_bytes: float | None = Field(default=None, ge=0)
    busy_remaining_s: float = Field(default=0.0, ge=0)
    max_batch_size_by_model: dict[str, int] = Field(
        default_factory=dict, description="most requests one batch takes, per model, here"
    )
    slo_ms_by_model: dict[str, float] = Field(
        default_factory=dict, description="latency SLO per model (models without one absent)"
    )
    max_queue_by_model: dict[str, int] = Field(
        default_factory=dict, description="queue bound per model (unbounded models absent)"
    )
    profile_scale_by_model: dict[str, float] = Field(
        default_factory=dict,
        description="profiles that learn (--learn-profiles): each model's learned batch time "
        "over its profile's (core.profile_learning); absent: the worker does not learn",
    )
    observed_ms_by_model: dict[str, dict[int, float]] = Field(
        default_factory=dict,
        description="profiles that learn: each model's smoothed observed batch time, ms, by "
        "batch size (sizes observed often enough); the gateway's profile follows them",
    )
    llm_by_model: dict[str, LlmLoad] = Field(
        default_factory=dict, description="each LLM engine's sequences, KV use and step profile"
    )
    engine_utilization: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="a worker with LLM engines (awake or asleep): the device's load as "
        "placement reads it (policy.placement.engine: classic batches' busy fraction, plus "
        "of the rest the engines' mean step time over their TPOT target, or their KV use if "
        "higher), over utilization_window_s; None: no LLM here (placement reads utilization)",
    )
    loading_models: list[str] = Field(
        default_factory=list,
        description="models being loaded here now (requests for them wait for the load, up "
        "to the worker's --load-wait-ms); the per-model figures above list READY models only",
    )
    models_version: int | None = Field(
        default=None,
        description="changes whenever a model's state changes here (load, unload): a gateway "
        "reads the repository index again only when it moved (None: not reported)",
    )
    ready: bool = True

    def to_sample(self, received_at_s: float) -> LoadSample:
        return LoadSample(
            timestamp_s=received_at_s,
            queue_depth=float(self.queue_depth),
            in_flight=float(self.in_flight),
            utilization=self.utilization,
            memory_used_bytes=self.memory_used_bytes,
            memory_total_bytes=self.memory_total_bytes,
            queued_by_model={m: float(q) for m, q in self.queued_by_model.items()},
            busy_remaining_s=self.busy_remaining_s,
            max_batch_size=self.max_batch_size_by_model,
            slo_s={m: ms / 1000.0 for m, ms in self.slo_ms_by_model.items()},
            max_queue=self.max_queue_by_model,
            profile_scale=self.profile_scale_by_model,
            observed_ms=self.observed_ms_by_model,
        )
