"""The gateway's ModelInfer: translated to HTTP over the dispatcher's fast path, or relayed
to the backends that take gRPC as bytes (``grpc_front`` has the whole of it).

A request is admitted with its class and deadline (the metadata, the call's own deadline)
as the HTTP request's headers, so the router sees them whichever way it goes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from functools import partial
from typing import Any

import grpc

from evenserve.core import wire
from evenserve.gateway import grpc_answer
from evenserve.gateway import grpc_codec as codec
from evenserve.gateway.answers import Answer, GrpcReply
from evenserve.gateway.grpc_channels import GrpcChannels
from evenserve.gateway.grpc_status import (
    S,
    answer_headers,
    backend_failure,
    bad_answer,
    code_of,
    forward_metadata,
    grpc_reply,
    http_headers,
    no_version,
    trailing_of,
)
from evenserve.gateway.grpc_wire import model_name_of


class GrpcInference(GrpcChannels):
    """ModelInfer over the kept channels and the dispatcher."""

    async def ModelInfer(self, raw: bytes, context: Any) -> Any:
        """Translated to HTTP and sent over the dispatcher's fast path; relayed as bytes when
        a host of the model is relayed to over gRPC (``_infer_relayed``)."""
        relays = self.relays
        if relays:
            try:
                model = model_name_of(raw)
            except ValueError as exc:
                await context.abort(S.INVALID_ARGUMENT, str(exc))
            hosts = self.registry.hosts_of(model)
            if any(n in relays for n in hosts):  # (grpcio's channel sends bytes only)
                return await self._infer_relayed(bytes(raw), model, hosts, context)
        try:
            req, raws = codec.parse_request(raw)
        except codec.CodecError as exc:
            await context.abort(S.INVALID_ARGUMENT, str(exc))
        model = req.model_name
        if not self.registry.hosts_model(model):  # the dispatcher's NOT_FOUND, counted so
            return await self._answer(await self._dispatch(model, "", b"", {}), True, context)
        http = await self._translate(req, raws, context)
        meta = dict(context.invocation_metadata() or ())
        try:
            headers = http_headers(meta, context.time_remaining(), http.header_length)
        except ValueError as exc:
            await self._refuse(model, context, S.INVALID_ARGUMENT, str(exc))
        ans = await self._dispatch(model, http.path, http.body, headers)
        return await self._answer(ans, http.raw_outputs, context)

    async def _refuse(self, model: str, context: Any, code: Any, message: str) -> None:
        """A request the gateway refuses itself before any backend sees it (counted as the
        client's error, as the HTTP server's refusals are)."""
        self.dispatcher.metrics.observe_request(None, model, "client_error", None)
        await context.abort(code, message)

    async def _translate(self, req: Any, raws: codec.Raws, context: Any) -> codec.HttpInfer:
        """``req`` as its HTTP request (``grpc_codec.to_http``), or the call refused:
        INVALID_ARGUMENT naming the field, NOT_FOUND a version no HTTP route can name."""
        version = req.model_version
        if version and not wire.is_safe_name(version):
            model = req.model_name
            await self._refuse(model, context, S.NOT_FOUND, no_version(model, version))
        try:
            return codec.to_http(req, raws)
        except codec.CodecError as exc:
            await self._refuse(req.model_name, context, S.INVALID_ARGUMENT, str(exc))
            raise  # not reached: abort raises

    async def _dispatch(
        self, model: str, path: str, body: bytes, headers: Mapping[str, str]
    ) -> Answer:
        """The dispatcher's answer to the HTTP request: over its fast path (a callback, no
        task) when it has one. A call cancelled meanwhile (the client's deadline, a
        cancel) leaves the request to finish and its answer unread."""
        d = self.dispatcher
        if not d.fast:
            return await d.infer(model, path, body, headers)
        fut: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        d.infer_fast(model, path, body, headers, partial(_resolve, fut))
        return await fut

    async def _answer(self, ans: Answer, raw_outputs: bool, context: Any) -> Any:
        """An HTTP answer as the gRPC answer: a 200 translated (``grpc_codec.to_grpc``), a
        refusal as its gRPC status and message; the trailing metadata (``trailing_of``)."""
        headers = answer_headers(ans)
        trailing = trailing_of(headers.get, ans.backend)
        body = ans.body if ans.raw is None else memoryview(ans.raw)[ans.raw_head :]
        if ans.status == 200:
            try:
                out = grpc_answer.to_grpc(body, headers.get(codec.HEADER_LENGTH), raw_outputs)
            except codec.CodecError as exc:
                code, message = S.INVALID_ARGUMENT, str(exc)
            except grpc_answer.BadAnswer as exc:
                code, message = S.INTERNAL, bad_answer(ans.backend, exc)
            else:
                context.set_trailing_metadata(tuple(trailing))
                return out
        else:
            code, message = code_of(ans.status), grpc_answer.error_message(body, ans.status)
        context.set_trailing_metadata(tuple(trailing))
        await context.abort(code, message)

    async def _infer_relayed(
        self, raw: bytes, model: str, hosts: tuple[str, ...], context: Any
    ) -> Any:
        """ModelInfer for a model some host of which is relayed to over gRPC: the request's
        bytes go as they came to those hosts (their ``grpc_url``; one without is not a
        candidate), translated to HTTP to the others; the dispatcher's ``infer_grpc`` tries
        them by the same rules."""
        registry = self.registry
        states = registry.states
        relays = self.relays
        without = [n for n in hosts if n in relays and states[n].spec.grpc_url is None]
        if hosts and len(without) == len(hosts):
            self.dispatcher.metrics.observe_request(None, model, "unavailable", None)
            await context.abort(S.UNAVAILABLE, f"no backend of model {model!r} serves gRPC")
        meta = dict(context.invocation_metadata() or ())
        http: codec.HttpInfer | None = None
        if any(n not in relays for n in hosts):
            try:
                req, raws = codec.parse_request(raw)
            except codec.CodecError as exc:
                await context.abort(S.INVALID_ARGUMENT, str(exc))
            http = await self._translate(req, raws, context)
            try:
                http_headers(meta, None, http.header_length)
            except ValueError as exc:
                await self._refuse(model, context, S.INVALID_ARGUMENT, str(exc))
        timeout_s = self.timeout_s
        forwarder = self.dispatcher.forwarder

        async def send(name: str) -> GrpcReply:
            # The deadline as it stands at this try (a retry has less time left).
            remaining = context.time_remaining()
            if name not in relays:
                assert http is not None
                headers = http_headers(meta, remaining, http.header_length)
                reply = await forwarder.request(
                    "POST", registry.url(name), http.path, http.body, headers
                )
                return grpc_reply(reply, http.raw_outputs, name)
            forward = forward_metadata(meta, remaining)
            try:
                response = await self._channel(name).infer(raw, timeout=timeout_s, metadata=forward)
            except grpc.aio.AioRpcError as exc:
                return backend_failure(exc)
            return GrpcReply(200, None, S.OK, response=response)

        ans = await self.dispatcher.infer_grpc(
            model, send, without, dict(forward_metadata(meta, context.time_remaining()))
        )
        return await self._relay(ans, context)

    @staticmethod
    async def _relay(ans: Answer, context: Any) -> Any:
        got = ans.grpc
        trailing: list[tuple[str, str]] = []
        if got is not None:
            trailing += [(k, v) for k, v in got.trailing if k != wire.BACKEND_HEADER]
        else:
            trailing += trailing_of(answer_headers(ans).get, None)
        if ans.backend is not None:
            trailing.append((wire.BACKEND_HEADER, ans.backend))
        context.set_trailing_metadata(tuple(trailing))
        if got is not None:
            if got.code == S.OK:
                return got.response
            await context.abort(got.code, got.message)
        await context.abort(code_of(ans.status), grpc_answer.error_message(ans.body, ans.status))


def _resolve(fut: asyncio.Future[Answer], ans: Answer) -> None:
    """The dispatcher's answer callback: the awaiting call's result (unless it is gone)."""
    if not fut.done():
        fut.set_result(ans)
