"""Warm-up: a loaded model runs each batch size it will serve before the worker is ready.

The first batch of a new size can take far longer than the next ones (kernel selection,
allocator growth, a compiled model's recompilation per shape), so the first request of each
batch size would pay it. After a runtime loads (from disk or from the host pool), the worker
runs a synthetic batch of each size of the warm-up list through ``Runtime.run`` twice: the
first call is the cold one, the second shows what a warm one costs. Both are timed and
reported in the model's load info (``warmup_batch_sizes``, ``warmup_seconds``,
``warmup_first_ms``, ``warmup_second_ms``).

Which sizes (``--warmup``): ``all`` (every size 1..max_batch_size), ``first`` (batch 1
only), ``none``, or a list like ``1,2,4,8`` (sizes above max_batch_size are left out).
Inputs follow model.yaml as the profiler's do (``example_shape``, ``synthetic`` ranges); a
variable dimension without ``example_shape`` is 8, as in the runtimes' own load-time check.

A model with a variable dimension (``-1``: a sequence length) also runs one batch of the
smallest size at another length (half of it, at least 2), twice: a compiled model turns that
dimension dynamic on its second value, a recompile that would otherwise fall on the first
request of a new length (``warmup_variable`` in the load info; None when nothing varies).

Emulated runtimes are not warmed up: their batches only sleep their profile's time, so there
is no first-call cost to take away.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from evenserve.core.errors import ConfigError
from evenserve.runtime.base import Array, Runtime
from evenserve.runtime.emulated import EmulatedRuntime
from evenserve.worker.profiler import synthetic_batch
from evenserve.worker.repository import ModelEntry

log = logging.getLogger(__name__)

#: A variable dimension without example_shape (as ``runtime.base.warm_up`` fills it).
VARIABLE_DIM = 8

WarmupMode = Literal["all", "first", "none"]
#: What ``--warmup`` says: a mode, or the batch sizes themselves (ascending, distinct).
WarmupSpec = WarmupMode | tuple[int, ...]


def parse_warmup(text: str) -> WarmupSpec:
    """``all``, ``first``, ``none`` or a comma list of batch sizes >= 1; ValueError saying
    what is wrong otherwise."""
    t = text.strip().lower()
    if t == "all":
        return "all"
    if t == "first":
        return "first"
    if t == "none":
        return "none"
    parts = [p.strip() for p in t.split(",") if p.strip()]
    try:
        sizes = sorted({int(p) for p in parts})
    except ValueError:
        raise ValueError(
            f"{text!r} is not all, first, none or a list of batch sizes like 1,2,4,8"
        ) from None
    if not sizes:
        raise ValueError(f"{text!r}: give all, first, none or at least one batch size")
    if sizes[0] < 1:
        raise ValueError(f"{text!r}: batch sizes must be >= 1")
    return tuple(sizes)


def warmup_sizes(spec: WarmupSpec, max_batch_size: int) -> list[int]:
    """The batch sizes a model of ``max_batch_size`` warms up, ascending."""
    if spec == "none":
        return []
    if spec == "first":
        return [1]
    if spec == "all":
        return list(range(1, max_batch_size + 1))
    return [b for b in spec if b <= max_batch_size]


def warmup_batch(entry: ModelEntry, batch: int, rng: np.random.Generator) -> dict[str, Array]:
    """A synthetic batch of ``batch`` items of the model's inputs (model.yaml's
    example_shape and synthetic ranges; a variable dim without example_shape is 8)."""
    fill = {
        t.name: [VARIABLE_DIM if d == -1 else d for d in t.shape]
        for t in entry.config.inputs
        if t.example_shape is None and -1 in t.shape
    }
    return synthetic_batch(entry, batch, fill, rng)


def other_lengths(entry: ModelEntry) -> dict[str, list[int]] | None:
    """Per-item shapes with each variable dimension at another length than the warm-up's
    (half of it, at least 2: a length of 0 or 1 is one a compiler specializes on); None
    when the model has no variable dimension."""
    if not any(-1 in t.shape for t in entry.config.inputs):
        return None
    out: dict[str, list[int]] = {}
    for t in entry.config.inputs:
        base = t.example_shape or [VARIABLE_DIM if d == -1 else d for d in t.shape]
        out[t.name] = [
            b if d != -1 else (b // 2 if b // 2 >= 2 else b + 1)
            for d, b in zip(t.shape, base, strict=True)
        ]
    return out


@dataclass
class WarmupReport:
    """What a model's warm-up ran and how long each call took."""

    batch_sizes: list[int]
    seconds: float = 0.0
    first_ms: dict[int, float] = field(default_factory=dict)
    second_ms: dict[int, float] = field(default_factory=dict)
    #: The batch at other variable lengths: ``{"batch", "shapes", "first_ms", "second_ms"}``.
    variable: dict[str, Any] | None = None

    def info(self) -> dict[str, Any]:
        """The load-info keys."""
        return {
            "warmup_batch_sizes": list(self.batch_sizes),
            "warmup_seconds": round(self.seconds, 6),
            "warmup_first_ms": {b: round(ms, 4) for b, ms in self.first_ms.items()},
            "warmup_second_ms": {b: round(ms, 4) for b, ms in self.second_ms.items()},
            "warmup_variable": self.variable,
        }

    def worst_ratio(self) -> tuple[int, float] | None:
        """The batch size whose first call took longest relative to its second, and that
        ratio (None when nothing ran)."""
        ratios = {
            b: self.first_ms[b] / max(self.second_ms[b], 1e-6)
            for b in self.batch_sizes
            if b in self.first_ms and b in self.second_ms
        }
        if not ratios:
            return None
        b = max(ratios, key=lambda k: ratios[k])
        return b, ratios[b]


def skipped(runtime: Runtime) -> bool:
    """Whether a runtime is not warmed up (emulated: no first-call cost)."""
    return isinstance(runtime, EmulatedRuntime)


def warm_up_model(
    entry: ModelEntry,
    runtime: Runtime,
    spec: WarmupSpec,
    *,
    timer: Callable[[], float] = time.perf_counter,
    seed: int = 0,
) -> WarmupReport:
    """Run each warm-up batch size of a loaded model twice (cold, then warm), ascending;
    ConfigError naming the model and the batch size when a batch fails. An emulated
    runtime, or ``spec`` none, runs nothing (an empty report)."""
    mbs = entry.config.max_batch_size
    sizes: Sequence[int] = [] if skipped(runtime) else warmup_sizes(spec, mbs)
    report = WarmupReport(list(sizes))
    if not sizes:
        return report
    rng = np.random.default_rng(seed)
    t0 = timer()

    def twice(b: int, batch: dict[str, Array], what: str) -> tuple[float, float]:
        times = []
        for _ in range(2):
            start = timer()
            try:
                runtime.run(batch)
            except Exception as exc:
                raise ConfigError(
                    f"model {entry.name!r}: warm-up batch of size {b}{what} failed: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            times.append((timer() - start) * 1000.0)
        return times[0], times[1]

    for b in sizes:
        try:
            batch = warmup_batch(entry, b, rng)
        except ConfigError as exc:
            raise ConfigError(f"model {entry.name!r}: warm-up batch of {b}: {exc}") from exc
        report.first_ms[b], report.second_ms[b] = twice(b, batch, "")
    shapes = other_lengths(entry)
    if shapes is not None:
        b = sizes[0]
        batch = synthetic_batch(entry, b, shapes, rng)
        where = f" at other variable lengths {shapes}"
        first, second = twice(b, batch, where)
        report.variable = {
            "batch": b,
            "shapes": shapes,
            "first_ms": round(first, 4),
            "second_ms": round(second, 4),
        }
    report.seconds = timer() - t0
    worst = report.worst_ratio()
    log.info(
        "model %s warmed up %d batch size(s) (%s..%s) in %.3f s; worst first/second call %s",
        entry.name,
        len(sizes),
        sizes[0],
        sizes[-1],
        report.seconds,
        "n/a" if worst is None else f"{worst[1]:.2f}x at batch {worst[0]}",
    )
    return report
