"""LLM run figures: TTFT, TPOT, ITL, end-to-end, rates and goodput from generation records."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from evenserve.core.llm import GenerationRecord
from evenserve.report.llm_summary import (
    inter_token_gaps,
    llm_table,
    llm_table_rows,
    summarize_generations,
)


def rec(
    rid: int,
    scheduled: float,
    times: list[float] | None,
    outcome: str = "completed",
    ttft_target: float | None = None,
    tpot_target: float | None = None,
    model: str = "m",
) -> GenerationRecord:
    return GenerationRecord(
        request_id=rid,
        model=model,
        scheduled_s=scheduled,
        prompt_tokens=8,
        outcome=outcome,
        token_times_s=times,
        finished_s=times[-1] if times else None,
        ttft_target_s=ttft_target,
        tpot_target_s=tpot_target,
    )


def test_figures_of_a_small_run() -> None:
    records = [
        rec(0, 0.0, [0.1, 0.2, 0.3], ttft_target=0.2, tpot_target=0.2),  # met
        rec(1, 1.0, [1.5, 1.6], ttft_target=0.2),  # TTFT 0.5 misses
        rec(2, 2.0, [2.1], tpot_target=0.001),  # one token: TPOT met
        rec(3, 3.0, None, outcome="overloaded"),
        rec(4, 3.5, None, outcome="overloaded"),
        rec(5, 3.6, [3.7], outcome="failed"),
        rec(6, 3.0, [3.1, 3.2], model="other"),
    ]
    s = summarize_generations(records, model="m", arm="a", window=(0.0, 4.0), preemptions=3)
    assert (s.requests, s.completed, s.output_tokens) == (6, 3, 6)
    assert s.refused == {"failed": 1, "overloaded": 2}
    assert s.ttft_s.n == 3 and s.ttft_s.mean == pytest.approx((0.1 + 0.5 + 0.1) / 3)
    assert s.tpot_s.n == 2 and s.tpot_s.p50 == pytest.approx(0.1)
    assert s.itl_s.n == 3 and s.itl_s.mean == pytest.approx(0.1)
    assert s.itl_p99_over_p50 == pytest.approx(1.0)
    assert s.e2e_s.p50 == pytest.approx(0.3)
    assert s.met_targets == 2
    assert s.goodput_rps == pytest.approx(0.5) and s.goodput_fraction == pytest.approx(2 / 6)
    assert s.requests_per_s == pytest.approx(0.75)
    assert s.output_tokens_per_s == pytest.approx(1.5)
    d = s.to_dict()
    json.dumps(d)
    assert d["ttft_ms"]["p50"] == pytest.approx(100.0) and d["preemptions"] == 3
    assert d["kv_usage"] is None and d["arm"] == "a"


def test_window_keeps_records_scheduled_in_it() -> None:
    records = [rec(i, float(i), [i + 0.5]) for i in range(10)]
    s = summarize_generations(records, window=(2.0, 5.0))
    assert s.requests == 3 and s.requests_per_s == pytest.approx(1.0)
    whole = summarize_generations(records)
    assert (whole.start_s, whole.end_s, whole.requests) == (0.0, 9.5, 10)
    with pytest.raises(ValueError, match="window"):
        summarize_generations(records, window=(3.0, 1.0))


def test_empty_input_gives_zeros_and_nones() -> None:
    s = summarize_generations([])
    assert (s.requests, s.completed, s.output_tokens, s.met_targets) == (0, 0, 0, 0)
    assert s.ttft_s.mean is None and s.itl_s.p99 is None and s.itl_p99_over_p50 is None
    assert s.requests_per_s is None and s.goodput_fraction is None
    w = summarize_generations([], window=(0.0, 10.0))
    assert w.requests_per_s == 0.0 and w.goodput_rps == 0.0
    json.dumps(s.to_dict())
    header, rows = llm_table_rows([s, w])
    assert len(header) == 3 and all(len(r) == 3 for r in rows)


def test_table_renders_every_summary() -> None:
    s = summarize_generations([rec(0, 0.0, [0.1, 0.3])], arm="a", kv_usage=0.5)
    header, rows = llm_table_rows([s])
    assert header == ["figure", "a m"]
    labels = [r[0] for r in rows]
    assert "TTFT P99 ms" in labels and "KV use" in labels and "preemptions" not in labels
    assert dict((r[0], r[1]) for r in rows)["TTFT P50 ms"] == "100.00"
    console = Console(record=True, width=120)
    console.print(llm_table([s]))
    assert "goodput rps" in console.export_text()


times_strategy = st.lists(st.floats(0.0, 5.0, allow_nan=False), min_size=0, max_size=12).map(
    lambda gaps: list(np.cumsum(gaps)) if gaps else None
)

record_strategy = st.builds(
    lambda rid, sched, times, outcome, ttft_t, tpot_t: rec(
        rid,
        sched,
        None if times is None else [sched + 0.01 + t for t in times],
        outcome,
        ttft_t,
        tpot_t,
    ),
    st.integers(0, 1000),
    st.floats(0.0, 100.0, allow_nan=False),
    times_strategy,
    st.sampled_from(["completed", "completed", "overloaded", "failed"]),
    st.none() | st.floats(0.001, 2.0),
    st.none() | st.floats(0.001, 2.0),
)


@given(st.lists(record_strategy, max_size=30))
def test_goodput_never_exceeds_the_completed_rate(records: list[GenerationRecord]) -> None:
    s = summarize_generations(records)
    assert s.met_targets <= s.completed <= s.requests
    if s.goodput_rps is not None:
        assert s.requests_per_s is not None
        assert s.goodput_rps <= s.requests_per_s + 1e-12
    if s.goodput_fraction is not None:
        assert 0.0 <= s.goodput_fraction <= 1.0


@given(st.lists(record_strategy, max_size=30))
def test_pooled_itl_is_every_records_gaps(records: list[GenerationRecord]) -> None:
    s = summarize_generations(records)
    done = [r for r in records if r.outcome == "completed"]
    gaps = [
        r.token_times_s[i + 1] - r.token_times_s[i]
        for r in done
        if r.token_times_s
        for i in range(len(r.token_times_s) - 1)
    ]
    assert s.itl_s.n == len(gaps) == len(inter_token_gaps(done))
    if gaps:
        assert s.itl_s.p50 == pytest.approx(float(np.percentile(gaps, 50)))
        assert s.itl_s.p99 == pytest.approx(float(np.percentile(gaps, 99)))
        # The pooled mean weighs each record's mean gap (its TPOT) by its gaps.
        n_gaps = [len(r.token_times_s or []) - 1 for r in done]
        weighted = sum(
            (r.tpot_s or 0.0) * n for r, n in zip(done, n_gaps, strict=True) if n > 0
        ) / sum(n for n in n_gaps if n > 0)
        assert s.itl_s.mean == pytest.approx(weighted)
    else:
        assert s.itl_s.mean is None


@given(st.lists(record_strategy, max_size=30))
def test_one_token_records_have_no_tpot(records: list[GenerationRecord]) -> None:
    s = summarize_generations(records)
    done = [r for r in records if r.outcome == "completed"]
    assert s.tpot_s.n == sum(1 for r in done if r.output_tokens >= 2)
    assert s.ttft_s.n == sum(1 for r in done if r.output_tokens >= 1)
    assert all(r.tpot_s is None for r in done if r.output_tokens == 1)
