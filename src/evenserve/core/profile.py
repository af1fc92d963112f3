"""Latency and memory profiles per (model, device), with provenance.

A profile is a list of measured points ``batch -> (ms per batch, MB of working memory)`` plus
the resident weights. Between points it interpolates linearly; above the largest measured
batch it extrapolates along the last segment (batch time grows about linearly once the device
is saturated); below the smallest it uses the smallest point (a batch never gets cheaper than
the fixed cost). Every profile states its device, runtime, precision, sequence length and
source, because ms-per-batch means nothing without them.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, model_validator

from evenserve.core.errors import ProfileError
from evenserve.core.validation import Strict, read_yaml, validate_document

MB = 1024.0 * 1024.0


class ProfilePoint(Strict):
    batch: int = Field(ge=1)
    latency_ms: float = Field(gt=0)
    memory_mb: float | None = Field(default=None, ge=0)


class ProfileFile(Strict):
    """The YAML schema of one profile (``profiles/<set>/<model>.yaml``)."""

    model: str
    device: str
    runtime: str
    precision: str
    sequence_length: int | None = None
    input_shape: str | None = None
    source: str
    memory_source: str | None = None
    notes: str | None = None
    weights_mb: float = Field(default=0.0, ge=0)
    points: list[ProfilePoint] = Field(min_length=1)

    @model_validator(mode="after")
    def _sorted_unique(self) -> ProfileFile:
        batches = [p.batch for p in self.points]
        if len(set(batches)) != len(batches):
            raise ValueError("points: batch sizes must be unique")
        self.points.sort(key=lambda p: p.batch)
        return self


class Table(dict[Any, Any]):
    """``table[key]`` is ``fn(key)``, computed on the first lookup and kept: a lookup that
    hits is one dict read, no Python call."""

    __slots__ = ("_fn",)

    def __init__(self, fn: Any) -> None:
        super().__init__()
        self._fn = fn

    def __missing__(self, key: Any) -> Any:
        value = self[key] = self._fn(key)
        return value


@dataclass(frozen=True)
class LatencyProfile:
    """Interpolating view of a profile; cheap to query in hot loops."""

    model: str
    device: str
    runtime: str
    precision: str
    source: str
    batches: tuple[int, ...]
    latency_ms: tuple[float, ...]
    memory_mb: tuple[float, ...]
    weights_mb: float
    sequence_length: int | None = None
    #: latency_s by batch size, filled as sizes are asked for (routers ask per request).
    _latency_s: dict[int, float] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )
    #: ``queue_parts_s`` and ``own_share_s`` as tables, filled as they are asked for: a
    #: lookup that hits is one dict read, no Python call (routers read them per request).
    queue_parts: Mapping[tuple[int, int], tuple[float, float]] = field(
        init=False, repr=False, compare=False, hash=False
    )
    own_share: Mapping[int, float] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "queue_parts", Table(self._queue_parts))
        object.__setattr__(self, "own_share", Table(self._own_share))

    @classmethod
    def from_points(
        cls,
        model: str,
        points: Mapping[int, float],
        *,
        memory_mb: Mapping[int, float] | None = None,
        weights_mb: float = 0.0,
        device: str = "test",
        runtime: str = "test",
        precision: str = "fp32",
        source: str = "test",
    ) -> LatencyProfile:
        batches = tuple(sorted(points))
        if not batches:
            raise ProfileError(f"profile {model!r}: no points")
        mem = memory_mb or {}
        return cls(
            model=model,
            device=device,
            runtime=runtime,
            precision=precision,
            source=source,
            batches=batches,
            latency_ms=tuple(float(points[b]) for b in batches),
            memory_mb=tuple(float(mem.get(b, 0.0)) for b in batches),
            weights_mb=weights_mb,
        )

    @classmethod
    def from_file_model(cls, f: ProfileFile) -> LatencyProfile:
        return cls(
            model=f.model,
            device=f.device,
            runtime=f.runtime,
            precision=f.precision,
            source=f.source,
            batches=tuple(p.batch for p in f.points),
            latency_ms=tuple(p.latency_ms for p in f.points),
            memory_mb=tuple(p.memory_mb or 0.0 for p in f.points),
            weights_mb=f.weights_mb,
            sequence_length=f.sequence_length,
        )

    def _interp(self, values: Sequence[float], batch: float) -> float:
        xs = self.batches
        if batch <= xs[0]:
            return values[0]
        if len(xs) == 1:  # one point: assume per-item cost stays constant beyond it
            return values[0] * batch / xs[0]
        i = bisect.bisect_left(xs, batch)
        if i < len(xs) and xs[i] == batch:
            return values[i]
        if i >= len(xs):
            i = len(xs) - 1
        x0, x1 = xs[i - 1], xs[i]
        y0, y1 = values[i - 1], values[i]
        return max(0.0, y0 + (y1 - y0) * (batch - x0) / (x1 - x0))

    def latency_s(self, batch: int) -> float:
        """Seconds to run one batch of ``batch`` requests."""
        s = self._latency_s.get(batch)
        if s is None:
            s = self._latency_s[batch] = self._interp(self.latency_ms, batch) / 1000.0
        return s

    def queue_parts_s(self, queued: int, cap: int) -> tuple[float, float]:
        """Seconds to run ``queued`` requests as full batches of ``cap`` and then one partial
        batch, as the two terms ``(floor(q / cap) * t(cap), t(q mod cap))`` (0 for none):
        kept apart so that a sum of them adds in the same order as the terms themselves."""
        return self.queue_parts[queued, cap]

    def _queue_parts(self, key: tuple[int, int]) -> tuple[float, float]:
        queued, cap = key
        if queued <= 0:
            return (0.0, 0.0)
        full, rest = divmod(queued, cap if cap > 1 else 1)
        return (full * self.latency_s(cap) if full else 0.0, self.latency_s(rest) if rest else 0.0)

    def own_share_s(self, rest: int) -> float:
        """What one more request adds to a partial batch of ``rest``: ``t(rest + 1) -
        t(rest)`` (``t(0) = 0``)."""
        return self.own_share[rest]

    def _own_share(self, rest: int) -> float:
        return self.latency_s(rest + 1) - (self.latency_s(rest) if rest else 0.0)

    def batch_memory_bytes(self, batch: int) -> float:
        """Working memory of one batch, in bytes (weights excluded)."""
        return self._interp(self.memory_mb, batch) * MB

    @property
    def weights_bytes(self) -> float:
        return self.weights_mb * MB

    def at_speed(self, fraction: float) -> LatencyProfile:
        """This profile on a device running at ``fraction`` of the profiled one's speed (a
        MIG slice: compute slices / 7): every latency divided by ``fraction``; memory and
        weights unchanged. ``fraction`` 1 returns this profile."""
        if not 0 < fraction <= 1:
            raise ValueError(f"speed fraction {fraction} not in (0, 1]")
        if fraction == 1:
            return self
        return replace(
            self,
            latency_ms=tuple(v / fraction for v in self.latency_ms),
            device=f"{self.device} at {fraction:.3g}x",
        )

    def per_item_s(self, batch: int) -> float:
        return self.latency_s(batch) / max(1, batch)

    def to_file_model(self) -> ProfileFile:
        return ProfileFile(
            model=self.model,
            device=self.device,
            runtime=self.runtime,
            precision=self.precision,
            sequence_length=self.sequence_length,
            source=self.source,
            weights_mb=self.weights_mb,
            points=[
                ProfilePoint(batch=b, latency_ms=lat, memory_mb=mem)
                for b, lat, mem in zip(self.batches, self.latency_ms, self.memory_mb, strict=True)
            ],
        )


def load_profile(path: Path) -> LatencyProfile:
    """Read one profile YAML; raise ProfileError naming the file and field on any problem."""
    raw = read_yaml(path, f"profile file not found: {path}", ProfileError)
    return LatencyProfile.from_file_model(
        validate_document(ProfileFile, raw, str(path), ProfileError)
    )


def load_profile_set(directory: Path) -> dict[str, LatencyProfile]:
    """All classic profiles of one set (one YAML per model), keyed by model name; an LLM's
    step profile in the set (``kind: llm-step``, ``core.llm``) is not one of them."""
    if not directory.is_dir():
        raise ProfileError(f"profile set not found: {directory}")
    out: dict[str, LatencyProfile] = {}
    steps = 0
    for path in sorted(directory.glob("*.yaml")):
        raw = read_yaml(path, f"profile file not found: {path}", ProfileError)
        if isinstance(raw, dict) and raw.get("kind") == "llm-step":
            steps += 1
            continue
        prof = LatencyProfile.from_file_model(
            validate_document(ProfileFile, raw, str(path), ProfileError)
        )
        out[prof.model] = prof
    if not out and not steps:
        raise ProfileError(f"profile set {directory} holds no *.yaml profiles")
    return out


def dump_profile(profile: LatencyProfile, path: Path, **extra: Any) -> None:
    """Write a profile YAML (extra provenance keys such as notes/input_shape allowed)."""
    data = profile.to_file_model().model_dump(exclude_none=True)
    data.update({k: v for k, v in extra.items() if v is not None})
    ProfileFile.model_validate(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def bundled_profile_set(name: str) -> Path | None:
    """A profile set shipped with evenserve (``evenserve/profiles/NAME``, in the wheel too),
    or None: what ``--device emulated:NAME`` finds outside a checkout."""
    if not name or "/" in name or name in (".", ".."):
        return None
    from importlib.resources import files

    d = Path(str(files("evenserve") / "profiles" / name))
    return d if d.is_dir() else None
