"""``evenserve profile``: measure a model's latency and memory per batch size on a device.

For each batch size (ascending) the runtime runs a synthetic batch ``warmup`` times unmeasured,
then ``iters`` times measured; the profile point is the median. The timed call is exactly
what the worker times as compute (``Runtime.run`` on an assembled batch), so the emulated
device and the simulator replay what the real device did. Synthetic inputs follow model.yaml:
``example_shape`` (or ``--input-shape``) fills variable dimensions and ``synthetic: {low,
high}`` the value range (integers uniform in [low, high); floats uniform).

Memory: on CUDA, the peak allocated by torch during the batch above what was allocated
before it (exact for torch runtimes). On the CPU, the growth of the process's peak resident
set over its size after loading, measured in ascending batch order (an approximation: the
allocator may reuse memory); the profile's ``memory_source`` says which.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib
import os
import platform
import resource
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from evenserve.core.errors import ConfigError
from evenserve.core.profile import MB, LatencyProfile, dump_profile
from evenserve.runtime.base import Array, Runtime
from evenserve.runtime.device import DeviceTarget
from evenserve.worker.repository import ModelEntry


@dataclass
class MeasuredPoint:
    """One batch size: the chosen clock's median/p10/p90, and both clocks' medians."""

    batch: int
    median_ms: float
    p10_ms: float
    p90_ms: float
    memory_mb: float | None
    wall_median_ms: float = 0.0
    cpu_median_ms: float = 0.0


Clock = Literal["wall", "cpu"]


def item_shape(entry: ModelEntry, name: str, overrides: Mapping[str, Sequence[int]]) -> list[int]:
    t = next(t for t in entry.config.inputs if t.name == name)
    if name in overrides:
        dims = list(overrides[name])
        if len(dims) != len(t.shape) or any(
            d < 1 or (s != -1 and s != d) for s, d in zip(t.shape, dims, strict=True)
        ):
            raise ConfigError(f"--input-shape {name}: {dims} does not fit shape {t.shape}")
        return dims
    if t.example_shape is not None:
        return list(t.example_shape)
    if -1 in t.shape:
        raise ConfigError(
            f"{entry.source}: inputs.{name}: variable shape {t.shape}; give example_shape "
            f"in model.yaml or --input-shape {name}=D1,D2"
        )
    return list(t.shape)


def synthetic_batch(
    entry: ModelEntry,
    batch: int,
    overrides: Mapping[str, Sequence[int]],
    rng: np.random.Generator,
) -> dict[str, Array]:
    out: dict[str, Array] = {}
    for t in entry.config.inputs:
        shape = [batch, *item_shape(entry, t.name, overrides)]
        dtype = t.spec().dtype
        lo, hi = (t.synthetic.low, t.synthetic.high) if t.synthetic else (0.0, 1.0)
        if dtype.kind in "iu":
            out[t.name] = rng.integers(int(lo), max(int(lo) + 1, int(hi)), size=shape).astype(dtype)
        elif dtype.kind == "b":
            out[t.name] = rng.integers(0, 2, size=shape).astype(dtype)
        else:
            out[t.name] = rng.uniform(lo, hi, size=shape).astype(dtype)
    return out


def _rss_bytes() -> float:
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return float(pages * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, IndexError):
        return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def _peak_rss_bytes() -> float:
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def measure(
    runtime: Runtime,
    entry: ModelEntry,
    device: DeviceTarget,
    batch_sizes: Sequence[int],
    *,
    warmup: int = 3,
    iters: int = 10,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    seed: int = 0,
    progress: Any = None,
    clock: Clock = "wall",
    threads: int | None = None,
) -> list[MeasuredPoint]:
    """Run the loaded ``runtime`` at each batch size; median/p10/p90 ms and memory.

    ``clock="wall"`` times each batch by the wall clock (the profile's meaning on a dedicated
    device). ``clock="cpu"`` times it by the CPU time of the calling thread, which equals the
    wall time of an uncontended core but ignores time-slicing by other processes: the honest
    choice on a shared host. It is only meaningful when the runtime computes on the calling
    thread, so it requires ``threads == 1`` on the CPU.
    """
    if iters < 1:
        raise ConfigError("--iters: must be >= 1")
    if clock == "cpu" and (device.kind != "cpu" or threads != 1):
        raise ConfigError("--clock cpu: needs --device cpu and --cpu-threads 1")
    rng = np.random.default_rng(seed)
    overrides = input_shapes or {}
    torch: Any = importlib.import_module("torch") if device.kind == "cuda" else None
    base_rss = _rss_bytes()
    points: list[MeasuredPoint] = []
    for b in sorted(set(batch_sizes)):
        if b < 1 or b > entry.config.max_batch_size:
            raise ConfigError(
                f"--batch-sizes: {b} is outside 1..{entry.config.max_batch_size} (max_batch_size)"
            )
        inputs = synthetic_batch(entry, b, overrides, rng)
        if torch is not None:
            torch.cuda.synchronize(device.cuda_index)
            torch.cuda.reset_peak_memory_stats(device.cuda_index)
            before = torch.cuda.memory_allocated(device.cuda_index)
        for _ in range(warmup):
            runtime.run(inputs)
        walls: list[float] = []
        cpus: list[float] = []
        for _ in range(iters):
            c0 = time.thread_time()
            t0 = time.perf_counter()
            runtime.run(inputs)
            walls.append((time.perf_counter() - t0) * 1000.0)
            cpus.append((time.thread_time() - c0) * 1000.0)
        times = cpus if clock == "cpu" else walls
        mem: float | None
        if torch is not None:
            mem = (torch.cuda.max_memory_allocated(device.index) - before) / MB
        elif device.kind == "cpu":
            mem = max(0.0, _peak_rss_bytes() - base_rss) / MB
            if points and points[-1].memory_mb is not None:
                mem = max(mem, points[-1].memory_mb)
        else:
            mem = runtime.batch_memory_bytes(b)
            mem = None if mem is None else mem / MB
        qs = statistics.quantiles(times, n=10) if len(times) >= 2 else [times[0]] * 9
        point = MeasuredPoint(
            b,
            statistics.median(times),
            qs[0],
            qs[-1],
            mem,
            wall_median_ms=statistics.median(walls),
            cpu_median_ms=statistics.median(cpus),
        )
        points.append(point)
        if progress is not None:
            progress(point)
    return points


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_label(device: DeviceTarget, described: Mapping[str, Any]) -> str:
    if device.kind == "cuda":
        return str(importlib.import_module("torch").cuda.get_device_name(device.index))
    if device.kind == "cpu":
        threads = described.get("torch_threads") or described.get("intra_op_threads")
        t = f"{threads} thread{'s' if threads != 1 else ''}, " if threads else ""
        return f"CPU {cpu_name()} ({t}{os.cpu_count()} cores visible)"
    return device.name


def runtime_label(described: Mapping[str, Any]) -> str:
    kind = described.get("runtime", "?")
    engine = str(described.get("engine", "eager"))
    if described.get("quantization"):
        engine += ", int8 dynamic quantization"
    if kind == "transformers":
        return (
            f"transformers {described.get('transformers_version')} "
            f"{described.get('architecture')} on torch {described.get('torch_version')} ({engine})"
        )
    if kind == "torch":
        return f"torch {described.get('torch_version')} ({described.get('format')}, {engine})"
    if kind == "onnx":
        return (
            f"onnxruntime {described.get('onnxruntime_version')} "
            f"({', '.join(described.get('providers') or [])})"
        )
    return str(kind)


def build_runtime(
    entry: ModelEntry,
    device: DeviceTarget,
    *,
    precision: str | None = None,
    cpu_threads: int | None = None,
    profiles_dir: Path | None = None,
) -> Runtime:
    params = entry.runtime_params
    if precision is not None:
        if params is None or "precision" not in type(params).model_fields:
            raise ConfigError(f"--precision: runtime {entry.config.runtime} has no precision")
        params = params.model_copy(update={"precision": precision})
        type(params).model_validate(params.model_dump())
    return entry.create_runtime(
        device, cpu_threads=cpu_threads, profiles_dir=profiles_dir, params=params
    )


def write_profile(
    path: Path,
    entry: ModelEntry,
    device: DeviceTarget,
    runtime: Runtime,
    points: Sequence[MeasuredPoint],
    *,
    warmup: int,
    iters: int,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    sequence_length: int | None = None,
    profile_name: str | None = None,
    load_average: tuple[float, float] | None = None,
    clock: Clock = "wall",
) -> LatencyProfile:
    """Write the profile YAML with its provenance; ``load_average`` = host 1-min load at the
    start and end of the measurement (a shared host's contention shows in the figures)."""
    described = runtime.describe()
    precision = str(described.get("precision", "fp32"))
    first = entry.config.inputs[0].name
    shape = item_shape(entry, first, input_shapes or {})
    memory_known = all(p.memory_mb is not None for p in points)
    clock_label = (
        "CPU time of the computing thread (1 thread; equals wall time on an idle core, "
        "immune to other processes on a shared host)"
        if clock == "cpu"
        else "wall time"
    )
    prof = LatencyProfile.from_points(
        profile_name or entry.name,
        {p.batch: round(p.median_ms, 3) for p in points},
        memory_mb={p.batch: round(p.memory_mb or 0.0, 1) for p in points} if memory_known else None,
        weights_mb=round(runtime.resident_bytes() / MB, 1),
        device=device_label(device, described),
        runtime=runtime_label(described),
        precision=precision,
        source=(
            f"Measured with `evenserve profile` on {platform.node() or 'this host'}, "
            f"{dt.date.today().isoformat()}: median {clock_label} of {iters} runs after "
            f"{warmup} warm-up runs per batch size, synthetic inputs of per-item shape {shape}."
        ),
    )
    prof = dataclasses.replace(prof, sequence_length=sequence_length)
    memory_source = {
        "cuda": "torch.cuda peak allocated during the batch above the allocation before it",
        "cpu": (
            "CPU: growth of the process's peak resident set (ru_maxrss) over its size after "
            "loading, batch sizes in ascending order; approximate (the allocator reuses memory)"
        ),
    }.get(device.kind, "the emulated runtime's own profile")
    spread = ", ".join(
        f"b{p.batch} p10 {p.p10_ms:.2f} / p90 {p.p90_ms:.2f} (median wall {p.wall_median_ms:.2f},"
        f" cpu {p.cpu_median_ms:.2f})"
        for p in points
    )
    load = (
        f" Host 1-min load average {load_average[0]:.2f} at the start, {load_average[1]:.2f} at "
        f"the end ({os.cpu_count()} CPUs)."
        if load_average is not None
        else ""
    )
    notes = (
        f"weights_mb = bytes of parameters and buffers. Latency spread ({clock}, ms): "
        f"{spread}.{load} "
        f"Runtime: {', '.join(f'{k}={v}' for k, v in described.items())}."
    )
    dump_profile(
        prof,
        path,
        input_shape="x".join(str(d) for d in shape),
        memory_source=memory_source,
        notes=notes,
    )
    return prof
