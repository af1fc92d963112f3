"""The cluster file: one YAML read by both ``evenserve gateway --config`` and ``evenserve up``.

```yaml
gateway:                      # the front door
  host: 127.0.0.1
  port: 8000
  routing: queue-aware        # a policy spec: a name or {policy: name, ...params}
  llm_routing: predicted-ttft # the LLM router's policy (OpenAI requests of LLM models)
  llm: {chars_per_token: 4, prefix_block_tokens: 16}   # how prompts are read (design 0021)
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
  - name: vllm0               # an OpenAI-compatible LLM server: its URL is all it takes
    url: http://127.0.0.1:8200
    kind: openai              # models from GET /v1/models, signals from its /metrics
    # engine: vllm            # its metric names (auto: told by them): vllm, sglang, tgi, trtllm
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
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from evenserve.cluster.admin_token import MIN_TOKEN_LENGTH, AdminToken
from evenserve.cluster.backend_spec import BackendSpec
from evenserve.cluster.gateway_section import GatewaySection, RecordConfig
from evenserve.cluster.workers_section import WorkersSection
from evenserve.core.errors import ConfigError
from evenserve.core.profile import bundled_profile_set
from evenserve.core.requestlog import MIB, RecordSettings
from evenserve.core.validation import Strict, read_yaml, validate_document
from evenserve.policy.llm_routing import LLM_ROUTING
from evenserve.policy.routing import ROUTING
from evenserve.runtime.device import parse_device


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

    def configured_admin_token(self) -> AdminToken | None:
        """The configured token: the file's ``gateway.admin.token``, else the environment
        variable ``gateway.admin.token_env`` names; None when neither is set. ConfigError
        naming the variable when its token is shorter than MIN_TOKEN_LENGTH."""
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
    LLM_ROUTING.parse(cfg.gateway.llm_routing, "gateway.llm_routing")
    if cfg.gateway.placement is not None or cfg.gateway.autoscaling is not None:
        from evenserve.policy.placement import AUTOSCALING

        cfg.gateway.placement_settings()
        if cfg.gateway.autoscaling is not None:
            AUTOSCALING.parse(cfg.gateway.autoscaling, "gateway.autoscaling")
    return LoadedCluster(cfg, base_dir)


def load_cluster(path: Path) -> LoadedCluster:
    raw = read_yaml(path, f"cluster file not found: {path}")
    return parse_cluster(raw, path.resolve().parent, str(path))
