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

import math
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
from google.protobuf import json_format
from tritonclient.grpc import service_pb2

from evenserve import __version__ as evenserve_version
from evenserve.core import wire
from evenserve.core.errors import ConfigError
from evenserve.httpio.grpc_service import SERVED_RPCS, Handler, add_service
from evenserve.runtime.base import Array
from evenserve.worker.dataplane import Answer, DataPlane, NotServedError
from evenserve.worker.grpc_codec import encode_grpc_response, parse_grpc_request
from evenserve.worker.kserve import (
    InferRequest,
    ModelSignature,
    ProtocolError,
)
from evenserve.worker.load_override import config_override
from evenserve.worker.models.control import ModelControlError

EXTENSIONS = ["statistics", "model_configuration", "model_repository", "evenserve_load"]
#: The gRPC status of each model control error's HTTP status.
CONTROL_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    503: grpc.StatusCode.UNAVAILABLE,
    500: grpc.StatusCode.INTERNAL,
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


class _InferCodec:
    """The protobuf codec of one ``ModelInfer`` call (``dataplane``)."""

    __slots__ = ("context", "raw", "request")
    transport = "grpc"

    def __init__(self, request: Any, context: Any) -> None:
        self.request = request
        self.context = context
        #: Answer with raw output contents (the request says, once decoded).
        self.raw = True

    def headers(self) -> Mapping[str, str]:
        return {k.lower(): v for k, v in self.context.invocation_metadata() or ()}

    async def decode(self, sig: ModelSignature) -> InferRequest:
        req, self.raw = parse_grpc_request(self.request, sig)
        return req

    async def encode(
        self, sig: ModelSignature, req: InferRequest, outputs: Mapping[str, Array]
    ) -> Any:
        return encode_grpc_response(sig, req.id, outputs, req.outputs, self.raw)


def _failure(answer: Answer[Any]) -> GrpcError:
    """A failed answer: its status code (``core.wire``'s outcome table) and metadata."""
    meta: list[tuple[str, str]] = []
    if answer.reason is not None:
        meta.append((wire.REASON_HEADER, answer.reason))
    if answer.retry_after_s is not None:
        meta.append(("retry-after", str(max(1, math.ceil(answer.retry_after_s)))))
    if answer.load_wait_s is not None:
        meta.append((wire.LOAD_WAIT_HEADER, _ms(answer.load_wait_s)))
    return GrpcError(grpc.StatusCode[answer.outcome.grpc_code], answer.message, meta)


class InferenceServicer:
    """Triton's GRPCInferenceService over the worker's data plane."""

    #: The RPCs served; every other answers UNIMPLEMENTED (``httpio.grpc_service``).
    RPCS = SERVED_RPCS

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane

    def rpcs(self) -> dict[str, Handler]:
        """Each served RPC's coroutine, by name."""
        return {name: getattr(self, name) for name in self.RPCS}

    @staticmethod
    async def _abort(context: Any, err: GrpcError) -> None:
        if err.metadata:
            context.set_trailing_metadata(err.metadata)
        await context.abort(err.code, err.message)

    @staticmethod
    async def _not_served(context: Any, exc: NotServedError) -> None:
        await context.abort(grpc.StatusCode[exc.outcome.grpc_code], str(exc))

    # -- health and metadata -------------------------------------------------------------------
    async def ServerLive(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerReadyResponse(ready=self.plane.ready)

    async def ModelReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ModelReadyResponse(
            ready=self.plane.model_ready(request.name, request.version)
        )

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerMetadataResponse(
            name="evenserve", version=evenserve_version, extensions=EXTENSIONS
        )

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        try:
            metadata = self.plane.model_metadata(request.name, request.version)
        except NotServedError as exc:
            await self._not_served(context, exc)
        return json_format.ParseDict(
            metadata, service_pb2.ModelMetadataResponse(), ignore_unknown_fields=True
        )

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        try:
            config_json = self.plane.model_config(request.name, request.version)
        except NotServedError as exc:
            await self._not_served(context, exc)
        config = json_format.ParseDict(
            config_json, service_pb2.model__config__pb2.ModelConfig(), ignore_unknown_fields=True
        )
        return service_pb2.ModelConfigResponse(config=config)

    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        try:
            stats = self.plane.statistics(request.name, request.version)
        except NotServedError as exc:
            await self._not_served(context, exc)
        return json_format.ParseDict(
            stats, service_pb2.ModelStatisticsResponse(), ignore_unknown_fields=True
        )

    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        resp = service_pb2.RepositoryIndexResponse()
        for m in self.plane.repository_index(bool(request.ready)):
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
            await self.plane.control.request_load(request.model_name, override)
        except ProtocolError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except ModelControlError as exc:
            await context.abort(CONTROL_CODES.get(exc.status, grpc.StatusCode.INTERNAL), str(exc))
        return service_pb2.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        try:
            await self.plane.control.request_unload(request.model_name)
        except ModelControlError as exc:
            await context.abort(CONTROL_CODES.get(exc.status, grpc.StatusCode.INTERNAL), str(exc))
        return service_pb2.RepositoryModelUnloadResponse()

    # -- inference -----------------------------------------------------------------------------
    async def ModelInfer(self, request: Any, context: Any) -> Any:
        answer = await self.plane.infer(
            request.model_name, request.model_version, _InferCodec(request, context)
        )
        if answer.body is None:
            await self._abort(context, _failure(answer))
        if answer.load_wait_s is not None:
            context.set_trailing_metadata([(wire.LOAD_WAIT_HEADER, _ms(answer.load_wait_s))])
        return answer.body


class GrpcServer:
    """grpcio's asyncio server with the servicer, on the running loop."""

    def __init__(self, plane: DataPlane, host: str, port: int) -> None:
        self.host = host
        self.requested_port = port
        self.port = 0
        limit = plane.device.options.max_body_bytes
        self.server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 0),
            ]
        )
        add_service(self.server, InferenceServicer(plane).rpcs())

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
