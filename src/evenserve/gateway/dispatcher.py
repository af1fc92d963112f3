"""The dispatcher: pick a backend with the routing policy, forward, retry once, answer once.

Theory of operation. For one request to model m:
1. Unknown model (no configured backend hosts it): 404, naming the known models.
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
   reach a backend is retried once on another host: connection refused or connect timeout
   (the backend is also ejected at once; the poller readmits it when it answers again), or a
   connection dropped before any response (a killed worker; inference is side-effect free,
   so a second try is safe; no ejection here, the poller decides within one period). A read
   timeout means the backend has the request and is stuck: eject it and answer 504 without
   a retry (the work may still finish there).
7. If every try failed, the client gets the last backend's 429/503 as relayed, or the
   gateway's own 503 with the reasons. Exactly one response per accepted request.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass

from evenserve.core import wire
from evenserve.core.clock import Clock
from evenserve.core.types import RequestInfo
from evenserve.gateway.backends import BackendRegistry
from evenserve.gateway.config import GatewaySection
from evenserve.gateway.forwarder import (
    AiohttpForwarder,
    ConnectionLost,
    Forwarder,
    ForwardError,
    ResponseTimeout,
    Unreachable,
)
from evenserve.metrics.gateway import GatewayMetrics

#: Request headers forwarded to the backend (lower case); others are hop-by-hop or ours.
FORWARD_REQUEST_HEADERS = (
    "content-type",
    wire.HEADER_LENGTH_HEADER.lower(),
    "content-encoding",
    wire.PRIORITY_HEADER,
    wire.DEADLINE_HEADER,
)
#: Response headers relayed to the client.
RELAY_RESPONSE_HEADERS = (
    "content-type",
    wire.HEADER_LENGTH_HEADER.lower(),
    "content-encoding",
    wire.RETRY_AFTER_HEADER,
    wire.REASON_HEADER,
)


@dataclass(slots=True)
class Answer:
    """What the gateway sends back: exactly one per request."""

    status: int
    body: bytes
    headers: dict[str, str]
    backend: str | None
    outcome: str


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
        self.router = registry.router
        self.cfg = cfg
        self.clock = clock
        self.metrics = metrics
        fwd = cfg.forward
        self.forwarder: Forwarder = forwarder or AiohttpForwarder(
            max_connections=fwd.max_connections,
            connect_timeout_s=fwd.connect_timeout_ms / 1000.0,
            request_timeout_s=fwd.request_timeout_s,
            keep_headers=RELAY_RESPONSE_HEADERS,
        )
        self._ids = itertools.count(1)
        self._decision = metrics.decision

    async def aclose(self) -> None:
        await self.forwarder.aclose()

    # -- the hot path -----------------------------------------------------------------------
    async def infer(self, model: str, path: str, body: bytes, headers: Mapping[str, str]) -> Answer:
        t0 = time.perf_counter()
        ans = await self._infer(model, path, body, headers)
        self.metrics.requests.labels(ans.backend or "none", model, ans.outcome).inc()
        self.metrics.latency.labels(model).observe(time.perf_counter() - t0)
        if ans.backend is not None:
            ans.headers[wire.BACKEND_HEADER] = ans.backend
        return ans

    async def _infer(
        self, model: str, path: str, body: bytes, headers: Mapping[str, str]
    ) -> Answer:
        if not self.registry.hosts_model(model):
            return error_answer(
                404,
                f"unknown model {model!r} (served: {', '.join(self.registry.models())})",
                "unknown_model",
            )
        ov = self.cfg.overload
        why = self.router.refusal(model, self.clock.now()) if ov.enabled else None
        if why is not None:
            return error_answer(
                429,
                f"{why}; retry later",
                wire.OVERLOADED,
                {"retry-after": str(ov.retry_after_s), wire.REASON_HEADER: wire.OVERLOADED},
            )
        fwd_headers = {"accept-encoding": "identity"}
        fwd_headers.update((h, headers[h]) for h in FORWARD_REQUEST_HEADERS if h in headers)
        req = RequestInfo(request_id=next(self._ids), model=model, arrival_s=self.clock.now())
        tried: list[str] = []
        failures: list[str] = []
        relayed: Answer | None = None
        for attempt in range(1 + self.cfg.forward.retries):
            d0 = time.perf_counter()
            view = self.router.choose(req, self.clock.now(), exclude=tried)
            self._decision.observe(time.perf_counter() - d0)
            if view is None:
                break
            name = view.name
            tried.append(name)
            if attempt > 0:
                self.metrics.retries.labels(model).inc()
            self.router.sent(name, model, self.clock.now())
            answered = False  # served: the router learns the backend's speed from it
            try:
                url = self.registry.url(name) + path
                reply = await self.forwarder.request("POST", url, body, fwd_headers)
                answered = reply.status < 400
            except Unreachable as exc:
                self.registry.eject(name, str(exc))
                failures.append(f"{name}: {exc}")
                continue
            except ConnectionLost as exc:
                failures.append(f"{name}: connection lost ({exc})")
                continue
            except ResponseTimeout:
                self.registry.eject(name, "timeout")
                return error_answer(
                    504,
                    f"backend {name} did not answer within "
                    f"{self.cfg.forward.request_timeout_s:g} s",
                    "timeout",
                    {wire.BACKEND_HEADER: name},
                )
            finally:
                self.router.done(name, model, now_s=self.clock.now() if answered else None)
            ans = Answer(reply.status, reply.body, reply.headers, name, outcome_of(reply.status))
            if reply.status in (429, 503) and reply.headers.get(wire.REASON_HEADER) != wire.SHED:
                relayed = ans
                failures.append(f"{name}: answered {reply.status}")
                continue
            return ans
        if relayed is not None:
            return relayed
        what = "; ".join(failures) if failures else "none is ready"
        return error_answer(
            503,
            f"no backend available for model {model!r} ({what})",
            "unavailable",
            {"retry-after": str(self.cfg.overload.retry_after_s)},
        )

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
                    self.registry.url(name) + path,
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
