"""Building and loading one model's runtime, with the host's warm pool beside it.

``build`` makes a model's record with its runtime not loaded; ``load_runtime`` loads it
(blocking): from the host pool when the pool holds the model (warm), else from the
repository and then into the pool (a cold load passes through host memory), then warms it
up on the device threads. ``release`` closes an unloaded model's runtime, first putting it in
the pool (an unload keeps it warm), and gives the memory back. The pool is an optimisation:
no load or unload fails for it.
"""

from __future__ import annotations

import ctypes
import gc
import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from evenserve.core.errors import ConfigError
from evenserve.runtime.base import Runtime
from evenserve.runtime.emulated import EmulatedRuntime
from evenserve.runtime.host_pool import HostPool, digest
from evenserve.runtime.torch_common import release_cuda_cache
from evenserve.worker.device import Device
from evenserve.worker.models.registry import HostedModel
from evenserve.worker.repository import VARIANT_FILE, ModelEntry
from evenserve.worker.warmup import warm_up_model

#: The name the worker's model lines have always been logged under (``--log-level``).
log = logging.getLogger("evenserve.worker.service")

#: What ``load_runtime`` reports of a load: where it came from, how long it took, and the
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
    """What writes (or refreshes) a model's pool entry; a failure is logged, never raised."""
    rt: Any = runtime

    def put() -> None:
        try:
            pool.put(model, key, rt.pool_bytes(), rt.write_pool_entry)
        except Exception:
            log.exception("host pool: keeping model %s failed", model)

    return put


def release(runtime: Runtime, keep: Callable[[Runtime], None] | None = None) -> None:
    """Close an unloaded model's runtime and collect what it held (runs in a thread);
    ``keep`` first puts it in the host pool (an unload keeps it warm)."""
    if keep is not None:
        keep(runtime)
    runtime.close()
    del runtime
    gc.collect()
    release_cuda_cache()
    trim_memory()


def keeper(pool: HostPool | None, model: HostedModel) -> Callable[[Runtime], None] | None:
    """What puts an unloaded model back in the host pool (None: no pool for it)."""
    key = model.pool_digest
    if pool is None or key is None:
        return None
    name = model.name

    def keep(runtime: Runtime) -> None:
        _pool_put(pool, name, key, runtime)()

    return keep


def build(entry: ModelEntry, device: Device, batching_override: Any) -> HostedModel:
    """A model's record, its runtime built but not loaded (ConfigError naming its file)."""
    options = device.options
    try:
        rt = entry.create_runtime(
            options.device,
            cpu_threads=options.cpu_threads,
            profiles_dir=options.profiles_dir,
            emulated_device=device.shared,
        )
    except ConfigError as exc:
        raise ConfigError(f"{entry.source}: {exc}") from exc
    if device.slowdown is not None and isinstance(rt, EmulatedRuntime):
        rt.slowdown = device.slowdown  # one schedule, one origin, for every model here
    if options.staging_s_per_item > 0 and isinstance(rt, EmulatedRuntime):
        rt.staging_s_per_item = options.staging_s_per_item
    # A model without a profile file of its own has its emulated runtime's, if any.
    # On an emulated MIG slice the model's own profile runs at the slice's speed too.
    own = entry.latency_profile()
    if own is not None and device.target.kind == "emulated":
        own = own.at_speed(device.target.compute_fraction)
    profile = own or getattr(rt, "profile", None)
    return HostedModel(
        entry,
        rt,
        entry.build_policy(batching_override),
        entry.batching_spec(batching_override),
        profile,
    )


def _pool_digest(entry: ModelEntry, runtime: Runtime) -> str:
    """The digest of a model's host-pool entry: its config and what the runtime adds."""
    tag = getattr(runtime, "pool_tag", lambda: "")()
    triton = json.dumps(entry.triton_config, sort_keys=True, default=str)
    return digest(entry.config.model_dump_json(), triton, str(tag))


def load_runtime(
    model: HostedModel,
    device: Device,
    pool: HostPool | None,
    observe_source: Callable[[str, str], None],
) -> dict[str, Any]:
    """Load a model's runtime (blocking; the module docstring), then warm it up
    (``worker.warmup``: each batch size of ``--warmup``, twice, on each device thread).
    Where it came from and how long it took (the entry's write included, the warm-up not):
    ``load_source`` (host | disk), ``load_seconds``; ``variant``, the one ``evenserve
    optimize`` chose (variant.yaml; None: model.yaml as written); the warm-up's
    ``warmup_batch_sizes``, ``warmup_seconds``, ``warmup_first_ms`` and
    ``warmup_second_ms`` (batch size: ms). ConfigError when a warm-up batch fails.
    ``observe_source(model, source)`` counts where it came from."""
    entry, runtime = model.entry, model.runtime
    pool = pool if _pooled(runtime) else None
    rt: Any = runtime
    key = _pool_digest(entry, runtime) if pool is not None else None
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
        model.pool_digest = key
    took = time.perf_counter() - t0
    observe_source(entry.name, source)
    log.info("model %s loaded from %s in %.3f s", entry.name, source, took)
    # Every batch size it will serve, run before the model (and a starting worker) is
    # ready: the first request of a size does not pay its first-call cost.
    # On the device threads that will run its batches (a first call on a new thread
    # costs extra), each of them.
    reports = device.threads().on_each_thread(
        lambda: warm_up_model(entry, runtime, device.options.warmup)
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


def load_model_runtime(
    model: HostedModel,
    device: Device,
    pool: HostPool | None,
    observe_source: Callable[[str, str], None],
) -> dict[str, Any]:
    """Load a built model (runs in a thread: an emulated load sleeps its load time); its
    runtime closed again if that fails. Returns its description, with where the load came
    from (``load_source``) and how long it took (``load_seconds``)."""
    try:
        info = load_runtime(model, device, pool, observe_source)
    except ConfigError as exc:
        model.runtime.close()
        raise ConfigError(f"{model.entry.source}: {exc}") from exc
    except BaseException:
        model.runtime.close()
        raise
    return {**model.runtime.describe(), **info}
