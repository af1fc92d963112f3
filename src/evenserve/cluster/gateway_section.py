"""The cluster file's ``gateway:`` section: the gateway's own settings (it reads them from
here; ``evenserve up`` reads its ports, admin token variable and placement)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from evenserve.cluster.admin_token import DEFAULT_TOKEN_ENV, MIN_TOKEN_LENGTH
from evenserve.core.errors import ConfigError
from evenserve.core.validation import Strict

#: How the gateway's gRPC front sends a backend its ModelInfer calls: translated to KServe
#: v2 HTTP (``http``, to its ``url``) or relayed as they came (``grpc``, to its ``grpc_url``).
GrpcForward = Literal["http", "grpc"]
GrpcServer = Literal["h2", "grpcio"]


class SignalsConfig(Strict):
    interval_ms: float = Field(default=100.0, gt=0, description="load poll period")
    window: int = Field(default=3, ge=1, description="samples averaged per backend")
    stale_after_ms: float = Field(
        default=500.0, gt=0, description="older samples count as unknown, not idle"
    )
    timeout_ms: float = Field(default=500.0, gt=0, description="one poll's time limit")
    idle_interval_ms: float = Field(
        default=250.0,
        gt=0,
        description="load poll period of an idle backend (nothing queued, running or in "
        "flight from this gateway; at most half of stale_after_ms); interval_ms once it "
        "is not, and always with replicas > 1",
    )


class HealthConfig(Strict):
    interval_ms: float = Field(
        default=100.0, gt=0, description="readiness poll period (all backends, ejected ones too)"
    )
    timeout_ms: float = Field(default=500.0, gt=0)
    misses: int = Field(
        default=2,
        ge=1,
        description="probes in a row without an answer in time that eject a backend "
        "(a refused connection or a not-ready answer ejects at once)",
    )


class ForwardConfig(Strict):
    connect_timeout_ms: float = Field(default=500.0, gt=0)
    request_timeout_s: float = Field(default=60.0, gt=0, description="one backend answer")
    max_connections: int = Field(default=512, ge=1)
    retries: int = Field(default=1, ge=0, le=3, description="other backends to try")
    max_body_mb: float = Field(
        default=64.0,
        gt=0,
        description="largest request body, MiB (413 above, before the rest is read; a "
        "worker's default limit is the same 64 MiB)",
    )


class OverloadConfig(Strict):
    enabled: bool = Field(
        default=True,
        description="may refuse (429): every host full or predicted to start it past its SLO",
    )
    retry_after_s: int = Field(default=1, ge=0, description="Retry-After header value")


class RecordConfig(Strict):
    """``gateway.record``: the request log (``core.requestlog``); the CLI's ``--record*``
    flags override it."""

    path: str | None = Field(
        default=None,
        min_length=1,
        description="JSONL file, relative to the cluster file (None: only the in-memory "
        "window that GET /admin/log serves)",
    )
    max_mb: float = Field(default=64.0, gt=0, description="size at which the file rotates, MiB")
    keep: int = Field(default=4, ge=0, description="rotated files kept (PATH.1 ... PATH.keep)")
    window: int = Field(
        default=200_000, ge=0, description="last records kept in memory for GET /admin/log"
    )
    flush_ms: float = Field(default=500.0, gt=0, description="how often the writer flushes")
    buffer: int = Field(
        default=65_536,
        ge=1,
        description="records waiting for the writer; beyond it the oldest are dropped and counted",
    )


class AdminConfig(Strict):
    token: str | None = Field(
        default=None, min_length=MIN_TOKEN_LENGTH, description="literal bearer token"
    )
    token_env: str = Field(
        default=DEFAULT_TOKEN_ENV, min_length=1, description="env var holding the token"
    )


class LlmGatewayConfig(Strict):
    """``gateway.llm``: how the gateway reads an LLM request for the LLM router (design note
    0021). The gateway has the request's text, not its tokens: it names the prompt's blocks
    by their characters (``prefix_block_tokens`` x ``chars_per_token`` characters a block,
    chained: block i names the prompt up to its end) and estimates its tokens as its
    characters / ``chars_per_token``."""

    chars_per_token: float = Field(
        default=4.0,
        gt=0,
        description="characters per token of the engines' tokenizers (llm-d's estimate: 4; "
        "evenserve's built-in byte-level tokenizer: 1)",
    )
    prefix_block_tokens: int = Field(
        default=16,
        ge=1,
        description="tokens per named prompt block (llm-d: 16, i.e. 64 characters at 4 "
        "characters a token)",
    )
    prefix_max_blocks: int = Field(
        default=1024, ge=1, description="prompt blocks the router's prefix index keeps per engine"
    )
    default_max_tokens: int = Field(
        default=256,
        ge=1,
        description="the output the router expects of a request that sets no max_tokens "
        "(a completion's default is OpenAI's 16)",
    )
    stale_after_ms: float = Field(
        default=10_000.0,
        gt=0,
        description="an LLM engine whose newest signal sample is older than this is routed "
        "on the gateway's own accounting alone (its last sample's corrections dropped)",
    )
    signal_delay_ms: float = Field(
        default=0.0,
        ge=0,
        description="experiments: every LLM engine sample reaches the router this long after "
        "it was read, with the time it was read (a lagging metrics pipeline; the simulator's "
        "signals.stale_s)",
    )
    ttft_ms: float | None = Field(
        default=None,
        gt=0,
        description="TTFT target of requests without the x-evenserve-ttft-ms header (and no "
        "target the engine reports): the router refuses (429) what no engine can meet",
    )
    tpot_ms: float | None = Field(
        default=None, gt=0, description="TPOT target likewise (x-evenserve-tpot-ms)"
    )


class GatewaySection(Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    grpc_port: int | None = Field(
        default=None, ge=0, le=65535, description="also serve KServe v2 over gRPC (0: any port)"
    )
    grpc_forward: GrpcForward = Field(
        default="http",
        description="how the gRPC front sends ModelInfer (and model metadata and config) to a "
        "backend whose own grpc_forward is not set: http (translated to KServe v2 HTTP with "
        "the binary tensor extension, sent to its url over the HTTP data plane) or grpc "
        "(relayed as bytes to its grpc_url; a backend without one takes no gRPC inference)",
    )
    grpc_server: GrpcServer = Field(
        default="h2",
        description="what serves the gRPC port: h2 (the gateway's own HTTP/2 listener, "
        "cleartext with prior knowledge, unary RPCs; a fraction of grpcio's CPU per call) "
        "or grpcio (grpcio's asyncio server)",
    )
    routing: Any = "queue-aware"
    llm_routing: Any = Field(
        default="predicted-ttft",
        description="the LLM router's policy for /v1/completions and /v1/chat/completions of "
        "LLM models: a name in LLM_ROUTING (round-robin, kv-load, prefix-approx, "
        "least-outstanding, predicted-ttft) or {policy: name, ...params}",
    )
    llm: LlmGatewayConfig = Field(default_factory=LlmGatewayConfig)
    seed: int = 0
    replicas: int = Field(
        default=1,
        ge=1,
        description="gateways (this one included) routing to the same workers behind one "
        "balancer: each of this gateway's sends since a load report counts 1 + (replicas - 1) "
        "x peer_weight times in its queue estimates, so several gateways do not all pick the "
        "backend that looked idlest at the last report (design 0013)",
    )
    peer_weight: float = Field(
        default=0.75,
        ge=0.0,
        le=1.0,
        description="with replicas > 1: how much of the other gateways' sends to count, as a "
        "share of this one's (0: only its own, the naive router; 1: as many as its own)",
    )
    reuse_port: bool = Field(
        default=False,
        description="listen with SO_REUSEPORT: several gateway processes share the port and "
        "the kernel splits the connections among them",
    )
    signals: SignalsConfig = Field(default_factory=SignalsConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)
    forward: ForwardConfig = Field(default_factory=ForwardConfig)
    overload: OverloadConfig = Field(default_factory=OverloadConfig)
    admin: AdminConfig = Field(default_factory=AdminConfig)
    placement: Any = Field(
        default=None,
        description="{policy: static|lru|cost-aware, ...params, interval_ms, load_wait_ms, "
        "host_memory_gb}: the gateway loads and unloads models on the workers (None: off)",
    )
    autoscaling: Any = Field(
        default=None,
        description="{policy: none|demand, ...params}: devices turned on and off (needs placement)",
    )
    record: RecordConfig | None = Field(
        default=None, description="the request log (None: off unless --record is given)"
    )

    def placement_settings(self) -> PlacementSettings | None:
        """The placement section split into the driver's settings and the policy spec."""
        return None if self.placement is None else PlacementSettings.parse(self.placement)


#: The driver's own keys of ``gateway.placement`` (the rest is the policy's spec).
PLACEMENT_DRIVER_KEYS = ("interval_ms", "load_wait_ms", "host_memory_gb", "min_switch_s")


@dataclass(frozen=True)
class PlacementSettings:
    """``gateway.placement`` split: the policy spec, and what the driver itself reads."""

    policy: Any
    interval_ms: float = 1000.0
    load_wait_ms: float = 10_000.0
    host_memory_gb: float = 0.0
    #: The anti-thrash window (``policy.placement.base``; 0: off).
    min_switch_s: float = 0.0

    @classmethod
    def parse(cls, raw: Any, where: str = "gateway.placement") -> PlacementSettings:
        """Validate ``raw`` (a name, or a mapping with ``policy``); ConfigError naming
        the field."""
        from evenserve.policy.placement import PLACEMENT

        if isinstance(raw, str):
            PLACEMENT.parse(raw, where)
            return cls(raw)
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: expected a policy name or a mapping with 'policy'")
        spec = dict(raw)
        own: dict[str, float] = {}
        for key in PLACEMENT_DRIVER_KEYS:
            if key not in spec:
                continue
            v = spec.pop(key)
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise ConfigError(f"{where}.{key}: expected a number, got {v!r}")
            if key == "interval_ms" and not v > 0:
                raise ConfigError(f"{where}.{key}: must be > 0")
            if v < 0:
                raise ConfigError(f"{where}.{key}: must be >= 0")
            own[key] = float(v)
        PLACEMENT.parse(spec, where)
        return cls(spec, **own)
