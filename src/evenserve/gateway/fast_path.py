"""The dispatcher's callback fast path: an inference request forwarded without a task.

The server's fast path (``httpio.server.FastHandler``: ``FastPath.serve``, routed here) and
the gRPC front's translated ModelInfer (``FastPath.infer``, ``Dispatcher.infer_fast``) hand
a request over with a callback: it is admitted, each try is sent on an idle pooled
connection by callback (``HttpClient.send_with``, the request its argument; a try that
finds none runs as a task), judged and answered through the dispatcher's steps
(``Dispatcher.admit``, ``pick``, ``done``, ``settle``, ``finish``), the very ones the
awaited path takes; ``admit``'s are inlined in ``serve``, ``pick``'s in ``next_try``, and
an answer's ``done``, ``settle`` and ``finish`` are one step (``Dispatcher.tried``, the
tries' callback), a failure's are ``FastPath.failed``'s (a Python call costs about as
much as the request path's cheaper steps).
Forwarded heads are made once per backend, path and forwarded-header set, and each
backend's client is looked up once.
"""

from __future__ import annotations

import asyncio
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping
from time import perf_counter
from typing import Protocol

from evenserve.core.types import RequestInfo
from evenserve.gateway.answers import Answer, GrpcReply, refusal_answer
from evenserve.gateway.backends import BackendRegistry
from evenserve.gateway.forward import FORWARD_REQUEST_HEADERS, Forward, classify, new_forward
from evenserve.gateway.forwarder import Forwarder, ForwardError, PooledForwarder, Reply
from evenserve.gateway.placement import PlacementDriver
from evenserve.httpio.client import HttpClient
from evenserve.httpio.client import Reply as HttpReply
from evenserve.httpio.server import Request, Response
from evenserve.metrics.gateway import GatewayMetrics
from evenserve.metrics.hot import Hist
from evenserve.policy.routing.dispatch import FrontDoor
from evenserve.policy.routing.router import Router


class Steps(Protocol):
    """What the fast path reads of its dispatcher (``gateway.dispatcher.Dispatcher``, which
    makes it): its state and its steps, named here so that this module does not import the
    dispatcher's."""

    @property
    def registry(self) -> BackendRegistry: ...
    @property
    def router(self) -> Router: ...
    @property
    def metrics(self) -> GatewayMetrics: ...
    @property
    def door(self) -> FrontDoor: ...
    @property
    def forwarder(self) -> Forwarder: ...
    @property
    def placement(self) -> PlacementDriver | None: ...
    @property
    def _now(self) -> Callable[[], float]: ...
    @property
    def _ids(self) -> Iterator[int]: ...
    @property
    def _decision(self) -> Hist: ...
    @property
    def _retries(self) -> int: ...
    @property
    def _retry_after_s(self) -> int: ...

    def admit(
        self, model: str, path: str, body: bytes, headers: Mapping[str, str]
    ) -> Answer | Forward: ...

    def missing(self, model: str) -> bool: ...

    async def miss(self, fw: Forward) -> Answer | None: ...

    def done(self, name: str, model: str, reply: Reply | HttpReply | GrpcReply | None) -> None: ...

    def settle(
        self, fw: Forward, name: str, reply: Reply | HttpReply | None, error: ForwardError | None
    ) -> Answer | None: ...

    def tried(
        self, fw: Forward, reply: Reply | HttpReply | None, error: BaseException | None
    ) -> None: ...

    def exhausted(self, fw: Forward) -> Answer: ...

    def finish(self, model: str, ans: Answer, t0: float) -> Answer: ...


#: The head cache's size before it starts over (``FastPath.next_try``).
FORWARD_HEADS = 1024
_LENGTH_ZERO = b"content-length: 0\r\n\r\n"


class _Head:
    """A backend's client and the forwarded head up to its Content-Length, for one path and
    set of forwarded headers, and the last whole head made from it (for ``length``)."""

    __slots__ = ("client", "head", "length", "prefix")

    def __init__(self, client: HttpClient, prefix: bytes) -> None:
        self.client = client
        self.prefix = prefix
        self.length = -1
        self.head = b""


class FastPath:
    """One dispatcher's callback driver: its pooled clients and forwarded heads."""

    def __init__(self, dispatcher: Steps) -> None:
        self.d = dispatcher
        #: Each backend's client and the forwarded request head up to its Content-Length, by
        #: backend, path and forwarded headers (a client sends few kinds of request): made
        #: once, not per request.
        self._heads: dict[tuple[str, str, tuple[str | None, ...]], _Head] = {}
        #: Each backend's pooled HTTP client.
        self._clients: dict[str, HttpClient] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        #: ``Dispatcher.tried`` bound once: every try's callback (``HttpClient.send_with``),
        #: the request's ``Forward`` its argument.
        self._tried_cb = dispatcher.tried
        #: ``serve``'s inference routes (``Gateway._infer_routes``) and the function that
        #: splits a path not among them (``Gateway._infer_route``); none until ``routes``.
        self._routes: Mapping[str, tuple[str, str]] = {}
        self._route: Callable[[str], tuple[str, str] | None] = lambda _path: None

    def routes(
        self,
        known: Mapping[str, tuple[str, str]],
        split: Callable[[str], tuple[str, str] | None],
    ) -> None:
        """What ``serve`` routes by: inference paths split before (read in place, as they
        are added) and the function that splits another (None: not an inference route)."""
        self._routes, self._route = known, split

    async def _miss_then_try(self, fw: Forward) -> None:
        d = self.d
        assert fw.answer is not None
        refused = await d.miss(fw)
        if refused is not None:
            fw.answer(d.finish(fw.model, refused, fw.t0))
        else:
            self.next_try(fw)

    def infer(
        self,
        model: str,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        answer: Callable[[Answer], None],
    ) -> None:
        """``Dispatcher.infer`` without a task or coroutines (the server's fast path):
        ``answer`` is called once with the Answer. Needs the pooled forwarder; a try that
        finds no idle connection to its backend runs as a task (``_try_async``)."""
        d = self.d
        fw = d.admit(model, path, body, headers)
        if isinstance(fw, Answer):
            answer(d.finish(model, fw, time.perf_counter()))
            return
        fw.answer = answer
        if d.placement is not None and d.missing(model):
            task = asyncio.get_running_loop().create_task(self._miss_then_try(fw))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        self.next_try(fw)

    def serve(self, request: Request, respond: Callable[[Response], None]) -> bool:
        """The server's fast handler (``httpio.server.FastHandler``) of a gateway without a
        request log (``Gateway.fast``): a POST to an inference route is ``infer``'s, read
        off the request in the same call (``Dispatcher.admit``'s steps inlined); any other
        request is not taken (False)."""
        if request.method != "POST":
            return False
        path = request.path
        route = self._routes.get(path) or self._route(path)
        if route is None:
            return False
        model, path = route
        d = self.d
        # Dispatcher.admit, inlined (one call less per request)
        t0 = perf_counter()
        now = d._now()
        ref = d.door.admit(model, now)
        if d.placement is not None and (ref is None or ref.status != 404):
            d.placement.arrival(model)  # the demand placement reads: refused ones count too
        if ref is not None:
            respond(d.finish(model, refusal_answer(ref, d._retry_after_s), perf_counter()))
            return True
        values = tuple(map(request.headers.get, FORWARD_REQUEST_HEADERS))
        req = RequestInfo(next(d._ids), model, now)
        if values[3] is not None or values[4] is not None:
            classify(req, values[3], values[4])
        fw = new_forward(req, path, request.body, t0, values)
        fw.answer = respond
        if d.placement is not None and d.missing(model):
            task = asyncio.get_running_loop().create_task(self._miss_then_try(fw))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return True
        self.next_try(fw)
        return True

    def next_try(self, fw: Forward) -> None:
        """The request's next try (``Dispatcher.pick``, in this call: the same steps), or
        its answer when no backend is left."""
        d = self.d
        assert fw.answer is not None
        # Dispatcher.pick, inlined (one call less per request)
        name = None
        attempt = fw.attempt
        if attempt <= d._retries:  # else no try left: no decision to time
            # The first try is decided at arrival: the clock is read once for both.
            now = fw.req.arrival_s if attempt == 0 else d._now()
            d0 = perf_counter()
            name = d.door.choose(fw, now)
            took = perf_counter() - d0
            h = d._decision  # Hist.observe, inlined
            h.counts[bisect_left(h.bounds, took)] += 1
            h.total += took
            if name is not None:
                if fw.attempt > 1:
                    d.metrics.retries.labels(fw.model).inc()
                d.router.sent(name, fw.model, now)
                if d.placement is not None:
                    d.placement.sent(fw.model, name)
        if name is None:
            fw.answer(d.finish(fw.model, d.exhausted(fw), fw.t0))
            return
        key = (name, fw.path, fw.head_key)
        known = self._heads.get(key)
        if known is None:
            client = self._clients.get(name)
            if client is None:
                fwd = d.forwarder
                assert isinstance(fwd, PooledForwarder)
                client = self._clients[name] = fwd.client(d.registry.url(name))
            prefix = client.head("POST", fw.path, fw.headers, 0)[: -len(_LENGTH_ZERO)]
            if len(self._heads) >= FORWARD_HEADS:
                self._heads.clear()
            known = self._heads[key] = _Head(client, prefix)
        client = known.client
        n = len(fw.body)
        if n == known.length:  # a client sends bodies of one size, mostly: made once
            head = known.head
        else:
            head = known.head = b"%scontent-length: %d\r\n\r\n" % (known.prefix, n)
            known.length = n
        fw.backend = name
        if not client.send_with(head, fw.body, self._tried_cb, fw):
            task = asyncio.get_running_loop().create_task(self._try_async(fw))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _try_async(self, fw: Forward) -> None:
        d = self.d
        try:
            reply = await d.forwarder.request(
                "POST", d.registry.url(fw.backend), fw.path, fw.body, fw.headers
            )
        except ForwardError as exc:
            self.failed(fw, None, exc)
        else:
            self.d.tried(fw, reply, None)

    def failed(
        self, fw: Forward, reply: Reply | HttpReply | None, error: BaseException | None
    ) -> None:
        """A try on ``fw.backend`` got no answer (``Dispatcher.tried`` hands it over): judged,
        then the answer or the next try."""
        d = self.d
        name = fw.backend
        d.done(name, fw.model, reply)
        if error is None:
            ans = d.settle(fw, name, reply, None)
        elif isinstance(error, ForwardError):
            ans = d.settle(fw, name, reply, PooledForwarder.sorted_error(error))
        else:
            raise error  # not a forwarding failure: a bug, not an outcome
        if ans is None:
            self.next_try(fw)
        else:
            assert fw.answer is not None
            fw.answer(d.finish(fw.model, ans, fw.t0))
