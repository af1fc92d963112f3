"""Generations on the worker's driver: an LLM request queued with its model's engine, its
tokens delivered on the event loop as each step ends (sans the HTTP layer).

``GenerationDriver`` is the batcher driver with engines: ``add_engine`` hosts one on the
device scheduler, ``submit_generation`` offers a generation (refused at once like any
request: ``queue-full``, ``context-too-long``, ``draining``), and a step's end, on the
device thread, advances the engine and posts the step's tokens to the loop, where each
request's ``GenerationSink`` gets them in order. The request's future resolves once, with
its finish reason, when its last token is delivered; a drop (shutdown) fails it; cancelling
it (its caller went away, a stop string matched) takes the sequence out of the engine and
frees its KV blocks at once (the driver's own cancel path). The sequences the engine let go
reach the step runner as ``free`` on the device thread before the next step.
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass, field
from typing import Any

from evenserve.policy.placement.engine import UtilizationMeter
from evenserve.sched import DRAINING
from evenserve.sched.engine import TOO_LONG, EngineSetup, GenSpec, TokenEvent
from evenserve.worker.batch import BatchResult, PendingRequest, RunningBatch
from evenserve.worker.driver import BatchDriver
from evenserve.worker.refusals import (
    BatchFailedError,
    DrainingError,
    RefusedError,
    UnknownModelError,
)


@dataclass
class GenerationSink:
    """Where a generation's tokens arrive, on the loop, in order; after the last token
    nothing more, or the error its request ended with (``ended``)."""

    events: asyncio.Queue[TokenEvent[Any] | BaseException] = field(default_factory=asyncio.Queue)
    prompt_tokens: int = 0

    def ended(self, fut: asyncio.Future[Any]) -> None:
        """The request's future is done: its error (a drop, a failed step, a cancel) follows
        the tokens already delivered; a result (the finish reason) came with the last one."""
        if fut.cancelled():
            self.events.put_nowait(asyncio.CancelledError())
            return
        exc = fut.exception()
        if exc is not None:
            self.events.put_nowait(exc)


class GenerationDriver(BatchDriver):
    """The batcher driver, with LLM engines (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Per model, how long after its step a token becomes visible (an emulated model:
        #: its step profile's CPU per output token, which the simulator applies too; a real
        #: model's CPU is real).
        self.token_delay_s: dict[str, float] = {}
        #: The device's load as placement reads it (``policy.placement.engine``): classic
        #: batches' and engine steps' device-seconds counted as they start, as the
        #: simulator's device counts them.
        self.meter = UtilizationMeter(float(kwargs.get("utilization_window_s", 1.0)))
        #: Whether this worker has LLMs (awake or asleep): its load report then carries
        #: ``engine_utilization``.
        self.hosts_llms = False

    def add_engine(
        self,
        name: str,
        setup: EngineSetup,
        num_blocks: int | None,
        priority: int,
        token_delay_s: float = 0.0,
    ) -> int:
        """Host an engine for ``name``; returns its KV blocks."""
        self.token_delay_s[name] = token_delay_s
        with self.lock:
            host = self.sched.add_engine(name, setup, self.clock.now(), num_blocks, priority)
            return host.engine.kv.num_blocks

    def remove_engine(self, name: str) -> None:
        """Stop hosting ``name``'s engine (put to sleep): its weights and KV blocks leave the
        device. ValueError unless ``drain_engine`` left it idle."""
        with self.lock:
            self.sched.remove_engine(name, self.clock.now())

    def model_idle(self, model: str) -> bool:
        """Nothing of ``model`` queued or running; an engine: no sequence waiting or
        running and no step of it in flight."""
        with self.lock:
            host = self.sched.engines.get(model)
            if host is not None:
                return not (host.in_flight or host.engine.has_work)
        return super().model_idle(model)

    async def drain_engine(self, model: str, timeout_s: float | None = None) -> int:
        """Wait until ``model``'s engine has no sequence (the caller refuses new ones
        meanwhile); after ``timeout_s`` its sequences still waiting or running are dropped
        (their callers get DrainingError) and the step in flight is waited for. Returns how
        many were dropped so."""
        self._bind_loop()
        return await self._drain(model, timeout_s)

    def submit_generation(
        self,
        model: str,
        spec: GenSpec,
        *,
        priority: int,
        deadline_in_s: float | None = None,
    ) -> PendingRequest:
        """Queue one generation; its tokens go to ``request.payload`` (a GenerationSink), its
        future resolves once with the finish reason. Raises on refusal as ``submit`` does."""
        self._bind_loop()
        with self.lock:
            if model not in self.sched.engines:
                raise UnknownModelError(f"model {model!r} is not served here")
            if self.sched.draining:
                raise DrainingError("the worker is shutting down and accepts no new requests")
            now = self.clock.now()
            sink = GenerationSink(prompt_tokens=len(spec.prompt))
            req = PendingRequest(
                request_id=next(self._ids),
                model=model,
                arrival_s=now,
                priority=priority,
                deadline_s=None if deadline_in_s is None else now + deadline_in_s,
                payload=sink,
            )
            fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            req.future = fut
            reason = self.sched.offer_generation(req, spec, now)
            if reason is not None:
                fut.cancel()
                if reason == DRAINING:
                    raise DrainingError("the worker is shutting down and accepts no new requests")
                if reason == TOO_LONG:
                    raise ValueError(
                        f"model {model!r}: the prompt and max_tokens need more context than "
                        "the model's length or its KV blocks hold"
                    )
                self.observer.request_dropped(model, reason, 0.0)
                engine = self.sched.engines[model].engine
                wait = engine.num_waiting * engine.next_step_s()
                raise RefusedError(
                    reason,
                    f"model {model!r}: queue full ({engine.num_waiting} generations waiting); "
                    f"retry after {wait:.3f} s",
                    wait,
                )
            fut.add_done_callback(functools.partial(self._on_future_done, req))
            fut.add_done_callback(sink.ended)
            return req

    def start_batch(self, batch: RunningBatch) -> None:
        """An engine step runs without the classic batch observer (its figures are the
        engine's: ``metrics.llm``); a classic batch as ever. Both count in ``meter``."""
        if batch.step is None:
            self.meter.classic(batch.solo_s)
            super().start_batch(batch)
            return
        self.meter.step(batch.solo_s)
        self._executor.start(batch, functools.partial(self._batch_done, batch))

    def engine_utilization(self, now: float) -> float:
        """The device's load for placement now (under the lock): the classic batches' busy
        fraction plus the engines' step time over their TPOT target, or their KV use if
        higher (``policy.placement.engine.engine_utilization``), over the meter's window."""
        engines = self.sched.engines.values()
        tpots = [h.engine.setup.tpot_s for h in engines if h.engine.setup.tpot_s]
        kv = max((h.engine.kv.usage() for h in engines), default=0.0)
        return self.meter.read(now, min(tpots) if tpots else None, kv)

    def take_free(self, model: str) -> list[int]:
        """The seq ids whose executor caches ``model``'s engine let go (under the lock)."""
        host = self.sched.engines.get(model)
        if host is None or not host.engine.to_free:
            return []
        out = list(host.engine.to_free)
        host.engine.to_free.clear()
        return out

    def _batch_done(self, batch: RunningBatch, result: BatchResult) -> None:
        if batch.step is None:
            super()._batch_done(batch, result)
            return
        with self.lock:
            now = self.clock.now()
            took = self._took(batch, result, now)
            sampled = result.sampled if result.error is None else None
            self.sched.finished(batch, now, took, sampled)
            events = batch.events or []
            failed = result.error
        delay = self.token_delay_s.get(batch.model, 0.0)
        if failed is not None:
            self._post(self._fail_step, batch, failed)
        elif delay > 0:  # the step profile's CPU per output token, off the device's clock
            deliver = functools.partial(self._deliver, events, batch, now)
            self._post(self._timer_service.call_at, now + delay, deliver)
        else:
            self._post(self._deliver, events, batch, now)
        self._post(self._notify_if_idle)

    def _deliver(self, events: list[TokenEvent[Any]], batch: RunningBatch, now: float) -> None:
        """On the loop: each token to its request's sink; a last token resolves its future."""
        for ev in events:
            r: PendingRequest = ev.req
            fut = r.future
            if fut is None or fut.done():
                continue
            sink = r.payload
            assert isinstance(sink, GenerationSink)
            sink.events.put_nowait(ev)
            if ev.finish is not None:
                fut.set_result(ev.finish)

    def _fail_step(self, batch: RunningBatch, error: str) -> None:
        """On the loop: a step failed (a real model raised): its sequences are taken out and
        their callers get the error."""
        with self.lock:
            now = self.clock.now()
            for r in batch.requests:
                self.sched.cancel(r, now)
        for r in batch.requests:
            fut = r.future
            if fut is not None and not fut.done():
                fut.set_exception(BatchFailedError(error))
