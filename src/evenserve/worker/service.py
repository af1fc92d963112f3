"""One worker: the device, its models' runtimes, the batcher driver, metrics and statistics.

Built from a repository and options; ``load`` loads the runtimes (blocking: call it from a
thread or before serving), ``start`` creates the driver on the running loop, ``begin_drain``
and ``stop`` shut it down gracefully. The HTTP layer (``http_api``) only talks to this class.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import ctypes
import gc
import json
import logging
import math
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from evenserve.core import wire
from evenserve.core.clock import Clock, RealClock
from evenserve.core.errors import ConfigError, EvenserveError
from evenserve.core.load import LoadReport
from evenserve.core.options import DeviceOptions, QueueOptions
from evenserve.core.profile import LatencyProfile
from evenserve.core.slowdown import SlowdownSchedule
from evenserve.core.wire import REFUSAL_REASONS
from evenserve.metrics.nvml import NvmlSampler
from evenserve.metrics.worker import DcgmLabels, DeviceSnapshot, WorkerMetrics
from evenserve.policy.registry import spec_label
from evenserve.runtime.base import Runtime
from evenserve.runtime.device import DeviceTarget, host_memory_bytes
from evenserve.runtime.emulated import EmulatedDevice, EmulatedRuntime, EmulatedSlowdown
from evenserve.runtime.factory import RUNTIME_PARAMS
from evenserve.runtime.host_pool import HostPool, digest
from evenserve.runtime.torch_common import (
    cuda_memory_bytes,
    cuda_process_memory_bytes,
    release_cuda_cache,
)
from evenserve.sched import ModelSetup, batching_setup
from evenserve.worker.driver import BatchDriver, BatchResult, DriverObserver, RunningBatch
from evenserve.worker.executor import ThreadedExecutor
from evenserve.worker.kserve import ModelSignature
from evenserve.worker.load_override import check_override_paths
from evenserve.worker.repository import (
    MODEL_FILE,
    VARIANT_FILE,
    ModelEntry,
    load_model,
    model_folders,
)
from evenserve.worker.stats import ModelStats
from evenserve.worker.timer import RealTimer
from evenserve.worker.triton_config import TRITON_FILE
from evenserve.worker.warmup import WarmupSpec, warm_up_model

log = logging.getLogger(__name__)

GIB = 1024.0**3
#: GIL switch interval while emulated runtimes are served (CPython's default is 5 ms).
EMULATED_SWITCH_INTERVAL_S = 0.0002


@dataclass
class WorkerOptions:
    device: DeviceTarget
    #: The worker's device name (``--name``; a cluster's launcher gives the device's, e.g.
    #: ``gpu0``): the ``device`` label of its metrics and its load report. None: the device
    #: string (``cuda:0``, ``emulated:PROFILE_SET``, which workers on one profile set share).
    name: str | None = None
    #: Instances, interference and (emulated) memory: the scenario's device options.
    run: DeviceOptions = field(default_factory=DeviceOptions)
    #: Queue bound, starvation bound, class headroom: the scenario's arm options; a model's
    #: ``max_queue_size`` overrides the bound.
    queue: QueueOptions = field(default_factory=lambda: QueueOptions(max_queue_per_model=1024))
    max_body_bytes: int = 64 * 1024 * 1024
    batching_override: Any = None
    profiles_dir: Path | None = Path("profiles")
    utilization_window_s: float = 1.0
    cpu_threads: int | None = None
    drain_timeout_s: float = 30.0
    #: Model control (Triton's ``--model-control-mode``): ``none``, the models given are
    #: served for the worker's life; ``explicit``, the repository extension's load and unload
    #: requests change them; ``poll``, the repository is rescanned every
    #: ``repository_poll_s`` (new folders load, removed ones unload, a changed model.yaml
    #: reloads).
    model_control: Literal["none", "explicit", "poll"] = "none"
    #: The model repository (model control loads from it; the index lists its folders).
    repository: Path | None = None
    repository_poll_s: float = 5.0
    #: How long an inference request for a model being loaded waits for the load to end
    #: before it is answered 503 (``--load-wait-ms``).
    load_wait_s: float = 10.0
    #: The host's warm pool (``--host-pool``, shared by the host's workers) and its capacity
    #: (``--host-pool-gb``); None: no pool, every load is from disk.
    host_pool: Path | None = None
    host_pool_bytes: float = 0.0
    #: Profiles that learn (``--learn-profiles``): each model's profile here follows its
    #: measured batch times (``core.profile_learning``), and the load report carries them.
    learn_profiles: bool = False
    #: An emulated device slower than its profiles (``--slowdown``, ``--slowdown-phases``,
    #: phases in seconds from ``slowdown_origin_unix_s``, None: the first batch).
    slowdown: SlowdownSchedule | None = None
    slowdown_origin_unix_s: float | None = None
    #: An emulated device that stages each batch's inputs for this long per item before it
    #: computes (``--staging-ms-per-item``, in seconds; the executor's compute_input).
    staging_s_per_item: float = 0.0
    #: The batch sizes each model runs after it loads, before it is ready (``--warmup``):
    #: ``all`` (1..max_batch_size), ``first`` (batch 1), ``none``, or the sizes themselves
    #: (those above a model's max_batch_size are left out); emulated models never do.
    warmup: WarmupSpec = "all"
    #: The admin API's bearer token (``--admin-token-file`` or ``$EVENSERVE_ADMIN_TOKEN``);
    #: None: ``/admin/*`` is off (404). Never shown (not in the repr).
    admin_token: str | None = field(default=None, repr=False)


#: What ``_load_runtime`` reports of a load: where it came from, how long it took, and the
#: warm-up's batch sizes and times.
LOAD_INFO_KEYS = (
    "load_source",
    "load_seconds",
    "warmup_batch_sizes",
    "warmup_seconds",
    "warmup_first_ms",
    "warmup_second_ms",
    "warmup_variable",
    "variant",
)

#: Model states (Triton's repository index).
READY, LOADING, UNLOADING, UNAVAILABLE = "READY", "LOADING", "UNLOADING", "UNAVAILABLE"


@dataclass(frozen=True)
class ModelState:
    state: str
    #: Why it is UNAVAILABLE (``unloaded``, ``not loaded``, ``load failed: ...``).
    reason: str | None = None
    version: str | None = None

    def json(self, name: str) -> dict[str, Any]:
        out: dict[str, Any] = {"name": name}
        if self.version is not None:
            out["version"] = self.version
        out["state"] = self.state
        if self.reason is not None:
            out["reason"] = self.reason
        return out


class ModelStates(dict[str, ModelState]):
    """Each model's state; ``version`` moves at every change (the load report carries it, so a
    gateway reads the repository index only when it moved). It starts at a random number, so
    a restarted worker does not repeat the versions of the one before it."""

    def __init__(self) -> None:
        super().__init__()
        self.version = random.randrange(1 << 40)

    def __setitem__(self, name: str, state: ModelState) -> None:
        super().__setitem__(name, state)
        self.version += 1

    def __delitem__(self, name: str) -> None:
        super().__delitem__(name)
        self.version += 1

    def pop(self, name: str, *default: Any) -> Any:
        self.version += 1
        return super().pop(name, *default)


#: How a load request's config override is named in errors (KServe's ``parameters.config``).
OVERRIDE_WHERE = "parameters.config"


class ModelControlError(EvenserveError):
    """A load or unload request that cannot be done; ``status`` is its HTTP status (400 bad
    request or config, 404 no such model folder, 503 shutting down, 500 the load failed)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def _open_nvml(device: DeviceTarget) -> NvmlSampler | None:
    """The NVML sampler of a CUDA device: a MIG slice's by its UUID, a GPU's by index."""
    if device.kind != "cuda":
        return None
    if device.mig_uuid is not None:
        return NvmlSampler.open_mig(device.mig_uuid)
    return NvmlSampler.open(device.cuda_index)


def _dcgm_labels(device: DeviceTarget, nvml: NvmlSampler | None) -> DcgmLabels:
    """dcgm-exporter's labels for the device (``metrics.worker.DcgmLabels``): NVML's index,
    UUID and name where NVML answers; a whole GPU's index without it (a MIG slice's parent is
    unknown then); none for the CPU or an emulated device, whose modelName is its string."""
    if device.kind != "cuda":
        return DcgmLabels(model_name=device.name)
    if nvml is None:
        return DcgmLabels(gpu="" if device.mig_uuid is not None else str(device.cuda_index))
    ident = nvml.identity()
    return DcgmLabels(
        gpu="" if ident.index is None else str(ident.index),
        uuid=ident.uuid or "",
        model_name=ident.name or "",
    )


class LoadWaitError(EvenserveError):
    """An inference request waited for its model's load in vain (503): the model is still
    loading after ``--load-wait-ms`` (``retry_after_s`` set), or the load failed or the worker
    began shutting down meanwhile (the message says which)."""

    def __init__(self, message: str, waited_s: float, retry_after_s: float | None = None):
        super().__init__(message)
        self.waited_s = waited_s
        self.retry_after_s = retry_after_s


class _LoadWatch:
    """One load in progress, for the requests waiting for it: set once it ends (``error``:
    why it failed, None when the model is READY)."""

    __slots__ = ("error", "event", "expected_s", "started_s", "waiting")

    def __init__(self, expected_s: float | None) -> None:
        self.event = asyncio.Event()
        self.error: str | None = None
        self.started_s = time.perf_counter()
        #: How long the load should take, when the runtime says (emulated models).
        self.expected_s = expected_s
        #: Requests waiting for it now.
        self.waiting = 0

    def finish(self, error: str | None) -> None:
        if not self.event.is_set():
            self.error = error
            self.event.set()


def gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def trim_memory() -> bool:
    """Give freed heap memory back to the OS (glibc's ``malloc_trim(0)``); False where there
    is no glibc (other platforms, musl)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.malloc_trim(0))
    except (OSError, AttributeError):
        return False


def _pooled(runtime: Runtime) -> bool:
    """Whether the runtime can load from and write a host-pool entry."""
    return all(
        hasattr(runtime, a) for a in ("load_warm", "write_pool_entry", "pool_bytes", "pool_tag")
    )


def _pool_put(pool: HostPool, model: str, key: str, runtime: Runtime) -> Callable[[], None]:
    """What writes (or refreshes) a model's pool entry; a failure is logged, never raised
    (the pool is an optimisation: no load or unload fails for it)."""
    rt: Any = runtime

    def put() -> None:
        try:
            pool.put(model, key, rt.pool_bytes(), rt.write_pool_entry)
        except Exception:
            log.exception("host pool: keeping model %s failed", model)

    return put


def _release(runtime: Runtime, keep: Callable[[Runtime], None] | None = None) -> None:
    """Close an unloaded model's runtime and collect what it held (runs in a thread);
    ``keep`` first puts it in the host pool (an unload keeps it warm)."""
    if keep is not None:
        keep(runtime)
    runtime.close()
    del runtime
    gc.collect()
    release_cuda_cache()
    trim_memory()


def _config_file(directory: Path) -> Path:
    """A model folder's config: model.yaml, else a Triton folder's config.pbtxt."""
    own = directory / MODEL_FILE
    return own if own.exists() else directory / TRITON_FILE


def _mtime(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def _stamp(directory: Path) -> tuple[int | None, int | None]:
    """What poll mode compares: the folder's config and its variant.yaml (``evenserve
    optimize`` writing a new variant reloads the model, as a changed model.yaml does)."""
    return _mtime(_config_file(directory)), _mtime(directory / VARIANT_FILE)


@dataclass
class _Built:
    """A model's runtime (loaded or not) with its policy, spec and profile."""

    runtime: Runtime
    policy: Any
    spec: Any
    profile: LatencyProfile | None


class _Telemetry(DriverObserver):
    """Feeds metrics and statistics, then any extra observers (tests, tracing)."""

    def __init__(
        self,
        metrics: WorkerMetrics,
        stats: dict[str, ModelStats],
        profiles: Mapping[str, LatencyProfile | None] | None = None,
    ) -> None:
        self.metrics = metrics
        self.stats = stats
        #: The models' profiles (the service's own dict, which follows loads): a batch's
        #: expected seconds count only for a model with one.
        self.profiles: Mapping[str, LatencyProfile | None] = profiles or {}
        self.extra: list[DriverObserver] = []

    def batch_started(self, batch: RunningBatch, now_s: float) -> None:
        self.metrics.observe_batch(
            batch.model,
            batch.items,
            [now_s - r.arrival_s for r in batch.requests],
            held_s=batch.held_s,
            expected_s=batch.solo_s if self.profiles.get(batch.model) is not None else None,
        )
        for o in self.extra:
            o.batch_started(batch, now_s)

    def request_dropped(self, model: str, reason: str, waited_s: float) -> None:
        if reason in REFUSAL_REASONS:
            self.metrics.observe_refusal(model, reason)
        for o in self.extra:
            o.request_dropped(model, reason, waited_s)

    def batch_finished(self, batch: RunningBatch, result: BatchResult, now_s: float) -> None:
        for o in self.extra:
            o.batch_finished(batch, result, now_s)
        stats = self.stats.get(batch.model)
        if result.error is None and stats is not None:
            self.metrics.observe_compute(batch.model, result.compute_s, result.compute_input_s)
            stats.record_batch(
                batch.items,
                len(batch.requests),
                [batch.started_s - r.arrival_s for r in batch.requests],
                result.compute_input_s,
                result.compute_infer_s,
                result.compute_output_s,
            )


class WorkerService:
    def __init__(
        self, entries: Sequence[ModelEntry], options: WorkerOptions, clock: Clock | None = None
    ) -> None:
        if not entries and options.model_control == "none":
            raise ConfigError("a worker needs at least one model (or --model-control explicit)")
        if options.model_control != "none" and options.repository is None:
            raise ConfigError(f"model control {options.model_control!r} needs the repository")
        self.options = options
        #: ``--learn-profiles`` as started (a params set's ``learn_profiles`` null goes back
        #: to it); ``options.learn_profiles`` is what runs now.
        self.startup_learn_profiles = options.learn_profiles
        self.device = options.device
        self.clock: Clock = clock or RealClock()
        self.ready = False
        self.draining = False
        # The models served (READY or UNLOADING), with what serving them takes.
        self.entries: dict[str, ModelEntry] = {}
        self.signatures: dict[str, ModelSignature] = {}
        self.runtimes: dict[str, Runtime] = {}
        self.policies: dict[str, Any] = {}
        self.batching_specs: dict[str, Any] = {}
        self.profiles: dict[str, LatencyProfile | None] = {}
        self.stats: dict[str, ModelStats] = {}
        self.descriptions: dict[str, dict[str, Any]] = {}
        #: Every model's state (the index); folders never loaded are absent.
        self.states = ModelStates()
        #: model.yaml's and variant.yaml's mtimes when each model was last (tried to be)
        #: loaded (poll mode).
        self._mtimes: dict[str, tuple[int | None, int | None]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        #: The loads in progress (model control), which inference requests may wait for.
        self._loads: dict[str, _LoadWatch] = {}
        # Emulated models share one device when batches run at once (they slow each other).
        run = options.run
        self._shared = EmulatedDevice(run.interference) if run.instances > 1 else None
        sd = options.slowdown
        self._slowdown = (
            None
            if sd is None or sd.constant
            else EmulatedSlowdown(sd, options.slowdown_origin_unix_s)
        )
        self.host_pool = (
            None
            if options.host_pool is None
            else HostPool(options.host_pool, options.host_pool_bytes)
        )
        #: Each loaded model's host-pool digest, and where its load came from and how long
        #: it took and its warm-up (``LOAD_INFO_KEYS``).
        self._pool_digests: dict[str, str] = {}
        self.load_info: dict[str, dict[str, Any]] = {}
        for e in entries:
            if e.name in self.entries:
                raise ConfigError(f"model {e.name!r} is given twice")
            self._register(e, self._build(e))
            self.states[e.name] = ModelState(LOADING, version=e.config.version)
            self._mtimes[e.name] = _stamp(e.directory)
        self.nvml = _open_nvml(options.device)
        self.metrics = WorkerMetrics(
            self.device_name,
            list(self.entries),
            self._snapshot,
            self.nvml,
            kind=options.device.kind,
            slice_label=options.device.slice_label or "",
            dcgm=_dcgm_labels(options.device, self.nvml),
        )
        self._telemetry = _Telemetry(self.metrics, self.stats, self.profiles)
        self._driver: BatchDriver | None = None
        self._executor: ThreadedExecutor | None = None
        self._memory_cache: tuple[float, float | None, float | None] = (-math.inf, None, None)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._saved_switch_interval: float | None = None
        self._poller: asyncio.Task[None] | None = None

    def _build(self, e: ModelEntry) -> _Built:
        """The runtime (not loaded), policy and profile of one model (ConfigError naming its
        file)."""
        try:
            rt = e.create_runtime(
                self.options.device,
                cpu_threads=self.options.cpu_threads,
                profiles_dir=self.options.profiles_dir,
                emulated_device=self._shared,
            )
        except ConfigError as exc:
            raise ConfigError(f"{e.source}: {exc}") from exc
        if self._slowdown is not None and isinstance(rt, EmulatedRuntime):
            rt.slowdown = self._slowdown  # one schedule, one origin, for every model here
        if self.options.staging_s_per_item > 0 and isinstance(rt, EmulatedRuntime):
            rt.staging_s_per_item = self.options.staging_s_per_item
        override = self.options.batching_override
        # A model without a profile file of its own has its emulated runtime's, if any.
        # On an emulated MIG slice the model's own profile runs at the slice's speed too.
        own = e.latency_profile()
        if own is not None and self.device.kind == "emulated":
            own = own.at_speed(self.device.compute_fraction)
        profile = own or getattr(rt, "profile", None)
        return _Built(rt, e.build_policy(override), e.batching_spec(override), profile)

    def _register(self, e: ModelEntry, b: _Built) -> None:
        n = e.name
        for note in e.notes:  # what its config sets that evenserve ignores
            log.warning("model %r: %s: %s", n, e.source, note)
        self.entries[n] = e
        self.signatures[n] = ModelSignature(
            n, e.config.version, e.inputs, e.outputs, e.config.max_batch_size
        )
        self.runtimes[n] = b.runtime
        self.policies[n] = b.policy
        self.batching_specs[n] = b.spec
        self.profiles[n] = b.profile
        self.stats[n] = ModelStats(n, e.config.version, load=self.load_info.get(n))

    def _unregister(self, n: str) -> Runtime:
        for d in (
            self.entries,
            self.signatures,
            self.policies,
            self.batching_specs,
            self.profiles,
            self.stats,
            self.descriptions,
        ):
            d.pop(n, None)
        return self.runtimes.pop(n)

    def _setup(self, n: str) -> ModelSetup:
        e = self.entries[n]
        return ModelSetup(
            name=n,
            policy=self.policies[n],
            profile=self.profiles[n],
            max_batch_size=e.config.max_batch_size,
            max_queue=e.config.max_queue_size or self.options.queue.max_queue_per_model,
            priority=e.config.priority_value,
            deadline_s=e.config.deadline_s,
            slo_s=e.config.slo_s,
        )

    # -- parameters (``PUT /admin/params``) -----------------------------------------------
    def batching_params(self) -> dict[str, Any]:
        """The batching spec each served model runs with now."""
        return {n: dict(s) if isinstance(s, Mapping) else s for n, s in self.batching_specs.items()}

    def apply_params(
        self,
        batching_per_model: Mapping[str, Any] | None = None,
        class_headroom: float | None = None,
        *,
        set_headroom: bool = False,
        learn_profiles: bool | None = None,
        set_learning: bool = False,
        where: str = "params",
    ) -> None:
        """Batch each model named with its new spec, (``set_headroom``) use the class
        headroom given and (``set_learning``) turn profiles that learn on or off
        (``learn_profiles`` None: as the worker was started), from the scheduler's next
        decision on: queued requests stay queued
        and are each answered once; running batches run on. Every spec is checked before
        anything changes (ConfigError naming the field: a model not served here, a policy's
        batch size over the model's ``max_batch_size``). Call it on the worker's loop."""
        built: dict[str, tuple[Any, Any]] = {}
        for m, spec in (batching_per_model or {}).items():
            e = self.entries.get(m)
            at = f"{where}.batching_per_model.{m}"
            if e is None:
                served = ", ".join(sorted(self.entries)) or "none"
                raise ConfigError(f"{at}: model {m!r} is not served here (models: {served})")
            built[m] = batching_setup(spec, e.config.max_batch_size, at)
        driver = self._driver
        now = self.clock.now()
        for m, (full, policy) in built.items():
            self.policies[m] = policy
            self.batching_specs[m] = full
            if driver is not None:
                with driver.lock:
                    driver.sched.set_policy(m, policy, now)
        if set_headroom:
            self.options.queue = self.options.queue.model_copy(
                update={"class_headroom": class_headroom}
            )
            if driver is not None:
                with driver.lock:
                    driver.sched.set_class_headroom(class_headroom, now)
        if set_learning:
            on = self.startup_learn_profiles if learn_profiles is None else learn_profiles
            self.options.learn_profiles = on
            if driver is not None:
                with driver.lock:
                    driver.sched.set_learn_profiles(on, now)

    # -- lifecycle ---------------------------------------------------------------------------
    def load(self) -> None:
        """Load every runtime (blocking; an emulated one sleeps its load time). On an emulated
        device, ConfigError first when their weights do not fit in its memory."""
        if self.device.kind == "emulated":
            need = sum(self._weights_bytes(n) for n in self.runtimes)
            total = self._emulated_total()  # --memory-gb, or a slice's or share's cap
            if need > total:
                each = ", ".join(f"{n} {gib(self._weights_bytes(n))}" for n in self.runtimes)
                raise ConfigError(
                    f"not enough device memory for the models: needs {gib(need)} ({each}), "
                    f"the device has {gib(total)}"
                )
        for name, rt in self.runtimes.items():
            try:
                info = self._load_runtime(self.entries[name], rt)
            except ConfigError as exc:
                raise ConfigError(f"{self.entries[name].source}: {exc}") from exc
            self.descriptions[name] = {**rt.describe(), **info}
            self.load_info[name] = info
            self.stats[name].load = info

    def _pool_digest(self, entry: ModelEntry, runtime: Runtime) -> str:
        """The digest of a model's host-pool entry: its config and what the runtime adds."""
        tag = getattr(runtime, "pool_tag", lambda: "")()
        triton = json.dumps(entry.triton_config, sort_keys=True, default=str)
        return digest(entry.config.model_dump_json(), triton, str(tag))

    def _load_runtime(self, entry: ModelEntry, runtime: Runtime) -> dict[str, Any]:
        """Load a runtime (blocking): from the host pool when it holds the model (warm), else
        from the repository, and then into the pool (a cold load passes through host
        memory), then warm it up (``worker.warmup``: each batch size of ``--warmup``, twice).
        Where it came from and how long it took (the entry's write included, the warm-up
        not): ``load_source`` (host | disk), ``load_seconds``; ``variant``, the one
        ``evenserve optimize`` chose (variant.yaml; None: model.yaml as written); the warm-up's
        ``warmup_batch_sizes``, ``warmup_seconds``, ``warmup_first_ms`` and
        ``warmup_second_ms`` (batch size: ms). ConfigError when a warm-up batch fails."""
        pool = self.host_pool if _pooled(runtime) else None
        rt: Any = runtime
        key = self._pool_digest(entry, runtime) if pool is not None else None
        source = "disk"
        t0 = time.perf_counter()
        found = None
        if pool is not None and key is not None:
            try:
                found = pool.take(entry.name, key)
            except OSError as exc:  # the pool is an optimisation: a load never fails for it
                log.warning("host pool: %s", exc)
        if found is not None:
            try:
                rt.load_warm(found)
                source = "host"
            except (OSError, ConfigError) as exc:  # evicted under it: the cold load then
                log.warning("model %s: warm load from the host pool failed: %s", entry.name, exc)
                rt.close()
                t0 = time.perf_counter()
        if source == "disk":
            if pool is not None and key is not None:
                put = _pool_put(pool, entry.name, key, rt)
                if getattr(rt, "pool_entry_first", False):
                    # The entry stands for the host buffer the cold load reads into: written
                    # while the load runs (emulated: reserving its pages takes a while).
                    writer = threading.Thread(target=put, name="host-pool")
                    writer.start()
                    try:
                        runtime.load()
                    finally:
                        writer.join()
                else:
                    runtime.load()
                    put()
            else:
                runtime.load()
        if key is not None:
            self._pool_digests[entry.name] = key
        took = time.perf_counter() - t0
        self.metrics.observe_load_source(entry.name, source)
        log.info("model %s loaded from %s in %.3f s", entry.name, source, took)
        # Every batch size it will serve, run before the model (and a starting worker) is
        # ready: the first request of a size does not pay its first-call cost.
        # On the device threads that will run its batches (a first call on a new thread
        # costs extra), each of them.
        reports = self._device_threads().on_each_thread(
            lambda: warm_up_model(entry, runtime, self.options.warmup)
        )
        warm = reports[0]
        variant = None if entry.variant is None else entry.variant["name"]
        if variant is not None:
            log.info("model %s: serving the %s variant (%s)", entry.name, variant, VARIANT_FILE)
        return {
            "load_source": source,
            "load_seconds": round(took, 6),
            **warm.info(),
            "variant": variant,
        }

    def _keeper(self, name: str) -> Callable[[Runtime], None] | None:
        """What puts an unloaded model back in the host pool (None: no pool for it)."""
        pool, key = self.host_pool, self._pool_digests.pop(name, None)
        if pool is None or key is None:
            return None

        def keep(runtime: Runtime) -> None:
            _pool_put(pool, name, key, runtime)()

        return keep

    def _emulated_switch_interval(self) -> None:
        if self._saved_switch_interval is None and any(
            isinstance(rt, EmulatedRuntime) for rt in self.runtimes.values()
        ):
            # An emulated batch ends when its device thread wakes up, which needs the GIL;
            # with CPython's default 5 ms switch interval a busy HTTP thread delays that by
            # up to 5 ms and inflates millisecond batches. A shorter interval bounds it.
            self._saved_switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(EMULATED_SWITCH_INTERVAL_S)

    def _device_threads(self) -> ThreadedExecutor:
        """The executor whose threads run the batches, made on first use (the startup
        warm-up runs on them before the driver starts)."""
        if self._executor is None:
            self._executor = ThreadedExecutor(
                self.runtimes,
                {n: [s.name for s in e.inputs] for n, e in self.entries.items()},
                instances=self.options.run.instances,
            )
        return self._executor

    async def start(self) -> None:
        """Create the driver on the running loop; the worker is ready afterwards (with poll
        model control, the repository poller starts too)."""
        self.loop = asyncio.get_running_loop()
        self._emulated_switch_interval()
        self._executor = executor = self._device_threads()
        for n, e in self.entries.items():  # what it runs is what is registered now
            executor.add(n, self.runtimes[n], [s.name for s in e.inputs])
        models = [self._setup(n) for n in self.entries]
        emulated = self.device.kind == "emulated"
        self._driver = BatchDriver(
            models,
            self._executor,
            clock=self.clock,
            timer=RealTimer(self.clock),
            device=self.options.run,
            queue=self.options.queue,
            observer=self._telemetry,
            utilization_window_s=self.options.utilization_window_s,
            # An emulated device's memory is the profiles' account (a slice's or share's cap);
            # a real one is measured (a share's cap applied to the measured total).
            memory_total_bytes=self._emulated_total() if emulated else None,
            memory_probe=None if emulated else self.memory_bytes,
            learn_profiles=self.options.learn_profiles,
        )
        for n, e in self.entries.items():
            self.states[n] = ModelState(READY, version=e.config.version)
        self.ready = True
        if self.options.model_control == "poll":
            self._poller = asyncio.ensure_future(self._poll_forever())

    def count_infer(self, model: str, outcome: str, elapsed_s: float) -> None:
        """One inference request answered (HTTP or gRPC): its metrics, and the model's
        statistics unless it never reached the model or was cancelled."""
        self.metrics.observe_request(model, outcome, elapsed_s)
        stats = self.stats.get(model)  # None: unloaded since
        if outcome not in ("not_found", "cancelled") and stats is not None:
            stats.record_request(outcome == "success", elapsed_s)

    def add_observer(self, observer: DriverObserver) -> None:
        """Also tell ``observer`` about every batch (e.g. a trace recorder)."""
        self._telemetry.extra.append(observer)

    @property
    def started(self) -> bool:
        return self._driver is not None

    @property
    def driver(self) -> BatchDriver:
        if self._driver is None:
            raise RuntimeError("worker not started")
        return self._driver

    def begin_drain_threadsafe(self) -> None:
        """``begin_drain`` from a signal handler or another thread."""
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.begin_drain)

    def begin_drain(self) -> None:
        """Stop accepting inference; run what is queued now (called on SIGTERM/Ctrl-C)."""
        self.draining = True
        self.ready = False
        for watch in self._loads.values():  # the requests waiting for a load are answered
            watch.finish("the worker is shutting down")
        if self._driver is not None:
            self._driver.begin_drain()

    async def stop(self) -> None:
        self.begin_drain()
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
            self._poller = None
        if self._driver is not None:
            await self._driver.drain(self.options.drain_timeout_s)
        if self._executor is not None:
            await asyncio.to_thread(self._executor.shutdown)
        for rt in list(self.runtimes.values()):
            rt.close()
        if self.nvml is not None:
            self.nvml.close()
        if self._saved_switch_interval is not None:
            sys.setswitchinterval(self._saved_switch_interval)
            self._saved_switch_interval = None

    # -- model control -------------------------------------------------------------------------
    def model_state(self, name: str) -> ModelState:
        st = self.states.get(name)
        return st if st is not None else ModelState(UNAVAILABLE, "not loaded")

    def model_ready(self, name: str) -> bool:
        return self.ready and self.model_state(name).state == READY

    def model_refusal(self, name: str) -> str | None:
        """Why a new inference request for ``name`` is refused now (503), None when it may be
        queued. Checked right before it is submitted (no await between)."""
        if self.draining or not self.ready:
            return "the worker is not ready (loading or shutting down)"
        st = self.model_state(name)
        if st.state == READY:
            return None
        if st.state == UNLOADING:
            return f"model {name!r} is unloading"
        if st.state == LOADING:
            return f"model {name!r} is loading"
        return f"model {name!r} is not loaded ({st.reason})"

    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """Every model folder of the repository and every model known, with its state."""
        names = set(self.states)
        repo = self.options.repository
        if repo is not None:
            with contextlib.suppress(ConfigError, OSError):
                names.update(d.name for d in model_folders(repo))
        out = []
        for n in sorted(names):
            st = self.model_state(n)
            if ready_only and not (st.state == READY and self.ready):
                continue
            out.append(st.json(n))
        return out

    def _check_control(self, action: str) -> None:
        mode = self.options.model_control
        if mode == "none":
            raise ModelControlError("model control is disabled (--model-control none)", 400)
        if mode == "poll":
            raise ModelControlError(
                f"explicit model {action} is not allowed while the repository is polled "
                "(--model-control poll)",
                400,
            )

    async def request_load(
        self, name: str, override: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """A load request of the repository extension (explicit model control only); where
        the load came from (``load_source``: host or disk) and ``load_seconds``."""
        self._check_control("load")
        return await self.load_model(name, override)

    async def request_unload(self, name: str) -> None:
        """An unload request of the repository extension (explicit model control only)."""
        self._check_control("unload")
        await self.unload_model(name)

    def _lock(self, name: str) -> asyncio.Lock:
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = asyncio.Lock()
        return lock

    def _folder(self, name: str) -> Path:
        repo = self.options.repository
        if repo is None:
            raise ModelControlError("this worker has no model repository to load from", 400)
        if not wire.is_safe_name(name) or name.startswith((".", "_")):
            raise ModelControlError(f"model {wire.shown_name(name)}: not a model folder name", 400)
        d = repo / name
        if not d.is_dir():
            raise ModelControlError(f"no model folder {name!r} in the repository", 404)
        return d

    def public_text(self, text: str) -> str:
        """``text`` as a client may read it (a model-control error, a model's state): the
        repository's absolute path taken out, so the paths in it are relative to the
        repository (``em/model.yaml``)."""
        repo = self.options.repository
        if repo is None:
            return text
        roots = {str(repo.absolute()), str(repo.resolve())}
        for root in sorted(roots, key=len, reverse=True):
            text = text.replace(root + os.sep, "").replace(root, "the repository")
        return text

    def _ignored_override(self, entry: ModelEntry, override: Mapping[str, Any]) -> str | None:
        """Why a field of a load's config override would have no effect on what this worker
        serves (the field named, as ``parameters.config.emulated.profile``), else None: such
        a load is refused rather than answered 200 with the field silently ignored."""
        if entry.triton_config is not None:
            return None  # Triton's config JSON: what evenserve ignores is in its notes
        w = OVERRIDE_WHERE
        dev = self.options.device
        on_set = dev.kind == "emulated"
        runtime = entry.config.runtime
        if "optimize" in override:
            return f"{w}.optimize: has no effect on a load (evenserve optimize reads model.yaml)"
        if "batching" in override and self.options.batching_override is not None:
            return f"{w}.batching: has no effect: this worker's --batching batches every model"
        for key in ("runtime", "profile", *(k for k in RUNTIME_PARAMS if k != "emulated")):
            if key in override and override[key] != getattr(entry.config, key):
                return (
                    f"{w}.{key}: has no effect: the folder's {VARIANT_FILE} (evenserve optimize) "
                    "sets it; add use_variant: false to serve model.yaml's"
                )
        emulated = override.get("emulated")
        if emulated is not None:
            if not on_set and runtime != "emulated":
                return (
                    f"{w}.emulated: has no effect: the model runs on runtime {runtime} on "
                    f"device {dev.name}"
                )
            if on_set and "profile" in emulated:
                return (
                    f"{w}.emulated.profile: has no effect on device {dev.name}: its profile set "
                    "gives each model its profile (emulated.profile_name picks one)"
                )
            if not on_set and "profile_name" in emulated:
                return (
                    f"{w}.emulated.profile_name: has no effect on device {dev.name}: it picks a "
                    "profile of an emulated:PROFILE_SET device (here emulated.profile does)"
                )
        if on_set:
            for key in RUNTIME_PARAMS:
                if key != "emulated" and key in override:
                    return (
                        f"{w}.{key}: has no effect on device {dev.name}: every model runs "
                        "emulated there"
                    )
        return None

    def _check_running(self) -> None:
        if self.draining:
            raise ModelControlError("the worker is shutting down", 503)
        if self._driver is None or self._executor is None:
            raise ModelControlError("the worker has not started yet", 503)

    async def load_model(
        self, name: str, override: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Load (or reload) model ``name`` from its repository folder; ``override``: model.yaml
        fields replacing the file's top-level ones. The model is LOADING meanwhile (inference
        requests for it wait for the load: ``await_load``), READY after. A model already
        loaded is reloaded: the new config is validated and its runtime built first, and its
        memory checked (a bad one, or one that does not fit, leaves the old model serving),
        then the old one is unloaded (drained: no request lost) and the new one loaded. On an
        emulated device a load whose weights do not fit in the memory not yet held (the
        resident models' weights and those being loaded) is refused (400). ModelControlError
        with the status otherwise. Returns where the load came from, how long it took and
        its warm-up (``LOAD_INFO_KEYS``); the model is READY only once warmed up.

        An override's files must be in the model folder (``check_override_paths``) and a
        field of it that would have no effect here is refused (``_ignored_override``): 400
        naming ``parameters.config.<field>``. Error texts (and the states' reasons) name
        files relative to the repository (``public_text``)."""
        self._check_running()
        directory = self._folder(name)
        async with self._lock(name):
            self._check_running()
            try:
                if override is not None:
                    check_override_paths(directory, override, OVERRIDE_WHERE)
                entry = await asyncio.to_thread(load_model, directory, True, override)
                ignored = None if override is None else self._ignored_override(entry, override)
                if ignored is not None:
                    raise ConfigError(ignored)
            except ConfigError as exc:
                self.metrics.observe_load(name, "failure")
                text = self.public_text(str(exc))
                if name not in self.entries:
                    self.states[name] = ModelState(UNAVAILABLE, f"load failed: {text}")
                raise ModelControlError(text, 400) from exc
            reload = name in self.entries
            watch = None if reload else self._begin_loading(entry)
            reserved = 0.0
            #: What the requests waiting for the load are told (None: it is READY).
            failure: str | None = f"model {name!r}: the load was interrupted"
            try:
                try:
                    built = await asyncio.to_thread(self._build_entry, entry)
                except ConfigError as exc:
                    raise self._load_failed(name, str(exc), 400, keep=reload) from exc
                memory = self.driver.sched.memory
                need = built.profile.weights_bytes if built.profile is not None else 0.0
                with self.driver.lock:
                    free = memory.unreserved_bytes()
                old = self._weights_bytes(name) if reload else 0.0
                if free is not None:
                    if need > free + old:
                        await asyncio.to_thread(built.runtime.close)
                        raise self._load_failed(
                            name,
                            f"not enough device memory: needs {gib(need)}, free "
                            f"{gib(max(0.0, free + old))} (of {gib(memory.total_bytes or 0.0)})",
                            400,
                            keep=reload,
                        )
                    # Held from now on: what the old model frees joins once it is unloaded.
                    reserved = max(0.0, need - old)
                    with self.driver.lock:
                        memory.loading_bytes += reserved
                if reload:
                    await self._unload(name)  # reload: unload, then load the new config
                    if free is not None:
                        with self.driver.lock:
                            memory.loading_bytes += need - reserved
                        reserved = need
                    watch = self._begin_loading(entry, built)
                elif watch is not None:
                    watch.expected_s = getattr(built.runtime, "load_s", None)
                try:
                    description = await asyncio.to_thread(self._load_built, entry, built)
                except Exception as exc:
                    status = 400 if isinstance(exc, ConfigError) else 500
                    text = str(exc) if status == 400 else f"{type(exc).__name__}: {exc}"
                    raise self._load_failed(name, text, status, keep=False) from exc
                if self.draining:  # shut down while it loaded
                    await asyncio.to_thread(_release, built.runtime)
                    self.states[name] = ModelState(UNAVAILABLE, "unloaded")
                    raise ModelControlError("the worker is shutting down", 503)
                # No await from here: its weights move from the reservation to the account.
                self._install(entry, built, description)
                memory.loading_bytes = max(0.0, memory.loading_bytes - reserved)
                reserved = 0.0
                self.metrics.observe_load(name, "success")
                self.states[name] = ModelState(READY, version=entry.config.version)
                failure = None
                log.info("model %s loaded", name)
                return dict(self.load_info[name])
            except ModelControlError as exc:
                failure = str(exc)
                raise
            finally:
                if reserved:
                    memory = self.driver.sched.memory
                    with self.driver.lock:
                        memory.loading_bytes = max(0.0, memory.loading_bytes - reserved)
                if self._loads.get(name) is watch:
                    self._loads.pop(name, None)
                if watch is not None:
                    watch.finish(failure)

    def _begin_loading(self, entry: ModelEntry, built: _Built | None = None) -> _LoadWatch:
        """The model is LOADING: requests for it wait on the watch returned."""
        name = entry.name
        self.states[name] = ModelState(LOADING, version=entry.config.version)
        self._mtimes[name] = _stamp(entry.directory)
        watch = _LoadWatch(None if built is None else getattr(built.runtime, "load_s", None))
        self._loads[name] = watch
        return watch

    def _load_failed(self, name: str, text: str, status: int, keep: bool) -> ModelControlError:
        """A load that failed: counted, the model UNAVAILABLE (``keep``: the old one still
        serves, a reload refused before it was unloaded), the error to raise."""
        self.metrics.observe_load(name, "failure")
        text = self.public_text(text)
        if not keep:
            self.states[name] = ModelState(UNAVAILABLE, f"load failed: {text}")
        return ModelControlError(f"model {name!r}: load failed: {text}", status)

    def _weights_bytes(self, name: str) -> float:
        profile = self.profiles.get(name)
        return profile.weights_bytes if profile is not None else 0.0

    def _build_entry(self, entry: ModelEntry) -> _Built:
        """Build a model's runtime, not loaded (runs in a thread; ConfigError naming its
        file)."""
        return self._build(entry)

    def _load_built(self, entry: ModelEntry, built: _Built) -> dict[str, Any]:
        """Load a built runtime (runs in a thread: an emulated load sleeps its load time);
        closed again if that fails. Returns its description, with where the load came from
        (``load_source``) and how long it took (``load_seconds``)."""
        try:
            info = self._load_runtime(entry, built.runtime)
        except ConfigError as exc:
            built.runtime.close()
            raise ConfigError(f"{entry.source}: {exc}") from exc
        except BaseException:
            built.runtime.close()
            raise
        return {**built.runtime.describe(), **info}

    def waiting_for_load(self, name: str) -> int:
        """How many inference requests wait for the load of ``name`` now."""
        watch = self._loads.get(name)
        return 0 if watch is None else watch.waiting

    async def await_load(self, name: str) -> float:
        """Wait for the load of model ``name`` to end, at most ``load_wait_s``; the seconds
        waited (0.0 at once when no load of it is in progress). LoadWaitError (503) when it
        is still loading after the bound, when the load failed (its error), when the worker
        began shutting down. The wait is observed in ``evenserve_load_wait_seconds``."""
        watch = self._loads.get(name)
        if watch is None:
            return 0.0
        bound = self.options.load_wait_s
        t0 = time.perf_counter()
        if not watch.event.is_set():
            watch.waiting += 1
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(watch.event.wait(), max(bound, 0.0))
            finally:
                watch.waiting -= 1
        waited = time.perf_counter() - t0
        self.metrics.observe_load_wait(name, waited)
        if not watch.event.is_set():
            left = None
            if watch.expected_s is not None:
                left = watch.started_s + watch.expected_s - time.perf_counter()
            raise LoadWaitError(
                f"model {name!r} is still loading after {bound * 1000.0:g} ms",
                waited,
                retry_after_s=max(1.0, left or 1.0),
            )
        if watch.error is not None:
            raise LoadWaitError(watch.error, waited)
        return waited

    def _install(self, entry: ModelEntry, built: _Built, description: dict[str, Any]) -> None:
        """A loaded model joins the executor, the scheduler, signatures, stats and metrics."""
        assert self._executor is not None and self._driver is not None
        n = entry.name
        self._register(entry, built)
        self.descriptions[n] = description
        self.load_info[n] = {k: description[k] for k in LOAD_INFO_KEYS}
        self.stats[n].load = self.load_info[n]
        self._executor.add(n, built.runtime, [s.name for s in entry.inputs])
        self._driver.add_model(self._setup(n))
        self.metrics.add_model(n)
        self._emulated_switch_interval()

    async def unload_model(self, name: str) -> None:
        """Unload a READY model: UNLOADING at once (new requests for it are refused with 503),
        its queued and running requests finish (queued ones still waiting after the drain
        timeout are refused with 503), then it leaves the scheduler and the executor, its
        runtime is closed and the memory given back; UNAVAILABLE (``unloaded``) after."""
        self._check_running()
        async with self._lock(name):
            self._check_running()
            st = self.model_state(name)
            if name not in self.entries or st.state != READY:
                raise ModelControlError(
                    f"model {wire.shown_name(name)} is not loaded (state {st.state}"
                    + (f": {st.reason}" if st.reason else "")
                    + ")",
                    400,
                )
            await self._unload(name)

    async def _unload(self, name: str) -> None:
        assert self._executor is not None and self._driver is not None
        version = self.entries[name].config.version
        self.states[name] = ModelState(UNLOADING, version=version)
        dropped = await self._driver.drain_model(name, self.options.drain_timeout_s)
        if dropped:
            log.warning(
                "model %s: %d queued request(s) refused at the unload timeout", name, dropped
            )
        self._driver.remove_model(name)
        self._executor.remove(name)
        runtime = self._unregister(name)
        self._mtimes.pop(name, None)
        self.load_info.pop(name, None)
        await asyncio.to_thread(_release, runtime, self._keeper(name))
        del runtime
        self.metrics.observe_unload(name)
        self.states[name] = ModelState(UNAVAILABLE, "unloaded", version)
        log.info("model %s unloaded", name)

    async def poll_repository(self) -> list[tuple[str, str]]:
        """One rescan of the repository (poll model control): load new folders, unload the
        models whose folder is gone, reload those whose model.yaml (or config.pbtxt) changed.
        A folder whose load failed is tried again once its config changes. Returns what it did:
        (model, ``load`` | ``reload`` | ``unload`` | ``load failed``)."""
        repo = self.options.repository
        assert repo is not None
        done: list[tuple[str, str]] = []
        try:
            folders = {d.name: d for d in model_folders(repo)}
        except ConfigError as exc:
            log.warning("repository poll: %s", exc)
            return done
        for name, d in folders.items():
            mtime = _stamp(d)
            loaded = name in self.entries
            if name in self._mtimes and self._mtimes[name] == mtime:
                continue
            if not loaded and self.states.get(name, ModelState(UNAVAILABLE)).state != UNAVAILABLE:
                continue  # loading or unloading: the next poll looks again
            self._mtimes[name] = mtime
            try:
                await self.load_model(name)
                done.append((name, "reload" if loaded else "load"))
            except ModelControlError as exc:
                log.warning("repository poll: %s", exc)
                done.append((name, "load failed"))
        for name in [n for n in self.entries if n not in folders]:
            try:
                await self.unload_model(name)
                done.append((name, "unload"))
            except ModelControlError as exc:
                log.warning("repository poll: %s", exc)
        return done

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self.options.repository_poll_s)
            if self.draining:
                return
            try:
                await self.poll_repository()
            except Exception:  # a poll must never end the poller
                log.exception("repository poll failed")

    # -- signals -----------------------------------------------------------------------------
    def memory_bytes(self) -> tuple[float | None, float | None]:
        """(used, total) bytes of the device; host/CUDA figures cached for 100 ms."""
        dev = self.device
        if dev.kind == "emulated":
            if self._driver is not None:
                with self._driver.lock:
                    return self._driver.sched.memory.used_total()
            accounted = sum(rt.resident_bytes() for rt in self.runtimes.values())
            return accounted, self._emulated_total()
        now = time.monotonic()
        if now - self._memory_cache[0] < 0.1:
            return self._memory_cache[1], self._memory_cache[2]
        used: float | None
        total: float | None
        try:
            used, total = self._measured_memory()
        except Exception:
            used = total = None
        self._memory_cache = (now, used, total)
        return used, total

    def _emulated_total(self) -> float:
        """An emulated device's memory cap: ``memory_gb``, a share's part of it, or a MIG
        profile's own memory."""
        return self.device.memory_cap_bytes(self.options.run.memory_gb * GIB)

    def _measured_memory(self) -> tuple[float, float]:
        """(used, total) bytes measured: a MIG slice's from NVML on the slice's handle (torch's
        view of its only visible device without NVML); a share's own process's bytes against
        its part of the GPU; a whole GPU's or the host's as reported."""
        dev = self.device
        if dev.kind != "cuda":
            return host_memory_bytes()
        if dev.mig_uuid is not None and self.nvml is not None:
            mem = self.nvml.memory()
            if mem is not None:
                return mem
        used, total = cuda_memory_bytes(dev.cuda_index)
        if dev.slice is not None:  # a time-sliced share
            return cuda_process_memory_bytes(dev.cuda_index), dev.memory_cap_bytes(total)
        return used, total

    def _snapshot(self) -> DeviceSnapshot:
        d = self._driver
        if d is None:
            return self._snapshot_of(None)
        with d.lock:
            return self._snapshot_of(d)

    def _snapshot_of(self, d: BatchDriver | None) -> DeviceSnapshot:
        used, total = self.memory_bytes()
        now = self.clock.now()
        return DeviceSnapshot(
            busy_ratio=d.sched.busy.fraction(now) if d else 0.0,
            busy_seconds_total=d.sched.busy.total_s(now) if d else 0.0,
            memory_used_bytes=used,
            memory_total_bytes=total,
            instances=self.options.run.instances,
            queued_by_model=d.sched.queued_by_model() if d else {m: 0 for m in self.entries},
            in_flight_by_model=d.sched.in_flight_by_model() if d else {m: 0 for m in self.entries},
            cap_by_model=dict(d.sched.max_batch_size)
            if d
            else {m: p.max_batch_size for m, p in self.policies.items()},
        )

    @property
    def device_name(self) -> str:
        """What the metrics and the load report call the device (``WorkerOptions.name``)."""
        return self.options.name or self.device.name

    def load_report(self) -> LoadReport:
        """The load report; its per-model figures list only READY models (the ones a router
        may send work to: not those loading or unloading). The device's totals count all."""
        with self.driver.lock:
            return self._load_report()

    def _load_report(self) -> LoadReport:
        d = self.driver
        now = self.clock.now()
        used, total = self.memory_bytes()
        routable = {n for n, st in self.states.items() if st.state == READY}

        def ready_only(by_model: Mapping[str, Any]) -> dict[str, Any]:
            return {m: v for m, v in by_model.items() if m in routable}

        scale, observed = d.sched.learned()

        return LoadReport(
            timestamp_s=time.time(),
            device=self.device_name,
            device_kind=self.device.kind,
            device_slice=self.device.slice_label,
            queue_depth=d.sched.waiting,
            in_flight=d.sched.in_flight,
            queued_by_model=ready_only(d.sched.queued_by_model()),
            in_flight_by_model=ready_only(d.sched.in_flight_by_model()),
            utilization=d.sched.busy.fraction(now),
            utilization_window_s=self.options.utilization_window_s,
            memory_used_bytes=used,
            memory_total_bytes=total,
            busy_remaining_s=d.sched.busy_remaining_s(now),
            max_batch_size_by_model=ready_only(d.sched.max_batch_size),
            slo_ms_by_model={m: s * 1000.0 for m, s in ready_only(d.sched.slo_s).items()},
            max_queue_by_model=ready_only(d.sched.max_queue),
            profile_scale_by_model={m: round(v, 5) for m, v in ready_only(scale).items()},
            observed_ms_by_model={
                m: {b: round(ms, 4) for b, ms in v.items()} for m, v in ready_only(observed).items()
            },
            loading_models=sorted(n for n, st in self.states.items() if st.state == LOADING),
            models_version=self.states.version,
            ready=self.ready,
        )

    # -- descriptions ------------------------------------------------------------------------
    def model_config_json(self, name: str) -> dict[str, Any]:
        """The model's configuration in the shape of Triton's model config JSON."""
        e = self.entries[name]
        spec = self.batching_specs[name]
        policy = self.policies[name]
        ours = {
            "evenserve_device": {"string_value": self.device.name},
            "evenserve_batching": {"string_value": spec_label(spec)},
            "evenserve_runtime": {
                "string_value": json.dumps(self.descriptions.get(name, {}), default=str)
            },
        }
        if e.notes:
            ours["evenserve_ignored"] = {"string_value": json.dumps(e.notes)}
        if e.triton_config is not None:
            # A Triton repository's model: its own config, as Triton clients expect it.
            triton = copy.deepcopy(e.triton_config)
            triton["name"] = name
            triton["parameters"] = {**triton.get("parameters", {}), **ours}
            return triton
        cfg: dict[str, Any] = {
            "name": name,
            "platform": f"evenserve_{e.config.runtime}",
            "backend": "evenserve",
            "max_batch_size": e.config.max_batch_size,
            **{
                kind: [
                    {"name": t.name, "data_type": f"TYPE_{t.datatype}", "dims": t.shape} for t in ts
                ]
                for kind, ts in (("input", e.config.inputs), ("output", e.config.outputs))
            },
            "instance_group": [
                {
                    "name": name,
                    "count": self.options.run.instances,
                    "kind": "KIND_GPU" if self.device.kind == "cuda" else "KIND_CPU",
                }
            ],
            "version_policy": {"specific": {"versions": [e.config.version]}},
            "parameters": ours,
        }
        if policy.max_batch_size > 1:
            delay_ms = spec.get("max_batch_delay_ms", spec.get("max_wait_ms", 0)) or 0
            cfg["dynamic_batching"] = {
                "max_queue_delay_microseconds": int(float(delay_ms) * 1000),
                "preferred_batch_size": [policy.max_batch_size],
            }
        if e.config.slo_ms is not None:
            cfg["parameters"]["evenserve_slo_ms"] = {"string_value": str(e.config.slo_ms)}
        return cfg

    def model_metadata_json(self, name: str) -> dict[str, Any]:
        e = self.entries[name]
        triton = e.triton_config or {}
        return {
            "name": name,
            "versions": [e.config.version],
            "platform": triton.get("platform") or f"evenserve_{e.config.runtime}",
            **{
                kind: [
                    {"name": t.name, "datatype": t.datatype, "shape": [-1, *t.shape]} for t in ts
                ]
                for kind, ts in (("inputs", e.config.inputs), ("outputs", e.config.outputs))
            },
        }
