"""The cluster file's ``backends:`` entries: servers started elsewhere (Triton, MLServer, other
workers), and how the gateway reads their signals."""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from evenserve.cluster.gateway_section import GrpcForward
from evenserve.cluster.names import ModelName, Name
from evenserve.cluster.prometheus_mapping import PRESETS, TRITON_MAPPING, PrometheusMapping
from evenserve.core.validation import Strict


class BackendSignals(Strict):
    source: Literal["evenserve", "prometheus", "none"] = "evenserve"
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
    url: str = Field(min_length=1, description="base URL of the KServe v2 HTTP API")
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
