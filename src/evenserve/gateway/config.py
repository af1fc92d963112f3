"""The cluster file: one YAML read by both ``evenserve gateway --config`` and ``evenserve up``.

```yaml
gateway:                      # the front door
  host: 127.0.0.1
  port: 8000
  routing: queue-aware        # a policy spec: a name or {policy: name, ...params}
  signals: {interval_ms: 100, window: 3, stale_after_ms: 500}
  # placement: {policy: cost-aware, interval_ms: 1000, load_wait_ms: 10000, host_memory_gb: 0}
  # autoscaling: {policy: demand, target_utilization: 0.7}   # needs placement
  # record: {path: requests.jsonl, max_mb: 64, keep: 4, window: 200000}   # the request log
  # replicas: 2                # gateways in front of the same workers (design 0013)
  # reuse_port: true           # SO_REUSEPORT: those gateways share one port
  # grpc_port: 8001            # also serve KServe v2 over gRPC
  # grpc_forward: http         # how gRPC inference reaches a backend (http, grpc): below
  # grpc_server: h2            # what serves grpc_port: h2 (our own HTTP/2) or grpcio
workers:                      # devices ``evenserve up`` starts one worker on each
  repo: models                # model repository (relative to this file)
  base_port: 8101             # device i listens on base_port + i unless it names a port
  devices:
    - {name: gpu0, device: "emulated:a10-trt-fp16", models: [resnet50, bert-base]}
    # - {name: gpu1, device: "emulated:a10-trt-fp16", active: false}   # a spare (autoscaling)
backends:                     # servers started elsewhere (Triton, MLServer, other workers)
  - name: triton0
    url: http://127.0.0.1:8000
    models: [resnet50]          # optional: what it hosts at startup (default: learned)
    signals: {source: prometheus, url: http://127.0.0.1:8002/metrics, mapping: triton}
  - name: mlserver0
    url: http://127.0.0.1:8080
    grpc_url: 127.0.0.1:8081    # its gRPC endpoint
    grpc_forward: grpc          # its HTTP API has no binary tensor extension: relay gRPC
    signals: {source: none}
```

The gateway routes to every worker device plus every listed backend. Which models each one
hosts it learns from the backend's repository index (``POST /v2/repository/index``, read
every ``health.interval_ms``): a model it lists READY is routed there, one LOADING,
UNLOADING or UNAVAILABLE is known but not routed (503 with Retry-After), so models a
backend loads or unloads at run time need no config change. A backend's ``models``, when
given, is the set expected at startup (profiles are looked up for them at once) and stands
until its index first answers, or for good when it has no index (404/405). Everything is
validated on load; an error names the field by its dotted path.

With ``gateway.grpc_port`` the gateway also serves gRPC; a backend's ``grpc_forward`` (else
``gateway.grpc_forward``) says how a gRPC inference call reaches it: ``http`` (the default)
translates it to KServe v2 HTTP with the binary tensor extension, sent to its ``url``
(Triton, evenserve workers); ``grpc`` relays it as it came to its ``grpc_url`` (required
then), for servers whose HTTP API lacks the binary extension (MLServer).
"""

from __future__ import annotations

import os
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, field_validator, model_validator

from evenserve.core import wire
from evenserve.core.errors import ConfigError
from evenserve.core.options import DeviceOptions, QueueOptions
from evenserve.core.profile import bundled_profile_set
from evenserve.core.requestlog import MIB, RecordSettings
from evenserve.core.validation import Strict, read_yaml, validate_document
from evenserve.policy.routing import ROUTING
from evenserve.runtime.device import parse_device

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _check_name(v: str) -> str:
    if not NAME_RE.match(v):
        raise ValueError("letters, digits, '_', '.', '-' only")
    return v


#: A backend or device name: it becomes a metric label, a header value and a log file name.
Name = Annotated[str, Field(min_length=1), AfterValidator(_check_name)]


def _check_model(v: str) -> str:
    if not wire.is_safe_name(v):
        raise ValueError(
            f"{v!r}: a model name is a path segment: {wire.NAME_CHARS}, at most "
            f"{wire.MAX_NAME_LENGTH}, not '.' or '..'"
        )
    return v


#: A model name, as the gateway routes it (``core.wire.split_model_path``).
ModelName = Annotated[str, AfterValidator(_check_model)]
#: How the gateway's gRPC front sends a backend its ModelInfer calls: translated to KServe
#: v2 HTTP (``http``, to its ``url``) or relayed as they came (``grpc``, to its ``grpc_url``).
GrpcForward = Literal["http", "grpc"]
GrpcServer = Literal["h2", "grpcio"]
DEFAULT_TOKEN_ENV = "EVENSERVE_ADMIN_TOKEN"
#: The shortest admin token accepted (from the file or the environment); a generated one has 32.
MIN_TOKEN_LENGTH = 16


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


@dataclass(frozen=True)
class AdminToken:
    """The gateway's admin bearer token and where it came from. Its repr hides the value, so
    it cannot reach a log by accident: print ``source``, never ``value``."""

    value: str = field(repr=False)
    #: ``gateway.admin.token``, ``$NAME`` (the environment variable), or ``generated``.
    source: str

    @property
    def generated(self) -> bool:
        return self.source == "generated"


def write_private(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` readable by its owner only (mode 0600, also when the file
    existed with a wider mode); for files that hold a secret."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    return path


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
PLACEMENT_DRIVER_KEYS = ("interval_ms", "load_wait_ms", "host_memory_gb")


@dataclass(frozen=True)
class PlacementSettings:
    """``gateway.placement`` split: the policy spec, and what the driver itself reads."""

    policy: Any
    interval_ms: float = 1000.0
    load_wait_ms: float = 10_000.0
    host_memory_gb: float = 0.0

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


class DeviceEntry(DeviceOptions, QueueOptions):
    """One worker: its device and models, and how it runs and queues work (the scenario's
    DeviceOptions and QueueOptions, passed to the worker as its flags). How it batches each
    model the gateway learns from the worker's load reports."""

    name: Name
    device: str = Field(
        min_length=1,
        description="cpu | cuda:N | cuda:N#share=K/M | cuda:MIG-<uuid> | emulated:PROFILE_SET "
        "(#mig=<G>g.<M>gb or #share=K/M)",
    )
    models: list[ModelName] | None = Field(default=None, description="default: every repo model")
    port: int | None = Field(default=None, ge=1, le=65535)
    grpc_port: int | None = Field(
        default=None, ge=1, le=65535, description="also serve gRPC here (the gateway uses it)"
    )
    host: str | None = Field(
        default=None,
        min_length=1,
        description="where the gateway reaches this worker (default: workers.host); "
        "`evenserve up --ray` sets it to the node its actor runs on",
    )
    ray_node: str | None = Field(
        default=None,
        min_length=1,
        description="`evenserve up --ray`: the IP of the Ray node this worker must run on",
    )
    extra_args: list[str] = Field(default_factory=list, description="more worker CLI args")
    profiles: str | None = Field(
        default=None,
        description="profile set dir of a real device (cpu, cuda:N): the gateway's "
        "least-expected-work reads it, and `evenserve tune --cluster` simulates the device "
        "with it (an emulated:PROFILE_SET device has its own)",
    )
    active: bool = Field(
        default=True,
        description="false: a spare, not started by `evenserve up` until the autoscaler "
        "turns it on (needs gateway.placement and gateway.autoscaling)",
    )

    def option_flags(self) -> list[str]:
        """The worker flags for this device's options (only those the file sets)."""
        given = self.model_fields_set
        return [
            *DeviceOptions.of(self).flags(given),
            *QueueOptions.of(self).flags(given),
        ]

    @field_validator("device")
    @classmethod
    def _device_ok(cls, v: str) -> str:
        try:
            parse_device(v)
        except ConfigError as exc:
            raise ValueError(str(exc).removeprefix("--device ")) from None
        return v


class WorkersSection(Strict):
    repo: str = Field(min_length=1, description="model repository (relative to the file)")
    host: str = "127.0.0.1"
    base_port: int = Field(default=8101, ge=1, le=65535)
    devices: list[DeviceEntry] = Field(min_length=1)
    ready_timeout_s: float = Field(default=120.0, gt=0)
    drain_timeout_s: float = Field(default=15.0, gt=0)
    restart: bool = Field(default=True, description="restart a worker that exits on its own")

    def port_of(self, i: int) -> int:
        d = self.devices[i]
        return d.port if d.port is not None else self.base_port + i

    def host_of(self, i: int) -> str:
        """Where the gateway reaches worker ``i``: its own ``host``, else ``workers.host``."""
        return self.devices[i].host or self.host


class ClusterConfig(Strict):
    name: str = "cluster"
    gateway: GatewaySection = Field(default_factory=GatewaySection)
    workers: WorkersSection | None = None
    backends: list[BackendSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> ClusterConfig:
        names: list[str] = [b.name for b in self.backends]
        ports: dict[int, str] = {}
        if self.workers is not None:
            names += [d.name for d in self.workers.devices]
            for i, d in enumerate(self.workers.devices):
                p = self.workers.port_of(i)
                if p > 65535:
                    raise ValueError(
                        f"workers.devices.{i}.port: workers.base_port + {i} = {p} is over 65535"
                    )
                if p in ports:
                    raise ValueError(f"workers.devices.{i}.port: {p} also used by {ports[p]}")
                ports[p] = d.name
            for i, d in enumerate(self.workers.devices):
                g = d.grpc_port
                if g is not None and g in ports:
                    raise ValueError(f"workers.devices.{i}.grpc_port: {g} also used by {ports[g]}")
                if g is not None:
                    ports[g] = f"{d.name} (gRPC)"
            mine = (("port", self.gateway.port), ("grpc_port", self.gateway.grpc_port))
            for key, gp in mine:
                if gp in ports:
                    raise ValueError(f"gateway.{key}: {gp} also used by worker {ports[gp]}")
        twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
        if twice is not None:
            raise ValueError(f"backend/device name {twice!r} used twice")
        if not names:
            raise ValueError("no backends: give workers.devices or backends")
        gw = self.gateway
        if gw.autoscaling is not None and gw.placement is None:
            raise ValueError("gateway.autoscaling: needs gateway.placement")
        if self.workers is not None and gw.autoscaling is None:
            for i, d in enumerate(self.workers.devices):
                if not d.active:
                    raise ValueError(
                        f"workers.devices.{i}.active: a spare needs gateway.autoscaling "
                        "(nothing would turn it on)"
                    )
        return self


@dataclass
class LoadedCluster:
    """A validated cluster file plus the directory its relative paths are resolved against."""

    config: ClusterConfig
    base_dir: Path

    def resolve(self, relative: str) -> Path:
        p = Path(relative)
        return p if p.is_absolute() else (self.base_dir / p).resolve()

    def with_worker_addresses(self, addresses: dict[str, str]) -> LoadedCluster:
        """This cluster with some workers at other addresses (``{name: "host:port"}``, what
        ``evenserve up --ray`` writes once each actor reports where its worker listens).
        ConfigError for a name that is not a worker or an address that is not host:port."""
        w = self.config.workers
        names = [] if w is None else [d.name for d in w.devices]
        devices = [] if w is None else list(w.devices)
        for name, addr in addresses.items():
            if name not in names:
                raise ConfigError(f"worker addresses: {name!r} is not a worker of the cluster")
            host, sep, port = str(addr).rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ConfigError(f"worker addresses: {name}: expected host:port, got {addr!r}")
            i = names.index(name)
            devices[i] = devices[i].model_copy(update={"host": host, "port": int(port)})
        if w is None:
            return self
        workers = w.model_copy(update={"devices": devices})
        return LoadedCluster(self.config.model_copy(update={"workers": workers}), self.base_dir)

    def record_settings(
        self,
        path: Path | None = None,
        max_mb: float | None = None,
        keep: int | None = None,
        window: int | None = None,
    ) -> RecordSettings | None:
        """The request log's settings: ``gateway.record`` with the CLI's flags over it (a
        ``path`` turns it on); None when neither asks for one."""
        cfg = self.config.gateway.record
        if cfg is None and path is None:
            return None
        c = cfg or RecordConfig()
        where = path if path is not None else (None if c.path is None else self.resolve(c.path))
        mb = c.max_mb if max_mb is None else max_mb
        if not mb > 0:
            raise ConfigError("--record-max-mb: must be > 0")
        if keep is not None and keep < 0:
            raise ConfigError("--record-keep: must be >= 0")
        if window is not None and window < 0:
            raise ConfigError("--record-window: must be >= 0")
        return RecordSettings(
            path=where,
            max_bytes=max(1, int(mb * MIB)),
            keep=c.keep if keep is None else keep,
            window=c.window if window is None else window,
            flush_s=c.flush_ms / 1000.0,
            buffer=c.buffer,
        )

    def repo_models(self) -> list[str]:
        """Model names in the workers' repository (sub-directories holding a model.yaml, or a
        Triton model folder's config.pbtxt)."""
        w = self.config.workers
        if w is None:
            return []
        repo = self.resolve(w.repo)
        if not repo.is_dir():
            raise ConfigError(f"workers.repo: not a directory: {repo}")
        return sorted(
            p.name
            for p in repo.iterdir()
            if (p / "model.yaml").is_file() or (p / "config.pbtxt").is_file()
        )

    def backends(self) -> list[BackendSpec]:
        """Every backend the gateway routes to: the workers' devices, then listed backends."""
        out: list[BackendSpec] = []
        w = self.config.workers
        if w is not None:
            all_models = self.repo_models() if any(d.models is None for d in w.devices) else []
            for i, d in enumerate(w.devices):
                models = d.models if d.models is not None else all_models
                if not models:
                    raise ConfigError(f"workers.devices.{i}.models: the repository has no models")
                target = parse_device(d.device)
                profiles = target.profile_set or d.profiles  # emulated: its own set
                host = w.host_of(i)
                out.append(
                    BackendSpec(
                        name=d.name,
                        url=f"http://{host}:{w.port_of(i)}",
                        grpc_url=None if d.grpc_port is None else f"{host}:{d.grpc_port}",
                        # A spare starts with nothing (it is off until scaled up).
                        models=list(models) if d.active else None,
                        profiles=profiles,
                        profile_speed=target.compute_fraction,
                    )
                )
        out.extend(self.config.backends)
        return out

    def profile_dir(self, name: str) -> Path | None:
        """Where a profile set named in a device or backend lives, if it can be found."""
        for cand in (
            self.resolve(name),
            (self.base_dir / ".." / "profiles" / name).resolve(),
            Path.cwd() / "profiles" / name,
        ):
            if cand.is_dir():
                return cand
        return bundled_profile_set(name)

    def admin_token(self) -> str | None:
        """The configured token: the file's ``gateway.admin.token``, else the environment
        variable ``gateway.admin.token_env`` names; None when neither is set. ConfigError
        naming the variable when its token is shorter than MIN_TOKEN_LENGTH."""
        configured = self.configured_admin_token()
        return None if configured is None else configured.value

    def configured_admin_token(self) -> AdminToken | None:
        a = self.config.gateway.admin
        if a.token is not None:
            return AdminToken(a.token, "gateway.admin.token")
        value = os.environ.get(a.token_env)
        if not value:
            return None
        if len(value) < MIN_TOKEN_LENGTH:
            raise ConfigError(
                f"{a.token_env} (the environment variable gateway.admin.token_env names): "
                f"an admin token must have at least {MIN_TOKEN_LENGTH} characters"
            )
        return AdminToken(value, f"${a.token_env}")

    def resolve_admin_token(self) -> AdminToken:
        """The configured token, else a new random one (``source`` ``generated``)."""
        return self.configured_admin_token() or AdminToken(secrets.token_urlsafe(24), "generated")


def parse_cluster(raw: Any, base_dir: Path, where: str = "cluster") -> LoadedCluster:
    cfg = validate_document(ClusterConfig, raw, where)
    ROUTING.parse(cfg.gateway.routing, "gateway.routing")
    if cfg.gateway.placement is not None or cfg.gateway.autoscaling is not None:
        from evenserve.policy.placement import AUTOSCALING

        cfg.gateway.placement_settings()
        if cfg.gateway.autoscaling is not None:
            AUTOSCALING.parse(cfg.gateway.autoscaling, "gateway.autoscaling")
    return LoadedCluster(cfg, base_dir)


def load_cluster(path: Path) -> LoadedCluster:
    raw = read_yaml(path, f"cluster file not found: {path}")
    return parse_cluster(raw, path.resolve().parent, str(path))
