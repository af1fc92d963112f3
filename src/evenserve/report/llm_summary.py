"""The figures of an LLM run (simulated, benched or load-generated), from its generation records.

Definitions, for one model and arm over a measured window ``[start_s, end_s)``:
- the requests are the records *scheduled* in the window (open loop: the time each was due;
  TTFT and end-to-end count from it, so a late send is never hidden). Without a window it
  runs from the first scheduled time to the last moment any record shows (finish, last
  token or schedule), the convention of vLLM's serving bench (total over duration).
- ``completed``: outcome ``completed``; every other outcome is counted by reason in
  ``refused``. Latency figures are over the completed requests only.
- TTFT: first token - scheduled. TPOT (per request): (last token - first token) / (tokens -
  1); a request with one token has none. ITL: every gap between consecutive token times of
  every completed request, pooled (a chunk of k tokens records k equal times, so it adds
  k - 1 zero gaps); ``itl_p99_over_p50`` is their P99 / P50 (None when P50 is 0 or none).
  End-to-end: finished - scheduled.
- Percentiles are numpy's (linear interpolation), as the classic summary's.
- Rates are over the window's length: ``requests_per_s`` completed, ``output_tokens_per_s``
  the completed requests' output tokens, ``goodput_rps`` completed requests that met both
  their TTFT and TPOT targets (``GenerationRecord.met_targets``: a missing target is met).
  They are None when the window has no length. ``goodput_fraction``: those over all the
  window's requests (refused ones included; None without requests).
- ``kv_usage`` (the fraction of KV blocks in use, as the engine reports it) and
  ``preemptions`` are passed through from the caller (the engine counts them, not a client).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from rich.table import Table

from evenserve.core.llm import GenerationRecord
from evenserve.report.figures import rounded
from evenserve.report.table import rich_table

COMPLETED = "completed"


@dataclass(frozen=True, slots=True)
class Spread:
    """Mean and percentiles of a set of durations, seconds (all None for an empty set)."""

    n: int = 0
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None

    @classmethod
    def of(cls, values: Sequence[float] | np.ndarray) -> Spread:
        a = np.asarray(values, dtype=float)
        if a.size == 0:
            return cls()
        p50, p90, p99 = (float(x) for x in np.percentile(a, [50.0, 90.0, 99.0]))
        return cls(int(a.size), float(a.mean()), p50, p90, p99)

    def to_dict_ms(self) -> dict[str, Any]:
        def ms(x: float | None) -> float | None:
            return None if x is None else rounded(x * 1e3, 4)

        return {
            "n": self.n,
            "mean": ms(self.mean),
            "p50": ms(self.p50),
            "p90": ms(self.p90),
            "p99": ms(self.p99),
        }


@dataclass(frozen=True, slots=True)
class LlmSummary:
    """One model and arm's figures over a window (module docstring); times in seconds."""

    model: str
    arm: str | None
    start_s: float
    end_s: float
    requests: int
    completed: int
    refused: dict[str, int]
    ttft_s: Spread
    tpot_s: Spread
    itl_s: Spread
    itl_p99_over_p50: float | None
    e2e_s: Spread
    output_tokens: int
    requests_per_s: float | None
    output_tokens_per_s: float | None
    goodput_rps: float | None
    goodput_fraction: float | None
    met_targets: int
    kv_usage: float | None = None
    preemptions: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def window_s(self) -> float:
        return self.end_s - self.start_s

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (durations in ms, as the classic summary's)."""

        def r(x: float | None) -> float | None:
            return None if x is None else rounded(x)

        out: dict[str, Any] = {
            "model": self.model,
            "arm": self.arm,
            "window_s": [r(self.start_s), r(self.end_s)],
            "requests": self.requests,
            "completed": self.completed,
            "refused": dict(self.refused),
            "ttft_ms": self.ttft_s.to_dict_ms(),
            "tpot_ms": self.tpot_s.to_dict_ms(),
            "itl_ms": self.itl_s.to_dict_ms(),
            "itl_p99_over_p50": r(self.itl_p99_over_p50),
            "e2e_ms": self.e2e_s.to_dict_ms(),
            "output_tokens": self.output_tokens,
            "requests_per_s": r(self.requests_per_s),
            "output_tokens_per_s": r(self.output_tokens_per_s),
            "goodput_rps": r(self.goodput_rps),
            "goodput_fraction": r(self.goodput_fraction),
            "met_targets": self.met_targets,
            "kv_usage": r(self.kv_usage),
            "preemptions": self.preemptions,
        }
        out.update(self.extra)
        return out


def _last_seen_s(rec: GenerationRecord) -> float:
    times = [rec.scheduled_s]
    if rec.finished_s is not None:
        times.append(rec.finished_s)
    if rec.token_times_s:
        times.append(rec.token_times_s[-1])
    return max(times)


def inter_token_gaps(records: Iterable[GenerationRecord]) -> np.ndarray:
    """Every gap between consecutive token times of the records, pooled, in seconds."""
    parts = [np.diff(np.asarray(r.token_times_s, dtype=float)) for r in records if r.token_times_s]
    return np.concatenate(parts) if parts else np.zeros(0)


def summarize_generations(
    records: Iterable[GenerationRecord],
    *,
    model: str | None = None,
    arm: str | None = None,
    window: tuple[float, float] | None = None,
    kv_usage: float | None = None,
    preemptions: int | None = None,
    extra: dict[str, Any] | None = None,
) -> LlmSummary:
    """The figures of ``records`` (those of ``model`` when given) scheduled in ``window``
    (``(start_s, end_s)``; default: the records' own span). ``extra`` goes into the JSON."""
    recs = [r for r in records if model is None or r.model == model]
    if window is not None:
        start_s, end_s = window
        if not end_s >= start_s:
            raise ValueError(f"window: end {end_s} is before start {start_s}")
        recs = [r for r in recs if start_s <= r.scheduled_s < end_s]
    elif recs:
        start_s = min(r.scheduled_s for r in recs)
        end_s = max(_last_seen_s(r) for r in recs)
    else:
        start_s = end_s = 0.0
    done = [r for r in recs if r.outcome == COMPLETED]
    refused = dict(sorted(Counter(r.outcome for r in recs if r.outcome != COMPLETED).items()))
    ttft = [t for r in done if (t := r.ttft_s) is not None]
    tpot = [t for r in done if (t := r.tpot_s) is not None]
    e2e = [t for r in done if (t := r.e2e_s) is not None]
    itl = Spread.of(inter_token_gaps(done))
    ratio = None
    if itl.p50 is not None and itl.p99 is not None and itl.p50 > 0:
        ratio = itl.p99 / itl.p50
    tokens = sum(r.output_tokens for r in done)
    met = sum(1 for r in done if r.met_targets())
    window_s = end_s - start_s

    def rate(n: int) -> float | None:
        return n / window_s if window_s > 0 else None

    return LlmSummary(
        model=model if model is not None else ",".join(sorted({r.model for r in recs})),
        arm=arm,
        start_s=start_s,
        end_s=end_s,
        requests=len(recs),
        completed=len(done),
        refused=refused,
        ttft_s=Spread.of(ttft),
        tpot_s=Spread.of(tpot),
        itl_s=itl,
        itl_p99_over_p50=ratio,
        e2e_s=Spread.of(e2e),
        output_tokens=tokens,
        requests_per_s=rate(len(done)),
        output_tokens_per_s=rate(tokens),
        goodput_rps=rate(met),
        goodput_fraction=met / len(recs) if recs else None,
        met_targets=met,
        kv_usage=kv_usage,
        preemptions=preemptions,
        extra=dict(extra or {}),
    )


# -- the printed table -----------------------------------------------------------------------


def _num(x: float | None, nd: int = 1, scale: float = 1.0, pct: bool = False) -> str:
    if x is None:
        return "-"
    if pct:
        return f"{100.0 * x:.{nd}f}%"
    return f"{x * scale:.{nd}f}"


def llm_table_rows(summaries: Sequence[LlmSummary]) -> tuple[list[str], list[list[str]]]:
    """The summaries side by side, a figure per row: header and rows (printed and in HTML)."""
    out: list[list[str]] = []

    def add(label: str, values: Iterable[str]) -> None:
        out.append([label, *values])

    add("requests", (str(s.requests) for s in summaries))
    add("completed", (str(s.completed) for s in summaries))
    add(
        "refused",
        (", ".join(f"{k} {v}" for k, v in s.refused.items()) or "0" for s in summaries),
    )
    for label, attr, keys in (
        ("TTFT", "ttft_s", ("mean", "p50", "p90", "p99")),
        ("TPOT", "tpot_s", ("mean", "p50", "p99")),
        ("ITL", "itl_s", ("mean", "p50", "p99")),
        ("E2E", "e2e_s", ("mean", "p50", "p99")),
    ):
        for k in keys:
            add(
                f"{label} {k.upper() if k != 'mean' else k} ms",
                (_num(getattr(getattr(s, attr), k), 2, 1e3) for s in summaries),
            )
    add("ITL P99/P50", (_num(s.itl_p99_over_p50, 2) for s in summaries))
    add("output tok/s", (_num(s.output_tokens_per_s, 1) for s in summaries))
    add("requests/s", (_num(s.requests_per_s, 2) for s in summaries))
    add("goodput rps", (_num(s.goodput_rps, 2) for s in summaries))
    add("goodput share", (_num(s.goodput_fraction, 1, pct=True) for s in summaries))
    if any(s.kv_usage is not None for s in summaries):
        add("KV use", (_num(s.kv_usage, 1, pct=True) for s in summaries))
    if any(s.preemptions is not None for s in summaries):
        add(
            "preemptions", ("-" if s.preemptions is None else str(s.preemptions) for s in summaries)
        )
    header = ["figure", *(s.model if s.arm is None else f"{s.arm} {s.model}" for s in summaries)]
    return header, out


def llm_table(summaries: Sequence[LlmSummary], title: str = "LLM generation") -> Table:
    """The rich table of :func:`llm_table_rows`."""
    return rich_table(title, *llm_table_rows(summaries))
