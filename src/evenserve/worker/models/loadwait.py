"""Waiting for a load: an inference request for a model being loaded (LOADING) waits for the
load to end, at most ``--load-wait-ms``, then runs as any other; past the bound, or when the
load fails or the worker shuts down meanwhile, it is answered 503 (``LoadWaitError``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from evenserve.core.errors import EvenserveError
from evenserve.worker.options import WorkerOptions


class LoadWaitError(EvenserveError):
    """An inference request waited for its model's load in vain (503): the model is still
    loading after ``--load-wait-ms`` (``retry_after_s`` set), or the load failed or the worker
    began shutting down meanwhile (the message says which)."""

    def __init__(self, message: str, waited_s: float, retry_after_s: float | None = None):
        super().__init__(message)
        self.waited_s = waited_s
        self.retry_after_s = retry_after_s


class LoadWatch:
    """One load in progress, for the requests waiting for it: set once it ends (``error``:
    why it failed, None when the model is READY)."""

    __slots__ = ("error", "event", "expected_s", "started_s", "waiting")

    def __init__(self, expected_s: float | None) -> None:
        self.event = asyncio.Event()
        self.error: str | None = None
        self.started_s = time.perf_counter()
        #: How long the load should take, when the runtime says (emulated models).
        self.expected_s = expected_s
        #: Requests waiting for it now.
        self.waiting = 0

    def finish(self, error: str | None) -> None:
        if not self.event.is_set():
            self.error = error
            self.event.set()


class LoadWaits(dict[str, LoadWatch]):
    """The loads in progress (model control), by model, which inference requests may wait
    for; ``observe_wait(model, seconds)`` counts each wait."""

    def __init__(self, options: WorkerOptions, observe_wait: Callable[[str, float], None]):
        super().__init__()
        self.options = options
        self.observe_wait = observe_wait

    def waiting(self, name: str) -> int:
        """How many inference requests wait for the load of ``name`` now."""
        watch = self.get(name)
        return 0 if watch is None else watch.waiting

    async def wait(self, name: str) -> float:
        """Wait for the load of model ``name`` to end, at most ``load_wait_s``; the seconds
        waited (0.0 at once when no load of it is in progress). LoadWaitError (503) when it
        is still loading after the bound, when the load failed (its error), when the worker
        began shutting down. The wait is observed in ``evenserve_load_wait_seconds``."""
        watch = self.get(name)
        if watch is None:
            return 0.0
        bound = self.options.load_wait_s
        t0 = time.perf_counter()
        if not watch.event.is_set():
            watch.waiting += 1
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(watch.event.wait(), max(bound, 0.0))
            finally:
                watch.waiting -= 1
        waited = time.perf_counter() - t0
        self.observe_wait(name, waited)
        if not watch.event.is_set():
            left = None
            if watch.expected_s is not None:
                left = watch.started_s + watch.expected_s - time.perf_counter()
            raise LoadWaitError(
                f"model {name!r} is still loading after {bound * 1000.0:g} ms",
                waited,
                retry_after_s=max(1.0, left or 1.0),
            )
        if watch.error is not None:
            raise LoadWaitError(watch.error, waited)
        return waited

    def finish_all(self, error: str) -> None:
        """Every request waiting for a load is answered ``error`` (the worker shuts down)."""
        for watch in self.values():
            watch.finish(error)
