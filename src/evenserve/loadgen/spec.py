"""What a load run is asked to do and what it gives back.

:class:`LoadSpec` is the run (target, mix, one of closed loop / open loop / trace, limits),
validated before anything is sent, with errors naming the command-line option;
:class:`Sample` is one request as the generator saw it, :class:`LiveStats` what the progress
line shows, and :class:`LoadResult` the whole run (samples, scrapes, errors, lag).
``records`` writes and reads these; ``runner`` fills them.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from evenserve.core.errors import ConfigError
from evenserve.loadgen.scrape import BackendScrape
from evenserve.workload import Arrival

#: Hard limits: no run may be longer or send more than this, whatever it is asked.
MAX_DURATION_S = 3600.0
MAX_REQUESTS = 10_000_000


@dataclass
class LoadSpec:
    target: str
    mix: dict[str, float]
    duration_s: float
    warmup_s: float = 0.0
    users: int | None = None
    think_s: float = 0.0
    rate_rps: float | None = None
    trace: list[Arrival] | None = None
    trace_time_scale: float = 1.0
    max_requests: int = 1_000_000
    timeout_s: float = 30.0
    drain_s: float = 10.0
    seed: int = 0
    var_dim: int = 1
    #: Bodies made from metadata: ``binary`` (the tensor extension) or ``json``.
    encoding: str = "binary"
    payload_files: dict[str, Path] = field(default_factory=dict)
    scrape: dict[str, str] = field(default_factory=dict)
    scrape_interval_s: float = 0.1
    metrics_interval_s: float = 1.0
    max_in_flight: int = 4096
    abort_after: int = 100
    #: Per-model request parameters (``priority``) added to every body of that model.
    model_priority: dict[str, int] = field(default_factory=dict)

    def mode(self) -> str:
        if self.trace is not None:
            return "trace"
        if self.rate_rps is not None:
            return "open-loop"
        return "closed-loop"

    def validate(self) -> None:
        if not (0 < self.duration_s <= MAX_DURATION_S):
            raise ConfigError(f"--duration: must be > 0 and at most {MAX_DURATION_S:g} s")
        if not (0 <= self.warmup_s < self.duration_s):
            raise ConfigError("--warmup: must be >= 0 and less than --duration")
        if not (1 <= self.max_requests <= MAX_REQUESTS):
            raise ConfigError(f"--max-requests: must be between 1 and {MAX_REQUESTS}")
        modes = [self.trace is not None, self.rate_rps is not None, self.users is not None]
        if sum(modes) != 1:
            raise ConfigError("give exactly one of --users (closed loop), --rate or --trace")
        if self.users is not None and self.users < 1:
            raise ConfigError("--users: must be >= 1")
        if self.rate_rps is not None and not (0 < self.rate_rps < math.inf):
            raise ConfigError("--rate: must be a number > 0")
        if self.think_s < 0:
            raise ConfigError("--think-ms: must be >= 0")
        if self.timeout_s <= 0:
            raise ConfigError("--timeout: must be > 0")
        if self.var_dim < 1:
            raise ConfigError("--var-dim: must be >= 1")
        if self.encoding not in ("binary", "json"):
            raise ConfigError(f"--encoding: must be binary or json, got {self.encoding!r}")

    def models(self) -> list[str]:
        if self.trace is not None:
            return sorted({a.model for a in self.trace})
        return sorted(m for m, w in self.mix.items() if w > 0)


@dataclass(slots=True)
class Sample:
    """One request as the generator saw it; times are seconds from time zero."""

    model: str
    intended_s: float
    sent_s: float = math.nan
    done_s: float = math.nan
    status: int = 0
    outcome: str = "unfinished"
    backend: str = ""
    user: int = -1
    priority: int | None = None
    #: 1 when the request was sent a second time, on a fresh connection, because the reused
    #: keep-alive connection it went out on was closed before any answer byte (see
    #: ``http.RawHttpClient.post``); the latency still counts from the first intended time.
    resent: int = 0

    def to_json(self) -> dict[str, Any]:
        """Every field at full precision (``evenserve report`` recomputes the very same figures
        from these); a time not reached (NaN) is null."""
        out = asdict(self)
        for k in ("sent_s", "done_s"):
            out[k] = None if math.isnan(out[k]) else out[k]
        return out


@dataclass
class LiveStats:
    """What the progress display shows."""

    elapsed_s: float = 0.0
    duration_s: float = 0.0
    sent: int = 0
    ok: int = 0
    failed: int = 0
    in_flight: int = 0
    recent_ms: deque[float] = field(default_factory=lambda: deque(maxlen=2000))
    failures: dict[str, int] = field(default_factory=dict)
    draining: bool = False

    def percentiles(self) -> tuple[float | None, float | None]:
        if not self.recent_ms:
            return None, None
        a = np.fromiter(self.recent_ms, dtype=float)
        return float(np.percentile(a, 50)), float(np.percentile(a, 99))


@dataclass
class LoadResult:
    spec: LoadSpec
    samples: list[Sample]
    scrapes: dict[str, BackendScrape]
    errors: dict[str, Any]
    lag_ms: dict[str, Any]
    started_unix_s: float
    end_s: float
    aborted: str | None = None
    #: The generator thread's scheduling while it ran (see ``sender_priority``).
    priority: str = "normal"
    #: The send path's connections: opened, idle ones retired before reuse, requests resent
    #: after a keep-alive race (``http.RawHttpClient.stats``).
    connections: dict[str, int] = field(default_factory=dict)
    #: The wall time (Unix seconds) of the run's t = 0, the origin of the samples' and the
    #: schedule's times (None: not known).
    t0_unix_s: float | None = None
