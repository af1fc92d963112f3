"""Where each LLM of a worker is: awake (its engine on the device: weights and KV cache),
asleep (weights in host memory, no KV cache: vLLM's sleep mode level 1) or on disk; and the
sleep and wake the gateway's placement asks for through the repository extension's
``load`` / ``unload`` (design 0022).

- **wake** (``load`` of an LLM asleep or on disk): the model is LOADING (its requests wait
  for the load, ``models.loadwait``, as a classic model's do), the emulated load takes its
  folder's ``placement.warm_load_ms`` from host memory or ``cold_load_ms`` from disk, then
  its engine joins the device scheduler with ``placement.kv_tokens`` of KV blocks and it is
  READY. The answer carries ``load_source`` (``host`` / ``disk``) and ``load_seconds``, as a
  classic load's. A device whose memory account cannot hold the engine's weights and KV
  cache (the memory not resident or reserved) refuses it (400), as for a classic load.
- **sleep** (``unload`` of an awake LLM): UNLOADING at once (new requests are refused with
  503 as for a classic model being unloaded), its sequences finish (after the drain timeout
  the rest are dropped), its engine leaves the scheduler (weights and KV blocks off the
  device), and it is UNAVAILABLE (``asleep``): a request for it is answered as a classic
  model that is not loaded (404) until it is woken.

Sleep and wake are emulated (a ``runtime: emulated`` folder with a ``placement:`` section);
an LLM without one is served awake for the worker's life and refuses both (400).

**The host's warm pool** (the worker's ``--host-pool``, shared by the workers of a host;
``runtime.host_pool``). The placement controller plans with one warm pool per cluster: a
model that slept or was loaded anywhere wakes warm on any device while the pool holds it
(the weights in host memory: vLLM's sleep mode keeps them in the engine's process, and a
fresh engine reads a file the page cache holds at memory speed). Without a pool the worker
knew only its own LLMs: one on disk here loaded cold although another worker had put it to
sleep a minute before, so a device the autoscaler turned on for a burst took the cold load
(20 s) where the controller had planned the wake (1.5 s). With a pool:

- a wake of an LLM on disk here is warm when the pool holds its entry (``take``: keyed by
  its model.yaml and its profile's weights), else cold;
- every wake and every sleep keeps the entry (``put``: written if missing, else the most
  recently used), as the controller's pool makes a model warm at each load and unload;
- an LLM asleep here wakes warm as before (its own process holds it);
- at the worker's stop every LLM awake here is kept (``keep_awake``): the controller makes
  a stopped device's residents warm.

The entry is counted at the weights' bytes in the pool (its room and LRU order follow the
controller's) but takes no host memory (``reserves=False``): the emulation holds no weights
in host memory while asleep, and an 8B model's 15 GiB would not fit a small host.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from evenserve.core.llm import GIB
from evenserve.runtime.host_pool import HostPool, digest
from evenserve.worker.llm.generation import GenerationDriver
from evenserve.worker.llm.hosting import LlmModel
from evenserve.worker.models.loadwait import LoadWaits, LoadWatch
from evenserve.worker.models.registry import (
    LOADING,
    READY,
    UNAVAILABLE,
    UNLOADING,
    ModelState,
    ModelStates,
)

log = logging.getLogger("evenserve.worker.service")

AWAKE = "device"
ASLEEP = "host"
ON_DISK = "disk"
#: A sleeping or unloaded LLM's state reason in the repository index.
ASLEEP_REASON = "asleep (weights in host memory)"
ON_DISK_REASON = "not loaded (on disk)"


def _empty_entry(path: Path) -> None:
    """An emulated LLM's pool entry: an empty file (the pool counts its bytes)."""
    path.write_bytes(b"")


class LlmResidencyError(Exception):
    """A sleep or wake that cannot be done; ``status`` its HTTP status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class LlmResidency:
    """Each LLM's place and its sleep and wake (module docstring)."""

    def __init__(
        self,
        llms: Mapping[str, LlmModel],
        awake: set[str],
        states: ModelStates,
        loads: LoadWaits,
        driver: Callable[[], GenerationDriver],
        drain_timeout_s: float | None,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        pool: HostPool | None = None,
    ) -> None:
        self.llms = dict(llms)
        self.where: dict[str, str] = {n: AWAKE if n in awake else ON_DISK for n in llms}
        self.states = states
        self.loads = loads
        self._driver = driver
        self.drain_timeout_s = drain_timeout_s
        self._sleep = sleep
        self.pool = pool

    def placeable(self, name: str) -> bool:
        """Whether ``name`` is an LLM that may be put to sleep and woken here."""
        m = self.llms.get(name)
        return (
            m is not None
            and m.entry.config.placement is not None
            and m.entry.config.runtime == "emulated"
        )

    def initial_states(self) -> None:
        """Every LLM's state at the start: READY awake, UNAVAILABLE on disk."""
        for n, m in self.llms.items():
            v = m.entry.config.version
            if self.where[n] == AWAKE:
                self.states[n] = ModelState(READY, version=v)
            else:
                self.states[n] = ModelState(UNAVAILABLE, ON_DISK_REASON, v)

    def host(self, name: str) -> None:
        """Put ``name``'s engine on the device scheduler (at the start and at a wake)."""
        llm = self.llms[name]
        c = llm.entry.config
        delay = llm.profile.cpu_s_per_output_token if c.runtime == "emulated" else 0.0
        driver = self._driver()
        llm.kv_blocks = driver.add_engine(name, llm.setup, llm.num_blocks, c.priority_value,
                                          delay)  # fmt: skip

    def _check(self, name: str, action: str) -> LlmModel:
        if not self.placeable(name):
            raise LlmResidencyError(
                f"model {name!r}: an LLM is put to sleep and woken only with runtime: "
                f"emulated and a placement: section in its model.yaml; cannot {action} it",
                400,
            )
        return self.llms[name]

    # -- the host's warm pool ---------------------------------------------------------------
    def _pool_key(self, llm: LlmModel) -> str:
        p = llm.profile
        return digest(llm.entry.config.model_dump_json(), f"{p.model}|{p.weights_bytes:.0f}")

    async def _in_pool(self, llm: LlmModel) -> bool:
        """Whether the host's pool holds ``llm`` (then the most recently used)."""
        pool = self.pool
        if pool is None:
            return False
        try:
            return await asyncio.to_thread(pool.take, llm.name, self._pool_key(llm)) is not None
        except OSError as exc:  # the pool is an optimisation: a wake never fails for it
            log.warning("host pool: %s", exc)
            return False

    async def _keep(self, llm: LlmModel) -> None:
        """Keep ``llm`` in the host's pool (module docstring); a failure is logged."""
        pool = self.pool
        if pool is None:
            return
        try:
            await asyncio.to_thread(
                pool.put, llm.name, self._pool_key(llm), llm.profile.weights_bytes,
                _empty_entry, reserves=False,
            )  # fmt: skip
        except OSError as exc:
            log.warning("host pool: keeping model %s failed: %s", llm.name, exc)

    async def keep_awake(self) -> None:
        """At the worker's stop: every placeable LLM awake here into the host's pool (the
        controller makes a stopped device's residents warm)."""
        for name, where in self.where.items():
            if where == AWAKE and self.placeable(name):
                await self._keep(self.llms[name])

    # -- wake --------------------------------------------------------------------------------
    async def wake(self, name: str) -> dict[str, Any]:
        """Load ``name`` (module docstring): from host memory (asleep) or disk; nothing
        to do when awake. Returns ``load_source`` and ``load_seconds``."""
        llm = self._check(name, "load")
        where = self.where[name]
        if where == AWAKE:
            return {"load_source": "device", "load_seconds": 0.0}
        spec = llm.entry.config.placement
        assert spec is not None
        # (Asked first: the memory check and the LOADING state below then follow at once.)
        warm = where == ASLEEP or await self._in_pool(llm)
        source = ASLEEP if warm else ON_DISK
        driver = self._driver()
        need = llm.profile.weights_bytes + (llm.num_blocks or 0) * llm.profile.block_bytes
        memory = driver.sched.memory
        with driver.lock:
            free = memory.unreserved_bytes()
        if free is not None and need > free:
            raise LlmResidencyError(
                f"model {name!r}: load failed: not enough device memory: the engine needs "
                f"{need / GIB:.2f} GiB (weights and KV cache), free {max(0.0, free) / GIB:.2f} "
                f"GiB (of {(memory.total_bytes or 0.0) / GIB:.2f} GiB)",
                400,
            )
        seconds = (spec.warm_load_ms if warm else spec.cold_load_ms) / 1e3
        version = llm.entry.config.version
        self.states[name] = ModelState(LOADING, version=version)
        watch = LoadWatch(seconds)
        self.loads[name] = watch
        failure: str | None = f"model {name!r}: the load was interrupted"
        reserved = need if free is not None else 0.0
        with driver.lock:
            memory.loading_bytes += reserved
        t0 = time.perf_counter()
        try:
            await self._sleep(seconds)
            with driver.lock:
                memory.loading_bytes = max(0.0, memory.loading_bytes - reserved)
            reserved = 0.0
            try:
                self.host(name)
            except ValueError as exc:
                failure = f"model {name!r}: load failed: engine: {exc}"
                self.states[name] = ModelState(UNAVAILABLE, failure, version)
                raise LlmResidencyError(failure, 400) from exc
            self.where[name] = AWAKE
            self.states[name] = ModelState(READY, version=version)
            failure = None
            took = time.perf_counter() - t0
            log.info("model %s woken from %s in %.3f s", name, source, took)
            await self._keep(llm)  # a load passes through host memory
            return {"load_source": source, "load_seconds": round(took, 6)}
        finally:
            if reserved:
                with driver.lock:
                    memory.loading_bytes = max(0.0, memory.loading_bytes - reserved)
            if failure is not None and self.states.get(name, ModelState(LOADING)).state == LOADING:
                self.states[name] = ModelState(
                    UNAVAILABLE, ASLEEP_REASON if where == ASLEEP else ON_DISK_REASON, version
                )
            if self.loads.get(name) is watch:
                self.loads.pop(name, None)
            watch.finish(failure)

    # -- sleep -------------------------------------------------------------------------------
    async def sleep(self, name: str) -> None:
        """Put ``name`` to sleep (module docstring): its engine leaves the device, its
        weights stay in host memory."""
        llm = self._check(name, "unload")
        version = llm.entry.config.version
        st = self.states.get(name)
        if self.where[name] != AWAKE or st is None or st.state != READY:
            raise LlmResidencyError(
                f"model {name!r} is not loaded (state "
                f"{'UNAVAILABLE' if st is None else st.state}"
                + (f": {st.reason}" if st is not None and st.reason else "")
                + ")",
                400,
            )
        self.states[name] = ModelState(UNLOADING, version=version)
        driver = self._driver()
        dropped = await driver.drain_engine(name, self.drain_timeout_s)
        if dropped:
            log.warning("model %s: %d sequence(s) dropped at the sleep's timeout", name, dropped)
        driver.remove_engine(name)
        self.where[name] = ASLEEP
        self.states[name] = ModelState(UNAVAILABLE, ASLEEP_REASON, version)
        log.info("model %s asleep (weights in host memory)", name)
        await self._keep(llm)
