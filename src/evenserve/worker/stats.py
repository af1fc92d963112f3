"""Per-model inference statistics in the shape of Triton's statistics extension.

``GET /v2/models/{m}/stats`` answers ``{"model_stats": [...]}`` with cumulative counts and
nanoseconds, as Triton does: ``success``/``fail`` time a request from receipt to answer;
``queue`` from arrival to its batch's start; ``compute_input``/``compute_infer``/
``compute_output`` are the batch's phases, counted once per request in the batch;
``batch_stats`` count executions per batch size. Tools that read Triton's statistics
(perf_analyzer, dashboards) read these unchanged. One key of evenserve's own:
``evenserve_load``, where the model's last load came from (``load_source``: ``host``, the
warm pool, or ``disk``), how long it took (``load_seconds``) and its warm-up
(``warmup_batch_sizes``, ``warmup_seconds``, ``warmup_first_ms``, ``warmup_second_ms``).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, seconds: float, count: int = 1) -> None:
        self.count += count
        self.ns += int(seconds * 1e9) * count


@dataclass
class Phases:
    """Time in a batch's three phases: assembling its inputs, running it, splitting outputs."""

    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)

    def add(self, input_s: float, infer_s: float, output_s: float, count: int = 1) -> None:
        self.compute_input.add(input_s, count)
        self.compute_infer.add(infer_s, count)
        self.compute_output.add(output_s, count)


@dataclass
class ModelStats:
    name: str
    version: str
    last_inference_ms: int = 0
    inference_count: int = 0
    execution_count: int = 0
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute: Phases = field(default_factory=Phases)
    batches: dict[int, Phases] = field(default_factory=dict)
    #: Where the model's load came from and how long it took (``load_source``: host, the
    #: warm pool, or disk; ``load_seconds``), shown as ``evenserve_load``.
    load: dict[str, Any] | None = None

    def record_batch(
        self,
        items: int,
        requests: int,
        queue_s: list[float],
        compute_input_s: float,
        compute_infer_s: float,
        compute_output_s: float,
    ) -> None:
        self.last_inference_ms = int(time.time() * 1000)
        self.inference_count += items
        self.execution_count += 1
        for q in queue_s:
            self.queue.add(q)
        phases = (compute_input_s, compute_infer_s, compute_output_s)
        self.compute.add(*phases, count=requests)
        self.batches.setdefault(items, Phases()).add(*phases)

    def record_request(self, ok: bool, duration_s: float) -> None:
        (self.success if ok else self.fail).add(duration_s)

    def json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": asdict(self.success),
                "fail": asdict(self.fail),
                "queue": asdict(self.queue),
                **asdict(self.compute),
                "cache_hit": {"count": 0, "ns": 0},
                "cache_miss": {"count": 0, "ns": 0},
            },
            "response_stats": {},
            "batch_stats": [
                {"batch_size": size, **asdict(b)} for size, b in sorted(self.batches.items())
            ],
            "memory_usage": [],
            **({} if self.load is None else {"evenserve_load": dict(self.load)}),
        }
