"""Executors run a batch the driver started: on a thread (real runtimes) or on a FakeTimer.

ThreadedExecutor is the live path. It keeps inference off the event loop: each instance of
the device has a thread of its own (a model instance, in Triton's words), and a batch the
scheduler starts on instance i runs on thread i: assembled (requests concatenated along the
batch dimension), run, and split back per request, timed phase by phase (Triton's
compute_input / compute_infer / compute_output). The thread then reports the result itself
(``done`` runs on it: the driver tells the scheduler, which starts the next batch there and
then, without a round trip through the event loop). Requests whose variable dimensions
differ cannot share one tensor: they are grouped by shape and the groups run one after
another within the same device slot, so the device still runs one batch at a time.

VirtualExecutor is the deterministic twin used by tests and replays: nothing runs, a batch
ends when the device scheduler's timing says (the profile's time, shared-device contention
included, as in the simulator) and its outputs are its payloads.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

import numpy as np

from evenserve.runtime.base import Array, Runtime
from evenserve.worker.batch import BatchResult, RunningBatch

Inputs = Mapping[str, Array]
T = TypeVar("T")
log = logging.getLogger("evenserve.worker")
#: How long ``on_each_thread`` waits for every device thread to be free (a long batch).
EACH_THREAD_WAIT_S = 600.0


def run_batch(
    runtime: Runtime, input_names: Sequence[str], payloads: Sequence[Inputs]
) -> BatchResult:
    """Assemble, run and split one batch (runs in the device thread). A runtime with a
    ``stage(inputs)`` method (the torch runtimes' host-to-device copy, the emulated one's
    staging delay) has it called on each assembled group before it runs: its time is the
    batch's compute_input, and what it returns (if anything) is what ``run`` gets."""
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
    stage: Callable[[Inputs], Mapping[str, Any] | None] | None = getattr(runtime, "stage", None)
    if stage is not None:
        for k, (idx, batch) in enumerate(assembled):
            staged = stage(batch)  # the torch runtimes: tensors on the device, for run
            if staged is not None:
                assembled[k] = (idx, dict(staged))
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
    """Runs batches of real (or emulated) runtimes on one thread per instance."""

    def __init__(
        self,
        runtimes: Mapping[str, Runtime],
        input_names: Mapping[str, Sequence[str]],
        instances: int = 1,
    ) -> None:
        self.runtimes = dict(runtimes)
        self.input_names = {m: list(v) for m, v in input_names.items()}
        self.instances = instances
        self._inboxes: list[queue.SimpleQueue[Callable[[], None] | None]] = [
            queue.SimpleQueue() for _ in range(instances)
        ]
        self._threads = [
            threading.Thread(
                target=self._serve, args=(inbox,), name=f"evenserve-device-{i}", daemon=True
            )
            for i, inbox in enumerate(self._inboxes)
        ]
        for t in self._threads:
            t.start()
        #: LLM models' step runners (``worker.llm.steps``) and the driver's hand-over of the
        #: sequences whose caches to drop (set by the worker when it hosts an LLM).
        self.steppers: dict[str, Any] = {}
        self.take_free: Callable[[str], list[int]] = lambda model: []

    @staticmethod
    def _serve(inbox: queue.SimpleQueue[Callable[[], None] | None]) -> None:
        while (job := inbox.get()) is not None:
            try:
                job()
            except Exception:  # a bug in a job must not stop the device
                log.exception("device thread: a job failed")

    def on_each_thread(self, fn: Callable[[], T]) -> list[T]:
        """Run ``fn`` once on each of the device threads, the ones batches run on, one thread
        after the other (blocking; not on the event loop): a warm-up's timings are then each
        thread's own, not those of threads sharing the device. A framework's first call on a
        new thread costs extra (thread-local state: allocator and kernel caches, the intra-op
        pool), so a warm-up that ran on another thread would leave it to the first
        request."""
        out: list[T] = []
        for inbox in self._inboxes:
            fut: Future[T] = Future()

            def job(fut: Future[T] = fut) -> None:
                try:
                    fut.set_result(fn())
                except BaseException as exc:
                    fut.set_exception(exc)

            inbox.put(job)
            out.append(fut.result(EACH_THREAD_WAIT_S))
        return out

    def add(self, model: str, runtime: Runtime, input_names: Sequence[str]) -> None:
        """Run batches of one more (loaded) model."""
        self.runtimes[model] = runtime
        self.input_names[model] = list(input_names)

    def remove(self, model: str) -> Runtime:
        """Forget a model with no batch running (the driver's drain ensures it); returns its
        runtime for the caller to close."""
        self.input_names.pop(model, None)
        return self.runtimes.pop(model)

    def _run(self, model: str, payloads: Sequence[Inputs]) -> BatchResult:
        try:
            return run_batch(self.runtimes[model], self.input_names[model], payloads)
        except Exception as exc:
            return BatchResult(outputs=None, error=f"model {model!r}: {type(exc).__name__}: {exc}")

    timed_by_scheduler = False

    def start(self, batch: RunningBatch, done: Callable[[BatchResult], None]) -> None:
        """Run ``batch`` on its instance's thread; ``done`` is called there when it ends.
        An engine step runs on its model's step runner (``steppers``)."""
        model = batch.model
        if batch.step is not None:
            step, runner, free = batch.step, self.steppers[model], self.take_free(model)

            def run_step() -> None:
                t0 = time.perf_counter()
                try:
                    sampled = runner.run(step, free)
                except Exception as exc:
                    done(BatchResult(None, error=f"model {model!r}: {type(exc).__name__}: {exc}"))
                    return
                done(BatchResult(None, compute_infer_s=time.perf_counter() - t0, sampled=sampled))

            self._inboxes[batch.instance % self.instances].put(run_step)
            return
        payloads = [r.payload for r in batch.requests]

        def job() -> None:
            done(self._run(model, payloads))

        self._inboxes[batch.instance % self.instances].put(job)

    def complete(self, batch: RunningBatch) -> None:
        raise RuntimeError("a threaded executor's batches end when their thread is done")

    def shutdown(self) -> None:
        """Finish the batches already handed over, then stop the threads."""
        for inbox in self._inboxes:
            inbox.put(None)
        for t in self._threads:
            t.join()


class VirtualExecutor:
    """Runs nothing: a batch ends at the time its device scheduler says; outputs are the
    payloads and the compute time is the batch's time on the scheduler's clock."""

    timed_by_scheduler = True

    def __init__(self) -> None:
        self._done: dict[int, Callable[[BatchResult], None]] = {}

    def start(self, batch: RunningBatch, done: Callable[[BatchResult], None]) -> None:
        self._done[batch.index] = done

    def complete(self, batch: RunningBatch) -> None:
        done = self._done.pop(batch.index)
        outputs = [r.payload for r in batch.requests]
        done(BatchResult(outputs=outputs, compute_infer_s=batch.end_s - batch.started_s))
