"""Busy time of a device with several instance slots: a running total and the exact busy
fraction over a sliding window, O(1) amortized per change and per reading.

Busy time is counted in instance-seconds (two batches running for 1 s count 2 s); the busy
fraction divides by ``instances`` x elapsed time, so a device whose every instance runs all
the time is at 1.0. Every change in the number of running batches leaves a mark
(time, instance-seconds so far, batches running after it); marks older than the window are
let go, keeping the one the window starts in, so the total at the window's start is exact.
Times must not go back: readings and changes come in clock order.
"""

from __future__ import annotations

from collections import deque


class BusyClock:
    __slots__ = ("_acc", "_mark", "_marks", "instances", "origin_s", "running", "window_s")

    def __init__(self, instances: int = 1, window_s: float = 1.0, origin_s: float = 0.0) -> None:
        if instances < 1:
            raise ValueError("instances must be >= 1")
        if window_s <= 0:
            raise ValueError("window_s must be > 0")
        self.instances = instances
        self.window_s = window_s
        self.origin_s = origin_s
        self.running = 0
        self._acc = 0.0
        self._mark = origin_s
        self._marks: deque[tuple[float, float, int]] = deque([(origin_s, 0.0, 0)])

    def start(self, now_s: float) -> None:
        """A batch started."""
        self._change(now_s, 1)

    def stop(self, now_s: float) -> None:
        """A batch ended."""
        if self.running <= 0:
            raise ValueError("no batch is running")
        self._change(now_s, -1)

    def _change(self, now_s: float, delta: int) -> None:
        if self.running:
            self._acc += self.running * (now_s - self._mark)
        self._mark = now_s
        self.running += delta
        marks = self._marks
        marks.append((now_s, self._acc, self.running))
        lo = now_s - self.window_s
        while len(marks) > 2 and marks[1][0] <= lo:
            marks.popleft()

    def total_s(self, now_s: float) -> float:
        """Instance-seconds busy since the origin."""
        return self._acc + self.running * (now_s - self._mark)

    def fraction(self, now_s: float) -> float:
        """Mean busy fraction of the instances over the last ``window_s`` (or since origin)."""
        lo = now_s - self.window_s
        if lo < self.origin_s:
            lo = self.origin_s
        span = now_s - lo
        if span <= 0:
            return 1.0 if self.running else 0.0
        marks = self._marks
        while len(marks) > 1 and marks[1][0] <= lo:
            marks.popleft()
        t0, acc0, running0 = marks[0]
        at_lo = acc0 + running0 * (lo - t0) if lo > t0 else acc0
        busy = (self.total_s(now_s) - at_lo) / (span * self.instances)
        return 0.0 if busy < 0.0 else (1.0 if busy > 1.0 else busy)
