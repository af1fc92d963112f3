"""The worker's KServe v2 gRPC API (Triton's ``inference.GRPCInferenceService``).

The protocol's messages and service come from tritonclient's generated modules (the
``grpc`` extra: ``pip install 'evenserve[grpc]'``); the server is grpcio's asyncio server on
the same event loop as the HTTP server, so an inference request goes to the very driver,
queues and refusals an HTTP one does, and is counted in the same metrics and statistics.

Served: ServerLive, ServerReady, ModelReady (false for a model not served here or not
READY), ServerMetadata, ModelMetadata, ModelConfig, ModelStatistics, RepositoryIndex (every
model folder with its state), RepositoryModelLoad (``parameters["config"].string_param``: a
JSON object of model.yaml fields overriding the file's), RepositoryModelUnload, ModelInfer.
Every other RPC (streaming, shared memory, trace, log settings) answers UNIMPLEMENTED,
naming it, with nothing logged (``httpio.grpc_service``). A model name or version the worker
does not serve is cut in the error message (``wire.shown_name``): gRPC names are unbounded,
and a message longer than the client's metadata limit would reach it as RESOURCE_EXHAUSTED.
Model control answers as HTTP does: INVALID_ARGUMENT a bad config or request, or model
control disabled; NOT_FOUND no such model folder; UNAVAILABLE shutting down; INTERNAL the
load failed.

ModelInfer takes each input either as typed ``contents`` (the field of its datatype:
``fp32_contents`` for FP32, ``int_contents`` for INT8/16/32 ...; FP16 only raw) or, for
every input at once, as ``raw_input_contents`` (row-major, little-endian, as tritonclient's
``set_data_from_numpy`` sends them). Outputs are answered as ``raw_output_contents``, as
Triton does; with the request parameter ``binary_data_output: false`` (or every requested
output's ``binary_data: false``) they come as typed ``contents`` instead. The parameters
``priority``, ``deadline_ms`` and ``timeout`` and the metadata ``x-evenserve-priority`` and
``x-evenserve-deadline-ms`` mean what they mean over HTTP.

Status codes: NOT_FOUND unknown model or version; INVALID_ARGUMENT a missing, unexpected,
mistyped or misshapen input, or a bad parameter (the message names it); RESOURCE_EXHAUSTED
a message over the body limit (grpcio refuses it before the handler sees it, so it is not
counted in the metrics), the queue is full (``queue-full``) or the request was shed
(``shed``); DEADLINE_EXCEEDED ``deadline-infeasible`` or ``deadline-expired``; UNAVAILABLE
not ready or shutting down; INTERNAL the runtime failed. A refusal's reason is the first word
of the message and the trailing metadata ``x-evenserve-reason`` (with ``retry-after`` in
seconds where a retry may cure it). An inference request for a model being loaded waits for
the load as over HTTP (at most ``--load-wait-ms``; UNAVAILABLE with ``retry-after`` past it,
UNAVAILABLE with the load's error if it fails); the trailing metadata
``x-evenserve-load-wait-ms`` says how long it waited.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import service_pb2

from evenserve import __version__ as evenserve_version
from evenserve.core import wire
from evenserve.core.errors import ConfigError
from evenserve.core.tensors import CONTENTS_FIELD, DATATYPES, contents_error
from evenserve.httpio.grpc_service import SERVED_RPCS, Handler, add_service
from evenserve.metrics.names import UNKNOWN_MODEL_LABEL
from evenserve.runtime.base import Array
from evenserve.worker.driver import BatchFailedError, DrainingError, RefusedError
from evenserve.worker.kserve import (
    InferRequest,
    ModelSignature,
    ProtocolError,
    RequestedOutput,
    check_shape,
    class_parameters,
    input_spec,
    request_class,
)
from evenserve.worker.load_override import config_override
from evenserve.worker.service import LOADING, LoadWaitError, ModelControlError, WorkerService

EXTENSIONS = ["statistics", "model_configuration", "model_repository", "evenserve_load"]
#: The gRPC status of each model control error's HTTP status.
CONTROL_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    503: grpc.StatusCode.UNAVAILABLE,
    500: grpc.StatusCode.INTERNAL,
}
#: The gRPC status of each refusal.
REFUSAL_CODES = {
    wire.QUEUE_FULL: grpc.StatusCode.RESOURCE_EXHAUSTED,
    wire.SHED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    wire.DEADLINE_INFEASIBLE: grpc.StatusCode.DEADLINE_EXCEEDED,
    wire.DEADLINE_EXPIRED: grpc.StatusCode.DEADLINE_EXCEEDED,
    wire.LOAD_TIMEOUT: grpc.StatusCode.UNAVAILABLE,
}
REFUSAL_OUTCOMES = {
    wire.QUEUE_FULL: "rejected_queue_full",
    wire.SHED: "shed",
    wire.DEADLINE_INFEASIBLE: "deadline_infeasible",
    wire.DEADLINE_EXPIRED: "deadline_expired",
    wire.LOAD_TIMEOUT: "unavailable",
}


def _ms(seconds: float) -> str:
    return f"{seconds * 1000.0:.3f}"


class GrpcError(Exception):
    """An RPC's error answer: status code, message, trailing metadata."""

    def __init__(self, code: Any, message: str, metadata: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.metadata = tuple(metadata)


def _parameter(p: Any) -> Any:
    """An ``InferParameter``'s value (None when unset)."""
    which = p.WhichOneof("parameter_choice")
    return None if which is None else getattr(p, which)


def _parameters(params: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _parameter(v) for k, v in params.items()}


def _typed_array(name: str, dt: str, contents: Any, shape: list[int]) -> Array:
    """An input's typed contents as an array of ``shape``; ProtocolError naming it."""
    field = CONTENTS_FIELD.get(dt)
    if field is None:
        raise ProtocolError(f"input {name!r}: {dt} has no typed contents; use raw_input_contents")
    why = contents_error(contents, field, dt, shape)
    if why is not None:
        raise ProtocolError(f"input {name!r}: {why}")
    values = getattr(contents, field)
    want = DATATYPES[dt]
    if want.kind in "iu" and want.itemsize < 4:
        raw = np.array(values, dtype=np.int64)
        info = np.iinfo(want)
        if raw.size and (int(raw.min()) < info.min or int(raw.max()) > info.max):
            raise ProtocolError(f"input {name!r}: a value is out of range for {dt}")
        return raw.astype(want).reshape(shape)
    return np.array(values, dtype=want).reshape(shape)


def parse_grpc_request(
    req: Any, sig: ModelSignature, metadata: Mapping[str, str]
) -> tuple[InferRequest, bool]:
    """A ``ModelInferRequest`` validated for model ``sig`` as the HTTP path validates a JSON
    one, and whether to answer with raw contents; ProtocolError naming the field otherwise."""
    params = _parameters(req.parameters)
    if params.get("sequence_id") not in (None, 0, ""):
        raise ProtocolError("parameters.sequence_id: sequence batching is not supported")
    if not req.inputs:
        raise ProtocolError("inputs: required, a non-empty list")
    raw = list(req.raw_input_contents)
    if raw and len(raw) != len(req.inputs):
        raise ProtocolError(
            f"raw_input_contents: {len(raw)} given for {len(req.inputs)} inputs "
            "(raw contents are given for every input or for none)"
        )
    specs = {s.name: s for s in sig.inputs}
    arrays: dict[str, Array] = {}
    items: int | None = None
    for i, t in enumerate(req.inputs):
        name = t.name
        spec = input_spec(sig, specs, name, arrays)
        if t.datatype != spec.datatype:
            raise ProtocolError(
                f"input {name!r}: datatype {wire.shown(t.datatype)}, model {sig.name!r} expects "
                f"{spec.datatype}"
            )
        shape = check_shape(name, spec, list(t.shape), sig.max_batch_size)
        if items is None:
            items = shape[0]
        elif shape[0] != items:
            raise ProtocolError(
                f"input {name!r}: batch dimension {shape[0]} differs from the other inputs' {items}"
            )
        if raw:
            if t.HasField("contents"):
                raise ProtocolError(f"input {name!r}: both contents and raw_input_contents given")
            expected = math.prod(shape) * spec.dtype.itemsize
            if len(raw[i]) != expected:
                raise ProtocolError(
                    f"input {name!r}: raw_input_contents[{i}] holds {len(raw[i])} bytes but "
                    f"shape {shape} of {spec.datatype} needs {expected}"
                )
            arr = np.frombuffer(raw[i], dtype=spec.dtype.newbyteorder("<"))
            arrays[name] = arr.astype(spec.dtype, copy=False).reshape(shape)
        else:
            arrays[name] = _typed_array(name, spec.datatype, t.contents, shape)
    missing = [s.name for s in sig.inputs if s.name not in arrays]
    if missing:
        raise ProtocolError(f"input {missing[0]!r}: missing (model {sig.name!r} needs it)")

    binary_default = params.get("binary_data_output", True)
    if not isinstance(binary_default, bool):
        raise ProtocolError("parameters.binary_data_output: must be a boolean")
    out_names = [o.name for o in sig.outputs]
    requested: list[RequestedOutput] = []
    for o in req.outputs:
        if o.name not in out_names:
            raise ProtocolError(
                f"output {wire.shown(o.name)}: unknown; model {sig.name!r} gives "
                f"{', '.join(repr(n) for n in out_names)}"
            )
        op = _parameters(o.parameters)
        if op.get("classification"):
            raise ProtocolError(f"output {o.name!r}: the classification extension is not supported")
        b = op.get("binary_data", binary_default)
        if not isinstance(b, bool):
            raise ProtocolError(f"output {o.name!r}: binary_data must be a boolean")
        requested.append(RequestedOutput(o.name, b))
    if not requested:
        requested = [RequestedOutput(n, binary_default) for n in out_names]
    kinds = {r.binary for r in requested}
    if len(kinds) > 1:
        raise ProtocolError(
            "outputs: raw_output_contents are used for every output or for none "
            "(binary_data differs between outputs)"
        )
    priority, deadline_in_s = class_parameters(params)
    assert items is not None
    parsed = InferRequest(
        id=req.id or None,
        inputs={s.name: arrays[s.name] for s in sig.inputs},
        items=items,
        outputs=requested,
        priority=priority,
        deadline_in_s=deadline_in_s,
        parameters=params,
    )
    return parsed, kinds == {True}


def encode_grpc_response(
    sig: ModelSignature,
    request_id: str | None,
    outputs: Mapping[str, Array],
    requested: Sequence[RequestedOutput],
    raw: bool,
) -> Any:
    """A ``ModelInferResponse``: raw output contents, or typed ones."""
    specs = {s.name: s for s in sig.outputs}
    resp = service_pb2.ModelInferResponse(
        model_name=sig.name, model_version=sig.version, id=request_id or ""
    )
    for r in requested:
        arr = np.ascontiguousarray(outputs[r.name])
        dt = specs[r.name].datatype
        out = resp.outputs.add(name=r.name, datatype=dt, shape=list(arr.shape))
        if raw:
            resp.raw_output_contents.append(
                arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
            )
        else:
            field = CONTENTS_FIELD.get(dt)
            if field is None:
                raise ProtocolError(
                    f"output {r.name!r}: {dt} has no typed contents; ask for raw contents"
                )
            getattr(out.contents, field).extend(arr.reshape(-1).tolist())
    return resp


class InferenceServicer:
    """Triton's GRPCInferenceService over a WorkerService."""

    #: The RPCs served; every other answers UNIMPLEMENTED (``httpio.grpc_service``).
    RPCS = SERVED_RPCS

    def __init__(self, service: WorkerService) -> None:
        self.service = service
        self.metrics = service.metrics

    def rpcs(self) -> dict[str, Handler]:
        """Each served RPC's coroutine, by name."""
        return {name: getattr(self, name) for name in self.RPCS}

    # -- helpers -------------------------------------------------------------------------------
    def _signature(self, name: str, version: str) -> ModelSignature:
        svc = self.service
        sig = svc.signatures.get(name)
        if sig is None and svc.model_state(name).state == LOADING:
            raise GrpcError(grpc.StatusCode.UNAVAILABLE, f"model {name!r} is loading")
        if sig is None:
            raise GrpcError(
                grpc.StatusCode.NOT_FOUND,
                f"model {wire.shown_name(name)} is not served here "
                f"(models: {', '.join(svc.signatures)})",
            )
        if version not in ("", sig.version):
            raise GrpcError(
                grpc.StatusCode.NOT_FOUND,
                f"model {name!r} has no version {wire.shown_name(version)} "
                f"(versions: {sig.version})",
            )
        return sig

    @staticmethod
    async def _abort(context: Any, err: GrpcError) -> None:
        if err.metadata:
            context.set_trailing_metadata(err.metadata)
        await context.abort(err.code, err.message)

    # -- health and metadata -------------------------------------------------------------------
    async def ServerLive(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerReadyResponse(ready=self.service.ready)

    async def ModelReady(self, request: Any, context: Any) -> Any:
        sig = self.service.signatures.get(request.name)
        known = sig is not None and request.version in ("", sig.version)
        return service_pb2.ModelReadyResponse(
            ready=known and self.service.model_ready(request.name)
        )

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerMetadataResponse(
            name="evenserve", version=evenserve_version, extensions=EXTENSIONS
        )

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        try:
            self._signature(request.name, request.version)
        except GrpcError as err:
            await self._abort(context, err)
        return json_format.ParseDict(
            self.service.model_metadata_json(request.name),
            service_pb2.ModelMetadataResponse(),
            ignore_unknown_fields=True,
        )

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        try:
            self._signature(request.name, request.version)
        except GrpcError as err:
            await self._abort(context, err)
        config = json_format.ParseDict(
            self.service.model_config_json(request.name),
            service_pb2.model__config__pb2.ModelConfig(),
            ignore_unknown_fields=True,
        )
        return service_pb2.ModelConfigResponse(config=config)

    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        stats = self.service.stats
        if request.name:
            try:
                self._signature(request.name, request.version)
            except GrpcError as err:
                await self._abort(context, err)
            chosen = [stats[request.name]]
        else:
            chosen = list(stats.values())
        return json_format.ParseDict(
            {"model_stats": [s.json() for s in chosen]},
            service_pb2.ModelStatisticsResponse(),
            ignore_unknown_fields=True,
        )

    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        resp = service_pb2.RepositoryIndexResponse()
        for m in self.service.repository_index(bool(request.ready)):
            resp.models.add(**m)
        return resp

    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        try:
            override = None
            params = dict(request.parameters)
            unknown = sorted(k for k in params if k != "config")
            if unknown:
                raise ProtocolError(
                    f"parameters[{wire.shown_name(unknown[0])}]: not supported (only "
                    "parameters['config']: model.yaml fields as JSON)"
                )
            if "config" in params:
                p = params["config"]
                if p.WhichOneof("parameter_choice") != "string_param":
                    raise ProtocolError("parameters['config']: expected string_param (JSON)")
                override = config_override(p.string_param, "parameters['config']")
            await self.service.request_load(request.model_name, override)
        except ProtocolError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except ModelControlError as exc:
            await context.abort(CONTROL_CODES.get(exc.status, grpc.StatusCode.INTERNAL), str(exc))
        return service_pb2.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        try:
            await self.service.request_unload(request.model_name)
        except ModelControlError as exc:
            await context.abort(CONTROL_CODES.get(exc.status, grpc.StatusCode.INTERNAL), str(exc))
        return service_pb2.RepositoryModelUnloadResponse()

    # -- inference -----------------------------------------------------------------------------
    async def ModelInfer(self, request: Any, context: Any) -> Any:
        name = request.model_name
        t0 = time.perf_counter()
        wait_meta: list[tuple[str, str]] = []
        if name not in self.service.signatures and self.service.model_state(name).state == (
            LOADING
        ):
            try:
                waited_s = await self.service.await_load(name)
            except LoadWaitError as exc:
                meta = [(wire.LOAD_WAIT_HEADER, _ms(exc.waited_s))]
                if exc.retry_after_s is not None:
                    meta.append(("retry-after", str(max(1, math.ceil(exc.retry_after_s)))))
                self.metrics.observe_request(name, "unavailable", None)
                await self._abort(context, GrpcError(grpc.StatusCode.UNAVAILABLE, str(exc), meta))
            wait_meta = [(wire.LOAD_WAIT_HEADER, _ms(waited_s))]
        try:
            sig = self._signature(name, request.model_version)
        except GrpcError as err:
            if err.code == grpc.StatusCode.UNAVAILABLE:  # loading
                self.metrics.observe_request(name, "unavailable", None)
            else:
                self.metrics.observe_request(UNKNOWN_MODEL_LABEL, "not_found", None)
            err.metadata = (*err.metadata, *wait_meta)
            await self._abort(context, err)
        if not wait_meta:
            t0 = time.perf_counter()
        outcome = "error"
        try:
            response, outcome = await self._infer(request, context, sig)
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            self.service.count_infer(name, outcome, time.perf_counter() - t0)
        if isinstance(response, GrpcError):
            response.metadata = (*response.metadata, *wait_meta)
            await self._abort(context, response)
        if wait_meta:
            context.set_trailing_metadata(wait_meta)
        return response

    async def _infer(self, request: Any, context: Any, sig: ModelSignature) -> tuple[Any, str]:
        service = self.service
        if service.draining or not service.ready:
            err = GrpcError(
                grpc.StatusCode.UNAVAILABLE, "the worker is not ready (loading or shutting down)"
            )
            return err, "unavailable"
        try:
            metadata = {k.lower(): v for k, v in context.invocation_metadata() or ()}
            req, raw = parse_grpc_request(request, sig, metadata)
            priority, deadline_in_s = request_class(req, metadata)
        except ProtocolError as exc:
            return GrpcError(grpc.StatusCode.INVALID_ARGUMENT, str(exc)), "bad_request"
        refusal = service.model_refusal(sig.name)  # no await from here to the submit
        if refusal is not None:
            return GrpcError(grpc.StatusCode.UNAVAILABLE, refusal), "unavailable"
        try:
            pending = service.driver.submit(
                sig.name,
                req.inputs,
                items=req.items,
                priority=priority,
                deadline_in_s=deadline_in_s,
            )
            assert pending.future is not None
            outputs = await pending.future
        except RefusedError as exc:
            meta = [(wire.REASON_HEADER, exc.reason)]
            if exc.retry_after_s is not None:
                meta.append(("retry-after", str(max(1, math.ceil(exc.retry_after_s)))))
            return GrpcError(REFUSAL_CODES[exc.reason], str(exc), meta), REFUSAL_OUTCOMES[
                exc.reason
            ]
        except DrainingError as exc:
            return GrpcError(grpc.StatusCode.UNAVAILABLE, str(exc)), "unavailable"
        except BatchFailedError as exc:
            return GrpcError(grpc.StatusCode.INTERNAL, f"inference failed: {exc}"), "error"
        try:
            resp = encode_grpc_response(sig, req.id, outputs, req.outputs, raw)
        except ProtocolError as exc:
            return GrpcError(grpc.StatusCode.INVALID_ARGUMENT, str(exc)), "bad_request"
        return resp, "success"


class GrpcServer:
    """grpcio's asyncio server with the servicer, on the running loop."""

    def __init__(self, service: WorkerService, host: str, port: int) -> None:
        self.service = service
        self.host = host
        self.requested_port = port
        self.port = 0
        limit = service.options.max_body_bytes
        self.server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 0),
            ]
        )
        add_service(self.server, InferenceServicer(service).rpcs())

    async def start(self) -> None:
        address = (
            f"[{self.host}]:{self.requested_port}"
            if ":" in self.host
            else (f"{self.host}:{self.requested_port}")
        )
        try:
            port = self.server.add_insecure_port(address)
        except RuntimeError as exc:
            raise ConfigError(f"--grpc-port: cannot bind {address}: {exc}") from None
        if not port:
            raise ConfigError(f"--grpc-port: cannot bind {address}")
        self.port = int(port)
        await self.server.start()

    async def stop(self, grace_s: float) -> None:
        """Stop taking RPCs; let the open ones finish for up to ``grace_s``."""
        await self.server.stop(grace_s)
