"""The gateway's OpenAI-compatible front: completions and chat completions routed to a backend
hosting the model, their answers relayed (a streamed one piece by piece), and the model list.

Theory of operation. ``POST /v1/completions`` and ``POST /v1/chat/completions`` are inference
requests of the model their JSON body names: the same front door as ``/v2/.../infer``
(``Dispatcher.admit``, ``pick``, ``done``, ``settle``, ``exhausted``, ``finish``), so the
class and deadline headers, the 404 of an unknown model, overload refusals, the placement
miss path and the retries of a backend's 503 or non-``shed`` 429 hold as they do for v2, and
each request is counted once in the gateway's request metrics. A try opens the request on
the backend's pooled client as a stream (``httpio.client.HttpClient.stream``) and judges its
head:

- a ``text/event-stream`` 2xx answer is relayed as it arrives (``httpio.server.
  StreamResponse``; nothing is buffered): the client gets each event when the backend sends
  it. The try stays in flight for the router until the stream ends. When the client goes
  away the server closes the relay, which closes the backend connection (the worker then
  cancels the sequence). A backend that fails mid-stream (connection lost, malformed, a
  piece overdue by ``forward.request_timeout_s``) cannot be answered with an error status
  any more: the relay sends one SSE event ``data: {"error": {...}}`` and ends the stream;
  counted ``backend_error``.
- any other answer is read whole and judged as v2's (a 503 or a 429 other than ``shed``: the
  next backend, the answer kept to relay if none is left); the answer is relayed as it came.
- a try without an answer is judged as v2's (``FrontDoor.failed``: retry, eject, 504).

An LLM model (one an LLM engine serves: an evenserve worker's engine, or a ``kind: openai``
server's model; ``gateway.llm_router``) is routed by the LLM router instead of the classic
router's pick (``relay_llm``): the same admission, miss path, tries, judging and counting,
but each try's backend is the LLM policy's choice (``gateway.llm_routing``) among the
healthy engines not tried yet, and the try is accounted to the router (``LlmTry``: sent,
first token, one end per try, however it ends). When the policy refuses (no engine can meet
the request's TTFT target: ``ttft-unreachable``) the answer is 429 with Retry-After (the
predicted excess, whole seconds rounded up, at least 1), counted in
``evenserve_gateway_llm_refusals_total``.

The gateway's own answers (400 for a body that is not JSON or names no model, 404 unknown
model, 429, 503, 504) come in OpenAI's error shape, ``{"error": {"message", "type", "param",
"code"}}``; an unknown model's is OpenAI's ``model_not_found``. ``GET /v1/models`` lists
every model some backend has, in OpenAI's list shape.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson

from evenserve.core import wire
from evenserve.core.llm import openai_error_body
from evenserve.gateway.answers import RELAY_RESPONSE_HEADERS, Answer, error_answer
from evenserve.gateway.backends import BackendRegistry
from evenserve.gateway.dispatcher import Dispatcher
from evenserve.gateway.forward import Forward
from evenserve.gateway.forwarder import PooledForwarder, Reply
from evenserve.gateway.llm_router import LlmGateway, LlmTry, retry_after_header
from evenserve.httpio.client import HttpClient, HttpClientError, StreamReply
from evenserve.httpio.server import JSON, Request, Response, StreamResponse

COMPLETIONS_PATH = "/v1/completions"
CHAT_COMPLETIONS_PATH = "/v1/chat/completions"
MODELS_PATH = "/v1/models"
EVENT_STREAM = "text/event-stream"

#: Request headers forwarded beside the dispatcher's (``forward.FORWARD_REQUEST_HEADERS``).
EXTRA_REQUEST_HEADERS = ("accept",)

Endpoint = Callable[[Request], Awaitable[Response]]


def openai_error(
    message: str, type_: str, code: str | int | None = None, param: str | None = None
) -> bytes:
    """OpenAI's error body."""
    return openai_error_body(message, type_, param, code)


def error_type(status: int) -> str:
    """OpenAI's error ``type`` for a status the gateway answers itself."""
    if status == 429:
        return "rate_limit_error"
    return "invalid_request_error" if status < 500 else "server_error"


def body_of(body: bytes) -> dict[str, Any] | Response:
    """The request's JSON object naming its ``model``, or the 400 that says why not."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return _bad(f"the request body is not JSON: {exc}", None)
    if not isinstance(obj, dict):
        return _bad("the request body must be a JSON object", None)
    model = obj.get("model")
    if not isinstance(model, str) or not model:
        return _bad("the request body must name its model: a string 'model'", "model")
    return obj


def model_of(body: bytes) -> str | Response:
    """The request's ``model``, or the 400 that says why there is none."""
    obj = body_of(body)
    return obj if isinstance(obj, Response) else str(obj["model"])


def _bad(message: str, param: str | None) -> Response:
    return Response(400, openai_error(message, "invalid_request_error", None, param), {
        "content-type": JSON
    })  # fmt: skip


def sse_error(message: str, code: str) -> bytes:
    """One server-sent event carrying an error (a stream that failed after its head)."""
    return b"data: " + openai_error(message, "server_error", code) + b"\n\n"


class OpenAIFront:
    """The OpenAI routes of one gateway (``routes``), over its dispatcher and registry."""

    def __init__(
        self, dispatcher: Dispatcher, registry: BackendRegistry, llm: LlmGateway | None = None
    ) -> None:
        self.d = dispatcher
        self.registry = registry
        #: The LLM router (None: every model takes the classic router's pick).
        self.llm = llm
        #: What ``/v1/models`` gives as each model's ``created`` (the gateway's start).
        self.created = int(time.time())

    def routes(self) -> dict[tuple[str, str], Endpoint]:
        return {
            ("POST", COMPLETIONS_PATH): self.completions,
            ("POST", CHAT_COMPLETIONS_PATH): self.chat_completions,
            ("GET", MODELS_PATH): self.models,
        }

    async def completions(self, request: Request) -> Response:
        return await self.relay(COMPLETIONS_PATH, request)

    async def chat_completions(self, request: Request) -> Response:
        return await self.relay(CHAT_COMPLETIONS_PATH, request)

    async def models(self, request: Request) -> Response:
        names = sorted({m for st in self.registry.states.values() for m in st.index})
        data = [
            {"id": m, "object": "model", "created": self.created, "owned_by": "evenserve"}
            for m in names
        ]
        return Response(200, orjson.dumps({"object": "list", "data": data}), {
            "content-type": JSON
        })  # fmt: skip

    # -- one request ------------------------------------------------------------------------
    async def relay(self, path: str, request: Request) -> Response:
        """Route one completion request (the module's docstring) and answer it."""
        obj = body_of(request.body)
        if isinstance(obj, Response):
            return obj
        model = str(obj["model"])
        d = self.d
        if not isinstance(d.forwarder, PooledForwarder):
            return Response(
                501, openai_error("streaming needs the pooled forwarder", "server_error")
            )
        fw = d.admit(model, path, request.body, request.headers)
        if isinstance(fw, Answer):
            return self._respond(d.finish(model, fw, time.perf_counter()), model)
        for h in EXTRA_REQUEST_HEADERS:
            v = request.headers.get(h)
            if v is not None:
                fw.headers[h] = v
        if d.missing(model):
            refused = await d.miss(fw)
            if refused is not None:
                return self._respond(d.finish(model, refused, fw.t0), model)
        if self.llm is not None and self.llm.handles(model):
            return await self.relay_llm(fw, obj, path == CHAT_COMPLETIONS_PATH, request)
        while True:
            name = d.pick(fw)
            if name is None:
                return self._respond(d.finish(model, d.exhausted(fw), fw.t0), model)
            answered = await self._try(fw, name)
            if answered is not None:
                return answered

    async def relay_llm(
        self, fw: Forward, obj: dict[str, Any], chat: bool, request: Request
    ) -> Response:
        """The tries of an LLM model's request, each backend the LLM router's choice."""
        d, llm = self.d, self.llm
        assert llm is not None
        model = fw.model
        now = d.clock.now()
        info = llm.request_info(
            fw.req.request_id, model, chat, obj, request.headers, now, fw.req.priority
        )
        while True:
            if fw.attempt > d.door.retries:
                return self._respond(d.finish(model, d.exhausted(fw), fw.t0), model)
            now = d.clock.now() if fw.attempt else now
            routable = [v.name for v in d.router.candidates(model)]
            t0 = time.perf_counter()
            decision = llm.choose(info, now, routable, fw.tried)
            d.metrics.decision.observe(time.perf_counter() - t0)
            view = decision.engine
            if view is None:
                if decision.reason == "no-engine":
                    return self._respond(d.finish(model, d.exhausted(fw), fw.t0), model)
                return self._refuse(fw, decision.reason or "refused", decision.retry_after_s)
            name = llm.backend_of[view.index]
            fw.tried.append(name)
            fw.attempt += 1
            if fw.attempt > 1:
                d.metrics.retries.labels(model).inc()
            d.router.sent(name, model, now)
            if d.placement is not None:
                d.placement.sent(model, name)
            track = llm.start(info, view, now)
            try:
                answered = await self._try(fw, name, track)
            except BaseException:  # cancelled (the client went away): the try is over
                # (every await in ``_try`` comes before its own ``done``)
                track.end()
                d.done(name, model, None)
                raise
            if answered is not None:
                return answered

    def _refuse(self, fw: Forward, reason: str, retry_after_s: float | None) -> Response:
        """The LLM policy refused: 429 with Retry-After, counted."""
        assert self.llm is not None
        self.llm.refused(fw.model, reason)
        retry = retry_after_header(retry_after_s)
        ans = error_answer(
            429,
            f"no engine of model {fw.model!r} can give this request its first token in time "
            f"({reason}); retry after {retry} s",
            "overloaded",
            {wire.RETRY_AFTER_HEADER: retry, wire.REASON_HEADER: reason},
        )
        return self._respond(self.d.finish(fw.model, ans, fw.t0), fw.model)

    async def _try(self, fw: Forward, name: str, track: LlmTry | None = None) -> Response | None:
        """One try on backend ``name``: the response, or None to try the next backend.
        ``track``: the LLM router's accounting of the try (ended here, or by the relay of
        a streamed answer)."""
        d = self.d
        try:
            up = await self._client(name).stream("POST", fw.path, fw.body, fw.headers)
        except HttpClientError as exc:
            if track is not None:
                track.end()
            d.done(name, fw.model, None)
            return self._settled(fw, name, None, exc)
        if up.status < 300 and up.headers.get("content-type", "").startswith(EVENT_STREAM):
            return self._stream(fw, name, up, track)
        try:
            body = await up.read()
        except HttpClientError as exc:
            if track is not None:
                track.end()
            d.done(name, fw.model, None)
            return self._settled(fw, name, None, exc)
        finally:
            await up.aclose()
        if track is not None:
            if up.status < 300:
                track.whole(body)
            else:
                track.end()
        reply = Reply(up.status, _relayed(up.headers), body)
        d.done(name, fw.model, reply)
        return self._settled(fw, name, reply, None)

    def _settled(
        self, fw: Forward, name: str, reply: Reply | None, exc: HttpClientError | None
    ) -> Response | None:
        d = self.d
        error = PooledForwarder.sorted_error(exc) if exc is not None else None
        ans = d.settle(fw, name, reply, error)
        if ans is None:
            return None
        return self._respond(d.finish(fw.model, ans, fw.t0), fw.model)

    def _stream(
        self, fw: Forward, name: str, up: StreamReply, track: LlmTry | None = None
    ) -> Response:
        """Relay a streamed answer (the try stays in flight until it ends)."""
        reply = Reply(up.status, _relayed(up.headers), b"")
        ans = self.d.settle(fw, name, reply, None)
        assert ans is not None  # a 2xx is always the answer
        headers = dict(reply.headers)
        headers["cache-control"] = "no-cache"
        headers[wire.BACKEND_HEADER] = name
        return StreamResponse(up.status, headers, Relay(self.d, fw, name, up, ans, track))

    def _client(self, name: str) -> HttpClient:
        fwd = self.d.forwarder
        assert isinstance(fwd, PooledForwarder)
        return fwd.client(self.registry.url(name))

    @staticmethod
    def _respond(ans: Answer, model: str) -> Response:
        """An answer as sent: a backend's as it came, the gateway's own in OpenAI's shape."""
        if ans.backend is not None:
            return Response(ans.status, ans.body, ans.headers)
        headers = dict(ans.headers)
        headers["content-type"] = JSON
        if ans.status == 404:
            body = openai_error(
                f"The model '{model}' does not exist", "invalid_request_error", "model_not_found"
            )
        else:
            code = ans.headers.get(wire.REASON_HEADER) or ans.outcome
            body = openai_error(_message(ans.body), error_type(ans.status), code)
        return Response(ans.status, body, headers)


def _message(body: bytes) -> str:
    """The message of the gateway's own error body (``answers.error_answer``)."""
    try:
        obj: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode("utf-8", "replace")
    return str(obj.get("error")) if isinstance(obj, dict) else str(obj)


def _relayed(headers: Mapping[str, str]) -> dict[str, str]:
    return {h: headers[h] for h in RELAY_RESPONSE_HEADERS if h in headers}


class Relay:
    """A backend's streamed answer as the client's body (``StreamResponse.chunks``): each
    piece as it arrives. Its end (the backend's stream ended or failed, or the server closed
    it because the client went away: ``aclose``) ends the try: the router's in-flight count
    is taken back, the request counted once, and the backend connection closed unless the
    stream was read to its end."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        fw: Forward,
        name: str,
        up: StreamReply,
        ans: Answer,
        track: LlmTry | None = None,
    ) -> None:
        self.d = dispatcher
        self.fw = fw
        self.name = name
        self.up = up
        self.ans = ans
        #: The LLM router's accounting of the try (None: a classic pick): each piece is
        #: read for its first text and usage; the end ends it.
        self.track = track
        self.ended = False

    def __aiter__(self) -> Relay:
        return self

    async def __anext__(self) -> bytes:
        if self.ended:
            raise StopAsyncIteration
        try:
            piece = await anext(self.up)
            if self.track is not None:
                self.track.feed(piece)
            return piece
        except StopAsyncIteration:
            self._end(True)
            raise
        except HttpClientError as exc:
            self.ans.outcome = "backend_error"
            self._end(False)
            what = f"backend {self.name} failed mid-stream: {type(exc).__name__}: {exc}"
            return sse_error(what, "backend_error")
        finally:
            if self.ended:
                await self.up.aclose()

    async def aclose(self) -> None:
        """The server is done with the body (its end, or its client went away)."""
        if not self.ended:
            self._end(False)
        await self.up.aclose()

    def _end(self, served: bool) -> None:
        """The try is over: a whole stream teaches the router the backend's time; one cut
        short does not."""
        self.ended = True
        if self.track is not None:
            self.track.end_stream()
        d, fw = self.d, self.fw
        d.done(self.name, fw.model, Reply(self.ans.status, None, b"") if served else None)
        d.finish(fw.model, self.ans, fw.t0)
