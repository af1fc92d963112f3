"""Executors run a batch the driver started: on a thread (real runtimes) or on a FakeTimer.

ThreadedExecutor is the live path. It keeps inference off the event loop: the batch is
assembled (requests concatenated along the batch dimension), run, and split back per request
inside a worker thread, timed phase by phase (Triton's compute_input / compute_infer /
compute_output), and the result is delivered on the event loop. Requests whose variable
dimensions differ cannot share one tensor: they are grouped by shape and the groups run one
after another within the same device slot, so the device still runs one batch at a time.

VirtualExecutor is the deterministic twin used by tests and replays: a batch lasts the
profile's latency on a FakeTimer, with no thread and no sleeping.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from evenserve.core.contention import SharedDevice, occupancy
from evenserve.core.profile import LatencyProfile
from evenserve.runtime.base import Array, Runtime
from evenserve.worker.driver import BatchResult, PendingRequest
from evenserve.worker.timer import Timer

Inputs = Mapping[str, Array]


def run_batch(
    runtime: Runtime, input_names: Sequence[str], payloads: Sequence[Inputs]
) -> BatchResult:
    """Assemble, run and split one batch (runs in the device thread)."""
    t0 = time.perf_counter()
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, p in enumerate(payloads):
        key = tuple(p[n].shape[1:] for n in input_names)
        groups.setdefault(key, []).append(i)
    assembled: list[tuple[list[int], dict[str, Array]]] = []
    for idx in groups.values():
        if len(idx) == 1:
            batch = {n: payloads[idx[0]][n] for n in input_names}
        else:
            batch = {n: np.concatenate([payloads[i][n] for i in idx]) for n in input_names}
        assembled.append((idx, batch))
    t1 = time.perf_counter()
    results: list[tuple[list[int], dict[str, Array]]] = []
    for idx, batch in assembled:
        results.append((idx, runtime.run(batch)))
    t2 = time.perf_counter()
    outputs: list[dict[str, Array]] = [{} for _ in payloads]
    for idx, out in results:
        offset = 0
        for i in idx:
            k = int(payloads[i][input_names[0]].shape[0])
            outputs[i] = {name: arr[offset : offset + k] for name, arr in out.items()}
            offset += k
    t3 = time.perf_counter()
    return BatchResult(
        outputs=outputs, compute_input_s=t1 - t0, compute_infer_s=t2 - t1, compute_output_s=t3 - t2
    )


class ThreadedExecutor:
    """Runs batches of real (or emulated) runtimes on ``instances`` threads."""

    def __init__(
        self,
        runtimes: Mapping[str, Runtime],
        input_names: Mapping[str, Sequence[str]],
        instances: int = 1,
    ) -> None:
        self.runtimes = dict(runtimes)
        self.input_names = {m: list(v) for m, v in input_names.items()}
        self._pool = ThreadPoolExecutor(
            max_workers=instances, thread_name_prefix="evenserve-device"
        )

    def _run(self, model: str, payloads: Sequence[Inputs]) -> BatchResult:
        try:
            return run_batch(self.runtimes[model], self.input_names[model], payloads)
        except Exception as exc:
            return BatchResult(outputs=None, error=f"model {model!r}: {type(exc).__name__}: {exc}")

    def start(
        self,
        instance: int,
        model: str,
        requests: Sequence[PendingRequest],
        done: Callable[[BatchResult], None],
    ) -> None:
        loop = asyncio.get_running_loop()
        payloads = [r.payload for r in requests]
        fut = loop.run_in_executor(self._pool, self._run, model, payloads)

        def deliver(f: asyncio.Future[BatchResult]) -> None:
            if f.cancelled():
                done(BatchResult(outputs=None, error="batch cancelled (worker shutting down)"))
            elif (exc := f.exception()) is not None:
                done(BatchResult(outputs=None, error=f"{type(exc).__name__}: {exc}"))
            else:
                done(f.result())

        fut.add_done_callback(deliver)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=False)


class VirtualExecutor:
    """A batch takes the profile's latency on a (fake) timer; outputs are the payloads.

    With ``shared`` (a device running several batches at once) concurrent batches slow each
    other as the simulator's devices do (``core.contention``): every start or end moves the
    running batches' ends, and the earliest one is re-armed."""

    def __init__(
        self,
        profiles: Mapping[str, LatencyProfile],
        timer: Timer,
        clock: Any,
        shared: SharedDevice | None = None,
    ) -> None:
        self.profiles = dict(profiles)
        self.timer = timer
        self.clock = clock
        self.shared = shared
        self._pending: dict[int, tuple[BatchResult, Callable[[BatchResult], None]]] = {}
        self._epoch = 0

    def start(
        self,
        instance: int,
        model: str,
        requests: Sequence[PendingRequest],
        done: Callable[[BatchResult], None],
    ) -> None:
        items = sum(r.items for r in requests)
        prof = self.profiles[model]
        dur = prof.latency_s(items)
        result = BatchResult(outputs=[r.payload for r in requests], compute_infer_s=dur)
        if self.shared is None:
            self.timer.call_at(self.clock.now() + dur, lambda: done(result))
            return
        self.shared.start(instance, self.clock.now(), dur, occupancy(prof, items))
        self._pending[instance] = (result, done)
        self._arm()

    def _arm(self) -> None:
        assert self.shared is not None
        self._epoch += 1
        epoch = self._epoch
        nxt = self.shared.next_end()
        if nxt is not None:
            self.timer.call_at(nxt[1], lambda: self._fire(epoch))

    def _fire(self, epoch: int) -> None:
        if epoch != self._epoch or self.shared is None:
            return  # a batch started or ended since: re-armed
        nxt = self.shared.next_end()
        assert nxt is not None and isinstance(nxt[0], int)
        self.shared.finish(nxt[0], self.clock.now())
        result, done = self._pending.pop(nxt[0])
        self._arm()
        done(result)
