"""Model control (Triton's ``--model-control-mode``): load, unload, poll, and await a load.

``explicit``: the repository extension's load and unload requests change the models served;
``poll``: the repository is rescanned every ``repository_poll_s`` (new folders load, removed
ones unload, a changed model.yaml or variant.yaml reloads); ``none``: the models given are
served for the worker's life. A model being loaded is LOADING: inference requests for it wait
for the load (``models.loadwait``, at most ``load_wait_s``). Error texts (and the states' reasons)
name files relative to the repository (``public_text``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evenserve.core import wire
from evenserve.core.errors import ConfigError, EvenserveError
from evenserve.metrics.worker import WorkerMetrics
from evenserve.runtime.host_pool import HostPool
from evenserve.worker.device import Device, gib
from evenserve.worker.driver import BatchDriver
from evenserve.worker.load_override import OVERRIDE_WHERE, check_override_paths, ignored_override
from evenserve.worker.models.loading import (
    LOAD_INFO_KEYS,
    build,
    keeper,
    load_model_runtime,
    release,
)
from evenserve.worker.models.loadwait import LoadWaits, LoadWatch
from evenserve.worker.models.registry import (
    LOADING,
    READY,
    UNAVAILABLE,
    UNLOADING,
    HostedModel,
    ModelRegistry,
    ModelState,
)
from evenserve.worker.repository import (
    MODEL_FILE,
    VARIANT_FILE,
    ModelEntry,
    load_model,
    model_folders,
)
from evenserve.worker.triton_config import TRITON_FILE

if TYPE_CHECKING:
    from evenserve.worker.llm.residency import LlmResidency

#: The name the worker's model lines have always been logged under (``--log-level``).
log = logging.getLogger("evenserve.worker.service")


class ModelControlError(EvenserveError):
    """A load or unload request that cannot be done; ``status`` is its HTTP status (400 bad
    request or config, 404 no such model folder, 503 shutting down, 500 the load failed)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def _config_file(directory: Path) -> Path:
    """A model folder's config: model.yaml, else a Triton folder's config.pbtxt."""
    own = directory / MODEL_FILE
    return own if own.exists() else directory / TRITON_FILE


def _mtime(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def stamp(directory: Path) -> tuple[int | None, int | None]:
    """What poll mode compares: the folder's config and its variant.yaml (``evenserve
    optimize`` writing a new variant reloads the model, as a changed model.yaml does)."""
    return _mtime(_config_file(directory)), _mtime(directory / VARIANT_FILE)


class ModelControl:
    """Loads and unloads the registry's models while the worker serves."""

    def __init__(
        self,
        models: ModelRegistry,
        device: Device,
        metrics: WorkerMetrics,
        host_pool: HostPool | None,
    ) -> None:
        self.models = models
        self.device = device
        self.options = device.options
        self.metrics = metrics
        self.host_pool = host_pool
        #: model.yaml's and variant.yaml's mtimes when each model was last (tried to be)
        #: loaded (poll mode).
        self.mtimes: dict[str, tuple[int | None, int | None]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        #: The loads in progress, which inference requests may wait for.
        self.loads = LoadWaits(self.options, metrics.observe_load_wait)
        #: The LLMs' sleep and wake (``worker.llm.residency``; None: no LLM here): a load
        #: of an LLM folder wakes its engine, an unload puts it to sleep.
        self.llm: LlmResidency | None = None

    @property
    def driver(self) -> BatchDriver:
        if self.device.driver is None:
            raise RuntimeError("worker not started")
        return self.device.driver

    # -- requests (the repository extension) --------------------------------------------------
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

    def _check_running(self) -> None:
        if self.models.draining:
            raise ModelControlError("the worker is shutting down", 503)
        if self.device.driver is None or self.device.executor is None:
            raise ModelControlError("the worker has not started yet", 503)

    # -- load --------------------------------------------------------------------------------
    async def load_model(
        self, name: str, override: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Load (or reload) model ``name`` from its repository folder; ``override``: model.yaml
        fields replacing the file's top-level ones. The model is LOADING meanwhile (inference
        requests for it wait for the load: ``models.loadwait``), READY after. A model already
        loaded is reloaded: the new config is validated and its runtime built first, and its
        memory checked (a bad one, or one that does not fit, leaves the old model serving),
        then the old one is unloaded (drained: no request lost) and the new one loaded. On an
        emulated device a load whose weights do not fit in the memory not yet held (the
        resident models' weights and those being loaded) is refused (400). ModelControlError
        with the status otherwise. Returns where the load came from, how long it took and
        its warm-up (``LOAD_INFO_KEYS``); the model is READY only once warmed up.

        An override's files must be in the model folder (``check_override_paths``) and a
        field of it that would have no effect here is refused (``ignored_override``): 400
        naming ``parameters.config.<field>``."""
        self._check_running()
        directory = self._folder(name)
        if self.llm is not None and name in self.llm.llms:
            if override is not None:
                raise ModelControlError(
                    f"model {name!r}: an LLM's load (a wake) takes no config override", 400
                )
            async with self._lock(name):
                self._check_running()
                return await self._llm_op(name, "load")
        async with self._lock(name):
            self._check_running()
            try:
                if override is not None:
                    check_override_paths(directory, override, OVERRIDE_WHERE)
                entry = await asyncio.to_thread(load_model, directory, True, override)
                ignored = (
                    None if override is None else ignored_override(entry, override, self.options)
                )
                if ignored is not None:
                    raise ConfigError(ignored)
            except ConfigError as exc:
                self.metrics.observe_load(name, "failure")
                text = self.public_text(str(exc))
                if name not in self.models:
                    self.models.states[name] = ModelState(UNAVAILABLE, f"load failed: {text}")
                raise ModelControlError(text, 400) from exc
            return await self._load(name, entry)

    async def _llm_op(self, name: str, action: str) -> dict[str, Any]:
        """A load (wake) or unload (sleep) of an LLM (``worker.llm.residency``)."""
        from evenserve.worker.llm.residency import LlmResidencyError

        llm = self.llm
        assert llm is not None
        try:
            if action == "load":
                info = await llm.wake(name)
                self.metrics.observe_load(name, "success")
                if info["load_source"] != "device":  # not already awake
                    self.metrics.observe_load_source(name, str(info["load_source"]))
                return info
            await llm.sleep(name)
            self.metrics.observe_unload(name)
            return {}
        except LlmResidencyError as exc:
            if action == "load":
                self.metrics.observe_load(name, "failure")
            raise ModelControlError(str(exc), exc.status) from exc

    async def _load(self, name: str, entry: ModelEntry) -> dict[str, Any]:
        reload = name in self.models
        watch = None if reload else self._begin_loading(entry)
        reserved = 0.0
        #: What the requests waiting for the load are told (None: it is READY).
        failure: str | None = f"model {name!r}: the load was interrupted"
        try:
            try:
                built = await asyncio.to_thread(
                    build, entry, self.device, self.options.batching_override
                )
            except ConfigError as exc:
                raise self._load_failed(name, str(exc), 400, keep=reload) from exc
            memory = self.driver.sched.memory
            need = built.weights_bytes
            with self.driver.lock:
                free = memory.unreserved_bytes()
            old = self.models.weights_bytes(name) if reload else 0.0
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
                description = await asyncio.to_thread(self.load_built, built)
            except Exception as exc:
                status = 400 if isinstance(exc, ConfigError) else 500
                text = str(exc) if status == 400 else f"{type(exc).__name__}: {exc}"
                raise self._load_failed(name, text, status, keep=False) from exc
            if self.models.draining:  # shut down while it loaded
                await asyncio.to_thread(release, built.runtime)
                self.models.states[name] = ModelState(UNAVAILABLE, "unloaded")
                raise ModelControlError("the worker is shutting down", 503)
            # No await from here: its weights move from the reservation to the account.
            self.install(built, description)
            memory.loading_bytes = max(0.0, memory.loading_bytes - reserved)
            reserved = 0.0
            self.metrics.observe_load(name, "success")
            self.models.states[name] = ModelState(READY, version=entry.config.version)
            failure = None
            log.info("model %s loaded", name)
            return dict(built.load_info or {})
        except ModelControlError as exc:
            failure = str(exc)
            raise
        finally:
            if reserved:
                memory = self.driver.sched.memory
                with self.driver.lock:
                    memory.loading_bytes = max(0.0, memory.loading_bytes - reserved)
            if self.loads.get(name) is watch:
                self.loads.pop(name, None)
            if watch is not None:
                watch.finish(failure)

    def load_built(self, model: HostedModel) -> dict[str, Any]:
        """Load a built model's runtime (blocking: runs in a thread); its description."""
        return load_model_runtime(
            model, self.device, self.host_pool, self.metrics.observe_load_source
        )

    def install(self, model: HostedModel, description: dict[str, Any]) -> None:
        """A loaded model is served: its record in the registry, whose hooks tell the
        executor, the scheduler and telemetry."""
        model.loaded(description, {k: description[k] for k in LOAD_INFO_KEYS})
        self.models.install(model)

    def _begin_loading(self, entry: ModelEntry, built: HostedModel | None = None) -> LoadWatch:
        """The model is LOADING: requests for it wait on the watch returned."""
        name = entry.name
        self.models.states[name] = ModelState(LOADING, version=entry.config.version)
        self.mtimes[name] = stamp(entry.directory)
        watch = LoadWatch(None if built is None else getattr(built.runtime, "load_s", None))
        self.loads[name] = watch
        return watch

    def _load_failed(self, name: str, text: str, status: int, keep: bool) -> ModelControlError:
        """A load that failed: counted, the model UNAVAILABLE (``keep``: the old one still
        serves, a reload refused before it was unloaded), the error to raise."""
        self.metrics.observe_load(name, "failure")
        text = self.public_text(text)
        if not keep:
            self.models.states[name] = ModelState(UNAVAILABLE, f"load failed: {text}")
        return ModelControlError(f"model {name!r}: load failed: {text}", status)

    def begin_drain(self) -> None:
        """The requests waiting for a load are answered (the worker is shutting down)."""
        self.loads.finish_all("the worker is shutting down")

    # -- unload ------------------------------------------------------------------------------
    async def unload_model(self, name: str) -> None:
        """Unload a READY model: UNLOADING at once (new requests for it are refused with 503),
        its queued and running requests finish (queued ones still waiting after the drain
        timeout are refused with 503), then it leaves the scheduler and the executor, its
        runtime is closed and the memory given back; UNAVAILABLE (``unloaded``) after."""
        self._check_running()
        if self.llm is not None and name in self.llm.llms:
            async with self._lock(name):
                self._check_running()
                await self._llm_op(name, "unload")
            return
        async with self._lock(name):
            self._check_running()
            st = self.models.state(name)
            if name not in self.models or st.state != READY:
                raise ModelControlError(
                    f"model {wire.shown_name(name)} is not loaded (state {st.state}"
                    + (f": {st.reason}" if st.reason else "")
                    + ")",
                    400,
                )
            await self._unload(name)

    async def _unload(self, name: str) -> None:
        version = self.models[name].entry.config.version
        self.models.states[name] = ModelState(UNLOADING, version=version)
        dropped = await self.driver.drain_model(name, self.options.drain_timeout_s)
        if dropped:
            log.warning(
                "model %s: %d queued request(s) refused at the unload timeout", name, dropped
            )
        model = self.models.remove(name)
        self.mtimes.pop(name, None)
        keep = keeper(self.host_pool, model)
        runtime = model.runtime
        del model
        await asyncio.to_thread(release, runtime, keep)
        del runtime
        self.models.states[name] = ModelState(UNAVAILABLE, "unloaded", version)
        log.info("model %s unloaded", name)

    # -- the index ---------------------------------------------------------------------------
    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """Every model folder of the repository and every model known, with its state."""
        names = set(self.models.states)
        repo = self.options.repository
        if repo is not None:
            with contextlib.suppress(ConfigError, OSError):
                names.update(d.name for d in model_folders(repo))
        out = []
        for n in sorted(names):
            st = self.models.state(n)
            if ready_only and not (st.state == READY and self.models.ready):
                continue
            out.append(st.json(n))
        return out
