"""Batches that share one device: how fast each runs when several run at once.

A device with ``instances`` > 1 runs that many batches at once (Triton's ``instance_group``
count; different models on one GPU also run at once there). Concurrent batches overlap only
in part, so each runs slower than alone. The model, shared by the simulator, the emulated
runtime and the worker's driver (so all three agree on when a batch ends):

- a batch of ``b`` alone takes the profile's ``t(b)`` and uses the fraction
  ``u(b) = (b / t(b)) / peak`` of the device, where ``peak`` is the profile's best measured
  throughput (``occupancy``): a batch of 1 on a T4 ResNet-50 uses 22 %, a batch of 8 85 %;
- while ``n`` batches run, each progresses at speed
  ``min(1, 1 / (1 + interference * (n - 1)), 1 / sum(u))`` (``shared_speed``): overlap is
  imperfect (``interference``), and together the batches never beat the device's peak.

The default ``interference`` of 1/3 is calibrated on Triton's optimization guide: two
instances of an unbatched Inception model reach about 1.5x one instance's throughput (73 ->
~110 inferences/s), i.e. each runs at 0.75 of its solo speed. With one instance nothing
changes: a batch takes exactly ``t(b)``.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from evenserve.core.profile import LatencyProfile

#: Each of two concurrent small batches runs at 1 / (1 + 1/3) = 0.75 of its solo speed.
DEFAULT_INTERFERENCE = 1.0 / 3.0


def occupancy(profile: LatencyProfile, batch: int) -> float:
    """Fraction of the device's peak throughput that a batch of ``batch`` uses alone."""
    best = min(t / b for b, t in zip(profile.batches, profile.latency_ms, strict=True))
    per_item = profile.latency_s(batch) * 1000.0 / max(1, batch)
    if per_item <= 0:
        return 1.0
    return min(1.0, best / per_item)


def shared_speed(occupancies: Iterable[float], interference: float) -> float:
    """Speed (fraction of solo speed) of each of the batches running at once."""
    occ = list(occupancies)
    n = len(occ)
    if n <= 1:
        return 1.0
    speed = 1.0 / (1.0 + interference * (n - 1))
    total = sum(occ)
    if total > 1.0:
        speed = min(speed, 1.0 / total)
    return min(1.0, speed)


@dataclass(slots=True)
class _Run:
    left_s: float  # solo seconds of work still to do
    occupancy: float


class SharedDevice:
    """The batches running on one device and when each will end, on any clock.

    ``start`` and ``finish`` take the time of the change; between changes every running batch
    progresses at ``speed``. ``ends`` assumes no further change.
    """

    __slots__ = ("_runs", "_speed", "_t", "interference")

    def __init__(self, interference: float = DEFAULT_INTERFERENCE) -> None:
        if not 0.0 <= interference <= 1.0:
            raise ValueError("interference must be in [0, 1]")
        self.interference = interference
        self._runs: dict[Hashable, _Run] = {}
        self._t = 0.0
        self._speed = 1.0

    def __len__(self) -> int:
        return len(self._runs)

    @property
    def speed(self) -> float:
        return self._speed

    def _advance(self, now_s: float) -> None:
        dt = now_s - self._t
        if dt > 0:
            if self._runs:
                done = dt * self._speed
                for r in self._runs.values():
                    r.left_s = max(0.0, r.left_s - done)
            self._t = now_s

    def _respeed(self) -> None:
        runs = self._runs
        if len(runs) <= 1:  # the common case (one instance): no sharing
            self._speed = 1.0
        else:
            self._speed = shared_speed((r.occupancy for r in runs.values()), self.interference)

    def start(self, key: Hashable, now_s: float, solo_s: float, occupancy: float) -> None:
        if key in self._runs:
            raise KeyError(f"batch {key!r} is already running")
        self._advance(now_s)
        self._runs[key] = _Run(solo_s, occupancy)
        self._respeed()

    def finish(self, key: Hashable, now_s: float) -> None:
        self._advance(now_s)
        del self._runs[key]
        self._respeed()

    def end_of(self, key: Hashable) -> float:
        """When ``key`` will end if nothing else starts or ends first."""
        return self._t + self._runs[key].left_s / self._speed

    def next_end(self) -> tuple[Hashable, float] | None:
        """The batch that ends first (the earliest started among ties) and when."""
        runs = self._runs
        if len(runs) == 1:
            for key, r in runs.items():
                return key, self._t + r.left_s / self._speed
        best: tuple[Hashable, float] | None = None
        for key, r in runs.items():
            t = self._t + r.left_s / self._speed
            if best is None or t < best[1]:
                best = (key, t)
        return best
