"""The worker's settings: everything ``evenserve worker`` is started with, typed and validated
once, with the device and queue options of ``core.options`` embedded as they are (``run``,
``queue``: the same names, bounds and errors as in scenario and cluster files).

The command line is generated from them (``cli.flags``): a field ``some_name`` is the flag
``--some-name``, with the field's type and default and its description as the help (a
device or queue option's, the one the files give it). ``from_flags`` validates flag values
(an error names the flag) and ``to_options`` gives the ``WorkerOptions`` the worker runs
with.

The admin token is not a setting: only the file it is read from is, and the token goes
straight into the options (never into ``--help``, a repr or a log line).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Self, cast

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from evenserve.core.errors import ConfigError
from evenserve.core.options import DeviceOptions, FlagOptions, QueueOptions
from evenserve.core.slowdown import SlowdownSchedule, parse_slowdown_phases
from evenserve.core.validation import Strict
from evenserve.worker.warmup import WarmupSpec, parse_warmup

if TYPE_CHECKING:
    from evenserve.worker.options import WorkerOptions

MIB = 1024 * 1024
GIB = 1024.0**3
MODEL_CONTROL_MODES = ("none", "explicit", "poll")
ModelControl = Literal["none", "explicit", "poll"]


class WorkerSettings(Strict):
    """What a worker is started with, in the units of its flags."""

    repo: Path = Field(description="Model repository: one folder per model.")
    device: str = Field(
        default="cpu",
        description="cpu; cuda:N; cuda:N#share=K/M (K of M time-sliced shares of GPU N: memory "
        "cap total x K/M, busy time its own batches); cuda:MIG-<uuid> (one MIG slice, "
        "also MIG-GPU-<uuid>/<gi>/<ci>: the worker sets CUDA_VISIBLE_DEVICES to it and "
        "sees it as cuda:0, memory from NVML for the slice); emulated:PROFILE_SET (a "
        "folder or a name), with #mig=<G>g.<M>gb (M GiB, latency x 7/G) or #share=K/M "
        "(memory x K/M).",
    )
    name: str | None = Field(
        default=None,
        description="The device's name (e.g. gpu0): the device label of the metrics and the "
        "load report (default: the --device string).",
    )
    port: int = Field(default=8000, description="Port (0: any free port, see --port-file).")
    host: str = Field(default="127.0.0.1", description="Address to bind.")
    #: Instances, interference and (emulated) memory: the scenario's device options.
    run: DeviceOptions = DeviceOptions()
    #: Queue bound, starvation bound, class headroom: the scenario's arm options.
    queue: QueueOptions = QueueOptions(max_queue_per_model=1024)
    max_body_bytes: int = Field(default=64 * MIB, description="Largest request body (413 above).")
    batching: str | None = Field(
        default=None,
        description="Batching policy for every model, YAML: '{policy: static, batch_size: 8}'.",
    )
    models: str | None = Field(
        default=None,
        description="Serve only these models (comma-separated); with --model-control explicit, "
        "the models loaded at startup (as --load-model).",
    )
    model_control: str = Field(
        default="none",
        description="none: serve the models found at startup for the worker's life; explicit: "
        "POST /v2/repository/models/M/load and /unload (and gRPC) load and unload models, "
        "only --load-model/--models load at startup; poll: load every folder, then rescan "
        "the repository every --repository-poll-secs (new folders load, removed ones "
        "unload, a changed model.yaml reloads).",
    )
    load_model: list[str] | None = Field(
        default=None,
        description="With --model-control explicit: load this model at startup (repeatable).",
    )
    repository_poll_secs: float = Field(
        default=5.0,
        description="With --model-control poll: seconds between rescans of the repository.",
    )
    load_wait_ms: float = Field(
        default=10000.0,
        description="An inference request for a model being loaded (LOADING) waits this long "
        "for the load to end, then runs (its response has x-evenserve-load-wait-ms); past "
        "it, 503 with Retry-After. A failed load answers its waiting requests 503 with its "
        "error. 0: refuse at once.",
    )
    profiles_dir: Path = Field(
        default=Path("profiles"), description="Where emulated:NAME looks for profile sets."
    )
    utilization_window_s: float = Field(
        default=1.0, description="Window of the busy fraction in the load report, seconds."
    )
    cpu_threads: int | None = Field(
        default=None, description="Threads of CPU runtimes (default: the framework's)."
    )
    drain_timeout_s: float = Field(
        default=30.0, description="On shutdown, how long queued work may take to finish."
    )
    host_pool: Path | None = Field(
        default=None,
        description="The host's warm pool: a directory (tmpfs, e.g. under /dev/shm, so it is "
        "host memory) shared by the workers of this host, created if missing. A cold load "
        "(from the repository) writes the model's entry there, an unload keeps it, and a "
        "load that finds it is warm (emulated: emulated.warm_load_ms, default weights / "
        "12 GB/s + 5 ms); least recently used entries are deleted beyond --host-pool-gb. "
        "Needs --host-pool-gb.",
    )
    host_pool_gb: float | None = Field(
        default=None, description="Capacity of --host-pool in GiB (needs --host-pool)."
    )
    learn_profiles: bool = Field(
        default=False,
        description="Profiles that learn: each model's latency profile here follows its "
        "measured batch times (smoothed), so batching, estimates and admission track a device "
        "that slows down or speeds up; the load report carries them to the gateway, whose "
        "profiles for this worker follow.",
    )
    slowdown: float = Field(
        default=1.0,
        description="Emulated devices: every batch takes this many times its profile's time "
        "(the profile, and so the worker's estimates, still say 1x).",
    )
    slowdown_phases: str | None = Field(
        default=None,
        description="Emulated devices: START_S:END_S:MULT,... stretches (seconds from the "
        "origin) where --slowdown is multiplied by MULT; the origin is the worker's first "
        "batch unless --slowdown-origin-unix says.",
    )
    slowdown_origin_unix: float | None = Field(
        default=None, description="Origin of --slowdown-phases, wall-clock Unix seconds."
    )
    staging_ms_per_item: float = Field(
        default=0.0,
        description="Emulated devices: every batch first stages its inputs for this many ms "
        "per item (counted as its compute_input phase), on top of its profile's time.",
    )
    warmup: str = Field(
        default="all",
        description="Batch sizes each model runs (twice: cold, then warm) after it loads and "
        "before it is ready (startup, model-control and warm-pool loads alike), so no "
        "first request of a batch size pays its first-call cost: all (1..max_batch_size), "
        "first (batch 1), none, or a list like 1,2,4,8 (sizes above a model's "
        "max_batch_size are left out). Emulated models are never warmed up. The times "
        "are in the model's load info (model config and statistics).",
    )
    port_file: Path | None = Field(
        default=None, description="Write the bound port here once listening."
    )
    grpc_port: int = Field(
        default=0,
        description="Also serve KServe v2 over gRPC on this port (0: no gRPC; needs the grpc "
        "extra).",
    )
    record: Path | None = Field(
        default=None,
        description="Write the request log here: one JSON line per answered inference "
        "request, a replayable trace plus outcomes.",
    )
    record_max_mb: float = Field(
        default=64.0, description="Rotate the request log past this size, MiB."
    )
    record_keep: int = Field(default=4, description="Rotated request logs kept: PATH.1 ...")
    log_level: str = Field(default="warning", description="Python log level.")
    admin_token_file: Path | None = Field(
        default=None,
        description="File holding the admin API's bearer token (/admin/params); default: the "
        "variable EVENSERVE_ADMIN_TOKEN; neither: the admin API is off.",
    )

    # -- checks (each message is what follows the flag's name) ------------------------------
    @field_validator("port", "grpc_port")
    @classmethod
    def _a_port(cls, v: int) -> int:
        if not 0 <= v <= 65535:
            raise ValueError(f"must be in 0..65535 (got {v})")
        return v

    @field_validator("max_body_bytes")
    @classmethod
    def _positive_int(cls, v: int) -> int:
        if v < 1:
            raise ValueError("must be >= 1")
        return v

    @field_validator("utilization_window_s", "repository_poll_secs", "record_max_mb")
    @classmethod
    def _positive(cls, v: float) -> float:
        if not v > 0:
            raise ValueError("must be > 0")
        return v

    @field_validator("load_wait_ms", "record_keep")
    @classmethod
    def _not_negative(cls, v: float) -> float:
        if not v >= 0:
            raise ValueError("must be >= 0")
        return v

    @field_validator("slowdown")
    @classmethod
    def _a_factor(cls, v: float) -> float:
        if not (v > 0 and v < math.inf):
            raise ValueError("must be a number > 0")
        return v

    @field_validator("staging_ms_per_item")
    @classmethod
    def _a_duration(cls, v: float) -> float:
        if not (v >= 0 and v < math.inf):
            raise ValueError("must be a number >= 0")
        return v

    @field_validator("model_control")
    @classmethod
    def _a_mode(cls, v: str) -> str:
        if v not in MODEL_CONTROL_MODES:
            raise ValueError(f"{v!r} is not none, explicit or poll")
        return v

    @field_validator("batching")
    @classmethod
    def _a_policy(cls, v: str | None) -> str | None:
        if v is not None:
            _batching_spec(v)
        return v

    @field_validator("warmup")
    @classmethod
    def _sizes(cls, v: str) -> str:
        parse_warmup(v)
        return v

    @model_validator(mode="after")
    def _together(self) -> Self:
        """Flags that need or exclude each other; the phases parsed (ConfigError naming the
        flag: the message is whole)."""
        if self.load_model and self.model_control != "explicit":
            raise ValueError("--load-model: needs --model-control explicit")
        if self.models and self.model_control == "poll":
            raise ValueError(
                "--models: not with --model-control poll (the poll serves every model folder)"
            )
        if self.host_pool_gb is not None and self.host_pool is None:
            raise ValueError("--host-pool-gb: needs --host-pool DIR (the pool's directory)")
        if self.host_pool is not None:
            if self.host_pool_gb is None:
                raise ValueError("--host-pool: needs --host-pool-gb (the pool's capacity in GiB)")
            if not self.host_pool_gb > 0:
                raise ValueError("--host-pool-gb: must be > 0")
        if self.slowdown_origin_unix is not None and self.slowdown_phases is None:
            raise ValueError("--slowdown-origin-unix: needs --slowdown-phases")
        self.slowdown_schedule()
        return self

    # -- derived --------------------------------------------------------------------------
    @property
    def batching_spec(self) -> Any:
        """``--batching`` parsed: a policy name, a mapping, or None (each model's own)."""
        return None if self.batching is None else _batching_spec(self.batching)

    @property
    def only_models(self) -> list[str] | None:
        """``--models`` as a list (None: every folder)."""
        if not self.models:
            return None
        return [m.strip() for m in self.models.split(",") if m.strip()]

    @property
    def control(self) -> ModelControl:
        return cast(ModelControl, self.model_control)

    @property
    def warmup_spec(self) -> WarmupSpec:
        return parse_warmup(self.warmup)

    def slowdown_schedule(self) -> SlowdownSchedule:
        """``--slowdown`` and ``--slowdown-phases`` (ConfigError naming the flag)."""
        phases = parse_slowdown_phases(self.slowdown_phases) if self.slowdown_phases else ()
        return SlowdownSchedule(self.slowdown, phases)

    @classmethod
    def from_flags(cls, **values: Any) -> Self:
        """The settings of these flag values (by field name; the device and queue options'
        among them); ConfigError naming the flag (``--port: must be in 0..65535 ...``)."""
        raw: dict[str, Any] = {}
        embedded: dict[str, dict[str, Any]] = {}
        for key, value in values.items():
            group = _EMBEDDED_FIELD.get(key)
            if group is None:
                raw[key] = value
            else:
                embedded.setdefault(group, {})[key] = value
        for group, given in embedded.items():
            options = cast(type[FlagOptions], cls.model_fields[group].annotation)
            default = cast(FlagOptions, cls.model_fields[group].default)
            raw[group] = options.from_flags(**{**default.model_dump(), **given})
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            raise ConfigError(_flag_error(exc)) from None

    def to_options(self, admin_token: str | None = None) -> WorkerOptions:
        """The ``WorkerOptions`` a worker with these settings runs with (``admin_token``: the
        one read from ``--admin-token-file`` or the environment)."""
        from evenserve.runtime.device import parse_device
        from evenserve.worker.options import WorkerOptions

        schedule = self.slowdown_schedule()
        return WorkerOptions(
            device=parse_device(self.device),
            name=self.name,
            run=self.run,
            queue=self.queue,
            max_body_bytes=self.max_body_bytes,
            batching_override=self.batching_spec,
            profiles_dir=self.profiles_dir,
            utilization_window_s=self.utilization_window_s,
            cpu_threads=self.cpu_threads,
            drain_timeout_s=self.drain_timeout_s,
            model_control=self.control,
            repository=self.repo,
            repository_poll_s=self.repository_poll_secs,
            load_wait_s=self.load_wait_ms / 1000.0,
            host_pool=self.host_pool,
            host_pool_bytes=(self.host_pool_gb or 0.0) * GIB,
            learn_profiles=self.learn_profiles,
            slowdown=None if schedule.constant else schedule,
            slowdown_origin_unix_s=self.slowdown_origin_unix,
            staging_s_per_item=self.staging_ms_per_item / 1000.0,
            warmup=self.warmup_spec,
            admin_token=admin_token,
        )


def _batching_spec(text: str) -> Any:
    try:
        spec = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"not valid YAML: {exc}") from None
    if not isinstance(spec, str | dict):
        raise ValueError(
            "expected a policy name or a mapping like '{policy: static, batch_size: 8}'"
        )
    return spec


def _flag_error(exc: ValidationError) -> str:
    """The first problem, named by its flag; a check of several flags says them itself."""
    e = exc.errors()[0]
    error = e.get("ctx", {}).get("error")
    msg = str(error) if isinstance(error, ValueError | ConfigError) else e["msg"]
    if not e["loc"]:
        return msg
    return f"--{str(e['loc'][-1]).replace('_', '-')}: {msg}"


#: The embedded options (field -> its group: ``run``, ``queue``).
_EMBEDDED_FIELD: dict[str, str] = {
    **dict.fromkeys(DeviceOptions.model_fields, "run"),
    **dict.fromkeys(QueueOptions.model_fields, "queue"),
}
