"""The cluster file's ``backends:`` entries: servers started elsewhere (Triton, MLServer, other
workers, OpenAI-compatible LLM servers such as vLLM), and how the gateway reads their
signals.

``kind: openai`` is an OpenAI-compatible LLM server known by its URL alone: the gateway
reads its models from ``GET /v1/models`` (which is also its readiness) and its signals from
its own ``/metrics`` through the LLM mapping of its ``engine`` (``auto``: told by the metric
names; ``cluster.prometheus_mapping.LLM_PRESETS``)."""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from evenserve.cluster.gateway_section import GrpcForward
from evenserve.cluster.names import ModelName, Name
from evenserve.cluster.prometheus_mapping import (
    LLM_PRESETS,
    PRESETS,
    TRITON_MAPPING,
    PrometheusMapping,
)
from evenserve.core.validation import Strict

#: A backend's API: KServe v2 (evenserve workers, Triton, MLServer) or OpenAI-compatible.
BackendKind = Literal["kserve", "openai"]
#: An OpenAI server's engine family (its ``/metrics`` names), or ``auto``.
LlmEngine = Literal["auto", "vllm", "sglang", "tgi", "trtllm", "trtllm-serve"]
assert set(LLM_PRESETS) == set(LlmEngine.__args__) - {"auto"}  # type: ignore[attr-defined]


class BackendSignals(Strict):
    source: Literal["evenserve", "prometheus", "llm", "none"] = Field(
        default="evenserve",
        description="evenserve: its load report; prometheus: its /metrics through mapping; "
        "llm: an OpenAI server's /metrics through its engine's LLM mapping (the default of "
        "kind: openai); none: the gateway's own counts only",
    )
    url: str | None = Field(
        default=None, description="load endpoint or metrics URL (default: on the backend URL)"
    )
    mapping: PrometheusMapping | None = None
    interval_ms: float | None = Field(default=None, gt=0, description="default: gateway's")

    @model_validator(mode="before")
    @classmethod
    def _expand_preset(cls, raw: Any) -> Any:
        if not isinstance(raw, dict):
            return raw
        mapping = raw.get("mapping")
        if isinstance(mapping, str):  # a preset's name: its mapping
            mapping = {"preset": mapping}
        if isinstance(mapping, dict) and "preset" in mapping:  # a preset and overrides
            overrides = dict(mapping)
            name = str(overrides.pop("preset"))
            if name not in PRESETS:
                raise ValueError(f"mapping: unknown preset {name!r} (known: {', '.join(PRESETS)})")
            raw = {**raw, "mapping": {**PRESETS[name], **overrides}}
        if raw.get("source") == "prometheus" and raw.get("mapping") is None:
            raw = {**raw, "mapping": dict(TRITON_MAPPING)}
        return raw

    @model_validator(mode="after")
    def _mapping_only_for_prometheus(self) -> BackendSignals:
        if self.mapping is not None and self.source != "prometheus":
            raise ValueError("mapping: only meaningful with source: prometheus")
        return self


class BackendSpec(Strict):
    name: Name
    url: str = Field(min_length=1, description="base URL of its HTTP API (KServe v2 or OpenAI)")
    kind: BackendKind = Field(
        default="kserve",
        description="kserve: KServe v2 (evenserve workers, Triton, MLServer); openai: an "
        "OpenAI-compatible LLM server (vLLM, SGLang, TGI, trtllm-serve): models from "
        "GET /v1/models, signals from its /metrics",
    )
    engine: LlmEngine = Field(
        default="auto",
        description="kind: openai: the server's engine family, whose metric names its "
        "/metrics uses (auto: told by the names it finds)",
    )
    kv_tokens: int | None = Field(
        default=None,
        ge=1,
        description="kind: openai: its KV cache in tokens, for a server whose /metrics does "
        "not say (TGI: its --max-batch-total-tokens): how much of the prompts sent there the "
        "router's prefix memory keeps",
    )
    grpc_url: str | None = Field(
        default=None,
        description="host:port of its KServe v2 gRPC API (used with grpc_forward: grpc)",
    )
    grpc_forward: GrpcForward | None = Field(
        default=None,
        description="how the gateway's gRPC front reaches it: http (its url, with the binary "
        "tensor extension: Triton, evenserve workers) or grpc (its grpc_url, relayed as "
        "bytes: servers whose HTTP API lacks the binary extension, such as MLServer); "
        "default: gateway.grpc_forward",
    )
    models: list[ModelName] | None = Field(
        default=None,
        description="expected at startup (default: learned from its repository index)",
    )
    signals: BackendSignals = Field(default_factory=BackendSignals)
    profiles: str | None = Field(default=None, description="profile set dir (for LEW)")
    profile_speed: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="the backend's speed as a fraction of the profiles' device (an emulated "
        "MIG slice: its compute slices / 7); its profiles' latencies are divided by it",
    )
    max_batch_size: dict[str, int] = Field(default_factory=dict)
    weight: float = Field(default=1.0, ge=0)

    @field_validator("url")
    @classmethod
    def _url_ok(cls, v: str) -> str:
        if not re.match(r"^https?://[^/\s]+", v):
            raise ValueError(f"expected http(s)://host:port, got {v!r}")
        try:
            urlsplit(v).port  # noqa: B018 - raises for a port that is no number in 0..65535
        except ValueError:
            raise ValueError(f"expected http(s)://host:port, port in 0..65535, got {v!r}") from None
        return v.rstrip("/")

    @field_validator("models")
    @classmethod
    def _models_ok(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and not v:
            raise ValueError(
                "empty: list the models it hosts at startup, or leave models out to learn "
                "them from its repository index"
            )
        return v

    @field_validator("grpc_url")
    @classmethod
    def _grpc_url_ok(cls, v: str | None) -> str | None:
        if v is not None and not (re.match(r"^[^/\s]+:\d+$", v) and int(v.rsplit(":")[-1]) < 65536):
            raise ValueError(f"expected host:port, port in 0..65535, got {v!r}")
        return v

    @model_validator(mode="before")
    @classmethod
    def _openai_defaults(cls, raw: Any) -> Any:
        """``kind: openai`` reads its /metrics through its LLM mapping unless told otherwise."""
        if not isinstance(raw, dict) or raw.get("kind") != "openai":
            return raw
        sig = raw.get("signals")
        if sig is None:
            return {**raw, "signals": {"source": "llm"}}
        if isinstance(sig, dict) and "source" not in sig:
            return {**raw, "signals": {**sig, "source": "llm"}}
        return raw

    @model_validator(mode="after")
    def _kind_consistent(self) -> BackendSpec:
        src = self.signals.source
        if self.kind == "openai":
            if src not in ("llm", "none"):
                raise ValueError(
                    f"signals.source: {src!r} is not for kind: openai (an OpenAI server has "
                    "no evenserve load report; use llm, its /metrics, or none)"
                )
            if self.grpc_url is not None or self.grpc_forward is not None:
                raise ValueError("grpc_url, grpc_forward: kind: openai serves no KServe v2 gRPC")
        else:
            if src == "llm":
                raise ValueError("signals.source: llm is for kind: openai backends")
            if self.engine != "auto":
                raise ValueError("engine: only meaningful with kind: openai")
            if self.kv_tokens is not None:
                raise ValueError("kv_tokens: only meaningful with kind: openai")
        return self

    @model_validator(mode="after")
    def _grpc_forward_has_its_endpoint(self) -> BackendSpec:
        if self.grpc_forward == "grpc" and self.grpc_url is None:
            raise ValueError(
                "grpc_forward: grpc needs grpc_url (the backend's gRPC host:port), or use http"
            )
        return self

    def forwards_grpc(self, default: str) -> bool:
        """Whether the gRPC front relays ModelInfer to this backend over gRPC (else it is
        translated to HTTP); ``default``: ``gateway.grpc_forward``."""
        return (self.grpc_forward or default) == "grpc"
