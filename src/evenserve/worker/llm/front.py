"""The worker's OpenAI-compatible front: ``/v1/models``, ``/v1/completions`` and
``/v1/chat/completions`` over its LLM models, streamed (server-sent events, one chunk per
engine step) or whole.

A request is read and checked by ``worker.openai`` (every error in OpenAI's shape: 400 naming
the field, 404 unknown model, 400 ``context_length_exceeded``), tokenized with the model's
tokenizer (a chat through its template), and submitted to the device's engine with its class
and deadline (the ``x-evenserve-priority`` / ``-deadline-ms`` headers, as for v2 inference;
the model's class by default). A refusal at once is an HTTP answer (429 with Retry-After for
``queue-full``, 503 draining); after that the answer is 200 and the tokens stream as the
engine's steps produce them, decoded incrementally (never half a UTF-8 character). A client
that goes away mid-stream, or a stop string that matched, closes the event iterator: the
generation is cancelled in the engine at once and its KV blocks freed. Every request is
counted once by outcome (``evenserve_worker_llm_requests_total``), and its tokens'
times observed under vLLM's names (``metrics.llm``).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

from evenserve.core import wire
from evenserve.httpio.server import Request, Response, StreamResponse
from evenserve.metrics.llm import LlmMetrics
from evenserve.runtime.llm.tokenizer import IncrementalDetokenizer
from evenserve.sched.engine import GenSpec
from evenserve.worker.batch import PendingRequest
from evenserve.worker.llm.generation import GenerationDriver, GenerationSink
from evenserve.worker.llm.hosting import LlmModel
from evenserve.worker.models.loadwait import LoadWaitError, LoadWaits
from evenserve.worker.models.registry import LOADING, READY, UNLOADING, ModelStates
from evenserve.worker.openai import (
    SSE_CONTENT_TYPE,
    ChatRequest,
    CompletionRequest,
    GenEvent,
    OpenAIError,
    Reply,
    Tally,
    chat_completion_id,
    chat_prompt_ids,
    check_context,
    collect_chat,
    collect_completion,
    completion_id,
    from_refusal,
    internal,
    invalid_request,
    model_not_found,
    models_body,
    parse_chat,
    parse_completion,
    prompt_token_ids,
    stream_chat,
    stream_completion,
    unavailable,
)
from evenserve.worker.refusals import (
    BatchFailedError,
    DrainingError,
    RefusedError,
    UnknownModelError,
)

JSON = {"content-type": "application/json"}
Endpoint = Callable[[Request], Awaitable[Response]]


def _error(err: OpenAIError) -> Response:
    headers = dict(JSON)
    retry = err.retry_after_header()
    if retry is not None:
        headers["Retry-After"] = retry
    return Response(err.status, err.body(), headers)


def openai_error(exc: BaseException) -> OpenAIError:
    """The OpenAI-shaped error of a worker exception."""
    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, RefusedError):
        return from_refusal(exc.reason, str(exc), exc.retry_after_s)
    if isinstance(exc, DrainingError):
        return unavailable(str(exc))
    if isinstance(exc, UnknownModelError):
        return invalid_request(str(exc), param="model")
    if isinstance(exc, ValueError):
        return invalid_request(str(exc), param="max_tokens")
    if isinstance(exc, BatchFailedError):
        return internal(str(exc))
    return internal("internal error")


class LlmFront:
    """The OpenAI routes over the worker's LLM models (see the module docstring)."""

    def __init__(
        self,
        models: Mapping[str, LlmModel],
        driver: Callable[[], GenerationDriver],
        ready: Callable[[], bool],
        metrics: LlmMetrics | None = None,
        states: ModelStates | None = None,
        loads: LoadWaits | None = None,
    ) -> None:
        self.models = dict(models)
        #: Each model's state (an LLM asleep or being woken: ``worker.llm.residency``) and
        #: the loads in progress its requests wait for (None: always awake).
        self.states = states
        self.loads = loads
        self._driver = driver
        self._ready = ready
        self._ids = itertools.count(1)
        self.metrics = metrics

    def _observe(self, model: str, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.outcome(model, outcome)

    def routes(self) -> dict[tuple[str, str], Endpoint]:
        return {
            ("GET", "/v1/models"): self.list_models,
            ("POST", "/v1/completions"): self.completions,
            ("POST", "/v1/chat/completions"): self.chat,
        }

    async def list_models(self, request: Request) -> Response:
        created = int(time.time())
        return Response(200, models_body(sorted(self.models), created), JSON)

    async def completions(self, request: Request) -> Response:
        return await self._serve(request, chat=False)

    async def chat(self, request: Request) -> Response:
        return await self._serve(request, chat=True)

    async def _serve(self, request: Request, chat: bool) -> Response:
        name = "-"
        try:
            req: ChatRequest | CompletionRequest = (
                parse_chat(request.body) if chat else parse_completion(request.body)
            )
            name = req.model
            model = self.models.get(req.model)
            if model is None:
                raise model_not_found(req.model)
            if not self._ready():
                raise unavailable("the worker is not ready (starting or shutting down)")
            if self.states is not None:
                await self._awake(req.model)
            ids = (
                chat_prompt_ids(req, model.tokenizer, model.template)
                if isinstance(req, ChatRequest)
                else prompt_token_ids(req, model.tokenizer)
            )
            max_tokens = check_context(len(ids), req.max_new_tokens, model.max_model_len,
                                       chat=chat)  # fmt: skip
            priority, deadline_s = _class_and_deadline(request, model)
            top_p = 1.0 if req.top_p is None else req.top_p
            pending = self._driver().submit_generation(
                model.name,
                GenSpec(ids, max_tokens, req.ignore_eos, req.temperature, top_p, req.seed),
                priority=priority,
                deadline_in_s=deadline_s,
            )
        except Exception as exc:
            err = openai_error(exc)
            self._observe(name if name in self.models else "-", _outcome(err))
            return _error(err)
        n = next(self._ids)
        reply = Reply(
            chat_completion_id(n) if chat else completion_id(n),
            int(time.time()),
            model.name,
            len(ids),
        )
        tally = Tally()
        events = self._events(model, pending, ids, tally)
        if req.stream:
            maker = stream_chat if chat else stream_completion
            chunks = maker(events, reply, stop=req.stop, include_usage=req.include_usage,
                           tally=tally)  # fmt: skip
            return StreamResponse(200, {"content-type": SSE_CONTENT_TYPE,
                                        "cache-control": "no-cache"}, chunks)  # fmt: skip
        collect = collect_chat if chat else collect_completion
        try:
            body = await collect(events, reply, stop=req.stop, tally=tally)
        except Exception as exc:
            return _error(openai_error(exc))
        return Response(200, body, JSON)

    async def _awake(self, name: str) -> None:
        """An LLM being woken is waited for (at most ``--load-wait-ms``, then 503), as a
        classic model being loaded; one being put to sleep is 503, one asleep 404 (as a
        classic model not loaded). No await after the last check: the submit follows."""
        assert self.states is not None
        st = self.states.get(name)
        if st is not None and st.state == LOADING and self.loads is not None:
            try:
                await self.loads.wait(name)
            except LoadWaitError as exc:
                raise unavailable(str(exc), exc.retry_after_s) from None
            st = self.states.get(name)
        if st is None or st.state == READY:
            return
        if st.state == UNLOADING:
            raise unavailable(f"model {name!r} is being put to sleep here", 1.0)
        if st.state == LOADING:
            raise unavailable(f"model {name!r} is loading", 1.0)
        why = f" ({st.reason})" if st.reason else ""
        raise OpenAIError(
            404, f"The model `{name}` is not loaded here{why}.", code="model_not_found"
        )

    async def _events(
        self, model: LlmModel, pending: PendingRequest, prompt: list[int], tally: Tally
    ) -> AsyncIterator[GenEvent]:
        """The generation's steps as text, in order; closing it early cancels the sequence."""
        sink = pending.payload
        assert isinstance(sink, GenerationSink)
        fut = pending.future
        assert fut is not None
        detok = IncrementalDetokenizer(model.tokenizer, prompt)
        outcome = "cancelled"
        clock = self._driver().clock
        m, name = self.metrics, model.name
        last = None
        try:
            while True:
                got = await sink.events.get()
                if isinstance(got, BaseException):
                    outcome = _outcome(openai_error(got))
                    raise openai_error(got)
                now = clock.now()
                if got.cached is not None:
                    tally.cached_tokens = got.cached
                if m is not None:
                    if last is None:
                        m.ttft.labels(name).observe(now - pending.arrival_s)
                    else:
                        m.itl.labels(name).observe(now - last)
                last = now
                text = detok.push([got.token]) if got.token is not None else ""
                if got.finish is not None:
                    text += detok.flush()
                    outcome = "success"
                    if m is not None:
                        m.e2e.labels(name).observe(now - pending.arrival_s)
                        m.finished(name, got.finish)
                yield GenEvent(text, 1, got.finish)  # type: ignore[arg-type]
                if got.finish is not None:
                    return
        finally:
            if not fut.done():
                fut.cancel()  # the driver takes the sequence out and frees its blocks
            self._observe(name, outcome)


def _class_and_deadline(request: Request, model: LlmModel) -> tuple[int, float | None]:
    h = request.headers
    try:
        p = wire.parse_priority(h.get(wire.PRIORITY_HEADER), wire.PRIORITY_HEADER)
        d = wire.parse_deadline_ms(h.get(wire.DEADLINE_HEADER), wire.DEADLINE_HEADER)
    except ValueError as exc:
        raise invalid_request(str(exc), param=None) from None
    prio = model.entry.config.priority_value if p is None else p
    return prio, None if d is None else d / 1e3


def _outcome(err: OpenAIError) -> str:
    if err.status == 429:
        return "rejected_queue_full"
    if err.status == 404:
        return "not_found"
    if err.status == 400:
        return "bad_request"
    if err.status == 503:
        return "unavailable"
    if err.status == 504:
        return "deadline"
    return "error"
