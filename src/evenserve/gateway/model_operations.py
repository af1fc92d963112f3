"""The loads and unloads the placement driver has under way on the workers, and what the
router is told meanwhile.

Each is a POST to a worker's model-control API, run as a task. While one is under way the
model's state on that device (LOADING, UNLOADING) is written over what the backend's index
says (``override``, the registry's ``index_override``: an index read just before the worker
began must not make an unloading model routable again), and the requests waiting for a load
wait on its future (``waiter``: None once READY, else why not). A device lost meanwhile
(``lose``) bumps its generation: an answer to an operation begun before is stale, and the
requests waiting for a load there are answered ``Lost`` (the driver places the model again).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from evenserve.gateway.backends import BackendRegistry
from evenserve.gateway.placement_counters import PlacementCounters, bump
from evenserve.policy.placement import LOADING, UNLOADING, Load, Unload

#: The placement driver's logger: these are its lines.
log = logging.getLogger("evenserve.gateway.placement")
#: POST ``path`` on backend ``name``: (status, body); raises on a lost connection.
Post = Callable[[str, str], Awaitable[tuple[int, bytes]]]


class Lost(str):
    """A load's answer when its device was lost meanwhile: the request places it again."""


@dataclass
class ModelOperations:
    registry: BackendRegistry
    post: Post
    counters: PlacementCounters
    #: A future per load decided (model, device): None when READY, else the error.
    waiters: dict[tuple[str, str], asyncio.Future[str | None]] = field(default_factory=dict)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    #: Loads and unloads under way, (device, model) -> LOADING | UNLOADING.
    under_way: dict[tuple[str, str], str] = field(default_factory=dict)
    #: Per device, bumped when it is lost: a load or unload begun before answers nothing.
    generation: dict[str, int] = field(default_factory=dict)

    def begin(self, a: Load | Unload, run: Coroutine[Any, Any, None]) -> None:
        """Count ``a``, mark it under way (a load's waiters get their future) and run it."""
        key = (a.device, a.model)
        if isinstance(a, Unload):
            bump(self.counters.evictions, key)
            state = UNLOADING
        else:
            bump(self.counters.loads, key)
            self.waiter(a.model, a.device)
            state = LOADING
        self.under_way[key] = state
        self.set_state(a.device, a.model, state)
        task = asyncio.get_running_loop().create_task(run)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def load(self, a: Load, done: Callable[[Load, str | None], None]) -> None:
        """POST the load; then ``done(a, None)`` when the worker loaded it, ``done(a, why
        not)`` when not, nothing when its device was lost meanwhile (its waiters were
        answered then)."""
        path = f"/v2/repository/models/{a.model}/load"
        gen = self.generation.get(a.device, 0)
        body = b""
        try:
            status, body = await self.post(a.device, path)
            err = (
                None
                if status < 300
                else f"answered {status}: {body[:300].decode(errors='replace')}"
            )
        except Exception as exc:  # a lost connection: the load did not happen
            err = f"{type(exc).__name__} {exc}"
        if self.generation.get(a.device, 0) != gen:
            return
        self.under_way.pop((a.device, a.model), None)
        if err is None:
            self._count_source(body)
        done(a, err)

    def _count_source(self, body: bytes) -> None:
        """The worker's load reply says where the load came from (host: its warm pool)."""
        sources = self.counters.live_sources
        with contextlib.suppress(ValueError, AttributeError):
            source = json.loads(body or b"{}").get("load_source")
            if source in sources:
                sources[source] += 1

    async def unload(self, a: Unload, done: Callable[[Unload], None]) -> None:
        """POST the unload; then ``done(a)`` whatever the answer (a worker gone took the
        model with it), nothing when its device was lost meanwhile (the controller forgot
        its residents then)."""
        path = f"/v2/repository/models/{a.model}/unload"
        gen = self.generation.get(a.device, 0)
        try:
            status, _ = await self.post(a.device, path)
            if status >= 300:
                log.warning("placement: unload of %s on %s answered %d", a.model, a.device, status)
        except Exception as exc:  # the worker is gone: so is the model
            log.warning("placement: unload of %s on %s: %s", a.model, a.device, exc)
        if self.generation.get(a.device, 0) != gen:
            return
        self.under_way.pop((a.device, a.model), None)
        done(a)

    def busy(self, dev: str) -> bool:
        """Whether a load or unload is under way on ``dev``."""
        return any(d == dev for d, _ in self.under_way)

    def waiter(self, model: str, dev: str) -> asyncio.Future[str | None]:
        key = (model, dev)
        fut = self.waiters.get(key)
        if fut is None or fut.done():
            fut = self.waiters[key] = asyncio.get_running_loop().create_future()
        return fut

    def answer(self, model: str, dev: str, result: str | None) -> None:
        """The requests waiting for the load of ``model`` on ``dev`` get ``result``."""
        fut = self.waiters.pop((model, dev), None)
        if fut is not None and not fut.done():
            fut.set_result(result)

    def override(self, dev: str, index: dict[str, str]) -> dict[str, str]:
        ops = [(m, s) for (d, m), s in self.under_way.items() if d == dev]
        if not ops:
            return index
        out = dict(index)
        for m, s in ops:
            out[m] = s
        return out

    def set_state(self, dev: str, model: str, state: str | None) -> None:
        """Tell the router ``model``'s state on ``dev`` (None: not there) at once."""
        st = self.registry.states.get(dev)
        if st is None:
            return
        epochs = self.registry.index_epochs
        epochs[dev] = epochs.get(dev, 0) + 1
        index = dict(st.index)
        if state is None:
            index.pop(model, None)
        else:
            index[model] = state
        self.registry.set_index(dev, index)

    def forget_index(self, dev: str, read_again: bool) -> None:
        """``dev`` hosts nothing routable now; ``read_again``: its next index is read whatever
        its models version (what it hosts is unknown)."""
        st = self.registry.states.get(dev)
        if st is None:
            return
        epochs = self.registry.index_epochs
        epochs[dev] = epochs.get(dev, 0) + 1
        self.registry.set_index(dev, {})
        if read_again:
            st.index_version, st.index_read_s = None, -math.inf

    def lose(self, dev: str, reason: str) -> None:
        """``dev`` was lost: its operations' answers are stale, its loads' waiters answered."""
        self.generation[dev] = self.generation.get(dev, 0) + 1
        for key in [k for k in self.under_way if k[0] == dev]:
            del self.under_way[key]
        for key in [k for k in self.waiters if k[1] == dev]:
            fut = self.waiters.pop(key)
            if not fut.done():
                fut.set_result(Lost(f"{dev} was lost while loading model {key[0]!r} ({reason})"))
