"""The worker's composition root: its parts built and wired, its life, its sibling fronts.

:class:`Worker` builds, from a repository's entries and the options, the model registry, the
device, telemetry, model control, the live parameters and the data plane, and joins the
registry's hooks (the device threads, the driver and telemetry follow the models served).
``load`` loads the runtimes (blocking: call it from a thread or before serving), ``start``
creates the driver on the running loop, ``begin_drain`` and ``stop`` shut it down
gracefully.

:class:`WorkerServing` is what ``httpio.serving`` runs: it starts the worker, then the HTTP
front and (with a gRPC port) the gRPC front as siblings over the one data plane, and stops
them together: on a graceful stop both turn not-ready at once (the worker's readiness), the
gRPC front stops taking calls and answers its open ones while the queues drain.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Collection, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from evenserve.core.clock import Clock, RealClock
from evenserve.core.errors import ConfigError
from evenserve.core.requestlog import Recorder
from evenserve.httpio.server import Request, Response
from evenserve.metrics.llm import LlmMetrics
from evenserve.runtime.host_pool import HostPool
from evenserve.worker.admin import LiveParams, WorkerAdmin
from evenserve.worker.batch import DriverObserver
from evenserve.worker.dataplane import DataPlane
from evenserve.worker.device import Device, gib
from evenserve.worker.driver import BatchDriver
from evenserve.worker.http_api import WorkerApp
from evenserve.worker.llm.config import LlmEntry
from evenserve.worker.llm.front import LlmFront
from evenserve.worker.llm.generation import GenerationDriver
from evenserve.worker.llm.hosting import LlmModel, build_llm, llm_readings, profile_set_dir
from evenserve.worker.llm.residency import AWAKE, LlmResidency
from evenserve.worker.models.control import ModelControl, stamp
from evenserve.worker.models.loading import build, load_runtime
from evenserve.worker.models.poll import RepositoryPoller
from evenserve.worker.models.registry import LOADING, READY, ModelRegistry, ModelState
from evenserve.worker.options import WorkerOptions
from evenserve.worker.repository import ModelEntry
from evenserve.worker.telemetry import Telemetry, worker_metrics
from evenserve.worker.timer import RealTimer

if TYPE_CHECKING:
    from evenserve.worker.grpc_api import GrpcServer


class Worker:
    """One worker: the device, its models, the batcher driver, telemetry, the data plane."""

    def __init__(
        self,
        entries: Sequence[ModelEntry],
        options: WorkerOptions,
        clock: Clock | None = None,
        llm_entries: Sequence[LlmEntry] = (),
        llm_awake: Collection[str] | None = None,
    ) -> None:
        if not entries and not llm_entries and options.model_control == "none":
            raise ConfigError("a worker needs at least one model (or --model-control explicit)")
        if options.model_control != "none" and options.repository is None:
            raise ConfigError(f"model control {options.model_control!r} needs the repository")
        self.options = options
        self.clock: Clock = clock or RealClock()
        self.models = ModelRegistry()
        self.device = Device(options, self.models)
        host_pool = (
            None
            if options.host_pool is None
            else HostPool(options.host_pool, options.host_pool_bytes)
        )
        self.params = LiveParams(self.models, self.device)
        mtimes = {}
        for e in entries:
            if e.name in self.models:
                raise ConfigError(f"model {e.name!r} is given twice")
            self.models.add(build(e, self.device, options.batching_override))
            self.models.states[e.name] = ModelState(LOADING, version=e.config.version)
            mtimes[e.name] = stamp(e.directory)
        self.metrics = worker_metrics(self.models, self.device)
        self.telemetry = Telemetry(self.metrics, self.models)
        self.control = ModelControl(self.models, self.device, self.metrics, host_pool)
        self.control.mtimes.update(mtimes)
        self.poller = RepositoryPoller(self.control)
        self.plane = DataPlane(self.models, self.control, self.device, self.telemetry)
        #: LLM models (``kind: llm`` folders): each one's engine joins the device scheduler.
        target = self.device.target
        emulated = target.kind == "emulated"
        set_dir = profile_set_dir(target.profile_set, options.profiles_dir) if emulated else None
        self.llms: dict[str, LlmModel] = {}
        for le in llm_entries:
            if le.name in self.llms or le.name in self.models:
                raise ConfigError(f"model {le.name!r} is given twice")
            self.llms[le.name] = build_llm(le, set_dir, emulated)
        self.plane.llm_names = frozenset(self.llms)
        self.llm_metrics = LlmMetrics(self.metrics.registry, self.llms) if self.llms else None
        #: Where each LLM is (awake: ``llm_awake``, None: all; the rest on disk) and its
        #: sleep and wake, which model control's load and unload of it run.
        self.residency = LlmResidency(
            self.llms,
            set(self.llms if llm_awake is None else llm_awake),
            self.models.states,
            self.control.loads,
            self._generation_driver,
            options.drain_timeout_s,
            pool=host_pool,
        )
        if self.llms:
            self.control.llm = self.residency
        self.llm_front = LlmFront(
            self.llms,
            self._generation_driver,
            lambda: self.ready and not self.draining,
            self.llm_metrics,
            self.models.states,
            self.control.loads,
        )
        self.http = WorkerApp(
            self.plane,
            WorkerAdmin(self.params, options.admin_token),
            self.llm_front.routes() if self.llms else None,
        )
        self._poller: asyncio.Task[None] | None = None

    @property
    def ready(self) -> bool:
        return self.models.ready

    @property
    def draining(self) -> bool:
        return self.models.draining

    @property
    def driver(self) -> BatchDriver:
        if self.device.driver is None:
            raise RuntimeError("worker not started")
        return self.device.driver

    def _generation_driver(self) -> GenerationDriver:
        d = self.driver
        assert isinstance(d, GenerationDriver)
        return d

    def add_observer(self, observer: DriverObserver) -> None:
        """Also tell ``observer`` about every batch (e.g. a trace recorder)."""
        self.telemetry.extra.append(observer)

    # -- life --------------------------------------------------------------------------------
    def load(self) -> None:
        """Load every runtime (blocking; an emulated one sleeps its load time). On an emulated
        device, ConfigError first when their weights do not fit in its memory."""
        models = self.models
        if self.device.target.kind == "emulated":
            need = sum(m.weights_bytes for m in models.values())
            total = self.device.emulated_total()  # --memory-gb, or a slice's or share's cap
            if need > total:
                each = ", ".join(f"{n} {gib(m.weights_bytes)}" for n, m in models.items())
                raise ConfigError(
                    f"not enough device memory for the models: needs {gib(need)} ({each}), "
                    f"the device has {gib(total)}"
                )
        pool, observe = self.control.host_pool, self.metrics.observe_load_source
        for m in models.values():
            try:
                info = load_runtime(m, self.device, pool, observe)
            except ConfigError as exc:
                raise ConfigError(f"{m.entry.source}: {exc}") from exc
            m.loaded({**m.runtime.describe(), **info}, info)

    async def start(self) -> None:
        """Create the driver on the running loop and join the registry's hooks; the worker
        is ready afterwards (with poll model control, the repository poller starts too)."""
        self.device.fast_switches()
        executor = self.device.threads()
        for n, m in self.models.items():  # what it runs is what is registered now
            executor.add(n, m.runtime, m.input_names)
        emulated = self.device.target.kind == "emulated"
        max_queue = self.options.queue.max_queue_per_model
        driver = self.device.driver = GenerationDriver(
            [m.setup(max_queue) for m in self.models.values()],
            executor,
            clock=self.clock,
            timer=RealTimer(self.clock),
            device=self.options.run,
            queue=self.options.queue,
            observer=self.telemetry,
            utilization_window_s=self.options.utilization_window_s,
            # An emulated device's memory is the profiles' account (a slice's or share's cap);
            # a real one is measured (a share's cap applied to the measured total).
            memory_total_bytes=self.device.emulated_total() if emulated else None,
            memory_probe=None if emulated else self.device.memory_bytes,
            learn_profiles=self.options.learn_profiles,
        )
        for name, llm in self.llms.items():
            if self.residency.where[name] == AWAKE:
                try:
                    self.residency.host(name)
                except ValueError as exc:
                    raise ConfigError(f"{llm.entry.source}: engine: {exc}") from exc
            executor.steppers[name] = llm.runner
        if self.llms:
            driver.hosts_llms = True
            executor.take_free = driver.take_free
            if self.llm_metrics is not None:
                self.llm_metrics.bind(lambda: llm_readings(driver))
        # From now on a model loaded joins the device threads, then the scheduler, then
        # telemetry; one unloaded leaves them in the reverse order.
        self.models.join(self.device.on_load, self.device.on_unload)
        self.models.join(
            lambda m: driver.add_model(m.setup(self.options.queue.max_queue_per_model)),
            lambda m: driver.remove_model(m.name),
        )
        self.models.join(self.telemetry.on_load, self.telemetry.on_unload)
        for n, m in self.models.items():
            self.models.states[n] = ModelState(READY, version=m.entry.config.version)
        # Awake: READY in the index (the gateway routes them); the rest on disk.
        self.residency.initial_states()
        self.models.ready = True
        if self.options.model_control == "poll":
            self._poller = asyncio.ensure_future(self.poller.run())

    def begin_drain(self) -> None:
        """Stop accepting inference; run what is queued now (called on SIGTERM/Ctrl-C)."""
        self.models.draining = True
        self.models.ready = False
        self.control.begin_drain()  # the requests waiting for a load are answered
        if self.device.driver is not None:
            self.device.driver.begin_drain()

    async def stop(self) -> None:
        self.begin_drain()
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
            self._poller = None
        if self.device.driver is not None:
            await self.device.driver.drain(self.options.drain_timeout_s)
        await self.residency.keep_awake()
        if self.device.executor is not None:
            await asyncio.to_thread(self.device.executor.shutdown)
        for m in list(self.models.values()):
            m.runtime.close()
        self.device.close()


class WorkerServing:
    """The worker with its fronts, as ``httpio.serving`` runs it (module docstring): the HTTP
    front answers the server's requests; the gRPC front (``grpc_port``, 0: any free port, on
    ``grpc_host``) is its sibling; ``recorder`` is the request log both write through the
    data plane."""

    def __init__(
        self,
        worker: Worker,
        *,
        grpc_host: str = "127.0.0.1",
        grpc_port: int | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        self.worker = worker
        self.http = worker.http
        self.limits = self.http.limits
        self.refused = self.http.refused
        self.grpc_host = grpc_host
        self.grpc_port = grpc_port
        self.grpc: GrpcServer | None = None
        self.recorder = recorder
        worker.plane.recorder = recorder
        if recorder is not None:
            worker.metrics.count_record_drops(lambda: recorder.dropped)

    def __call__(self, request: Request) -> Coroutine[Any, Any, Response]:
        return self.http(request)

    async def startup(self) -> None:
        if self.recorder is not None:
            self.recorder.start()
        if self.grpc_port is not None:
            from evenserve.worker.grpc_api import GrpcServer

            # Not ready (UNAVAILABLE) until the worker has started below.
            self.grpc = GrpcServer(self.worker.plane, self.grpc_host, self.grpc_port)
            await self.grpc.start()
        try:
            await self.worker.start()
        except BaseException:
            if self.grpc is not None:
                await self.grpc.stop(0)
            raise

    def begin_drain(self) -> None:
        self.worker.begin_drain()

    async def shutdown(self) -> None:
        # The gRPC front stops taking calls and answers its open ones while the queues drain.
        grpc_stop = None
        if self.grpc is not None:
            grace = self.worker.options.drain_timeout_s + 5
            grpc_stop = asyncio.ensure_future(self.grpc.stop(grace))
        try:
            await self.worker.stop()
        finally:
            if grpc_stop is not None:
                await grpc_stop
            if self.recorder is not None:
                self.recorder.stop()
            self.http.close()
