"""The worker's data plane: what an inference, metadata, config, statistics, index or load
report request means, whatever the transport that carried it.

The HTTP and gRPC fronts (``http_api``, ``grpc_api``) only decode and encode: each hands a
request to :class:`DataPlane` with an :class:`InferCodec` of its own and turns the one
:class:`Answer` it gets back into its transport's answer (status and headers, or status code
and trailing metadata) through ``core.wire``'s outcome table. This module imports neither
``grpc`` nor ``evenserve.httpio`` (an import contract holds it so).

Theory of operation of ``infer``: find the model (a model being loaded is waited for, at most
``--load-wait-ms``); the ready check; the codec decodes the request for the model's signature;
the request's class and deadline (its parameters, else the ``x-evenserve-*`` headers or
metadata); the model's refusal check and the submit to the driver, with no await between
them; await the outputs; the codec encodes them. Every step that fails makes the answer's
outcome (``wire.Outcome``), and the request is counted (metrics, the model's statistics) and
written to the request log once, here, with the transport that carried it. A request that
never reached a model (no such model or version, a load waited for in vain) is counted in
the metrics only and not logged, as before the fronts shared this flow.

Streaming. :class:`Answer` is generic in its ``body``, which is whatever the front's codec
encodes (HTTP: bytes and headers; gRPC: a ``ModelInferResponse``). A front that streams (an
OpenAI-compatible one) gives a codec whose ``encode`` returns an async iterator of chunks, so
its answer's ``body`` is that iterator and the flow above is unchanged. What moves is the one
place an answer is counted and logged (the end of ``infer``: ``count_infer`` and
``_record``): for a streamed body it is taken when the iterator ends (or fails, or its client
goes away), by wrapping the iterator there; it is written once, so the stream needs no flow
of its own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from evenserve.core import wire
from evenserve.core.llm import GIB
from evenserve.core.load import LlmLoad, LoadReport
from evenserve.core.requestlog import Recorder
from evenserve.metrics.names import UNKNOWN_MODEL_LABEL
from evenserve.runtime.base import Array
from evenserve.sched.engine import Engine
from evenserve.worker.device import Device
from evenserve.worker.kserve import InferRequest, ModelSignature, ProtocolError, request_class
from evenserve.worker.llm.generation import GenerationDriver
from evenserve.worker.models.control import ModelControl
from evenserve.worker.models.describe import model_config_json, model_metadata_json
from evenserve.worker.models.loadwait import LoadWaitError
from evenserve.worker.models.registry import LOADING, HostedModel, ModelRegistry
from evenserve.worker.refusals import BatchFailedError, DrainingError, RefusedError
from evenserve.worker.telemetry import Telemetry

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class InferCodec(Protocol[T_co]):
    """A front's codec for one inference request."""

    #: What carried it (``http``, ``grpc``): the request log's ``transport``.
    transport: str

    def headers(self) -> Mapping[str, str]:
        """The request's headers (gRPC: its invocation metadata), names in lower case."""
        ...

    def decode(self, sig: ModelSignature) -> Awaitable[InferRequest]:
        """The request validated for the model; ProtocolError (with its HTTP status)."""
        ...

    def encode(
        self, sig: ModelSignature, request: InferRequest, outputs: Mapping[str, Array]
    ) -> Awaitable[T_co]:
        """The answer's body; ProtocolError when the outputs cannot be given as asked."""
        ...


@dataclass(slots=True)
class Answer(Generic[T]):
    """One request's one answer: its outcome (``wire.Outcome``: the HTTP status, the gRPC
    code, the metrics label), the encoded body when it succeeded, else the error message and
    a refusal's reason and retry hint."""

    outcome: wire.Outcome
    body: T | None = None
    message: str = ""
    #: A refusal's reason (``wire.REFUSAL_REASONS``): the ``x-evenserve-reason`` header.
    reason: str | None = None
    retry_after_s: float | None = None
    #: Seconds it waited for its model's load (None: it did not).
    load_wait_s: float | None = None
    #: Arrival to its batch's start and the batch's compute time (answered requests).
    queue_s: float | None = None
    compute_s: float | None = None


class NotServedError(Exception):
    """A model or version not served here (404) or being loaded (503)."""

    def __init__(self, outcome: wire.Outcome, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome


class DataPlane:
    """What the worker's fronts ask of it, transport-free."""

    def __init__(
        self,
        models: ModelRegistry,
        control: ModelControl,
        device: Device,
        telemetry: Telemetry,
    ) -> None:
        self.models = models
        self.control = control
        self.device = device
        self.telemetry = telemetry
        self.metrics = telemetry.metrics
        #: The request log (``--record``; None: off).
        self.recorder: Recorder | None = None
        #: The LLM models served here (over the OpenAI API, not KServe v2).
        self.llm_names: frozenset[str] = frozenset()

    # -- models ------------------------------------------------------------------------------
    def model(self, name: str, version: str | None) -> HostedModel:
        """The model served as ``name`` (``version``: None or "" any); NotServedError."""
        hosted = self.models.get(name)
        if hosted is None:
            if self.models.state(name).state == LOADING:  # soon served: retry
                raise NotServedError(wire.UNAVAILABLE, f"model {name!r} is loading")
            if name in self.llm_names:
                raise NotServedError(
                    wire.MODEL_NOT_FOUND,
                    f"model {name!r} is an LLM: it is served over the OpenAI API "
                    "(/v1/completions, /v1/chat/completions), not KServe v2",
                )
            raise NotServedError(
                wire.MODEL_NOT_FOUND,
                f"model {wire.shown_name(name)} is not served here "
                f"(models: {', '.join(self.models)})",
            )
        if version not in (None, "", hosted.signature.version):
            raise NotServedError(
                wire.MODEL_NOT_FOUND,
                f"model {name!r} has no version {wire.shown_name(version or '')} "
                f"(versions: {hosted.signature.version})",
            )
        return hosted

    def model_metadata(self, name: str, version: str | None) -> dict[str, Any]:
        return model_metadata_json(self.model(name, version))

    def model_config(self, name: str, version: str | None) -> dict[str, Any]:
        return model_config_json(
            self.model(name, version), self.device.target, self.device.options.run.instances
        )

    def statistics(self, name: str | None = None, version: str | None = None) -> dict[str, Any]:
        """Triton's statistics of one model (``name``), or of every model served."""
        chosen = self.models.values() if not name else [self.model(name, version)]
        return {"model_stats": [m.stats.json() for m in chosen]}

    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        return self.control.repository_index(ready_only)

    @property
    def ready(self) -> bool:
        return self.models.ready

    def model_ready(self, name: str, version: str | None = None) -> bool:
        hosted = self.models.get(name)
        known = hosted is not None and version in (None, "", hosted.signature.version)
        return known and self.models.model_ready(name)

    # -- inference ---------------------------------------------------------------------------
    async def infer(self, name: str, version: str | None, codec: InferCodec[T]) -> Answer[T]:
        """One inference request for model ``name`` (module docstring)."""
        t0 = time.perf_counter()
        waited_s: float | None = None
        if name not in self.models and self.models.state(name).state == LOADING:
            try:
                waited_s = await self.control.loads.wait(name)
            except LoadWaitError as exc:
                self.metrics.observe_request(name, wire.UNAVAILABLE.label, None)
                return Answer(
                    wire.UNAVAILABLE,
                    message=str(exc),
                    retry_after_s=exc.retry_after_s,
                    load_wait_s=exc.waited_s,
                )
        try:
            hosted = self.model(name, version)
        except NotServedError as exc:
            model = name if exc.outcome is wire.UNAVAILABLE else UNKNOWN_MODEL_LABEL
            self.metrics.observe_request(model, exc.outcome.label, None)
            return Answer(exc.outcome, message=str(exc), load_wait_s=waited_s)
        if waited_s is None:
            t0 = time.perf_counter()
        rec = self.recorder
        rec_at = (rec.clock.now(), rec.wall()) if rec is not None else None
        try:
            answer, request = await self._infer(hosted.signature, codec)
        except asyncio.CancelledError:
            self.telemetry.count_infer(name, "cancelled", time.perf_counter() - t0)
            raise
        except BaseException:  # a bug: counted as an error, not logged
            self.telemetry.count_infer(name, wire.FAILED.label, time.perf_counter() - t0)
            raise
        answer.load_wait_s = waited_s
        self.telemetry.count_infer(name, answer.outcome.label, time.perf_counter() - t0)
        if rec is not None and rec_at is not None:
            self._record(rec, rec_at, name, request, answer, codec.transport)
        return answer

    @staticmethod
    def _record(
        rec: Recorder,
        at: tuple[float, float],
        name: str,
        request: InferRequest | None,
        answer: Answer[Any],
        transport: str,
    ) -> None:
        """The request's line in the request log (``core.requestlog``)."""
        deadline_s = None if request is None else request.deadline_in_s
        rec.add(
            at[0],
            at[1],
            name,
            None if request is None else request.priority,
            None if deadline_s is None else deadline_s * 1000.0,
            None,
            answer.outcome.http_status,
            None if answer.queue_s is None else answer.queue_s * 1000.0,
            None if answer.compute_s is None else answer.compute_s * 1000.0,
            transport,
        )

    async def _infer(
        self, sig: ModelSignature, codec: InferCodec[T]
    ) -> tuple[Answer[T], InferRequest | None]:
        """The answer, and the request as decoded (its class and deadline), if it was."""
        models = self.models
        if models.draining or not models.ready:
            return Answer(
                wire.UNAVAILABLE, message="the worker is not ready (loading or shutting down)"
            ), None
        try:
            req = await codec.decode(sig)
            req.priority, req.deadline_in_s = request_class(req, codec.headers())
        except ProtocolError as exc:
            return Answer(
                wire.PROTOCOL_OUTCOMES.get(exc.status, wire.BAD_REQUEST), message=str(exc)
            ), None
        refusal = models.refusal(sig.name)  # no await from here to the submit
        if refusal is not None:
            return Answer(wire.UNAVAILABLE, message=refusal), req
        driver = self.device.driver
        assert driver is not None
        try:  # refused or draining at once, or while it waited; or its batch failed
            pending = driver.submit(
                sig.name,
                req.inputs,
                items=req.items,
                priority=req.priority,
                deadline_in_s=req.deadline_in_s,
            )
            assert pending.future is not None
            outputs = await pending.future
        except RefusedError as exc:
            return Answer(
                wire.REFUSAL_OUTCOMES[exc.reason],
                message=str(exc),
                reason=exc.reason,
                retry_after_s=exc.retry_after_s,
            ), req
        except DrainingError as exc:
            return Answer(wire.UNAVAILABLE, message=str(exc)), req
        except BatchFailedError as exc:
            return Answer(wire.FAILED, message=f"inference failed: {exc}"), req
        try:
            body = await codec.encode(sig, req, outputs)
        except ProtocolError as exc:
            return Answer(wire.BAD_REQUEST, message=str(exc)), req
        return Answer(
            wire.ANSWERED, body, queue_s=pending.queue_s, compute_s=pending.compute_s
        ), req

    # -- the load report ---------------------------------------------------------------------
    def load_report(self) -> LoadReport:
        """The load report; its per-model figures list only READY models (the ones a router
        may send work to: not those loading or unloading). The device's totals count all."""
        driver = self.device.driver
        if driver is None:
            raise RuntimeError("worker not started")
        with driver.lock:
            return self._load_report()

    def _load_report(self) -> LoadReport:
        d = self.device.driver
        assert d is not None
        now = d.clock.now()
        used, total = self.device.memory_bytes()
        routable = self.models.ready_names()

        def ready_only(by_model: Mapping[str, Any]) -> dict[str, Any]:
            return {m: v for m, v in by_model.items() if m in routable}

        scale, observed = d.sched.learned()
        states = self.models.states
        return LoadReport(
            timestamp_s=time.time(),
            device=self.device.name,
            device_kind=self.device.target.kind,
            device_slice=self.device.target.slice_label,
            queue_depth=d.sched.waiting,
            in_flight=d.sched.in_flight,
            queued_by_model=ready_only(d.sched.queued_by_model()),
            in_flight_by_model=ready_only(d.sched.in_flight_by_model()),
            utilization=d.sched.busy.fraction(now),
            utilization_window_s=self.device.options.utilization_window_s,
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
            llm_by_model={n: llm_load(h.engine) for n, h in d.sched.engines.items()},
            engine_utilization=(
                round(d.engine_utilization(now), 6)
                if isinstance(d, GenerationDriver) and d.hosts_llms
                else None
            ),
            loading_models=sorted(n for n, st in states.items() if st.state == LOADING),
            models_version=states.version,
            ready=self.models.ready,
        )


def llm_load(e: Engine[Any]) -> LlmLoad:
    """An engine's figures for the load report."""
    p = e.profile
    return LlmLoad(
        running=e.num_running,
        waiting=e.num_waiting,
        queued_prompt_tokens=e.queued_prompt_tokens,
        kv_usage=round(e.kv.usage(), 6),
        kv_blocks=e.kv.num_blocks,
        block_tokens=e.kv.block_tokens,
        max_num_seqs=e.setup.max_num_seqs,
        max_num_batched_tokens=e.setup.max_num_batched_tokens,
        preemptions=e.counters.preemptions,
        step_profile={
            "c0_ms": p.c0_s * 1e3,
            "prefill_us_per_token": p.prefill_s_per_token * 1e6,
            "decode_us_per_seq": p.decode_s_per_seq * 1e6,
            "kv_us_per_token": p.kv_s_per_token * 1e6,
            "cpu_ms_per_output_token": p.cpu_s_per_output_token * 1e3,
            "weights_gib": p.weights_bytes / GIB,
            "kv_bytes_per_token": p.kv_bytes_per_token,
            "device_memory_gib": p.device_memory_bytes / GIB,
            "memory_utilization": p.memory_utilization,
            "block_tokens": p.block_tokens,
            "max_model_len": p.max_model_len,
            "model": p.model,
            "device": p.device,
            "runtime": p.runtime,
            "precision": p.precision,
            "source": p.source,
        },
    )
