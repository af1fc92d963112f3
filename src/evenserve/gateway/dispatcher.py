"""The dispatcher: pick a backend with the routing policy, forward, retry once, answer once.

Theory of operation. For one request to model m:
1. Unknown model (no backend has it, in any state: ``BackendRegistry.hosted``, learned from
   the backends' repository indexes): 404, naming the known models. A model its backends
   list only LOADING, UNLOADING or UNAVAILABLE has no healthy host: 503 (step 3).
2. Overload that means overload (``overload.enabled``: may refuse): ``Router.refusal`` says
   whether every healthy host of m is full (its reported queue of m at its bound) or late
   (the work ahead of the request, predicted from the host's reported busy time, queues and
   latency profiles, exceeds the SLO the host reports for m). Then answer 429 with
   Retry-After and ``x-evenserve-reason: overloaded`` at once, naming each host's verdict.
   A host without fresh signals, a reported SLO or bound, or a profile is never full or late:
   no evidence, no refusal. A policy's soft-overload judgement (queue-aware's) only steers
   the choice in step 3; it never refuses.
3. Ask the Router (the same object the simulator drives) for a backend among the healthy
   hosts, excluding those already tried; the decision is timed into a histogram. No host
   left: 503 naming the model and what was tried.
4. ``Router.sent`` before forwarding and ``Router.done`` after (in ``finally``), so bursts
   between two signal polls see each other and in-flight counts never leak; both with the
   clock's time when the backend served the request (a 2xx or other answer below 400), so
   the router learns each backend's speed from what its answers took.
5. Forward the body bytes untouched (JSON or the binary tensor extension) with the headers
   that carry meaning (content type, Inference-Header-Content-Length, content encoding, and
   the request's class and deadline: x-evenserve-priority, x-evenserve-deadline-ms).
6. Outcomes. A response is relayed as is, with ``x-evenserve-backend`` naming the backend,
   except that a backend's 503 (not ready, draining) or 429 ``queue-full`` (its queue was
   full when the request came) means it did not take the work, so the request is tried once
   more elsewhere. A 429 ``shed`` (the worker took the request, then gave its place to a
   higher class: the device is overloaded and this is the lowest class) and a 504
   (``deadline-infeasible`` / ``deadline-expired``: the worker will not run it in time) are
   relayed as they are: moving the lowest class to another overloaded host would undo the
   shedding, and the deadline has not grown. The worker's ``x-evenserve-reason`` header
   comes back with every refusal. A request that did not
   reach a backend is retried once on another host: connection refused (the backend is also
   ejected at once; the poller readmits it when it answers again) or connect timeout (not
   ejected: a gateway too busy to complete a connect in time is not evidence against the
   backend; the poller decides), or a
   connection dropped before any response (a killed worker; inference is side-effect free,
   so a second try is safe; no ejection here, the poller decides within one period). A read
   timeout means the backend has the request and is stuck: eject it and answer 504 without
   a retry (the work may still finish there).
7. If every try failed, the client gets the last backend's 429/503 as relayed, or the
   gateway's own 503 with the reasons. Exactly one response per accepted request.

gRPC (``grpc_front``) takes the same path: ``infer_grpc`` admits, picks and settles with the
same methods; a backend's gRPC status is judged as its HTTP counterpart (``GrpcReply.status``:
UNAVAILABLE as 503, RESOURCE_EXHAUSTED with a reason as 429), so the retry rules are the
ones above. Backends without a gRPC endpoint are excluded from the start.

Placement (``gateway.placement``: ``self.placement``, a ``gateway.placement.PlacementDriver``;
None otherwise, and then each hook below is one ``is None`` test): a catalogue model no
backend has is known (not 404); every admitted request is an ``arrival``, every try a
``sent`` / ``done``; a request whose model has no READY healthy host takes the miss path
first (``_miss``: wait for the load placement starts or has under way, 503 with Retry-After
when it cannot be placed or the load failed or outlasted ``load_wait_ms``), then the tries.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from evenserve.cluster.gateway_section import GatewaySection
from evenserve.core import wire
from evenserve.core.clock import Clock
from evenserve.core.types import RequestInfo
from evenserve.gateway.backends import BackendRegistry
from evenserve.gateway.forwarder import (
    Forwarder,
    ForwardError,
    PooledForwarder,
    Reply,
    ResponseTimeout,
    Unreachable,
)
from evenserve.gateway.placement import PlacementDriver
from evenserve.httpio.client import HttpClient, parse_headers
from evenserve.httpio.client import Reply as HttpReply
from evenserve.metrics.gateway import GatewayMetrics

#: Request headers forwarded to the backend (lower case); others are hop-by-hop or ours.
FORWARD_REQUEST_HEADERS = (
    "content-type",
    wire.HEADER_LENGTH_HEADER.lower(),
    "content-encoding",
    wire.PRIORITY_HEADER,
    wire.DEADLINE_HEADER,
)
#: The head cache's size before it starts over (``Dispatcher._next_try``).
FORWARD_HEADS = 1024
_LENGTH_ZERO = b"content-length: 0\r\n\r\n"
#: Response headers relayed to the client.
RELAY_RESPONSE_HEADERS = (
    "content-type",
    wire.HEADER_LENGTH_HEADER.lower(),
    "content-encoding",
    wire.RETRY_AFTER_HEADER,
    wire.REASON_HEADER,
    wire.QUEUE_MS_HEADER,
    wire.COMPUTE_MS_HEADER,
)


#: What one try's send gives: an HTTP Reply or a GrpcReply (both carry an HTTP ``status``).
R = TypeVar("R", "Reply", "GrpcReply")


@dataclass(slots=True)
class _Forward:
    """One inference request on its way through the gateway."""

    model: str
    path: str
    body: bytes
    headers: dict[str, str]
    req: RequestInfo
    t0: float
    #: The forwarded headers' values (FORWARD_REQUEST_HEADERS' order): a key of its head.
    head_key: tuple[str | None, ...] = ()
    attempt: int = 0
    tried: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    relayed: Answer | None = None
    answer: Callable[[Answer], None] | None = None


@dataclass(slots=True)
class Answer:
    """What the gateway sends back: exactly one per request."""

    status: int
    body: bytes
    headers: dict[str, str]
    backend: str | None
    outcome: str
    #: A backend's gRPC answer, relayed as it is (gRPC requests only).
    grpc: GrpcReply | None = None
    #: A backend's HTTP answer relayed as the bytes it came in, ``x-evenserve-backend``
    #: added (``relayed_bytes``); ``headers`` is then empty and ``head`` (the backend's
    #: head) has them.
    raw: bytes | None = None
    #: Where the head of ``raw`` ends.
    raw_head: int = 0
    head: bytes = b""

    def header(self, name: str) -> str | None:
        """A response header (lower-case name) whichever way the answer goes out."""
        if self.raw is not None:
            return parse_headers(self.head).get(name)
        return self.headers.get(name)


#: Headers that concern one connection, not the answer (RFC 9110 7.6.1): an answer that has
#: one is not relayed as its bytes.
_HOP_BY_HOP = (b"\nconnection:", b"\nkeep-alive:", b"\nproxy-", b"\nupgrade:", b"\ntrailer:")


def relayed_bytes(raw: bytes | None, head: bytes, backend_line: bytes) -> bytes | None:
    """A backend's answer as the bytes to send on, ``backend_line`` (the
    ``x-evenserve-backend`` header line) added at the end of its head; None when it cannot
    go as it came (not read whole in one piece, its body not framed by Content-Length, a
    hop-by-hop header): then its headers are read and the answer is written anew. Every
    other header goes on as the backend sent it, as nginx relays them."""
    if raw is None or not head.endswith(b"\r\n\r\n"):
        return None
    low = head.lower()
    if b"\ncontent-length:" not in low:
        return None
    for h in _HOP_BY_HOP:
        if h in low:
            return None
    n = len(head) - 2
    return b"".join((raw[:n], backend_line, raw[n:]))


@dataclass(slots=True)
class GrpcReply:
    """A backend's answer to a gRPC call: its status code, message, trailing metadata and
    response (OK only: the serialized message, relayed as it is); ``status`` is the HTTP
    counterpart the shared rules judge, ``reason`` the backend's ``x-evenserve-reason``."""

    status: int
    reason: str | None
    code: Any
    message: str = ""
    trailing: tuple[tuple[str, str], ...] = ()
    response: Any = None


def error_answer(
    status: int, message: str, outcome: str, extra: Mapping[str, str] | None = None
) -> Answer:
    headers = {"content-type": "application/json"}
    if extra:
        headers.update(extra)
    return Answer(status, json.dumps({"error": message}).encode(), headers, None, outcome)


def outcome_of(status: int) -> str:
    if status < 400:
        return "ok"
    if status == 429:
        return "backend_overloaded"
    if status < 500:
        return "client_error"
    return "backend_error"


class Dispatcher:
    def __init__(
        self,
        registry: BackendRegistry,
        cfg: GatewaySection,
        clock: Clock,
        metrics: GatewayMetrics,
        forwarder: Forwarder | None = None,
    ) -> None:
        self.registry = registry
        self._states = registry.states
        self.router = registry.router
        self.cfg = cfg
        self.clock = clock
        self.metrics = metrics
        fwd = cfg.forward
        self.forwarder: Forwarder = forwarder or PooledForwarder(
            max_connections=fwd.max_connections,
            connect_timeout_s=fwd.connect_timeout_ms / 1000.0,
            request_timeout_s=fwd.request_timeout_s,
            keep_headers=RELAY_RESPONSE_HEADERS,
        )
        self._ids = itertools.count(1)
        #: Each backend's ``x-evenserve-backend`` header line (relayed answers).
        self._backend_lines: dict[str, bytes] = {}
        #: Forwarded request heads up to their Content-Length, by backend, path and forwarded
        #: headers (a client sends few kinds of request): made once, not per request.
        self._heads: dict[tuple[str, str, tuple[str | None, ...]], bytes] = {}
        #: Each backend's pooled HTTP client (the fast path's).
        self._clients: dict[str, HttpClient] = {}
        self._decision = metrics.decision
        fwd_ = self.forwarder
        #: The relayed headers a pooled client's answer gives when they are read.
        self._keep = fwd_.keep if isinstance(fwd_, PooledForwarder) else None
        self._tasks: set[asyncio.Task[None]] = set()
        #: The placement driver (``gateway.placement``), None without placement: then the
        #: request path is what it was (one ``is None`` test per hook).
        self.placement: PlacementDriver | None = None

    @property
    def fast(self) -> bool:
        """Whether ``infer_fast`` can run (the pooled forwarder, not a test's)."""
        return isinstance(self.forwarder, PooledForwarder)

    async def aclose(self) -> None:
        await self.forwarder.aclose()

    # -- the hot path -----------------------------------------------------------------------
    # One request is a _Forward: admitted (or answered at once), then tried on up to
    # 1 + retries backends: ``_pick`` chooses one, the forward happens (awaited in ``infer``,
    # by callback in ``infer_fast``), ``_settle`` judges its outcome (an answer, or try the
    # next backend), ``_finish`` counts the answer. Both paths share every decision.
    async def infer(self, model: str, path: str, body: bytes, headers: Mapping[str, str]) -> Answer:
        fw = self._admit(model, path, body, headers)
        if isinstance(fw, Answer):
            return self._finish(model, fw, time.perf_counter())
        if self._missing(model):
            refused = await self._miss(fw)
            if refused is not None:
                return self._finish(model, refused, fw.t0)
        return await self._tries(fw, partial(self._send_http, fw), self._settle)

    def _missing(self, model: str) -> bool:
        """Placement is on and no healthy host has ``model`` READY: the miss path first."""
        return self.placement is not None and not self.router.candidates(model)

    async def _miss(self, fw: _Forward) -> Answer | None:
        """Placement's miss path: no healthy host has the model READY. Wait for it to be
        loaded (where it loads, or where the policy loads it now); an Answer (503 with
        Retry-After) when it cannot be placed or its load did not end in time."""
        pl = self.placement
        assert pl is not None
        if not pl.handles(fw.model):
            return None
        dev, fut, why = pl.miss(fw.model)
        if dev is not None and fut is not None:
            err = await pl.wait(fw.model, dev, fut)
            if err is None:
                return None
            why = err
        return error_answer(
            503,
            f"no backend available for model {fw.model!r}: {why}",
            "unavailable",
            {"retry-after": str(self.cfg.overload.retry_after_s)},
        )

    async def _miss_then_try(self, fw: _Forward) -> None:
        assert fw.answer is not None
        refused = await self._miss(fw)
        if refused is not None:
            fw.answer(self._finish(fw.model, refused, fw.t0))
        else:
            self._next_try(fw)

    async def _send_http(self, fw: _Forward, name: str) -> Reply:
        return await self.forwarder.request(
            "POST", self.registry.url(name), fw.path, fw.body, fw.headers
        )

    async def _tries(
        self,
        fw: _Forward,
        send: Callable[[str], Awaitable[R]],
        settle: Callable[[_Forward, str, R | None, ForwardError | None], Answer | None],
    ) -> Answer:
        """The awaited tries of one request (HTTP or gRPC): pick, send, settle, until an
        answer or no backend is left."""
        while True:
            name = self._pick(fw)
            if name is None:
                return self._finish(fw.model, self._exhausted(fw), fw.t0)
            got: R | None = None
            error: ForwardError | None = None
            try:
                got = await send(name)
            except ForwardError as exc:
                error = exc
            finally:
                self._done(name, fw.model, got)
            ans = settle(fw, name, got, error)
            if ans is not None:
                return self._finish(fw.model, ans, fw.t0)

    def infer_fast(
        self,
        model: str,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        answer: Callable[[Answer], None],
    ) -> None:
        """``infer`` without a task or coroutines (the server's fast path): ``answer`` is
        called once with the Answer. Needs the pooled forwarder; a try that finds no idle
        connection to its backend runs as a task (``_try_async``)."""
        fw = self._admit(model, path, body, headers)
        if isinstance(fw, Answer):
            answer(self._finish(model, fw, time.perf_counter()))
            return
        fw.answer = answer
        if self._missing(model):
            task = asyncio.get_running_loop().create_task(self._miss_then_try(fw))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        self._next_try(fw)

    def _next_try(self, fw: _Forward) -> None:
        assert fw.answer is not None
        name = self._pick(fw)
        if name is None:
            fw.answer(self._finish(fw.model, self._exhausted(fw), fw.t0))
            return
        client = self._clients.get(name)
        if client is None:
            fwd = self.forwarder
            assert isinstance(fwd, PooledForwarder)
            client = self._clients[name] = fwd.client(self.registry.url(name))
        key = (name, fw.path, fw.head_key)
        prefix = self._heads.get(key)
        if prefix is None:
            prefix = client.head("POST", fw.path, fw.headers, 0)[: -len(_LENGTH_ZERO)]
            if len(self._heads) >= FORWARD_HEADS:
                self._heads.clear()
            self._heads[key] = prefix
        head = b"%scontent-length: %d\r\n\r\n" % (prefix, len(fw.body))
        if not client.send_cb(head, fw.body, partial(self._tried, fw, name)):
            task = asyncio.get_running_loop().create_task(self._try_async(fw, name))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _try_async(self, fw: _Forward, name: str) -> None:
        try:
            reply = await self.forwarder.request(
                "POST", self.registry.url(name), fw.path, fw.body, fw.headers
            )
        except ForwardError as exc:
            self._tried(fw, name, None, exc)
        else:
            self._tried(fw, name, reply, None)

    def _tried(
        self,
        fw: _Forward,
        name: str,
        reply: Reply | HttpReply | None,
        error: BaseException | None,
    ) -> None:
        self._done(name, fw.model, reply)
        if error is not None and not isinstance(error, ForwardError):
            raise error  # not a forwarding failure: a bug, not an outcome
        if error is not None:
            error = PooledForwarder.sorted_error(error)
        ans = self._settle(fw, name, reply, error)
        if ans is None:
            self._next_try(fw)
        else:
            assert fw.answer is not None
            fw.answer(self._finish(fw.model, ans, fw.t0))

    # -- gRPC ----------------------------------------------------------------------------------
    async def infer_grpc(
        self,
        model: str,
        send: Callable[[str], Awaitable[GrpcReply]],
        exclude: Iterable[str] = (),
    ) -> Answer:
        """``infer`` for a gRPC call: ``send(name)`` forwards it to backend ``name`` (a
        GrpcReply, or a ForwardError: Unreachable, ResponseTimeout); backends in ``exclude``
        (no gRPC endpoint) are never picked."""
        fw = self._admit(model, "", b"", {})
        if isinstance(fw, Answer):
            return self._finish(model, fw, time.perf_counter())
        fw.tried.extend(exclude)
        if self._missing(model):
            refused = await self._miss(fw)
            if refused is not None:
                return self._finish(model, refused, fw.t0)
        return await self._tries(fw, send, self._settle_grpc)

    def _settle_grpc(
        self, fw: _Forward, name: str, got: GrpcReply | None, error: ForwardError | None
    ) -> Answer | None:
        """``_settle`` for a gRPC try: judged by its HTTP counterpart; the Answer it gives (or
        keeps to relay) carries the gRPC answer itself."""
        reply = None
        if got is not None:
            reply = Reply(got.status, {wire.REASON_HEADER: got.reason} if got.reason else {}, b"")
        before = fw.relayed
        ans = self._settle(fw, name, reply, error)
        mine = ans if ans is not None else (fw.relayed if fw.relayed is not before else None)
        if mine is not None and got is not None:
            mine.grpc = got
        return ans

    def _done(self, name: str, model: str, reply: Reply | HttpReply | GrpcReply | None) -> None:
        """The try on ``name`` is over; a served answer (below 400) teaches the router the
        backend's speed (a quick refusal must not make a host look fast)."""
        if reply is None:
            self.router.done(name, model)
        else:
            now = self.clock.now()
            st = self._states.get(name)
            if st is not None:  # alive, whatever its probes say (poller)
                st.answered_s = now
            self.router.done(name, model, now_s=now if reply.status < 400 else None)
        if self.placement is not None:
            self.placement.done(model, name)

    def _admit(
        self, model: str, path: str, body: bytes, headers: Mapping[str, str]
    ) -> Answer | _Forward:
        """The answer at once (unknown model, overload), or the request to forward."""
        t0 = time.perf_counter()
        if not self.registry.hosts_model(model):
            return error_answer(
                404,
                f"unknown model {wire.shown_name(model)} "
                f"(served: {', '.join(self.registry.models())})",
                "unknown_model",
            )
        if self.placement is not None:  # the demand placement reads: refused ones count too
            self.placement.arrival(model)
        ov = self.cfg.overload
        now = self.clock.now()
        why = self.router.refusal(model, now) if ov.enabled else None
        if why is not None:
            return error_answer(
                429,
                f"{why}; retry later",
                wire.OVERLOADED,
                {"retry-after": str(ov.retry_after_s), wire.REASON_HEADER: wire.OVERLOADED},
            )
        values = tuple(map(headers.get, FORWARD_REQUEST_HEADERS))
        fwd_headers = {"accept-encoding": "identity"}
        for h, v in zip(FORWARD_REQUEST_HEADERS, values, strict=True):
            if v is not None:
                fwd_headers[h] = v
        req = RequestInfo(next(self._ids), model, now)
        return _Forward(model, path, body, fwd_headers, req, t0, values)

    def _pick(self, fw: _Forward) -> str | None:
        """The next backend to try (counted as sent), or None when none is left."""
        if fw.attempt > self.cfg.forward.retries:
            return None
        # The first try is decided at arrival: the clock is read once for both.
        now = fw.req.arrival_s if fw.attempt == 0 else self.clock.now()
        d0 = time.perf_counter()
        view = self.router.choose(fw.req, now, exclude=fw.tried)
        self._decision.observe(time.perf_counter() - d0)
        if view is None:
            return None
        name = view.name
        fw.tried.append(name)
        if fw.attempt > 0:
            self.metrics.retries.labels(fw.model).inc()
        fw.attempt += 1
        self.router.sent(name, fw.model, now)
        if self.placement is not None:
            self.placement.sent(fw.model, name)
        return name

    def _settle(
        self, fw: _Forward, name: str, reply: Reply | HttpReply | None, error: ForwardError | None
    ) -> Answer | None:
        """One try's outcome: the answer, or None to try the next backend."""
        if error is not None:
            if isinstance(error, Unreachable):
                if str(error) == "connect-refused":  # the backend's own evidence: eject now
                    self.registry.eject(name, str(error))
                fw.failures.append(f"{name}: {error}")
                return None
            if isinstance(error, ResponseTimeout):
                self.registry.eject(name, "timeout")
                return error_answer(
                    504,
                    f"backend {name} did not answer within "
                    f"{self.cfg.forward.request_timeout_s:g} s",
                    "timeout",
                    {wire.BACKEND_HEADER: name},
                )
            fw.failures.append(f"{name}: connection lost ({error})")
            return None
        assert reply is not None
        line = self._backend_lines.get(name)
        if line is None:
            line = self._backend_lines[name] = f"{wire.BACKEND_HEADER}: {name}\r\n".encode()
        status, head = reply.status, reply.head
        raw = relayed_bytes(reply.raw, head, line)
        if raw is not None:
            ans = Answer(
                status, reply.body, {}, name, outcome_of(status), None, raw,
                len(head) + len(line), head,
            )  # fmt: skip
        else:  # the pooled client's answer has its head only: the relayed headers from it
            headers = parse_headers(head, self._keep) if isinstance(reply, HttpReply) else None
            ans = Answer(status, reply.body, headers or reply.headers, name, outcome_of(status))
        if status in (429, 503) and ans.header(wire.REASON_HEADER) != wire.SHED:
            fw.relayed = ans
            fw.failures.append(f"{name}: answered {reply.status}")
            return None
        return ans

    def _exhausted(self, fw: _Forward) -> Answer:
        """Every try failed: the last backend's 429/503 as relayed, or the gateway's 503."""
        if fw.relayed is not None:
            return fw.relayed
        what = "; ".join(fw.failures) if fw.failures else self._none_ready(fw.model)
        return error_answer(
            503,
            f"no backend available for model {fw.model!r} ({what})",
            "unavailable",
            {"retry-after": str(self.cfg.overload.retry_after_s)},
        )

    def _none_ready(self, model: str) -> str:
        """Why no backend could take ``model``: each host's state there (not the hot path)."""
        states = self.registry.states_of(model)
        return "none is ready: " + ", ".join(f"{n} {s}" for n, s in states.items())

    def _finish(self, model: str, ans: Answer, t0: float) -> Answer:
        self.metrics.observe_request(ans.backend, model, ans.outcome, time.perf_counter() - t0)
        if ans.backend is not None and ans.raw is None:
            ans.headers[wire.BACKEND_HEADER] = ans.backend
        return ans

    # -- model metadata and friends ---------------------------------------------------------
    async def passthrough(self, model: str, method: str, path: str, body: bytes) -> Answer:
        """Forward a non-inference model request (metadata, config, stats) to a healthy host.

        Not a routing decision: it does not count as work and does not move the policy.
        """
        if not self.registry.hosts_model(model):
            return error_answer(404, f"unknown model {model!r}", "unknown_model")
        failures: list[str] = []
        for view in list(self.router.candidates(model))[: 1 + self.cfg.forward.retries]:
            name = view.name
            try:
                reply = await self.forwarder.request(
                    method,
                    self.registry.url(name),
                    path,
                    body,
                    {"accept-encoding": "identity", "content-type": "application/json"},
                )
            except ForwardError as exc:
                failures.append(f"{name}: {type(exc).__name__} {exc}")
                continue
            reply.headers[wire.BACKEND_HEADER] = name
            return Answer(reply.status, reply.body, reply.headers, name, "ok")
        what = "; ".join(failures) if failures else "none is ready"
        return error_answer(
            503, f"no backend available for model {model!r} ({what})", "unavailable"
        )
