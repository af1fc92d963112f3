"""The gateway's drivers of the front door's rules: admit, pick, forward, judge, answer once.

The rules themselves are ``policy.routing.dispatch`` (pure: the simulator's front runs them
too); this module carries them out over the network, three ways for one set of decisions:
the awaited HTTP path (``infer``), the callback fast path (``infer_fast``, in
``gateway.fast_path``: no task or coroutine unless a try finds no idle connection) and gRPC
(``infer_grpc``). For one request:

1. Admission (``FrontDoor.admit``): 404 for an unknown model, 429 ``overloaded`` with
   Retry-After when the overload rule holds. The request's class and deadline
   (``x-evenserve-priority``, ``x-evenserve-deadline-ms``: a gRPC call's metadata and its
   own deadline arrive as these) are parsed here into the ``RequestInfo`` the router sees; a
   value that does not parse leaves the default (online, no deadline) and goes on as it
   came, for the worker to refuse (400).
2. Each try: ``FrontDoor.choose`` picks a backend (the decision timed into a histogram),
   ``Router.sent`` before forwarding and ``Router.done`` after (in ``finally``), so bursts
   between two signal polls see each other and in-flight counts never leak; both with the
   clock's time when the backend served the request (a 2xx or other answer below 400), so
   the router learns each backend's speed from what its answers took. Any answer marks the
   backend as answering (the poller does not eject it for slow probes meanwhile).
3. Forward the body bytes untouched (JSON or the binary tensor extension) with the headers
   that carry meaning (content type, Inference-Header-Content-Length, content encoding, the
   class and deadline). Transport failures are sorted into the rules' kinds
   (``Unreachable`` "connect-refused" / "timeout", ``ConnectionLost``, ``ResponseTimeout``)
   and judged (``FrontDoor.failed``: retry, eject, 504); an answer is judged by its status
   and ``x-evenserve-reason`` (``FrontDoor.judge``: relayed with ``x-evenserve-backend``, or
   kept while the next backend is tried).
4. No try left: the kept refusal as relayed, or the gateway's own 503 with the reasons
   (``FrontDoor.exhausted``). Exactly one response per accepted request.

gRPC (``grpc_front``) takes the same path: ``infer_grpc`` admits, picks and settles with the
same methods; a backend's gRPC status is judged as its HTTP counterpart (``GrpcReply.status``:
UNAVAILABLE as 503, RESOURCE_EXHAUSTED with a reason as 429). Backends without a gRPC
endpoint are excluded from the start.

Placement (``gateway.placement``: ``self.placement``, a ``gateway.placement.PlacementDriver``;
None otherwise, and then each hook below is one ``is None`` test): a catalogue model no
backend has is known (not 404); every admitted request is an ``arrival``, every try a
``sent`` / ``done``; a request whose model has no READY healthy host takes the miss path
first (``miss``: wait for the load placement starts or has under way, 503 with Retry-After
when it cannot be placed or the load failed or outlasted ``load_wait_ms``), then the tries.
"""

from __future__ import annotations

import itertools
import time
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterable, Mapping
from functools import partial
from time import perf_counter
from typing import TypeVar

from evenserve.cluster.gateway_section import GatewaySection
from evenserve.core import wire
from evenserve.core.clock import Clock, RealClock
from evenserve.core.types import RequestInfo
from evenserve.gateway.answers import (
    RELAY_RESPONSE_HEADERS,
    Answer,
    GrpcReply,
    error_answer,
    outcome_of,
    refusal_answer,
    relayed_answer,
)
from evenserve.gateway.backends import BackendRegistry
from evenserve.gateway.fast_path import FastPath
from evenserve.gateway.forward import FORWARD_REQUEST_HEADERS, Forward, classify, new_forward
from evenserve.gateway.forwarder import (
    Forwarder,
    ForwardError,
    PooledForwarder,
    Reply,
    ResponseTimeout,
    Unreachable,
)
from evenserve.gateway.placement import PlacementDriver
from evenserve.httpio.client import Reply as HttpReply
from evenserve.httpio.client import parse_headers
from evenserve.metrics.gateway import GatewayMetrics
from evenserve.policy.routing.dispatch import (
    CONNECT_REFUSED,
    CONNECT_TIMEOUT,
    CONNECTION_LOST,
    REFUSING_STATUSES,
    RESPONSE_TIMEOUT,
    FrontDoor,
)

#: What one try's send gives: an HTTP Reply or a GrpcReply (both carry an HTTP ``status``).
R = TypeVar("R", "Reply", "GrpcReply")


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
        #: ``clock.now``; for the real clock, what it reads (``time.monotonic``) without its
        #: interpreted frame (read twice per request).
        self._now: Callable[[], float] = time.monotonic if type(clock) is RealClock else clock.now
        self.metrics = metrics
        fwd = cfg.forward
        #: The front door's rules (``policy.routing.dispatch``) over the registry's router.
        self.door = FrontDoor(
            registry.router,
            retries=fwd.retries,
            refusals=cfg.overload.enabled,
            hosts_model=registry.hosts_model,
            models=registry.models,
        )
        self._retry_after_s = cfg.overload.retry_after_s
        #: ``door.retries``, read once per try.
        self._retries = self.door.retries
        self.forwarder: Forwarder = forwarder or PooledForwarder(
            max_connections=fwd.max_connections,
            connect_timeout_s=fwd.connect_timeout_ms / 1000.0,
            request_timeout_s=fwd.request_timeout_s,
            keep_headers=RELAY_RESPONSE_HEADERS,
        )
        self._ids = itertools.count(1)
        #: Each backend's ``x-evenserve-backend`` header line (relayed answers).
        self._backend_lines: dict[str, bytes] = {}
        #: The callback fast path (``gateway.fast_path``; the pooled forwarder's only).
        self.fast_path = FastPath(self)
        self.infer_fast = self.fast_path.infer
        self._decision = metrics.decision
        fwd_ = self.forwarder
        #: The relayed headers a pooled client's answer gives when they are read.
        self._keep = fwd_.keep if isinstance(fwd_, PooledForwarder) else None
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
    # One request is a Forward: admitted (or answered at once), then tried on up to
    # 1 + retries backends: ``pick`` chooses one, the forward happens (awaited in ``infer``,
    # by callback in ``infer_fast``), ``settle`` judges its outcome (an answer, or try the
    # next backend), ``finish`` counts the answer. Both paths share every decision.
    async def infer(self, model: str, path: str, body: bytes, headers: Mapping[str, str]) -> Answer:
        fw = self.admit(model, path, body, headers)
        if isinstance(fw, Answer):
            return self.finish(model, fw, perf_counter())
        if self.missing(model):
            refused = await self.miss(fw)
            if refused is not None:
                return self.finish(model, refused, fw.t0)
        return await self._tries(fw, partial(self._send_http, fw), self.settle)

    def missing(self, model: str) -> bool:
        """Placement is on and no healthy host has ``model`` READY: the miss path first."""
        return self.placement is not None and not self.router.candidates(model)

    async def miss(self, fw: Forward) -> Answer | None:
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
            {"retry-after": str(self._retry_after_s)},
        )

    async def _send_http(self, fw: Forward, name: str) -> Reply:
        return await self.forwarder.request(
            "POST", self.registry.url(name), fw.path, fw.body, fw.headers
        )

    async def _tries(
        self,
        fw: Forward,
        send: Callable[[str], Awaitable[R]],
        settle: Callable[[Forward, str, R | None, ForwardError | None], Answer | None],
    ) -> Answer:
        """The awaited tries of one request (HTTP or gRPC): pick, send, settle, until an
        answer or no backend is left."""
        while True:
            name = self.pick(fw)
            if name is None:
                return self.finish(fw.model, self.exhausted(fw), fw.t0)
            got: R | None = None
            error: ForwardError | None = None
            try:
                got = await send(name)
            except ForwardError as exc:
                error = exc
            finally:
                self.done(name, fw.model, got)
            ans = settle(fw, name, got, error)
            if ans is not None:
                return self.finish(fw.model, ans, fw.t0)

    # -- gRPC ----------------------------------------------------------------------------------
    async def infer_grpc(
        self,
        model: str,
        send: Callable[[str], Awaitable[GrpcReply]],
        exclude: Iterable[str] = (),
        headers: Mapping[str, str] | None = None,
    ) -> Answer:
        """``infer`` for a gRPC call: ``send(name)`` forwards it to backend ``name`` (a
        GrpcReply, or a ForwardError: Unreachable, ResponseTimeout); backends in ``exclude``
        (no gRPC endpoint) are never picked; ``headers``: the call's class and deadline as
        their HTTP headers (``grpc_status.forward_metadata``)."""
        fw = self.admit(model, "", b"", headers or {})
        if isinstance(fw, Answer):
            return self.finish(model, fw, perf_counter())
        fw.tried.extend(exclude)
        if self.missing(model):
            refused = await self.miss(fw)
            if refused is not None:
                return self.finish(model, refused, fw.t0)
        return await self._tries(fw, send, self._settle_grpc)

    def _settle_grpc(
        self, fw: Forward, name: str, got: GrpcReply | None, error: ForwardError | None
    ) -> Answer | None:
        """``settle`` for a gRPC try: judged by its HTTP counterpart; the Answer it gives (or
        keeps to relay) carries the gRPC answer itself."""
        reply = None
        if got is not None:
            reply = Reply(got.status, {wire.REASON_HEADER: got.reason} if got.reason else {}, b"")
        before = fw.relayed
        ans = self.settle(fw, name, reply, error)
        mine = ans if ans is not None else (fw.relayed if fw.relayed is not before else None)
        if mine is not None and got is not None:
            mine.grpc = got
        return ans

    def done(self, name: str, model: str, reply: Reply | HttpReply | GrpcReply | None) -> None:
        """The try on ``name`` is over; a served answer (below 400) teaches the router the
        backend's speed (a quick refusal must not make a host look fast)."""
        if reply is None:
            self.router.done(name, model)
        else:
            now = self._now()
            st = self._states.get(name)
            if st is not None:  # alive, whatever its probes say (poller)
                st.answered_s = now
            self.router.done(name, model, now_s=now if reply.status < 400 else None)
        if self.placement is not None:
            self.placement.done(model, name)

    def admit(
        self, model: str, path: str, body: bytes, headers: Mapping[str, str]
    ) -> Answer | Forward:
        """The answer at once (unknown model, overload), or the request to forward."""
        t0 = perf_counter()
        now = self._now()
        ref = self.door.admit(model, now)
        if self.placement is not None and (ref is None or ref.status != 404):
            self.placement.arrival(model)  # the demand placement reads: refused ones count too
        if ref is not None:
            return refusal_answer(ref, self._retry_after_s)
        values = tuple(map(headers.get, FORWARD_REQUEST_HEADERS))
        req = RequestInfo(next(self._ids), model, now)
        if values[3] is not None or values[4] is not None:
            classify(req, values[3], values[4])
        return new_forward(req, path, body, t0, values)

    def pick(self, fw: Forward) -> str | None:
        """The next backend to try (counted as sent), or None when none is left."""
        if fw.attempt > self._retries:  # no try left: no decision to time
            return None
        # The first try is decided at arrival: the clock is read once for both.
        now = fw.req.arrival_s if fw.attempt == 0 else self._now()
        d0 = perf_counter()
        name = self.door.choose(fw, now)
        took = perf_counter() - d0
        h = self._decision  # Hist.observe, inlined (one call less per request)
        h.counts[bisect_left(h.bounds, took)] += 1
        h.total += took
        if name is None:
            return None
        if fw.attempt > 1:
            self.metrics.retries.labels(fw.model).inc()
        self.router.sent(name, fw.model, now)
        if self.placement is not None:
            self.placement.sent(fw.model, name)
        return name

    def settle(
        self, fw: Forward, name: str, reply: Reply | HttpReply | None, error: ForwardError | None
    ) -> Answer | None:
        """One try's outcome: the answer, or None to try the next backend."""
        if error is not None:
            return self._failed(fw, name, error)
        assert reply is not None
        line = self._backend_lines.get(name)
        if line is None:
            line = self._backend_lines[name] = f"{wire.BACKEND_HEADER}: {name}\r\n".encode()
        status, head, raw = reply.status, reply.head, reply.raw
        if raw is not None:  # relayed_bytes, inlined: the client kept it whole (relayable)
            n = len(head) - 2
            ans = relayed_answer(
                status, reply.body, name, "ok" if status < 400 else outcome_of(status),
                b"".join((raw[:n], line, raw[n:])), n + 2 + len(line), head,
            )  # fmt: skip
        else:  # the pooled client's answer has its head only: the relayed headers from it
            headers = parse_headers(head, self._keep) if isinstance(reply, HttpReply) else None
            ans = Answer(status, reply.body, headers or reply.headers, name, outcome_of(status))
        # Only a refusing status can send the request on (``FrontDoor.judge`` reads those):
        # every other answer is the answer, without the call.
        if status not in REFUSING_STATUSES or self.door.judge(
            fw, name, status, ans.header(wire.REASON_HEADER)
        ):
            return ans
        fw.relayed = ans
        return None

    def tried(
        self, fw: Forward, reply: Reply | HttpReply | None, error: BaseException | None
    ) -> None:
        """A fast-path try on ``fw.backend`` is over (every try's callback,
        ``HttpClient.send_with``): for an answer, ``done``, ``settle`` and ``finish`` in one
        step (the same steps in the same order), then the answer or the next try
        (``FastPath.next_try``); a failure is ``FastPath.failed``'s."""
        if error is not None or reply is None:
            self.fast_path.failed(fw, reply, error)
            return
        name = fw.backend
        model = fw.model
        status = reply.status
        # done
        now = self._now()
        st = self._states.get(name)
        if st is not None:  # alive, whatever its probes say (poller)
            st.answered_s = now
        self.router.done(name, model, 1, now if status < 400 else None)
        if self.placement is not None:
            self.placement.done(model, name)
        # settle
        line = self._backend_lines.get(name)
        if line is None:
            line = self._backend_lines[name] = f"{wire.BACKEND_HEADER}: {name}\r\n".encode()
        head, raw = reply.head, reply.raw
        if raw is not None:  # the client kept it whole (relayable)
            n = len(head) - 2
            ans = relayed_answer(
                status, reply.body, name, "ok" if status < 400 else outcome_of(status),
                b"".join((raw[:n], line, raw[n:])), n + 2 + len(line), head,
            )  # fmt: skip
        else:
            headers = parse_headers(head, self._keep) if isinstance(reply, HttpReply) else None
            ans = Answer(status, reply.body, headers or reply.headers, name, outcome_of(status))
        if status in REFUSING_STATUSES and not self.door.judge(
            fw, name, status, ans.header(wire.REASON_HEADER)
        ):
            fw.relayed = ans
            self.fast_path.next_try(fw)
            return
        # finish (a backend's answer)
        self.metrics.observe_served(name, model, ans.outcome, perf_counter() - fw.t0)
        if raw is None:
            ans.headers[wire.BACKEND_HEADER] = name
        assert fw.answer is not None
        fw.answer(ans)

    def _failed(self, fw: Forward, name: str, error: ForwardError) -> Answer | None:
        """A try that got no answer, judged by the rules: None to try the next backend, or
        the 504 of a backend that has the request and did not answer."""
        if isinstance(error, Unreachable):
            note = str(error)
            kind = CONNECT_REFUSED if note == "connect-refused" else CONNECT_TIMEOUT
        elif isinstance(error, ResponseTimeout):
            kind, note = RESPONSE_TIMEOUT, "timeout"
        else:
            kind, note = CONNECTION_LOST, f"connection lost ({error})"
        j = self.door.failed(fw, name, kind, note)
        if j.eject is not None:
            self.registry.eject(name, j.eject)
        if j.retry:
            return None
        return error_answer(
            504,
            f"backend {name} did not answer within {self.cfg.forward.request_timeout_s:g} s",
            "timeout",
            {wire.BACKEND_HEADER: name},
        )

    def exhausted(self, fw: Forward) -> Answer:
        """Every try failed: the last backend's 429/503 as relayed, or the gateway's 503."""
        ref = self.door.exhausted(fw, partial(self._none_ready, fw.model))
        if ref is None:
            assert fw.relayed is not None
            return fw.relayed
        return refusal_answer(ref, self._retry_after_s)

    def _none_ready(self, model: str) -> str:
        """Why no backend could take ``model``: each host's state there (not the hot path)."""
        states = self.registry.states_of(model)
        return "none is ready: " + ", ".join(f"{n} {s}" for n, s in states.items())

    def finish(self, model: str, ans: Answer, t0: float) -> Answer:
        """Count the answer (by backend, model and outcome; its latency by model)."""
        backend = ans.backend
        if backend is None:
            self.metrics.observe_request(None, model, ans.outcome, perf_counter() - t0)
            return ans
        # A backend's answer: the request was admitted, so its model is one the gateway serves.
        self.metrics.observe_served(backend, model, ans.outcome, perf_counter() - t0)
        if ans.raw is None:
            ans.headers[wire.BACKEND_HEADER] = backend
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
