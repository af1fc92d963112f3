"""Profiles that learn: a base LatencyProfile followed toward the batch times a device shows.

Pure (no clock, no I/O): the simulator's devices, the worker's scheduler and the gateway's
router all use it, so what one learns the others read the same way.

Formulas. For a model with base profile ``t0(b)`` (seconds for a batch of ``b``), each
observed batch ``(b, took)`` gives the log ratio ``x = ln(took / t0(b))``. Two smoothed
figures follow it, both exponentially weighted per observation (not per second: no clock)
and both clipped, so one outlier moves them a bounded step:

- the device-wide scale, ``L <- L + ALPHA * clip(x - L, -CLIP, +CLIP)``; ``scale = e^L``;
- per batch size, the residual shape ``S_b <- S_b + ALPHA * clip(x - L - S_b, -CLIP, +CLIP)``
  (with ``L`` just updated): how this size differs from the scaled profile, learned only
  while the scale is settled: ``|D| <= DRIFT_GATE``, with ``D <- D + ALPHA * (dL - D)`` the
  smoothed change of ``L`` per observation. While the scale moves (a step: every size's
  ``x - L`` is the lag, not a shape) no size takes the lag into its shape, so a size seen
  alone tracks exactly as the scale does, without overshoot; the alternating changes of ``L``
  that persistent shapes cause average out in ``D`` and do not stop them being learned.

The learned profile, at every point of the base profile and every size with at least
``MIN_SIZE_OBS`` observations::

    observed(b) = t0(b) * e^(L + S_b)      sizes observed often enough (what a worker reports)
    learned(b)  = observed(b)              where observed, else t0(b) * scale
    learned     = running max of learned over increasing b      (monotone in batch size)
    above the largest size b*, when it is observed: learned(b*) + (t0(b) - t0(b*)) * scale

interpolated as any profile (``core.profile``). So a uniform 2x slowdown is learned from any
mix of sizes (``scale`` -> 2, every ``S_b`` -> 0), and a device whose shape differs from its
profile's is learned where it is observed. ``learned_profile(base, scale, observed_ms)`` is
the same function for the worker (its own figures) and the gateway (the figures a worker
reports in its load report: ``profile_scale_by_model``, ``observed_ms_by_model``).

Constants and what they give. ``ALPHA = 0.05``, ``CLIP = ln 2``: after a 2x step, ``L``
is within 20 % of ln 2's ratio (scale >= 1.67) after 26 batches and within 10 % after 45
(``1 - 0.95^k``), which at 20-100 batches a second is 0.3-2 s; a size seen alone tracks the
same and overshoots by at most about 2 % (the gate opens as the scale settles). One batch
10x slower than expected moves the scale by 3.5 % (``e^(0.05 ln 2)``) and its own size's
estimate by about 7 %, and both decay again with the next batches. A speed-up back is tracked
the same way (log space is symmetric). ``L`` stays within ``[ln 1/16, ln 16]`` and each
``S_b`` within ``ln 4`` of 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from evenserve.core.profile import LatencyProfile

#: Weight of one observation in the scale (log space).
ALPHA = 0.05
#: A size's shape learns only while the scale's smoothed change per observation is within this.
DRIFT_GATE = 0.002
#: One observation moves a log estimate by at most ALPHA * CLIP (a 2x outlier's worth).
CLIP = math.log(2.0)
#: A size's own shape is used (and reported) once it has this many observations.
MIN_SIZE_OBS = 8
#: The learned profile is rebuilt when a figure it reads moved by more than this (log).
TOLERANCE = 0.01
_L_MAX = math.log(16.0)
_S_MAX = math.log(4.0)


def _clip(v: float, bound: float) -> float:
    return bound if v > bound else -bound if v < -bound else v


def learned_profile(
    base: LatencyProfile, scale: float, observed_ms: Mapping[int, float] | None = None
) -> LatencyProfile:
    """``base`` scaled by ``scale`` where nothing is observed, the smoothed ``observed_ms``
    (ms per batch, by size) where it is; non-decreasing in batch size (see the module).
    ``scale`` 1 and nothing observed returns ``base`` itself."""
    obs = {int(b): float(ms) for b, ms in (observed_ms or {}).items() if b >= 1 and ms > 0}
    if not math.isfinite(scale) or scale <= 0:
        scale = 1.0
    if scale == 1.0 and not obs:
        return base
    sizes = sorted(set(base.batches) | set(obs))
    values: list[float] = []
    top = 0.0
    for b in sizes:
        v = obs.get(b)
        if v is None:
            v = base.latency_s(b) * 1000.0 * scale
        top = v if v > top else top
        values.append(top)
    last = sizes[-1]
    if last in obs:  # beyond it, the base's slope scaled (not the slope of two noisy sizes)
        tail = 2 * last
        sizes.append(tail)
        values.append(top + (base.latency_s(tail) - base.latency_s(last)) * 1000.0 * scale)
    return replace(
        base,
        batches=tuple(sizes),
        latency_ms=tuple(values),
        memory_mb=tuple(base._interp(base.memory_mb, b) for b in sizes),
        source=f"{base.source} (learned)",
    )


class ProfileLearner:
    """One model's learned figures on one device (see the module for the formulas)."""

    __slots__ = ("_count", "_drift", "_log_scale", "_pub_scale", "_pub_shape", "_shape", "base")

    def __init__(self, base: LatencyProfile) -> None:
        self.base = base
        self._log_scale = 0.0
        self._drift = 0.0
        self._shape: dict[int, float] = {}
        self._count: dict[int, int] = {}
        self._pub_scale = 0.0
        self._pub_shape: dict[int, float] = {}

    @property
    def scale(self) -> float:
        """Smoothed observed / predicted batch time, over every size."""
        return math.exp(self._log_scale)

    def observations(self, batch: int) -> int:
        return self._count.get(batch, 0)

    def observe(self, batch: int, took_s: float) -> bool:
        """A batch of ``batch`` took ``took_s``. True when the learned profile moved by more
        than ``TOLERANCE`` since ``profile()`` was last asked (time to ask again)."""
        if batch < 1 or not took_s > 0 or not math.isfinite(took_s):
            return False
        t0 = self.base.latency_s(batch)
        if t0 <= 0:
            return False
        x = math.log(took_s / t0)
        ls0 = self._log_scale
        ls = _clip(ls0 + ALPHA * _clip(x - ls0, CLIP), _L_MAX)
        self._log_scale = ls
        self._drift = d = self._drift + ALPHA * (ls - ls0 - self._drift)
        s = self._shape.get(batch, 0.0)
        if -DRIFT_GATE <= d <= DRIFT_GATE:
            s = _clip(s + ALPHA * _clip(x - ls - s, CLIP), _S_MAX)
        self._shape[batch] = s
        n = self._count[batch] = self._count.get(batch, 0) + 1
        if abs(ls - self._pub_scale) > TOLERANCE:
            return True
        if n < MIN_SIZE_OBS:
            return False
        pub = self._pub_shape.get(batch)
        return pub is None or abs(s - pub) > TOLERANCE

    def observed_ms(self) -> dict[int, float]:
        """The smoothed batch time (ms) of every size observed ``MIN_SIZE_OBS`` times."""
        ls = self._log_scale
        base = self.base
        return {
            b: base.latency_s(b) * 1000.0 * math.exp(ls + s)
            for b, s in sorted(self._shape.items())
            if self._count[b] >= MIN_SIZE_OBS
        }

    def profile(self) -> LatencyProfile:
        """The learned profile now (``learned_profile`` of this learner's figures)."""
        self._pub_scale = self._log_scale
        self._pub_shape = {b: s for b, s in self._shape.items() if self._count[b] >= MIN_SIZE_OBS}
        return learned_profile(self.base, self.scale, self.observed_ms())
