"""The threaded executor: a batch's end starts the next batch on the device thread itself."""

from __future__ import annotations

import threading
from collections.abc import Mapping

import numpy as np

from evenserve.core.clock import RealClock
from evenserve.policy.batching import BATCHING
from evenserve.runtime.base import Array
from evenserve.sched import ModelSetup
from evenserve.worker.driver import BatchDriver
from evenserve.worker.executor import ThreadedExecutor
from evenserve.worker.timer import RealTimer


class Recording:
    """A runtime that notes, for each batch, whether the event loop was blocked meanwhile."""

    def __init__(self) -> None:
        self.loop_blocked = threading.Event()
        self.seen: list[bool] = []
        self.threads: list[str] = []
        self.ran_two = threading.Event()

    def run(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        self.seen.append(self.loop_blocked.is_set())
        self.threads.append(threading.current_thread().name)
        if len(self.seen) == 1:
            # Hold the first batch until the loop is blocked: the second must then start
            # without the loop.
            self.loop_blocked.wait(10.0)
        elif len(self.seen) == 2:
            self.ran_two.set()
        return {"y": np.asarray(inputs["x"])}


async def test_the_next_batch_starts_while_the_event_loop_is_blocked() -> None:
    """With the loop busy (a long request being read, say), a device that finishes a batch
    starts the next one at once: the device thread tells the scheduler itself. Before, the
    end went to the loop first, and the device sat idle until the loop got to it."""
    rt = Recording()
    ex = ThreadedExecutor({"m": rt}, {"m": ["x"]})
    setup = ModelSetup(
        name="m", policy=BATCHING.build({"policy": "none"}), profile=None, max_batch_size=1
    )
    clock = RealClock()
    driver = BatchDriver([setup], ex, clock=clock, timer=RealTimer(clock))
    try:
        first = driver.submit("m", {"x": np.ones((1, 2), np.float32)})
        second = driver.submit("m", {"x": np.full((1, 2), 2.0, np.float32)})
        rt.loop_blocked.set()
        # The loop thread blocks here (no await) until the second batch has run, or 10 s.
        ran = rt.ran_two.wait(10.0)
        assert ran, "the second batch waited for the event loop"
        assert rt.seen == [True, True] and rt.threads[0] == rt.threads[1]
        assert first.future is not None and second.future is not None
        assert float((await first.future)["y"][0, 0]) == 1.0
        assert float((await second.future)["y"][0, 0]) == 2.0
    finally:
        ex.shutdown()
